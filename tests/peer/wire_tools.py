"""Wire-level peer tools for runwarden's MCP client tests (M13-M17): server requests in
the response stream (ping, sampling, roots, elicitation), progress and log notifications,
a stream closed early for resumption, and counters of what reached the wire (DELETEs,
User-Agent headers, tools/call POSTs).

server.py calls `register(mcp)`, passes `app_options(stateless)` to
`streamable_http_app` and wraps the app with `wrap(app)`. `GET /wire-stats` answers
the counters as JSON.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import warnings
from collections import Counter

from mcp import types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.streamable_http import EventCallback, EventMessage, EventStore
from mcp.shared.message import ServerMessageMetadata
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse

# Logging, sampling and roots are deprecated in the 2026-07-28 revision; this peer speaks
# 2025-11-25, where they are current.
warnings.filterwarnings("ignore", message=".*deprecated.*")

WIRE: dict = {
    "deletes": 0,
    "delete_statuses": Counter(),
    "user_agents": Counter(),
    "methods": Counter(),
    "get_resumptions": 0,
    "standalone_opened": 0,
    "standalone_closed": 0,
    "resumable_started": 0,
}


def _wire_json() -> dict:
    return {
        **WIRE,
        "delete_statuses": {str(k): v for k, v in WIRE["delete_statuses"].items()},
        "user_agents": dict(WIRE["user_agents"]),
        "methods": dict(WIRE["methods"]),
    }


class MemoryEventStore(EventStore):
    """Every event of every stream, in memory, so a client can resume with Last-Event-ID."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._events: list[tuple[str, str, types.JSONRPCMessage | None]] = []

    async def store_event(self, stream_id, message):
        event_id = str(next(self._ids))
        self._events.append((event_id, stream_id, message))
        return event_id

    async def replay_events_after(self, last_event_id, send_callback: EventCallback):
        stream = next((s for (e, s, _) in self._events if e == last_event_id), None)
        if stream is None:
            return None
        after = False
        for event_id, stream_id, message in self._events:
            if after and stream_id == stream and message is not None:
                await send_callback(EventMessage(message, event_id))
            if event_id == last_event_id:
                after = True
        return stream


def app_options(stateless: bool) -> dict:
    """Resumability (an event store and a 100 ms `retry`) for a stateful server."""
    if stateless:
        return {}
    return {"event_store": MemoryEventStore(), "retry_interval": 100}


def wrap(app):
    """Counts what reaches the wire before the SDK sees it."""

    async def counted(scope, receive, send):
        if scope["type"] == "http" and scope["path"] == "/mcp":
            headers = dict(scope["headers"])
            WIRE["user_agents"][headers.get(b"user-agent", b"").decode()] += 1
            WIRE["methods"][scope["method"]] += 1
            if scope["method"] == "GET" and b"last-event-id" in headers:
                WIRE["get_resumptions"] += 1
            elif scope["method"] == "GET":
                # The standalone stream: counted closed once the SDK is done with it,
                # which is when the client drops the connection.
                WIRE["standalone_opened"] += 1
                try:
                    return await app(scope, receive, send)
                finally:
                    WIRE["standalone_closed"] += 1
            if scope["method"] == "DELETE":
                WIRE["deletes"] += 1

                async def send_counted(message):
                    if message["type"] == "http.response.start":
                        WIRE["delete_statuses"][message["status"]] += 1
                    await send(message)

                return await app(scope, receive, send_counted)
        return await app(scope, receive, send)

    return counted


def _related(ctx: Context) -> ServerMessageMetadata:
    # Related to the tools/call, so the request travels in that call's response stream.
    return ServerMessageMetadata(related_request_id=ctx.request_id)


class Name(BaseModel):
    name: str


def register(mcp: MCPServer) -> None:
    @mcp.custom_route("/wire-stats", methods=["GET"])
    async def wire_stats(request: Request) -> JSONResponse:
        return JSONResponse(_wire_json())

    @mcp.tool()
    async def ping_client(ctx: Context) -> str:
        """Pings the client from inside the call and says how long the answer took."""
        started = time.monotonic()
        await ctx.session.send_request(types.PingRequest(), types.EmptyResult, metadata=_related(ctx))
        return f"pong in {int((time.monotonic() - started) * 1000)} ms"

    @mcp.tool()
    async def ask_sampling(ctx: Context) -> str:
        """Asks the client to sample; a client without the capability must refuse at once."""
        started = time.monotonic()
        try:
            await ctx.session.create_message(
                [types.SamplingMessage(role="user", content=types.TextContent(type="text", text="hi"))],
                max_tokens=5,
                related_request_id=ctx.request_id,
            )
            outcome = "sampled"
        except Exception as e:  # the refusal is the expected path
            outcome = f"refused ({type(e).__name__}: {e})"
        return f"{outcome} in {int((time.monotonic() - started) * 1000)} ms"

    @mcp.tool()
    async def ask_roots(ctx: Context) -> str:
        """Asks the client for its roots; a client without the capability must refuse at once."""
        started = time.monotonic()
        try:
            await ctx.session.send_request(
                types.ListRootsRequest(), types.ListRootsResult, metadata=_related(ctx)
            )
            outcome = "listed"
        except Exception as e:
            outcome = f"refused ({type(e).__name__}: {e})"
        return f"{outcome} in {int((time.monotonic() - started) * 1000)} ms"

    @mcp.tool()
    async def ask_name(ctx: Context) -> str:
        """Elicits a name (form mode) and says what came back."""
        result = await ctx.elicit("What name should the ticket carry?", Name)
        if result.action == "accept":
            return f"accepted: {result.data.name}"
        return result.action

    @mcp.tool()
    async def ask_name_on_get_stream(ctx: Context) -> str:
        """Elicits a name with no related request, so the SDK sends the question on the
        standalone GET stream (not in the call's response stream)."""
        result = await ctx.session.elicit_form(
            "What name should the ticket carry?",
            {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
            related_request_id=None,
        )
        if result.action == "accept":
            return f"accepted: {result.content['name']}"
        return result.action

    @mcp.tool()
    async def progress(ctx: Context, steps: int, delay: float) -> str:
        """Reports progress and logs a line per step, `delay` seconds apart."""
        for step in range(1, steps + 1):
            await ctx.report_progress(step, steps, f"step {step} of {steps}")
            await ctx.info(f"log line {step}")
            await asyncio.sleep(delay)
        return f"done after {steps} steps"

    @mcp.tool()
    async def resumable(ctx: Context, delay: float) -> str:
        """Sends progress, closes its own response stream (the client must resume with
        GET and Last-Event-ID), then answers after `delay` seconds."""
        WIRE["resumable_started"] += 1
        await ctx.report_progress(1, 2, "before the stream closed")
        await ctx.close_sse_stream()
        await asyncio.sleep(delay)
        await ctx.report_progress(2, 2, "after the stream closed")
        return f"resumed result #{WIRE['resumable_started']}"
