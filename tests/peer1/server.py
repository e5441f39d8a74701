"""An older MCP peer for runwarden's tests and benchmarks: the official Python SDK 1.x
(FastMCP), stateful Streamable HTTP with sessions, which speaks 2025-11-25 and older and
answers `server/discover` with an error, as the servers people still run do.

    python server.py --port 0 [--json-response]

Prints exactly one line `READY <port>` on stdout once the port accepts connections.
`GET /stats` answers the counters as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
from collections import Counter

import uvicorn
from mcp.server.fastmcp import FastMCP
from starlette.requests import Request
from starlette.responses import JSONResponse

STATS: dict = {"slow_started": 0, "slow_cancelled": 0, "slow_completed": 0, "calls": Counter()}


def build(json_response: bool) -> FastMCP:
    mcp = FastMCP("runwarden-peer1", json_response=json_response, log_level="WARNING")

    @mcp.tool()
    def echo(text: str) -> str:
        """Return the text unchanged."""
        STATS["calls"]["echo"] += 1
        return text

    @mcp.tool()
    def big(size: int) -> str:
        """A non-idempotent write whose answer is `size` bytes of text."""
        STATS["calls"]["big"] += 1
        return "x" * size

    @mcp.tool()
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
    p.add_argument("--json-response", action="store_true")
    args = p.parse_args()
    app = build(args.json_response).streamable_http_app()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit it: no 40 ms stall on a kept connection (see server.py).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind(("127.0.0.1", args.port))
    except OSError as e:
        print(f"peer1: cannot bind 127.0.0.1:{args.port}: {e}", file=sys.stderr)
        return 1
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on", timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    serve = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if serve.done():
            print(f"peer1: server failed to start on port {port}", file=sys.stderr)
            return 1
        await asyncio.sleep(0.01)
    print(f"READY {port}", flush=True)
    await serve
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
