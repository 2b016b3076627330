"""Three tools in one model turn, a crash in the middle, and an honest recovery.

Run it (after ``pip install -e .``)::

    python examples/parallel_tools.py

The model's first turn calls three tools at once:

* ``lookup_availability`` (SAFE): a read-only lookup; it finishes first;
* ``book_room`` (KEYED): books a room on a small local booking service (started
  by this script) that deduplicates requests by their ``Idempotency-Key``; the
  service records the booking at once but is slow to answer;
* ``notify_guest`` (NEVER): appends a notification to a file.

The runtime runs in a child process with ``PERDURE_FAULT=tool.after:notify_guest``:
it dies (SIGKILL) right after the notification was written, before its result is
committed, while the booking is made but not yet confirmed to the runtime. A
second child opens the same log and recovers:

* the lookup's committed result is reused: it does not run again;
* the booking re-runs with the SAME idempotency key: the service answers with the
  booking it already made, so there is exactly one booking;
* the notification is not re-run: the model is told its outcome is unknown.

The script prints what happened, asserts it, and removes its temporary files.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import trio

import perdure
from perdure import ReplayPolicy, ToolContext, tool
from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse

FAULT = "tool.after:notify_guest"

# -- the booking service (runs in this, the parent, process) ------------------------------------


@contextmanager
def booking_service(store: Path, slow: float) -> Iterator[int]:
    """A local HTTP service that books rooms, once per Idempotency-Key; yields its port."""
    lock = threading.Lock()
    store.write_text(json.dumps({"bookings": {}, "requests": []}))

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            key = self.headers.get("Idempotency-Key", "")
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            with lock:
                data = json.loads(store.read_text())
                data["requests"].append(key)
                replayed = key in data["bookings"]
                if not replayed:
                    number = f"BK-{len(data['bookings']) + 1:04d}"
                    data["bookings"][key] = {"booking": number, "room": body["room"]}
                store.write_text(json.dumps(data))
                answer = {**data["bookings"][key], "replayed": replayed}
            if not replayed:
                time.sleep(slow)  # the booking is made; the confirmation is slow to come back
            payload = json.dumps(answer).encode()
            try:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the caller died while we were slow: it happens, see below

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


# -- the agent (runs in a child process) ------------------------------------------------------

WORKDIR = Path(".")  # set by the child
PORT = 0


@tool(replay=ReplayPolicy.SAFE)
async def lookup_availability(ctx: ToolContext, date: str) -> str:
    """Which rooms are free on a date."""
    with open(WORKDIR / "lookups.log", "a") as f:  # noqa: ASYNC230 (a tiny local write)
        f.write(f"{date}\n")
    return f"rooms free on {date}: 12, 14"


@tool(replay=ReplayPolicy.KEYED, timeout=20)
async def book_room(ctx: ToolContext, room: int, date: str) -> str:
    """Book a room; the booking service deduplicates by the idempotency key."""

    def post() -> dict[str, Any]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{PORT}/bookings",
            data=json.dumps({"room": room, "date": date}).encode(),
            headers={"Idempotency-Key": ctx.idempotency_key},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=15) as response:
            return json.load(response)  # type: ignore[no-any-return]

    answer = await trio.to_thread.run_sync(post)
    return f"booked room {answer['room']}: {answer['booking']}"


@tool(replay=ReplayPolicy.NEVER)
async def notify_guest(ctx: ToolContext, message: str) -> str:
    """Send the guest a notification (appended to the outbox)."""
    await trio.sleep(0.5)  # the lookup is done by now; the booking is in flight
    with open(WORKDIR / "outbox.txt", "a") as f:  # noqa: ASYNC230 (a tiny local write)
        f.write(message + "\n")
    return "notification sent"


SCRIPT = [
    Reply(
        text="Checking, booking and notifying at once.",
        tool_uses=[
            ToolUse("lookup_availability", {"date": "2025-06-01"}),
            ToolUse("book_room", {"room": 12, "date": "2025-06-01"}),
            ToolUse("notify_guest", {"message": "Room 12 is yours on June 1st."}),
        ],
    ),
    Reply(text="Room 12 is booked. I could not confirm that the guest was notified."),
]


async def agent() -> None:
    tools = [lookup_availability, book_room, notify_guest]
    provider = ScriptedProvider(SCRIPT)
    async with perdure.open_runtime(WORKDIR / "log", provider=provider, tools=tools) as rt:
        await rt.create_session("hotel")
        await rt.submit("hotel", "Book room 12 for June 1st and tell the guest.", request_id="r1")
        outcome = await rt.wait_idle("hotel")
        tasks = await rt.state("hotel", lambda s: s.task_views())
        decisions = await rt.state("hotel", lambda s: s.recovery_decisions())
    summary = {
        "outcome": outcome.status if outcome else None,
        "final_text": outcome.final_text if outcome else None,
        "tasks": {
            t.tool_name: {
                "phase": t.phase,
                "attempt": t.attempt,
                "key": t.executing.idempotency_key if t.executing else None,
                "output": getattr(t.result, "output", None),
            }
            for t in tasks
        },
        "decisions": [f"{d.subject}: {d.found} -> {d.action}" for d in decisions],
    }
    (WORKDIR / "summary.json").write_text(json.dumps(summary, indent=2))


# -- the demonstration (the parent) -------------------------------------------------------------


def run_child(workdir: Path, port: int, fault: str | None) -> int:
    env = dict(os.environ)
    env.pop("PERDURE_FAULT", None)
    if fault:
        env["PERDURE_FAULT"] = fault
    package_root = str(Path(perdure.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    command = [sys.executable, __file__, "--child", str(workdir), str(port)]
    return subprocess.run(command, env=env, timeout=60, check=False).returncode


def main() -> int:
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    with tempfile.TemporaryDirectory(prefix="perdure-parallel-") as tmp:
        workdir = Path(tmp)
        store = workdir / "bookings.json"
        with booking_service(store, slow=3.0) as port:
            print(f"1. run the agent; it will be killed at {FAULT}")
            code = run_child(workdir, port, FAULT)
            assert code == -signal.SIGKILL, f"the first run should have been killed, got {code}"
            before = json.loads(store.read_text())
            outbox = (workdir / "outbox.txt").read_text().splitlines()
            print(
                f"   killed (SIGKILL); bookings made: {len(before['bookings'])}, "
                f"notifications written: {len(outbox)}"
            )
            assert len(before["bookings"]) == 1, "the booking was made before the crash"
            assert len(outbox) == 1, "the notification happened before the crash"

            print("2. restart on the same log")
            code = run_child(workdir, port, None)
            assert code == 0, f"the recovery run failed with exit status {code}"
            after = json.loads(store.read_text())
            summary = json.loads((workdir / "summary.json").read_text())

        lookups = (workdir / "lookups.log").read_text().splitlines()
        outbox = (workdir / "outbox.txt").read_text().splitlines()
        tasks = summary["tasks"]
        print("   recovery decisions:")
        for line in summary["decisions"]:
            print(f"     - {line}")
        print("3. what happened to each call")
        for name, task in tasks.items():
            print(f"   {name}: {task['phase']}, attempt {task['attempt']}")
            print(f"     the model reads: {task['output']}")
        print(f"   run {summary['outcome']}: {summary['final_text']}")

        lookup, booking, notify = (
            tasks["lookup_availability"],
            tasks["book_room"],
            tasks["notify_guest"],
        )
        # completed calls are reused, never recomputed
        assert lookup["phase"] == "completed"
        assert lookup["attempt"] == 1
        assert len(lookups) == 1, "the lookup ran once"
        # the KEYED booking re-ran with the same key, and the service deduplicated it
        assert booking["phase"] == "completed"
        assert booking["attempt"] == 2
        assert after["requests"] == [booking["key"], booking["key"]], after["requests"]
        assert len(after["bookings"]) == 1, "exactly one booking"
        assert booking["output"] == "booked room 12: BK-0001"
        # the NEVER notification was not re-run, and the model is told the truth
        assert notify["phase"] == "outcome_unknown"
        assert "UNKNOWN" in notify["output"]
        assert len(outbox) == 1, "the notification was not sent twice"
        assert summary["outcome"] == "completed"
        print(
            "OK: the lookup was reused, the booking was re-run with the same key and made "
            "once, and the notification was reported as unknown, not repeated."
        )
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=2, metavar=("WORKDIR", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        WORKDIR, PORT = Path(args.child[0]), int(args.child[1])
        trio.run(agent)
        sys.exit(0)
    sys.exit(main())
