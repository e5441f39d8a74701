"""Shape peer tools for runwarden's MCP client tests (M7 and M8 amended): a pydantic
nested model (its input schema has `$defs` and `$ref`, a `Literal`, bounds and a
pattern), a typed result (`outputSchema` plus `structuredContent`), a result that breaks
the output schema it declares, and a tool that only runs as a task
(`execution.taskSupport = "required"`).

server.py calls `register(mcp)`.
"""

from __future__ import annotations

from typing import Literal

from mcp import types
from mcp.server.mcpserver import MCPServer
from pydantic import BaseModel, Field


class Address(BaseModel):
    street: str
    zip: str = Field(pattern=r"^[0-9]{5}$")


class Order(BaseModel):
    item: Literal["book", "pen"]
    quantity: int = Field(ge=1, le=10)
    ship_to: Address
    gift_wrap: Address | None = None


class Weather(BaseModel):
    city: str
    celsius: float


def register(mcp: MCPServer) -> None:
    @mcp.tool()
    def place_order(order: Order) -> str:
        """Place an order (a nested pydantic model as the argument)."""
        return f"{order.quantity} x {order.item} to {order.ship_to.street} {order.ship_to.zip}"

    @mcp.tool()
    def weather(city: str) -> Weather:
        """The weather as a typed result: outputSchema and structuredContent."""
        return Weather(city=city, celsius=21.5)

    @mcp.tool()
    def bad_weather(city: str) -> types.CallToolResult:
        """Declares Weather as its outputSchema (below) but answers something else."""
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=f"{city}: warm")],
            structured_content={"city": city, "celsius": "warm"},
        )

    @mcp.tool()
    def long_job(seconds: int) -> str:
        """Only runs as a task (execution.taskSupport = "required", set below)."""
        return f"ran {seconds}s"

    listed = mcp.list_tools

    async def list_tools() -> list[types.Tool]:
        tools = await listed()
        for tool in tools:
            if tool.name == "bad_weather":
                tool.output_schema = Weather.model_json_schema()
            if tool.name == "long_job":
                tool.execution = types.ToolExecution(task_support="required")
        return tools

    mcp.list_tools = list_tools
