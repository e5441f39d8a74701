"""An MCP peer built with fastmcp, the most used Python MCP server framework (on the
official SDK pinned beside it in requirements.txt), for runwarden's interop tests.

    python fastmcp_server.py --port 0

Serves echo, add (a structured result) and slow (cancellable) over Streamable HTTP at
`/mcp`. Prints exactly one line `READY <port>` on stdout once the port accepts
connections. `GET /stats` answers the counters as JSON: every tools/call that reached the
server (`tool_calls`, known tool or not), calls per known tool, and how many slow calls
started, were cancelled (the client's disconnect reached the handler) or completed.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
from collections import Counter

import uvicorn
from fastmcp import FastMCP
from fastmcp.server.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse

STATS: dict = {
    "tool_calls": 0,
    "slow_started": 0,
    "slow_cancelled": 0,
    "slow_completed": 0,
    "calls": Counter(),
}


class CountToolCalls(Middleware):
    """Counts every tools/call before fastmcp looks the tool up, so a call of a tool it
    does not have is counted too."""

    async def on_call_tool(self, context, call_next):
        STATS["tool_calls"] += 1
        return await call_next(context)


def build() -> FastMCP:
    mcp = FastMCP("runwarden-fastmcp-peer", middleware=[CountToolCalls()])

    @mcp.tool
    def echo(text: str) -> str:
        """Return the text unchanged."""
        STATS["calls"]["echo"] += 1
        return text

    @mcp.tool
    def add(a: int, b: int) -> dict:
        """Add two integers; the result is structured."""
        STATS["calls"]["add"] += 1
        return {"sum": a + b}

    @mcp.tool
    async def slow(seconds: float) -> str:
        """Sleep for `seconds`; a cancel (or a closed connection) stops it."""
        STATS["calls"]["slow"] += 1
        STATS["slow_started"] += 1
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            STATS["slow_cancelled"] += 1
            raise
        STATS["slow_completed"] += 1
        return f"slept {seconds}s"

    @mcp.custom_route("/stats", methods=["GET"])
    async def stats(request: Request) -> JSONResponse:
        return JSONResponse({**STATS, "calls": dict(STATS["calls"])})

    return mcp


async def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args()
    app = build().http_app(path="/mcp")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit it: no 40 ms stall on a kept connection (see server.py).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind(("127.0.0.1", args.port))
    except OSError as e:
        print(f"fastmcp peer: cannot bind 127.0.0.1:{args.port}: {e}", file=sys.stderr)
        return 1
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on", timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    serve = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if serve.done():
            print(f"fastmcp peer: server failed to start on port {port}", file=sys.stderr)
            return 1
        await asyncio.sleep(0.01)
    print(f"READY {port}", flush=True)
    await serve
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
