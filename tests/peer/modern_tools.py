"""2026-07-28 peer tools for runwarden's MCP client tests (M19): the SDK serves the
stateless revision to a client that probes `server/discover` (and the 2025-11-25 session
protocol to one that sends `initialize`). Its own machinery is under test: `requestState`
is sealed and verified by the SDK, so a resumed call that changed a byte of it fails.

- `confirm_ship(item)` asks the client a question through a resolver; at 2026-07-28 that
  is an `input_required` result, answered by re-issuing the call. Counts its runs.
- `route(region, priority, query)` declares `x-mcp-header` on `region` and `priority`
  (the SDK checks the `Mcp-Param-*` headers against the arguments).
- `GET /modern-stats` answers the `mcp-*` headers of the last POST of each method, and
  how many `notifications/cancelled` messages arrived.

server.py calls `register(mcp)` and wraps the app with `wrap(app)`.
"""

from __future__ import annotations

import json
from typing import Annotated

from mcp.server.mcpserver import Elicit, MCPServer, Resolve
from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import JSONResponse

MODERN: dict = {
    "confirm_ship_runs": 0,
    "cancel_notifications": 0,
    "headers": {},
    "posts": 0,
}


class Confirm(BaseModel):
    confirmed: bool


def ask_confirm(item: str) -> Elicit[Confirm]:
    return Elicit(f"Ship {item}?", Confirm)


def register(mcp: MCPServer) -> None:
    @mcp.custom_route("/modern-stats", methods=["GET"])
    async def modern_stats(request: Request) -> JSONResponse:
        return JSONResponse(MODERN)

    @mcp.tool()
    def confirm_ship(item: str, answer: Annotated[Confirm, Resolve(ask_confirm)]) -> str:
        """Ship an item once the operator confirms it."""
        MODERN["confirm_ship_runs"] += 1
        return f"shipped {item}: confirmed={answer.confirmed}"

    @mcp.tool()
    def route(
        region: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})],
        priority: Annotated[int, Field(json_schema_extra={"x-mcp-header": "Priority"})],
        query: str,
    ) -> str:
        """Route a query to a region (the region and priority travel as headers too)."""
        return f"routed {query} to {region} at {priority}"


def wrap(app):
    """Records the `mcp-*` headers of every POST to /mcp, by JSON-RPC method."""

    async def recorded(scope, receive, send):
        if not (scope["type"] == "http" and scope["path"] == "/mcp" and scope["method"] == "POST"):
            return await app(scope, receive, send)
        chunks = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        try:
            method = json.loads(body).get("method", "")
        except ValueError:
            method = ""
        MODERN["posts"] += 1
        if method == "notifications/cancelled":
            MODERN["cancel_notifications"] += 1
        MODERN["headers"][method] = {
            k.decode(): v.decode()
            for k, v in scope["headers"]
            if k.decode().lower().startswith("mcp-")
        }
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await app(scope, replay, send)

    return recorded
