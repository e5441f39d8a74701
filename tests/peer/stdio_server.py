"""A real local MCP server for runwarden's tests: the official Python SDK (mcp 2.x,
MCPServer) over stdio, started by runwarden itself.

    python stdio_server.py

What the tests cannot ask the server over MCP (did a handler see its cancel?) it appends,
one word per line, to the file named by `$PEER_EVENTS` when that is set.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

from mcp.server.mcpserver import Context, MCPServer

mcp = MCPServer("runwarden-stdio-peer", version="1.0.0", log_level="WARNING")
NOTES: list[str] = []


def _event(word: str) -> None:
    path = os.environ.get("PEER_EVENTS")
    if path:
        with open(path, "a", encoding="utf-8") as events:
            events.write(word + "\n")


@mcp.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@mcp.tool()
def add_note(text: str) -> str:
    """A non-idempotent write: every call adds a note."""
    NOTES.append(text)
    _event("note")
    return f"note {len(NOTES)}"


@mcp.tool()
async def slow(ctx: Context, seconds: float) -> str:
    """Report progress every 50 ms for `seconds` (cancellable), then say so."""
    _event("slow_started")
    try:
        steps = max(1, int(seconds / 0.05))
        for step in range(1, steps + 1):
            await ctx.report_progress(step, steps, f"step {step} of {steps}")
            await asyncio.sleep(0.05)
    except asyncio.CancelledError:
        _event("slow_cancelled")
        raise
    return f"slept {seconds}s"


@mcp.tool()
def stubborn(seconds: float, with_child: bool = False) -> str:
    """Ignores cancellation: blocks the whole server for `seconds`; with `with_child`,
    first starts a program of its own in a session of its own (as npx starts node)."""
    if with_child:
        subprocess.Popen(["sleep", "600"], start_new_session=True)
    _event("stubborn_started")
    time.sleep(seconds)
    return "done"


@mcp.tool()
def crash() -> str:
    """Exits the process in the middle of the call."""
    _event("crash")
    os._exit(3)


@mcp.tool()
def env() -> str:
    """The names of the environment variables this process sees, sorted, one per line."""
    return "\n".join(sorted(os.environ))


@mcp.tool()
def env_value(name: str) -> str:
    """One environment variable's value."""
    return os.environ.get(name, "(unset)")


@mcp.tool()
def shout(name: str) -> str:
    """Writes one environment variable's value to stderr (a leaky server)."""
    print(f"the value of {name} is {os.environ.get(name, '(unset)')}", file=sys.stderr, flush=True)
    return "shouted"


@mcp.tool()
def connect(host: str, port: int) -> str:
    """Opens a TCP connection directly (no proxy) and says how it went."""
    try:
        with socket.create_connection((host, port), timeout=3):
            return "connected"
    except OSError as e:
        return f"failed: {e.strerror or e}"


@mcp.tool()
def fetch(url: str) -> str:
    """GETs `url` the way most programs do: through $HTTP_PROXY when it is set."""
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return f"{answer.status} {answer.read().decode('utf-8', 'replace')}"
    except urllib.error.HTTPError as e:
        return f"{e.code} {e.read().decode('utf-8', 'replace')}"
    except OSError as e:
        return f"failed: {e}"


@mcp.tool()
async def hog(megabytes: int, seconds: float) -> str:
    """Holds `megabytes` of touched memory for `seconds`."""
    block = bytearray(megabytes * 1024 * 1024)
    for i in range(0, len(block), 4096):
        block[i] = 1
    await asyncio.sleep(seconds)
    return f"held {len(block)} bytes"


if __name__ == "__main__":
    print("stdio peer starting", file=sys.stderr, flush=True)
    _event(f"pid {os.getpid()}")
    mcp.run("stdio")
