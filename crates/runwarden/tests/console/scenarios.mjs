// The console (O4) in a real browser: Debian's chromium driven by playwright-core against
// a real `runwarden serve` with the real Python MCP peer. Started by tests/console.rs,
// which passes everything in the environment and checks the peer's counters and the saved
// pages itself. Each step prints one JSON line; any failed check exits non-zero with a
// message naming the step.
//
// RW_BASE       the console's base URL (http://127.0.0.1:PORT)
// RW_OPERATOR   an operator API token;  RW_VIEWER a viewer API token
// RW_PEER       the peer's base URL (its /stats has its own counters)
// RW_OUT        where screenshots and each page's HTML go
// RUNWARDEN_BROWSER_DIR  where scripts/browser.sh installed playwright-core
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
};
const BASE = env("RW_BASE");
const OPERATOR = env("RW_OPERATOR");
const VIEWER = env("RW_VIEWER");
const PEER = env("RW_PEER");
const OUT = env("RW_OUT");
const { chromium } = await import(
  path.join(env("RUNWARDEN_BROWSER_DIR"), "node_modules/playwright-core/index.mjs")
);

const WAIT = 15_000;
let step = "start";
const report = (fields) => console.log(JSON.stringify({ step, ...fields }));
function check(condition, message) {
  if (!condition) throw new Error(`${step}: ${message}`);
}

async function api(method, pathname, body) {
  const response = await fetch(BASE + pathname, {
    method,
    headers: { authorization: `Bearer ${OPERATOR}`, "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  check(response.ok, `${method} ${pathname} answered ${response.status}: ${text}`);
  return JSON.parse(text);
}

async function peerStats() {
  return (await fetch(PEER + "/stats")).json();
}

// A bounded look at a counter the browser cannot see (the peer's, the API's): the only
// way to learn it is to ask, so this asks every 10 ms until the deadline.
async function until(what, probe, timeout = WAIT) {
  const started = Date.now();
  for (;;) {
    const value = await probe();
    if (value) return { value, ms: Date.now() - started };
    if (Date.now() - started > timeout) throw new Error(`${step}: timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

async function runStatus(id) {
  return (await api("GET", `/v1/runs/${id}`)).status;
}

const userData = fs.mkdtempSync(path.join(os.tmpdir(), "rw-console-chromium-"));
const context = await chromium.launchPersistentContext(userData, {
  executablePath: "/usr/bin/chromium",
  headless: true,
  args: [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
  ],
});
const page = context.pages()[0] ?? (await context.newPage());
page.setDefaultTimeout(WAIT);
const violations = [];
page.on("console", (msg) => {
  if (msg.type() === "error") violations.push(msg.text());
});
page.on("pageerror", (error) => violations.push(String(error)));

async function save(name) {
  await page.screenshot({ path: path.join(OUT, `${name}.png`), fullPage: true });
  fs.writeFileSync(path.join(OUT, `${name}.html`), await page.content());
}

const figures = {};
try {
  step = "sign_in";
  await page.goto(BASE + "/");
  await save("sign-in");
  await page.fill("#token", OPERATOR);
  await Promise.all([page.waitForURL(BASE + "/runs"), page.click("section.signin button[type=submit]")]);
  check((await page.textContent("h1")) === "Runs", "the runs page follows the sign-in");
  const cookies = await context.cookies();
  const session = cookies.find((c) => c.name === "rw_session");
  check(session && session.httpOnly && session.sameSite === "Strict", `cookie ${JSON.stringify(session)}`);
  check(!(await page.evaluate(() => document.cookie)).includes("rw_session"), "scripts cannot read the cookie");
  report({ ok: true });

  step = "runs_live";
  await page.waitForSelector("body[data-live=open]");
  await page.evaluate(() => { window.__sameDocument = true; });
  const slow = await api("POST", "/v1/runs", { agent: "slowpoke", prompt: "take your time" });
  const appeared = Date.now();
  await page.waitForSelector(`tr[data-run="${slow.run_id}"]`);
  figures.row_appeared_ms = Date.now() - appeared;
  check(await page.evaluate(() => window.__sameDocument === true), "the page was not reloaded");
  await save("runs");
  report({ ok: true, run: slow.run_id, ms: figures.row_appeared_ms });

  step = "timeline_live";
  await page.click(`tr[data-run="${slow.run_id}"] a`);
  await page.waitForURL(`${BASE}/runs/${slow.run_id}`);
  await page.waitForSelector("body[data-live=open]");
  await page.evaluate(() => { window.__sameDocument = true; });
  const atLoad = await page.$$eval("#timeline li", (items) => items.map((i) => i.dataset.kind));
  // The first slow call takes 1.5 s: its result cannot be in the page as loaded.
  check(!atLoad.includes("tool_executed"), `the first result was already there: ${atLoad}`);
  await page.waitForSelector('#timeline li[data-kind="tool_executed"]');
  await until("the second slow call", async () => (await peerStats()).slow_started >= 2);
  await page.waitForSelector('#timeline li[data-kind="model_response"] >> nth=1');
  check(await page.evaluate(() => window.__sameDocument === true), "the timeline grew without a reload");
  const live = await page.$$eval("#timeline li", (items) => items.map((i) => i.dataset.kind));
  await save("run-live");
  report({ ok: true, at_load: atLoad, live });

  step = "cancel";
  const before = (await peerStats()).slow_cancelled;
  const clicked = Date.now();
  await Promise.all([page.waitForURL(`${BASE}/runs/${slow.run_id}`), page.click("#cancel")]);
  const seen = await until("the peer to see the cancel", async () => (await peerStats()).slow_cancelled > before, 1000);
  figures.cancel_to_peer_ms = Date.now() - clicked;
  check((await page.textContent("#run-status")) === "cancelled", "the page shows cancelled");
  await page.waitForSelector("#run-fence");
  const fence = await page.textContent("#run-fence");
  await page.waitForSelector("#timeline li.final");
  check((await page.$("#cancel")) === null, "a cancelled run has no Cancel button");
  await save("run-cancelled");
  // serve's own histogram: from the cancel hub waking the run to its call returning.
  const metrics = await (await fetch(BASE + "/metrics", { headers: { authorization: `Bearer ${OPERATOR}` } })).text();
  const sum = metrics.match(/^runwarden_cancel_latency_seconds_sum (\S+)/m);
  const count = metrics.match(/^runwarden_cancel_latency_seconds_count (\S+)/m);
  check(sum && count && Number(count[1]) === 1, `serve observed one cancel: ${count && count[1]}`);
  figures.cancel_wake_to_return_ms = Number(sum[1]) * 1000;
  report({ ok: true, ms: figures.cancel_to_peer_ms, polled_ms: seen.ms, fence, wake_to_return_ms: figures.cancel_wake_to_return_ms });

  step = "approval";
  await page.goto(BASE + "/decisions");
  await page.waitForSelector("body[data-live=open]");
  await page.evaluate(() => { window.__sameDocument = true; });
  const ticket = await api("POST", "/v1/runs", { agent: "ticket", prompt: "file a ticket" });
  const card = `article.decision[data-kind=approval]:has(a[href="/runs/${ticket.run_id}"])`;
  // The queue is live: the decision appears without a reload once the worker parks the run.
  await page.waitForSelector(card);
  check(await page.evaluate(() => window.__sameDocument === true), "the queue grew without a reload");
  check((await runStatus(ticket.run_id)) === "waiting_for_approval", "the run waits");
  check((await page.textContent(`${card} pre.arguments`)).includes("printer on fire"), "the arguments are shown");
  check((await peerStats()).create_ticket_calls === 0, "nothing was sent before the approval");
  await save("decisions");
  await Promise.all([page.waitForURL(BASE + "/decisions"), page.click(`${card} button.answer-approve`)]);
  await until("the run to complete", async () => (await runStatus(ticket.run_id)) === "completed");
  const calls = (await peerStats()).create_ticket_calls;
  check(calls === 1, `the peer ran create_ticket ${calls} times`);
  report({ ok: true, run: ticket.run_id, create_ticket_calls: calls });

  step = "hostile_result";
  const hostile = await api("POST", "/v1/runs", { agent: "hostile", prompt: "echo it" });
  await until("the hostile run to complete", async () => (await runStatus(hostile.run_id)) === "completed");
  await page.goto(`${BASE}/runs/${hostile.run_id}`);
  await page.waitForSelector('#timeline li[data-kind="tool_executed"]');
  const shown = await page.locator("#timeline pre.payload", { hasText: "<script>window.__pwned=1</script>" }).count();
  check(shown >= 1, "the hostile text is shown as text");
  check((await page.evaluate(() => window.__pwned)) === undefined, "no script of the result ran");
  check((await page.$$("#timeline script, #timeline img")).length === 0, "no element came from the result");
  await save("run-hostile");
  report({ ok: true, shown });

  step = "audit_mcp_metrics";
  await page.goto(BASE + "/audit?verify=1");
  await page.waitForSelector("#verify.intact");
  await save("audit");
  await page.goto(BASE + "/mcp");
  await page.waitForSelector('article.server[data-server="peer"] table.tools td');
  await save("mcp");
  await page.goto(BASE + "/charts");
  await page.waitForSelector("svg#cancel-histogram rect", { state: "attached" });
  const caption = await page.textContent("figure.chart figcaption");
  check(!caption.startsWith("0 "), `the histogram holds the console's cancel: ${caption}`);
  await save("charts");
  report({ ok: true, caption });

  step = "forged_post";
  const other = await api("POST", "/v1/runs", { agent: "ticket", prompt: "another ticket" });
  await until("the run to park", async () => (await runStatus(other.run_id)) === "waiting_for_approval");
  const forged = await page.evaluate(async (id) => {
    const r = await fetch(`/console/runs/${id}/cancel`, { method: "POST" });
    return { status: r.status, text: await r.text() };
  }, other.run_id);
  check(forged.status === 403 && forged.text.includes("CSRF"), `an operator's POST without the token: ${forged.status}`);
  check((await runStatus(other.run_id)) === "waiting_for_approval", "the forged cancel changed nothing");
  report({ ok: true, status: forged.status });

  step = "viewer";
  await Promise.all([page.waitForURL(BASE + "/"), page.click("form.signout button")]);
  await page.goto(BASE + "/runs");
  check((await page.textContent("h1")).startsWith("401"), "signed out: the runs page wants a sign-in");
  await page.goto(BASE + "/");
  await page.fill("#token", VIEWER);
  await Promise.all([page.waitForURL(BASE + "/runs"), page.click("section.signin button[type=submit]")]);
  for (const where of [`/runs/${other.run_id}`, "/decisions", "/runs"]) {
    await page.goto(BASE + where);
    const buttons = await page.$$eval("main button, main form[method=post]", (els) => els.map((e) => e.outerHTML));
    const actions = buttons.filter((b) => !b.includes("Filter") && !b.includes("Verify"));
    check(actions.length === 0, `a viewer sees no buttons on ${where}: ${actions}`);
  }
  await page.goto(`${BASE}/runs/${other.run_id}`);
  await save("viewer-run");
  const csrf = await page.getAttribute("form.signout input[name=csrf]", "value");
  const refused = await page.evaluate(async ({ id, csrf }) => {
    const r = await fetch(`/console/runs/${id}/cancel`, {
      method: "POST",
      headers: { "x-csrf-token": csrf },
    });
    return r.status;
  }, { id: other.run_id, csrf });
  check(refused === 403, `a viewer's POST with a good CSRF token: ${refused}`);
  const noToken = await page.evaluate(async (id) => (await fetch(`/console/runs/${id}/cancel`, { method: "POST" })).status, other.run_id);
  check(noToken === 403, `a viewer's POST without the token: ${noToken}`);
  check((await runStatus(other.run_id)) === "waiting_for_approval", "the viewer changed nothing");
  report({ ok: true });

  step = "csp";
  const blocked = violations.filter((v) => v.includes("Content Security Policy") || v.includes("Refused to"));
  check(blocked.length === 0, `the CSP blocked something of ours: ${blocked}`);
  report({ ok: true });

  step = "done";
  report({ ok: true, figures });
} catch (error) {
  console.log(JSON.stringify({ step, ok: false, error: String(error && error.stack ? error.stack : error) }));
  try { await save(`failed-${step}`); } catch {}
  process.exitCode = 1;
} finally {
  await context.close();
  fs.rmSync(userData, { recursive: true, force: true });
}
