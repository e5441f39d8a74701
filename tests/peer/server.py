"""A real MCP peer for runwarden's tests: the official Python SDK (mcp 2.x, MCPServer)
serving a small tool set over Streamable HTTP on 127.0.0.1.

    python server.py --port 0 [--stateless] [--json-response]

Prints exactly one line `READY <port>` on stdout once the port accepts connections;
everything else goes to stderr (warning level). Endpoint: POST/GET/DELETE /mcp.
`GET /stats` answers the counters as JSON without an MCP session.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import socket
import sys
from collections import Counter

import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, CancelledNotificationParams, TextContent
from starlette.requests import Request
from starlette.responses import JSONResponse

import modern_tools
import shape_tools
import wire_tools

STATS: dict = {
    "slow_started": 0,
    "slow_cancelled": 0,
    "slow_completed": 0,
    "cancel_notifications": 0,
    "create_ticket_calls": 0,
    "occupy_in_flight": 0,
    "occupy_most_in_flight": 0,
    "calls": Counter(),
}

mcp = MCPServer("runwarden-peer", version="1.0.0", log_level="WARNING")


def _count(tool: str) -> None:
    STATS["calls"][tool] += 1


def _stats_json() -> dict:
    return {**STATS, "calls": dict(STATS["calls"])}


@mcp.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    _count("echo")
    return text


@mcp.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    _count("add")
    return a + b


@mcp.tool()
def fail(message: str) -> CallToolResult:
    """Always fails: a tools/call RESULT with isError true and the message as its text."""
    _count("fail")
    return CallToolResult(content=[TextContent(type="text", text=message)], is_error=True)


@mcp.tool()
async def slow(seconds: float) -> str:
    """Sleep for `seconds` (cancellable by notifications/cancelled), then say so."""
    _count("slow")
    STATS["slow_started"] += 1
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        STATS["slow_cancelled"] += 1
        raise
    STATS["slow_completed"] += 1
    return f"slept {seconds}s"


@mcp.tool()
async def occupy(seconds: float) -> str:
    """Hold a call open for `seconds`, counting how many are open at once (the most is
    `occupy_most_in_flight` in the stats)."""
    _count("occupy")
    STATS["occupy_in_flight"] += 1
    STATS["occupy_most_in_flight"] = max(STATS["occupy_most_in_flight"], STATS["occupy_in_flight"])
    try:
        await asyncio.sleep(seconds)
    finally:
        STATS["occupy_in_flight"] -= 1
    return f"occupied {seconds}s"


@mcp.tool()
def create_ticket(title: str) -> str:
    """A non-idempotent write: every call creates a new ticket."""
    _count("create_ticket")
    STATS["create_ticket_calls"] += 1
    return f"ticket-{STATS['create_ticket_calls']}"


@mcp.tool()
def write_file(path: str, content: str) -> str:
    """A write to a path (nothing is written): for rules on a call's arguments."""
    _count("write_file")
    return f"wrote {len(content)} bytes to {path}"


@mcp.tool()
def pay(amount: int, to: str) -> str:
    """A payment (nothing is paid): for rules on an amount."""
    _count("pay")
    return f"paid {amount} to {to}"


@mcp.tool()
def stats() -> str:
    """The server's counters as JSON text."""
    _count("stats")
    return json.dumps(_stats_json(), sort_keys=True)


@mcp.tool()
def big(size: int) -> str:
    """A non-idempotent write whose answer is `size` bytes of text (a large answer)."""
    _count("big")
    return "x" * size


@mcp.tool(name="files.read")
def files_read(path: str) -> str:
    """A tool whose remote name has a dot (exercises local-name sanitising)."""
    _count("files.read")
    return f"contents of {path}"


@mcp.custom_route("/stats", methods=["GET"])
async def stats_route(request: Request) -> JSONResponse:
    return JSONResponse(_stats_json())


async def _on_cancelled(ctx, params: CancelledNotificationParams) -> None:
    # Runs after the SDK's dispatcher has already cancelled the in-flight request's
    # scope (it intercepts notifications/cancelled first, then tees it here).
    STATS["cancel_notifications"] += 1


wire_tools.register(mcp)
shape_tools.register(mcp)
modern_tools.register(mcp)

mcp._lowlevel_server.add_notification_handler(
    "notifications/cancelled", CancelledNotificationParams, _on_cancelled
)


async def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=0, help="0 = pick a free port")
    p.add_argument("--stateless", action="store_true", help="no Mcp-Session-Id")
    p.add_argument("--json-response", action="store_true", help="application/json instead of SSE")
    args = p.parse_args()

    app = mcp.streamable_http_app(
        stateless_http=args.stateless,
        json_response=args.json_response,
        **wire_tools.app_options(args.stateless),
    )
    app = wire_tools.wrap(modern_tools.wrap(app))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit it: uvicorn writes an answer's head and body apart, and
    # with Nagle on, a client that keeps its connection waits out its delayed ACK (40 ms).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind(("127.0.0.1", args.port))
    except OSError as e:
        print(f"peer: cannot bind 127.0.0.1:{args.port}: {e}", file=sys.stderr)
        return 1
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="on", timeout_graceful_shutdown=1
    )
    server = uvicorn.Server(config)
    serve = asyncio.create_task(server.serve(sockets=[sock]))
    # `started` is set once the lifespan (the SDK's session manager) is up and the
    # socket is listening, so READY is only printed when a request can be served.
    while not server.started:
        if serve.done():
            print(f"peer: server failed to start on port {port}", file=sys.stderr)
            return 1
        await asyncio.sleep(0.01)
    print(f"READY {port}", flush=True)
    await serve
    return 0


if __name__ == "__main__":
    logging.getLogger().setLevel(logging.WARNING)
    sys.exit(asyncio.run(main()))
