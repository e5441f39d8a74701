// The official TypeScript SDK's MCP client against runwarden's gateway (`serve` at /mcp):
// the same scenarios and the same findings (one JSON object per line on stdout) as
// gateway_client.py, so crates/runwarden/tests/peer/gateway.rs drives both alike.
//
//   node gateway_client.mjs URL SCENARIO [TOOL ARGUMENTS]
//
// GATEWAY_TOKEN is the bearer token; MCP_TS_SDK the SDK's package directory (the one
// scripts/conformance.sh installs with the everything server).

import { createInterface } from "node:readline";

const sdk = process.env.MCP_TS_SDK;
const { Client } = await import(`${sdk}/dist/esm/client/index.js`);
const { StreamableHTTPClientTransport } = await import(`${sdk}/dist/esm/client/streamableHttp.js`);
const { ElicitRequestSchema, CreateMessageRequestSchema } = await import(`${sdk}/dist/esm/types.js`);

const say = (finding) => console.log(JSON.stringify(finding));
const snake = (name) => name.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
const snakeKeys = (object) =>
  object ? Object.fromEntries(Object.entries(object).map(([k, v]) => [snake(k), v])) : null;

function outcome(result) {
  const text = result.content.filter((b) => b.type === "text").map((b) => b.text).join("\n");
  return { text, is_error: Boolean(result.isError), structured: result.structuredContent ?? null };
}

async function call(client, tool, args, options = {}) {
  try {
    say({ tool, ...outcome(await client.callTool({ name: tool, arguments: args }, undefined, options)) });
  } catch (error) {
    say({ tool, error_code: error.code ?? null, error: String(error.message ?? error) });
  }
}

const firstLine = () =>
  new Promise((resolve) => {
    const lines = createInterface({ input: process.stdin });
    lines.once("line", (line) => {
      lines.close();
      resolve(line);
    });
  });

const scenarios = {
  async list(client) {
    const { tools } = await client.listTools();
    say({ tools: tools.map((t) => ({ name: t.name, annotations: snakeKeys(t.annotations) })) });
    await call(client, "peer__add", { a: 2, b: 3 });
    await call(client, "peer__echo", { text: "hello" });
  },
  async progress(client) {
    const seen = [];
    const onprogress = (p) =>
      seen.push({ progress: p.progress, total: p.total ?? null, message: p.message ?? null });
    await call(client, "peer__progress", { steps: 3, delay: 0.05 }, { onprogress });
    say({ progress: seen });
  },
  async wait(client) {
    say({ calling: "peer__slow" });
    await call(client, "peer__slow", { seconds: 60 });
    await call(client, "peer__add", { a: 1, b: 1 });
  },
  async cancel(client) {
    const abort = new AbortController();
    const pending = call(client, "peer__slow", { seconds: 60 }, { signal: abort.signal });
    say({ calling: "peer__slow" });
    await firstLine();
    abort.abort("the test cancels it");
    await pending;
    say({ cancelled: "peer__slow" });
    await call(client, "peer__add", { a: 20, b: 22 });
  },
  async sample(client) {
    await call(client, "peer__ask_sampling", {});
    say({ sampled });
  },
  async ask(client) {
    await call(client, "peer__ask_name", {});
    say({ questions });
  },
  async call(client) {
    await call(client, process.argv[4], JSON.parse(process.argv[5]));
  },
};

const [url, scenario] = process.argv.slice(2);
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${process.env.GATEWAY_TOKEN}` } },
});
const questions = [];
const sampled = [];
const capabilities = { ask: { elicitation: {} }, sample: { sampling: {} } }[scenario] ?? {};
const client = new Client({ name: "runwarden-gateway-test", version: "1" }, { capabilities });
if (scenario === "sample") {
  client.setRequestHandler(CreateMessageRequestSchema, async (request) => {
    sampled.push(request.params.messages[0].content.text);
    return { role: "assistant", content: { type: "text", text: "hello" }, model: "gateway-test" };
  });
}
if (scenario === "ask") {
  client.setRequestHandler(ElicitRequestSchema, async (request) => {
    questions.push(request.params.message);
    return { action: "accept", content: { name: "Ada" } };
  });
}
try {
  await client.connect(transport);
  say({ version: transport.protocolVersion ?? null, server: client.getServerVersion()?.name ?? null });
  await scenarios[scenario](client);
  await transport.terminateSession();
  await client.close();
} catch (error) {
  say({ session_error_code: error.code ?? null, session_error: String(error.message ?? error) });
}
process.exit(0);
