"""A client of ``perdure serve`` that lives through a daemon crash (``perdure.client``).

    python examples/daemon_client.py

It starts ``perdure serve`` (a scripted model, so no API key is needed, and the
two tools below), starts a task with ``PerdureClient``, follows the session's
event stream, SIGKILLs the daemon while a tool is running and starts it again on
the same log and port. The client's event iterator reconnects by itself with
``Last-Event-ID`` (no gap, no duplicate), and the restarted daemon finishes the
run by itself: the client sends no new request (re-sending the first one with
the same ``request_id`` just returns the same answer). Everything lives in a
temporary directory that is removed at the end.

The file is also the tools module the daemon loads (``--tools daemon_client:TOOLS``).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import trio

import perdure
from perdure import Accepted
from perdure.client import EphemeralEvent, PerdureClient, is_final

HERE = Path(__file__).resolve().parent
TASK = "Check the forecast for Paris and send the team a short report."


# -- the tools the daemon runs -------------------------------------------------------------


@perdure.tool(replay=perdure.ReplayPolicy.SAFE)
async def fetch_forecast(ctx: perdure.ToolContext, city: str) -> str:
    """Fetch the weather forecast for a city (read-only: safe to re-run)."""
    await trio.sleep(1.5)  # a slow service: the daemon will be killed meanwhile
    return f"{city}: sunny, 21°C"


@perdure.tool(replay=perdure.ReplayPolicy.NEVER)
async def send_report(ctx: perdure.ToolContext, to: str, text: str) -> str:
    """Send a report (an effect that must not happen twice)."""
    assert ctx.workspace is not None
    async with await trio.Path(ctx.workspace / "outbox.txt").open("a") as outbox:
        await outbox.write(f"to {to}: {text}\n")
    return f"sent to {to}"


TOOLS = [fetch_forecast, send_report]

SCRIPT = [
    {
        "text": "Let me check the forecast first.",
        "tool_uses": [{"name": "fetch_forecast", "input": {"city": "Paris"}}],
    },
    {
        "text": "Sending the report to the team.",
        "tool_uses": [
            {"name": "send_report", "input": {"to": "team", "text": "Paris: sunny, 21°C"}}
        ],
    },
    {"text": "Done: Paris will be sunny at 21°C, and the team has the report."},
]


# -- the daemon, as a child process ------------------------------------------------------------


class Daemon:
    def __init__(self, root: Path, token: str) -> None:
        self.root = root
        self.token = token
        self.port = 0
        self.url = ""
        self.proc: subprocess.Popen[str] | None = None
        (root / "workspace").mkdir(parents=True, exist_ok=True)
        (root / "script.json").write_text(json.dumps({"replies": SCRIPT}))

    def start(self) -> None:
        env = dict(os.environ, PERDURE_TOKEN=self.token)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(HERE.parent), str(HERE), env.get("PYTHONPATH", "")]
        )
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "perdure.cli",
                "serve",
                "--log",
                str(self.root / "log"),
                "--port",
                str(self.port),
                "--provider",
                f"scripted:{self.root / 'script.json'}",
                "--tools",
                "daemon_client:TOOLS",
                "--workspace",
                str(self.root / "workspace"),
            ],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        ready = threading.Event()
        threading.Thread(target=self._watch, args=(self.proc, ready), daemon=True).start()
        if not ready.wait(30) or not self.url:
            raise RuntimeError("perdure serve did not start")

    def _watch(self, proc: subprocess.Popen[str], ready: threading.Event) -> None:
        assert proc.stdout is not None
        with proc.stdout:
            for line in proc.stdout:
                print("   [daemon] " + line.rstrip())
                if "listening on " in line:
                    self.url = line.split("listening on ")[1].strip()
                    self.port = int(self.url.rsplit(":", 1)[1])
                    ready.set()
        ready.set()

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(30)


# -- the client ---------------------------------------------------------------------------------


def main() -> int:
    root = Path(tempfile.mkdtemp(prefix="perdure-daemon-client-"))
    daemon = Daemon(root, token=secrets.token_urlsafe(24))
    restarting: threading.Thread | None = None
    try:
        print("1) start perdure serve")
        daemon.start()
        with PerdureClient(daemon.url, daemon.token) as client:
            sid = client.create_session("weather").session_id
            first = client.submit(sid, TASK, request_id="weather-1")
            print(f"2) task accepted (durably) as {first.submission_id}, record {first.seq}")

            final = None
            streamed: set[str] = set()  # model turns whose text arrived as live deltas
            # The iterator reconnects by itself (Last-Event-ID) when the daemon goes away.
            for event in client.events(sid):
                if isinstance(event, EphemeralEvent):
                    if event.type == "text_delta":
                        streamed.add(event.data["generation_id"])
                        print(event.data["text"], end="", flush=True)
                    continue
                record = event.record
                if event.type == "GenerationCompleted":
                    # Deltas are live only; a turn finished before we listened (or while
                    # the daemon was down) is printed from its committed record.
                    print("" if record["generation_id"] in streamed else record["text"])
                elif event.type == "ToolExecuting":
                    print(f"   tool {record['tool_name']} is executing")
                    if record["tool_name"] == "fetch_forecast" and restarting is None:
                        print(f"3) SIGKILL the daemon while the tool runs (at record {event.seq})")
                        daemon.kill()
                        print("4) restart it; the client reconnects with Last-Event-ID by itself")
                        restarting = threading.Thread(target=daemon.start)
                        restarting.start()
                elif event.type == "ToolCompleted":
                    print(f"   tool result: {record['output']}")
                elif event.type == "LogOpened":
                    print(f"   -- the runtime restarted (epoch {record['epoch']}) --")
                elif event.type == "RecoveryDecision":
                    print(f"   recovery: found {record['found']} -> {record['action']}")
                elif is_final(event):
                    final = record
                    break
            assert final is not None

            again = client.submit(sid, TASK, request_id="weather-1")
            assert again == Accepted(first.submission_id, first.seq, duplicate=True), again
            print("5) re-sending the task with the same request_id returns the same answer")
        outbox = (root / "workspace" / "outbox.txt").read_text().splitlines()
        print(f"   the report was sent {len(outbox)} time(s)")
        print(f"final answer ({final['status']}): {final['final_text']}")
        print(f"daemon stopped with exit code {daemon.stop()}")
        return 0 if final["status"] == "completed" and len(outbox) == 1 else 1
    finally:
        if restarting is not None:
            restarting.join()
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.kill()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
