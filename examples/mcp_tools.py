"""An MCP server's tools through perdure: killed in the middle of a call, and recovered.

This file is three programs:

* ``python examples/mcp_tools.py server`` — a small hotel MCP server written with the
  official SDK (stdio): ``find_room`` is read-only, ``book_room`` is idempotent and
  deduplicates by the ``perdure/idempotency-key`` of the request's ``_meta``,
  ``cancel_booking`` is destructive. Its state is the JSON file ``HOTEL_STORE``.
* ``python examples/mcp_tools.py agent WORKDIR`` — an agent (a scripted model, so it
  runs offline) that finds a room, books it, then cancels an old booking, with the
  hotel server connected through ``open_runtime(..., mcp_servers=[...])`` and its
  annotations trusted.
* ``python examples/mcp_tools.py`` — runs the agent with ``PERDURE_FAULT`` so it is
  SIGKILLed right after the server booked the room and before perdure recorded it,
  then runs it again on the same log. Recovery re-runs the booking with the same key
  (KEYED, from ``idempotentHint``), the server recognises it, and exactly one booking
  exists. The cancellation (destructive) waits for approval; the agent approves it.

Needs ``pip install 'perdure[mcp]'``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

# The server's tools are annotated with Context: the SDK resolves it at module level.
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

HERE = Path(__file__).resolve()
KEY = "perdure/idempotency-key"


# -- the MCP server ------------------------------------------------------------------------


def serve() -> None:
    hotel = MCPServer("hotel")
    store = Path(os.environ["HOTEL_STORE"])

    def load() -> dict[str, Any]:
        return json.loads(store.read_text()) if store.exists() else {"bookings": {}}

    def save(data: dict[str, Any]) -> None:
        tmp = store.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(store)

    @hotel.tool(annotations=ToolAnnotations(read_only_hint=True))
    def find_room(city: str) -> str:
        """Find a free room in a city."""
        return f"room 12 is free in {city}"

    @hotel.tool(annotations=ToolAnnotations(idempotent_hint=True, destructive_hint=False))
    def book_room(room: str, guest: str, ctx: Context) -> str:
        """Book a room; the same request (same idempotency key) books it only once."""
        data = load()
        key = (ctx.request_context.meta or {}).get(KEY) or f"no-key-{len(data['bookings'])}"
        if key in data["bookings"]:
            return f"already booked: {data['bookings'][key]['id']}"
        booking = {"id": f"BK-{len(data['bookings']) + 1}", "room": room, "guest": guest}
        data["bookings"][key] = booking
        save(data)
        return f"booked: {booking['id']}"

    @hotel.tool(annotations=ToolAnnotations(destructive_hint=True))
    def cancel_booking(booking_id: str) -> str:
        """Cancel a booking for good."""
        data = load()
        data.setdefault("cancelled", []).append(booking_id)
        save(data)
        return f"cancelled {booking_id}"

    hotel.run("stdio")


# -- the agent -------------------------------------------------------------------------------


async def agent(work: Path) -> None:
    import trio

    import perdure
    from perdure.providers import Reply, ScriptedProvider, ToolUse
    from perdure.tools.mcp import McpServer

    hotel = McpServer.stdio(
        "hotel",
        sys.executable,
        [str(HERE), "server"],
        env={"HOTEL_STORE": str(work / "hotel.json")},
        trust_annotations=True,
    )
    provider = ScriptedProvider(
        [
            Reply(tool_uses=[ToolUse("hotel__find_room", {"city": "Lisbon"})]),
            Reply(tool_uses=[ToolUse("hotel__book_room", {"room": "12", "guest": "Ada"})]),
            Reply(tool_uses=[ToolUse("hotel__cancel_booking", {"booking_id": "BK-0"})]),
            Reply(text="Room 12 in Lisbon is booked for Ada; the old booking is cancelled."),
        ]
    )
    async with perdure.open_runtime(work / "log", provider=provider, mcp_servers=[hotel]) as rt:
        if rt.recovered_sessions:
            print(f"recovered unfinished work in: {rt.recovered_sessions}")
        await rt.create_session("trip")
        await rt.submit("trip", "Book me a room in Lisbon.", request_id="trip-1")
        async for event in rt.events("trip"):  # the history so far, then live
            record = event.record
            kind = type(record).__name__
            if kind == "RecoveryDecision":
                print(f"recovery: {record.subject}: {record.action} ({record.reason})")
            elif kind == "ToolExecuting":
                print(f"calling {record.tool_name} [{record.replay}: {record.policy_reason}]")
            elif kind == "ToolAwaitingApproval":
                print(f"{record.call_id} needs approval: approving")
                await rt.approve("trip", record.call_id, approved=True)
            elif kind in ("ToolCompleted", "ToolOutcomeUnknown"):
                print(f"  -> {record.output}")
            elif kind == "RunFinished":
                print(f"run {record.status}: {record.final_text}")
                if record.status != "interrupted":  # an interrupted run is continued
                    break
        with trio.fail_after(30):
            await rt.wait_idle("trip")


# -- the demonstration -------------------------------------------------------------------------


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="perdure-mcp-"))
    env = {k: v for k, v in os.environ.items() if k != "PERDURE_FAULT"}
    print("== run 1: killed after the hotel booked the room, before perdure recorded it")
    crashed = subprocess.run(
        [sys.executable, str(HERE), "agent", str(work)],
        env={**env, "PERDURE_FAULT": "tool.after:hotel__book_room"},
        timeout=120,
    )
    print(f"(exit status {crashed.returncode})")
    print("== run 2: the same command, on the same log")
    done = subprocess.run([sys.executable, str(HERE), "agent", str(work)], env=env, timeout=120)
    store = json.loads((work / "hotel.json").read_text())
    summary = {
        "ok": crashed.returncode == -9 and done.returncode == 0,
        "bookings": len(store["bookings"]),
        "cancelled": store.get("cancelled", []),
        "workdir": str(work),
    }
    print(f"the hotel holds {summary['bookings']} booking(s)")
    print(json.dumps(summary))
    return 0 if summary["ok"] and summary["bookings"] == 1 else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["server"]:
        serve()
    elif sys.argv[1:2] == ["agent"]:
        import trio

        trio.run(agent, Path(sys.argv[2]))
    else:
        raise SystemExit(main())
