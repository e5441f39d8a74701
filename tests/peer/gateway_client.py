"""The official Python SDK's MCP client against runwarden's gateway (`serve` at /mcp).

Runs one scenario and prints one JSON object per finding on stdout; the Rust tests in
crates/runwarden/tests/peer/gateway.rs read them. The bearer token comes from
GATEWAY_TOKEN; GATEWAY_MODE is the SDK's connect mode (default `legacy`, the initialize
handshake; `auto` probes server/discover and takes the stateless 2026-07-28 revision).
Scenarios:

  list      list the tools, call peer__add and peer__echo
  progress  call peer__progress with a progress callback
  wait      call peer__slow for 60 s; print how it ended (an operator cancels it)
  cancel    call peer__slow for 60 s, cancel it when a line arrives on stdin, then call
            peer__add on the same session
  call T A  call tool T with the JSON arguments A
  ask       declare elicitation, call peer__ask_name, answer the server's question "Ada"
  sample    declare sampling, call peer__ask_sampling, answer its sampling request
"""

import json
import os
import sys

import anyio
import httpx2
import mcp_types
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError


def say(**finding) -> None:
    print(json.dumps(finding), flush=True)


def outcome(result) -> dict:
    texts = [block.text for block in result.content if getattr(block, "type", "") == "text"]
    return {"text": "\n".join(texts), "is_error": bool(result.is_error), "structured": result.structured_content}


async def call(client, tool: str, arguments: dict, **options) -> None:
    try:
        say(tool=tool, **outcome(await client.call_tool(tool, arguments, **options)))
    except MCPError as error:
        say(tool=tool, error_code=error.code, error=str(error))


async def listed(client) -> None:
    tools = (await client.list_tools()).tools
    say(tools=[{"name": t.name, "annotations": t.annotations.model_dump(exclude_none=True) if t.annotations else None} for t in tools])
    await call(client, "peer__add", {"a": 2, "b": 3})
    await call(client, "peer__echo", {"text": "hello"})


async def progress(client) -> None:
    seen = []

    async def on_progress(done, total, message):
        seen.append({"progress": done, "total": total, "message": message})

    await call(client, "peer__progress", {"steps": 3, "delay": 0.05}, progress_callback=on_progress)
    say(progress=seen)


async def wait(client) -> None:
    say(calling="peer__slow")
    await call(client, "peer__slow", {"seconds": 60})
    await call(client, "peer__add", {"a": 1, "b": 1})


async def cancel(client) -> None:
    async with anyio.create_task_group() as group:
        group.start_soon(call, client, "peer__slow", {"seconds": 60})
        say(calling="peer__slow")
        await anyio.to_thread.run_sync(sys.stdin.readline)
        group.cancel_scope.cancel()
    say(cancelled="peer__slow")
    await call(client, "peer__add", {"a": 20, "b": 22})


async def one(client) -> None:
    await call(client, sys.argv[3], json.loads(sys.argv[4]))


QUESTIONS = []


async def answer_question(context, params):
    QUESTIONS.append(params.message)
    return mcp_types.ElicitResult(action="accept", content={"name": "Ada"})


SAMPLED = []


async def answer_sampling(context, params):
    SAMPLED.append(params.messages[0].content.text)
    return mcp_types.CreateMessageResult(
        role="assistant", content=mcp_types.TextContent(type="text", text="hello"), model="gateway-test"
    )


async def sample(client) -> None:
    await call(client, "peer__ask_sampling", {})
    say(sampled=SAMPLED)


async def ask(client) -> None:
    await call(client, "peer__ask_name", {})
    say(questions=QUESTIONS)


SCENARIOS = {"list": listed, "progress": progress, "wait": wait, "cancel": cancel, "call": one, "ask": ask, "sample": sample}


async def main() -> int:
    url, scenario = sys.argv[1], sys.argv[2]
    headers = {"Authorization": f"Bearer {os.environ['GATEWAY_TOKEN']}"}
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120))
    try:
        options = {
            "ask": {"elicitation_callback": answer_question},
            "sample": {"sampling_callback": answer_sampling},
        }.get(scenario, {})
        async with Client(streamable_http_client(url, http_client=http), mode=os.environ.get("GATEWAY_MODE", "legacy"), **options) as client:
            say(version=client.protocol_version, server=client.server_info.name if client.server_info else None)
            await SCENARIOS[scenario](client)
    except* MCPError as group:
        error = group.exceptions[0]
        while isinstance(error, BaseExceptionGroup):  # the SDK's task groups nest them
            error = error.exceptions[0]
        say(session_error_code=error.code, session_error=str(error))
    return 0


if __name__ == "__main__":
    sys.exit(anyio.run(main))
