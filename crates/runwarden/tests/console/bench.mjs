// The console benchmark's browser side (benches/console.rs starts serve and this script):
// the runs page's weight (bytes on the wire for the document, its script and stylesheet,
// cache empty), its time to first render in headless chromium, and with 200 run status
// changes a second made through the API, whether the page stays live (rows updates, the
// longest gap between two, how soon the newest run shows) and serve's CPU, against the
// same churn with no console open. Prints one JSON line.
//
// RW_BASE, RW_OPERATOR, RW_SERVE_PID, RUNWARDEN_BROWSER_DIR; RW_SECONDS (default 5).
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
const PID = env("RW_SERVE_PID");
const SECONDS = Number(process.env.RW_SECONDS || "5");
const RATE = 200; // status changes a second: each run is created (queued) and cancelled
const { chromium } = await import(
  path.join(env("RUNWARDEN_BROWSER_DIR"), "node_modules/playwright-core/index.mjs")
);

// User plus system CPU seconds of serve so far (USER_HZ is 100 on Linux).
function cpu() {
  const stat = fs.readFileSync(`/proc/${PID}/stat`, "utf8");
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return (Number(fields[11]) + Number(fields[12])) / 100;
}

async function api(method, pathname, body) {
  const r = await fetch(BASE + pathname, {
    method,
    headers: { authorization: `Bearer ${OPERATOR}`, "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!r.ok) throw new Error(`${method} ${pathname}: ${r.status} ${await r.text()}`);
  return r.json();
}

// RATE status changes a second for SECONDS: a run created then cancelled, paced so the
// changes are spread evenly. Answers the id of the last run and the rate reached.
async function churn() {
  const started = performance.now();
  let changes = 0;
  let last = null;
  while (performance.now() - started < SECONDS * 1000) {
    const due = started + (changes / RATE) * 1000;
    const wait = due - performance.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    const run = await api("POST", "/v1/runs", { agent: "a", prompt: "churn" });
    await api("POST", `/v1/runs/${run.run_id}/cancel`);
    changes += 2;
    last = { id: run.run_id, at: performance.now() };
  }
  const elapsed = (performance.now() - started) / 1000;
  return { last, rate: changes / elapsed, elapsed };
}

async function measuredChurn() {
  const before = cpu();
  const t0 = performance.now();
  const result = await churn();
  const cores = (cpu() - before) / ((performance.now() - t0) / 1000);
  return { ...result, cores };
}

const userData = fs.mkdtempSync(path.join(os.tmpdir(), "rw-console-bench-"));
const context = await chromium.launchPersistentContext(userData, {
  executablePath: "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run"],
});
try {
  const page = context.pages()[0] ?? (await context.newPage());
  page.setDefaultTimeout(15_000);
  await page.goto(BASE + "/");
  await page.fill("#token", OPERATOR);
  await Promise.all([page.waitForURL(BASE + "/runs"), page.click("section.signin button[type=submit]")]);
  // 50 runs on the first page, so its weight is that of a full page.
  for (let i = 0; i < 50; i++) await api("POST", "/v1/runs", { agent: "a", prompt: "fill" });

  // Page weight and first render, cache empty (a fresh CDP session disables the cache).
  const cdp = await context.newCDPSession(page);
  await cdp.send("Network.enable");
  await cdp.send("Network.setCacheDisabled", { cacheDisabled: true });
  const sizes = new Map();
  cdp.on("Network.responseReceived", (e) => sizes.set(e.requestId, { url: e.response.url, bytes: 0 }));
  cdp.on("Network.loadingFinished", (e) => {
    const entry = sizes.get(e.requestId);
    if (entry) entry.bytes = e.encodedDataLength;
  });
  const renders = [];
  for (let i = 0; i < 5; i++) {
    sizes.clear();
    await page.goto(BASE + "/runs", { waitUntil: "load" });
    const fcp = await page.evaluate(() => {
      const paint = performance.getEntriesByName("first-contentful-paint")[0];
      return paint ? paint.startTime : null;
    });
    renders.push(fcp);
  }
  const files = [...sizes.values()].filter((s) => !s.url.includes("/console/stream/"));
  const weight = files.reduce((n, s) => n + s.bytes, 0);
  const documentBytes = files.find((s) => s.url.endsWith("/runs"))?.bytes ?? 0;
  await cdp.detach();

  // Baseline: the same churn with no console page open.
  await page.goto("about:blank");
  const baseline = await measuredChurn();

  // The runs page open and live during the churn.
  await page.goto(BASE + "/runs");
  await page.waitForSelector("body[data-live=open]");
  await page.evaluate(() => {
    window.__updates = [];
    new MutationObserver(() => window.__updates.push(performance.now())).observe(
      document.getElementById("runs-rows"), { childList: true });
  });
  const live = await measuredChurn();
  const shown = Date.now();
  await page.waitForSelector(`tr[data-run="${live.last.id}"] .status-cancelled`);
  const newestShownMs = Date.now() - shown;
  const updates = await page.evaluate(() => window.__updates);
  const gaps = updates.slice(1).map((t, i) => t - updates[i]);
  renders.sort((a, b) => a - b);
  console.log(JSON.stringify({
    figure: "console",
    runs_page_bytes: weight,
    runs_document_bytes: documentBytes,
    files: files.map((f) => ({ url: f.url.replace(BASE, ""), bytes: f.bytes })),
    first_contentful_paint_ms: { p50: renders[2], max: renders[4] },
    churn_changes_per_second: { baseline: baseline.rate, live: live.rate },
    serve_cores: { baseline: baseline.cores, live: live.cores },
    rows_updates: updates.length,
    rows_updates_per_second: updates.length / live.elapsed,
    longest_gap_ms: gaps.length ? Math.max(...gaps) : null,
    newest_run_shown_after_churn_ms: newestShownMs,
  }));
} finally {
  await context.close();
  fs.rmSync(userData, { recursive: true, force: true });
}
