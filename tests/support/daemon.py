"""A real ``perdure serve`` in a child process, and the client-side tools to test it.

``Daemon`` starts the CLI exactly as a user would (scripted provider, the ledger
tools, a log and a workspace under the test's tmp dir, ``--port 0`` the first time
and the same port on restarts), reads the address it prints, and stops it by a
real signal: SIGTERM (graceful) or SIGKILL (a crash). ``follow`` parses the
Server-Sent Events of a session with httpx, as any client would.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing, suppress
from pathlib import Path
from typing import Any

import httpx
from attrs import define, field

ROOT = Path(__file__).resolve().parents[2]
LEDGER_TOOLS = "tests.support.ledger_tools:ALL_TOOLS"
_LISTENING = re.compile(r"listening on (http://\S+)")


class DaemonError(AssertionError):
    pass


class Daemon:
    """One log, one workspace, and the ``perdure serve`` processes that own it in turn."""

    def __init__(
        self,
        root: Path,
        script: list[dict[str, Any]],
        *,
        tools: str = LEDGER_TOOLS,
        heartbeat: float = 1.0,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.root = root
        self.log = root / "log"
        self.workspace = root / "ws"
        self.workspace.mkdir(parents=True, exist_ok=True)
        self.script_path = root / "script.json"
        self.script_path.write_text(json.dumps({"replies": script}))
        self.tools = tools
        self.heartbeat = heartbeat
        self.extra_args = extra_args
        self.fault: str | None = None  # PERDURE_FAULT for the next start only
        self.proc: subprocess.Popen[str] | None = None
        self.port = 0
        self.url = ""
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        self.starts = 0

    # -- process control -----------------------------------------------------------------

    def command(self, port: int) -> list[str]:
        return [
            sys.executable,
            "-m",
            "perdure.cli",
            "serve",
            "--log",
            str(self.log),
            "--port",
            str(port),
            "--provider",
            f"scripted:{self.script_path}",
            "--tools",
            self.tools,
            "--workspace",
            str(self.workspace),
            "--heartbeat",
            str(self.heartbeat),
            *self.extra_args,
        ]

    def start(self, timeout: float = 30.0) -> Daemon:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.starts += 1
        stderr = open(self.root / f"daemon-{self.starts}.err", "w")  # noqa: SIM115
        env = dict(os.environ)
        env.pop("PERDURE_FAULT", None)
        env.pop("PERDURE_TOKEN", None)
        if self.fault:
            env["PERDURE_FAULT"], self.fault = self.fault, None
        env["PYTHONPATH"] = str(ROOT)
        self.proc = subprocess.Popen(
            self.command(self.port),
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        stderr.close()
        self.lines = queue.Queue()
        threading.Thread(target=self._read, args=(self.proc, self.lines), daemon=True).start()
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                self.kill()
                raise DaemonError(
                    f"perdure serve did not start in {timeout}s\n{self.stderr()}"
                ) from None
            if line is None:
                raise DaemonError(
                    f"perdure serve exited ({self.proc.wait()}) before listening\n"
                    + "\n".join(self.output)
                    + "\n"
                    + self.stderr()
                )
            found = _LISTENING.search(line)
            if found:
                self.url = found.group(1)
                self.port = int(self.url.rsplit(":", 1)[1])
                return self

    def _read(self, proc: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
        assert proc.stdout is not None
        with proc.stdout:
            for line in proc.stdout:
                self.output.append(line.rstrip("\n"))
                lines.put(line)
        lines.put(None)

    def stderr(self) -> str:
        return (self.root / f"daemon-{self.starts}.err").read_text()

    @property
    def token(self) -> str:
        return (self.log / "daemon.token").read_text().strip()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (graceful shutdown); returns the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise DaemonError(f"perdure serve ignored SIGTERM for {timeout}s") from None

    def kill(self) -> None:
        """SIGKILL: a crash, as far as the log can tell."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def restart(self) -> Daemon:
        return self.start()

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with suppress(DaemonError):
                self.stop(10)

    # -- clients -----------------------------------------------------------------------

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def client(self, **kwargs: Any) -> httpx.Client:
        kwargs.setdefault("headers", self.headers())
        return httpx.Client(base_url=self.url, timeout=30, **kwargs)

    def aclient(self, **kwargs: Any) -> httpx.AsyncClient:
        kwargs.setdefault("headers", self.headers())
        return httpx.AsyncClient(base_url=self.url, timeout=30, **kwargs)


# -- Server-Sent Events ------------------------------------------------------------------


@define
class Sse:
    event: str
    data: dict[str, Any]
    id: int | None = None

    @property
    def seq(self) -> int | None:
        return self.id

    @property
    def record(self) -> dict[str, Any]:
        return self.data.get("record", {})


@define
class Stream:
    """What one SSE connection delivered."""

    events: list[Sse] = field(factory=list)
    comments: list[str] = field(factory=list)
    retry: int | None = None
    ended: bool = False  # the server closed the response

    @property
    def seqs(self) -> list[int]:
        return [e.id for e in self.events if e.id is not None]


async def parse_sse(lines: AsyncIterator[str], stream: Stream) -> AsyncGenerator[Sse, None]:
    event, data, ident = "message", [], None
    async for line in lines:
        if line == "":
            if data:
                yield Sse(event, json.loads("\n".join(data)), ident)
            event, data, ident = "message", [], None
            continue
        if line.startswith(":"):
            stream.comments.append(line[1:].strip())
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
        elif name == "id":
            ident = int(value)
        elif name == "retry":
            stream.retry = int(value)


def is_final(sse: Sse, submission_id: str | None = None) -> bool:
    """A RunFinished that answers an input (not an ``interrupted`` one)."""
    if sse.event != "RunFinished" or sse.record.get("status") == "interrupted":
        return False
    return submission_id is None or sse.record.get("submission_id") == submission_id


async def follow(
    client: httpx.AsyncClient,
    session_id: str,
    *,
    after: int | None = None,
    last_event_id: int | None = None,
    until: Callable[[Sse], bool] = is_final,
    stream: Stream | None = None,
    limit: float = 60.0,
) -> Stream:
    """Read a session's events until ``until(event)`` is true or the server ends the stream."""
    import trio

    stream = stream if stream is not None else Stream()
    params = {} if after is None else {"after": str(after)}
    headers = {} if last_event_id is None else {"Last-Event-ID": str(last_event_id)}
    with trio.fail_after(limit):
        async with client.stream(
            "GET", f"/v1/sessions/{session_id}/events", params=params, headers=headers
        ) as resp:
            assert resp.status_code == 200, await resp.aread()
            assert resp.headers["content-type"].startswith("text/event-stream")
            async with (
                aclosing(resp.aiter_lines()) as lines,
                aclosing(parse_sse(lines, stream)) as events,
            ):
                async for sse in events:
                    stream.events.append(sse)
                    if until(sse):
                        return stream
    stream.ended = True
    return stream


def wait_for(
    client: httpx.Client,
    session_id: str,
    predicate: Callable[[dict[str, Any]], bool],
    timeout: float = 60.0,
) -> dict[str, Any]:
    """Poll ``GET /v1/sessions/{id}`` until ``predicate(summary)``."""
    deadline = time.monotonic() + timeout
    summary: dict[str, Any] = {}
    while time.monotonic() < deadline:
        resp = client.get(f"/v1/sessions/{session_id}")
        if resp.status_code == 200:
            summary = resp.json()
            if predicate(summary):
                return summary
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting on {session_id}; last summary: {summary}")


def idle(summary: dict[str, Any]) -> bool:
    return bool(summary["status"] == "idle" and summary["runs"])


def awaiting_approval(summary: dict[str, Any]) -> bool:
    return bool(summary["pending_approvals"])
