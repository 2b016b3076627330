"""A real MCP server written with the SDK's server side, for perdure's MCP tests.

``python shop_server.py`` serves over stdio; ``python shop_server.py http PORT`` over
streamable HTTP on 127.0.0.1. Every real effect is one line of the JSON-lines ledger
named by ``SHOP_LEDGER`` (tool, the ``perdure/idempotency-key`` of the request's
``_meta``, arguments, this process's pid), so a test can count what really happened.

Tools, one per row of the policy table (annotations as the spec spells them):

* ``lookup``  read-only
* ``book``    idempotent, not destructive: deduplicates by the request's key
* ``delete``  destructive (the spec's default), not idempotent
* ``append``  not destructive, not idempotent
* ``plain``   no annotations at all (the spec's defaults: destructive, not idempotent)

and tools to misbehave with: ``slow`` (read-only, sleeps; a cancellation is noted in
the ledger), ``hold`` (not read-only: notes its start, then waits to be killed),
``fail`` (an ``isError`` result), ``media`` (image + structured content), ``big``
(a long result), ``garble`` (writes garbage on the protocol stream).
``SHOP_BROKEN_SCHEMA=1`` adds ``broken``, whose input schema is not valid JSON Schema;
``SHOP_VARIANT=changed`` changes ``lookup``'s description, ``SHOP_VARIANT=gone`` removes it.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import CallToolResult, ImageContent, TextContent, ToolAnnotations

shop = MCPServer("shop")
KEY = "perdure/idempotency-key"


def _key(ctx: Context) -> str | None:
    meta = ctx.request_context.meta or {}
    value = meta.get(KEY)
    return value if isinstance(value, str) else None


def _ledger() -> list[dict[str, Any]]:
    path = os.environ["SHOP_LEDGER"]
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _note(tool: str, ctx: Context, **data: Any) -> None:
    line = json.dumps({"tool": tool, "key": _key(ctx), "pid": os.getpid(), **data})
    with open(os.environ["SHOP_LEDGER"], "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


lookup_hints = ToolAnnotations(read_only_hint=True)


@shop.tool(annotations=lookup_hints)
def lookup(city: str, ctx: Context) -> str:
    """The weather in a city."""
    _note("lookup", ctx, city=city)
    return f"{city}: sunny"


@shop.tool(annotations=ToolAnnotations(idempotent_hint=True, destructive_hint=False))
def book(room: str, ctx: Context) -> str:
    """Book a room; a repeated request (same idempotency key) books nothing more."""
    key = _key(ctx)
    for entry in _ledger():
        if entry["tool"] == "book" and key is not None and entry["key"] == key:
            return f"booked {entry['room']} (already, booking {entry['booking']})"
    booking = f"B{len(_ledger()) + 1}"
    _note("book", ctx, room=room, booking=booking)
    return f"booked {room} (booking {booking})"


@shop.tool()
def delete(item: str, ctx: Context) -> str:
    """Delete an item for good."""
    _note("delete", ctx, item=item)
    return f"deleted {item}"


@shop.tool(annotations=ToolAnnotations(destructive_hint=False))
def append(line: str, ctx: Context) -> str:
    """Append a line to the journal."""
    _note("append", ctx, line=line)
    return f"appended {line}"


@shop.tool()
def plain(note: str, ctx: Context) -> str:
    """A tool without annotations."""
    _note("plain", ctx, note=note)
    return f"plain {note}"


@shop.tool(annotations=ToolAnnotations(read_only_hint=True))
async def slow(seconds: float, ctx: Context) -> str:
    """Wait a while, then answer."""
    _note("slow.start", ctx, seconds=seconds)
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        _note("slow.cancelled", ctx)
        raise
    return f"waited {seconds}"


@shop.tool(annotations=ToolAnnotations(idempotent_hint=True, destructive_hint=False))
async def reserve(table: str, seconds: float, ctx: Context) -> str:
    """Reserve a table (deduplicated by the request's key), then take a while to confirm."""
    key = _key(ctx)
    for entry in _ledger():
        if entry["tool"] == "reserve" and key is not None and entry["key"] == key:
            return f"reserved {table} (already)"
    _note("reserve", ctx, table=table)
    await anyio.sleep(seconds)
    return f"reserved {table}"


@shop.tool(annotations=ToolAnnotations(destructive_hint=False))
async def hold(item: str, ctx: Context) -> str:
    """Start an effect, then hang (until this process is killed)."""
    _note("hold", ctx, item=item)
    await anyio.sleep(3600)
    return "held"


@shop.tool(annotations=ToolAnnotations(read_only_hint=True))
def fail(ctx: Context) -> CallToolResult:
    """Always fails, as a tool result."""
    return CallToolResult(content=[TextContent(type="text", text="no stock")], is_error=True)


@shop.tool(annotations=ToolAnnotations(read_only_hint=True))
def media(ctx: Context) -> CallToolResult:
    """An image and structured content."""
    pixel = base64.b64encode(b"\x89PNG" + b"\0" * 96).decode()
    return CallToolResult(
        content=[ImageContent(type="image", data=pixel, mime_type="image/png")],
        structured_content={"rooms": 3, "free": True},
    )


@shop.tool(annotations=ToolAnnotations(read_only_hint=True))
def big(n: int, ctx: Context) -> str:
    """A long text."""
    return "x" * n


@shop.tool(annotations=ToolAnnotations(destructive_hint=False))
async def garble(mode: str, ctx: Context) -> str:
    """Write garbage on the protocol stream instead of an answer (a broken server)."""
    from mcp.server import stdio as wire

    _note("garble", ctx, mode=mode)
    fd = wire._claims[1].private_fd  # the real stdout: the SDK keeps tools off it
    assert fd is not None
    if mode == "line":
        os.write(fd, b"this is not JSON-RPC\n")
    else:  # a response to this very request, of the wrong shape
        request_id = ctx.request_id
        bad = {"jsonrpc": "2.0", "id": request_id, "result": {"content": "not a list"}}
        os.write(fd, (json.dumps(bad) + "\n").encode())
    await anyio.sleep(3600)
    return "unreachable"


if os.environ.get("SHOP_BROKEN_SCHEMA") == "1":

    @shop.tool(annotations=ToolAnnotations(read_only_hint=True))
    def broken(x: int) -> str:
        """A tool whose advertised schema is not valid JSON Schema."""
        return str(x)

    # The SDK derives a valid schema from the signature; break it as a faulty server would.
    shop._tool_manager.get_tool("broken").parameters = {  # type: ignore[union-attr]
        "type": "object",
        "properties": {"x": {"type": 12}},
    }


# A newer version of the server: lookup's definition changed, or lookup is gone.
if os.environ.get("SHOP_VARIANT") == "changed":
    shop.remove_tool("lookup")
    shop.add_tool(
        lookup, description="The weather in a city, now in Celsius.", annotations=lookup_hints
    )
elif os.environ.get("SHOP_VARIANT") == "gone":
    shop.remove_tool("lookup")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "http":
        shop.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        shop.run("stdio")
