"""The daemon crashes (SIGKILL) or stops (SIGTERM) and comes back on the same log."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from perdure.storage.lmdb_log import LmdbLog
from perdure.storage.records import InputAccepted, LogOpened, RecoveryDecision, RunFinished
from tests.server.conftest import APPROVAL_SCRIPT, WORK_SCRIPT
from tests.server.test_streams import FINAL, expected_seqs
from tests.support.checker import check, read_log
from tests.support.daemon import (
    ROOT,
    Daemon,
    DaemonError,
    Stream,
    awaiting_approval,
    follow,
    is_final,
    wait_for,
)


def perdure_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "perdure.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_sigkill_mid_run_then_restart_completes_every_run_without_a_request(
    make_daemon: Callable[..., Daemon],
) -> None:
    daemon = await trio.to_thread.run_sync(make_daemon(WORK_SCRIPT).start)
    n = 8
    answers = {}
    async with daemon.aclient() as c:
        for i in range(n):
            sid = f"k{i}"
            await c.post("/v1/sessions", json={"session_id": sid})
            resp = await c.post(
                f"/v1/sessions/{sid}/messages", json={"text": f"task {i}", "request_id": "task"}
            )
            answers[sid] = resp.json()
        # Watch k0 until its slow tool is executing, then crash the daemon.
        before = await follow(
            c,
            "k0",
            after=0,
            until=lambda e: e.event == "ToolExecuting" and e.record["tool_name"] == "slow_lookup",
        )
    await trio.to_thread.run_sync(daemon.kill)
    log = LmdbLog(daemon.log, readonly=True)
    try:
        unfinished = set(log.active_sessions())
    finally:
        log.close()
    assert "k0" in unfinished

    # While no daemon runs, `perdure check` sees a sound log with work pending.
    checked = await trio.to_thread.run_sync(perdure_cli, "check", "--log", str(daemon.log))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "with work pending" in checked.stdout

    await trio.to_thread.run_sync(daemon.restart)
    assert any("recovered" in line and "k0" in line for line in daemon.output)
    # `perdure check` is read-only and safe beside the running daemon.
    beside = await trio.to_thread.run_sync(perdure_cli, "check", "--log", str(daemon.log))
    assert beside.returncode == 0, beside.stdout + beside.stderr

    async with daemon.aclient() as c:
        # No new request: k0's stream resumes from the last id it saw and the run ends.
        after = await follow(c, "k0", after=0, last_event_id=before.seqs[-1])
        assert is_final(after.events[-1]) and after.events[-1].record["status"] == "completed"
        kinds = [e.event for e in after.events]
        assert "LogOpened" in kinds  # the restart, marked in the stream, in seq order
        assert "RecoveryDecision" in kinds[kinds.index("LogOpened") :]
        for i in range(1, n):
            stream = await follow(c, f"k{i}", after=0)
            last = stream.events[-1]
            assert is_final(last) and last.record["final_text"] == FINAL, (i, last)
        # request_id dedup holds across the restart: the same answer, or a 409.
        for sid, first in answers.items():
            again = await c.post(
                f"/v1/sessions/{sid}/messages",
                json={"text": f"task {sid[1:]}", "request_id": "task"},
            )
            assert again.status_code == 202
            assert again.json() == {**first, "duplicate": True}
        conflict = await c.post(
            "/v1/sessions/k0/messages", json={"text": "something else", "request_id": "task"}
        )
        assert conflict.status_code == 409
        assert conflict.json()["error"]["code"] == "conflict"
        summary = (await c.get("/v1/sessions/k0")).json()
        assert summary["decisions"], "the restart's recovery decisions are in the summary"
        assert [r["status"] for r in summary["runs"]][-1] == "completed"
    joined = before.seqs + after.seqs
    assert joined == expected_seqs(daemon.log, "k0")  # no gap, no duplicate, across a crash
    assert await trio.to_thread.run_sync(daemon.stop) == 0

    records = [c.record for c in read_log(daemon.log)]
    assert sum(isinstance(r, InputAccepted) for r in records) == n  # no new input
    finals = [r for r in records if isinstance(r, RunFinished) and r.status != "interrupted"]
    assert len(finals) == n and all(r.status == "completed" for r in finals)
    assert sum(isinstance(r, LogOpened) for r in records) == 2
    assert any(isinstance(r, RecoveryDecision) for r in records)
    report = check(daemon.log, daemon.workspace, settled=True)
    assert report.violations == []  # includes: every NEVER effect at most once
    settled = await trio.to_thread.run_sync(
        perdure_cli, "check", "--settled", "--log", str(daemon.log)
    )
    assert settled.returncode == 0, settled.stdout


def test_graceful_stop_keeps_waiting_work_and_page_tokens(
    make_daemon: Callable[..., Daemon],
) -> None:
    daemon = make_daemon(APPROVAL_SCRIPT).start()
    token = daemon.token
    with daemon.client() as c:
        c.post("/v1/sessions", json={"session_id": "wait"})
        c.post("/v1/sessions/wait/messages", json={"text": "deploy", "request_id": "r1"})
        call = wait_for(c, "wait", awaiting_approval)["pending_approvals"][0]["call_id"]
    assert daemon.stop() == 0  # SIGTERM: a clean exit
    assert any("stopped" in line for line in daemon.output)
    daemon.restart()
    assert daemon.token == token  # the generated token is kept in the log directory
    assert oct((daemon.log / "daemon.token").stat().st_mode & 0o777) == "0o600"
    with daemon.client() as c:
        summary = wait_for(c, "wait", awaiting_approval)  # still waiting, nothing re-run
        assert summary["pending_approvals"][0]["call_id"] == call
        c.post(f"/v1/sessions/wait/approvals/{call}", json={"approved": True, "request_id": "yes"})
        summary = wait_for(c, "wait", lambda s: s["status"] == "idle")
        assert summary["runs"][-1]["status"] == "completed"


def flip_marker(log_dir: Path, marker: bytes) -> int:
    """Flip one bit of every copy of ``marker`` in the LMDB data file; return the count."""
    data = log_dir / "data.mdb"
    raw = bytearray(data.read_bytes())
    count, at = 0, raw.find(marker)
    while at >= 0:
        raw[at] ^= 0x01  # 'M' -> 'L': still valid JSON, a different checksum
        count += 1
        at = raw.find(marker, at + 1)
    data.write_bytes(bytes(raw))
    return count


def test_a_damaged_session_is_parked_and_the_rest_keeps_working(
    make_daemon: Callable[..., Daemon],
) -> None:
    daemon = make_daemon(APPROVAL_SCRIPT).start()
    with daemon.client() as c:
        c.post("/v1/sessions", json={"session_id": "hurt"})
        accepted = c.post(
            "/v1/sessions/hurt/messages",
            json={"text": "MARKER-damage-me please", "request_id": "r1"},
        ).json()
        wait_for(c, "hurt", awaiting_approval)  # the session stays active
    assert daemon.stop() == 0
    assert flip_marker(daemon.log, b"MARKER-damage-me") >= 1
    daemon.restart()
    with daemon.client() as c:
        # Its actor cannot load its records: it is parked, and says so (423).
        resp = c.post("/v1/sessions/hurt/messages", json={"text": "x", "request_id": "r2"})
        assert resp.status_code == 423, resp.text
        assert resp.json()["error"]["code"] == "parked"
        resp = c.post("/v1/sessions/hurt/pause", json={"request_id": "p"})
        assert resp.status_code == 423
        broken = c.get("/v1/sessions/hurt")
        assert broken.status_code == 500
        assert broken.json()["error"]["code"] == "corrupt_record"
        assert f"record {accepted['seq']}" in broken.json()["error"]["message"]
        # Other sessions are not affected.
        assert c.post("/v1/sessions", json={"session_id": "fine"}).status_code == 201
        ok = c.post("/v1/sessions/fine/messages", json={"text": "go", "request_id": "r"})
        assert ok.status_code == 202
        wait_for(c, "fine", awaiting_approval)
    found = perdure_cli("check", "--log", str(daemon.log))
    assert found.returncode == 1
    assert f"record {accepted['seq']} is damaged or unreadable: checksum mismatch" in found.stdout


def test_a_second_daemon_on_the_same_log_is_refused(make_daemon: Callable[..., Daemon]) -> None:
    first = make_daemon(APPROVAL_SCRIPT).start()
    second = Daemon(first.root / "second", APPROVAL_SCRIPT)
    shutil.rmtree(second.root / "ws")
    second.log = first.log
    second.workspace = first.workspace
    second.port = 0
    with pytest.raises(DaemonError) as refused:
        second.start(timeout=20)
    message = str(refused.value)
    assert f"is owned by pid {first.pid}" in message
    assert "perdure serve --takeover" in message
    assert "Traceback" not in message
    with first.client() as c:
        assert c.get("/v1/sessions").status_code == 200
    assert json.loads((first.log / "owner.lock").read_text())["pid"] == first.pid


async def test_sigterm_ends_streams_and_lets_the_running_tool_finish(
    make_daemon: Callable[..., Daemon],
) -> None:
    script = [
        {
            "text": "A slow lookup.",
            "tool_uses": [{"name": "slow_lookup", "input": {"query": "q", "seconds": 1.5}}],
        },
        {"text": "Found it."},
    ]
    daemon = await trio.to_thread.run_sync(make_daemon(script).start)
    async with daemon.aclient() as c:
        await c.post("/v1/sessions", json={"session_id": "g"})
        await c.post("/v1/sessions/g/messages", json={"text": "go", "request_id": "r"})
        executing = trio.Event()

        def note(e: Any) -> bool:
            if e.event == "ToolExecuting":
                executing.set()
            return False  # keep reading until the server ends the stream

        stream = Stream()
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda: follow(c, "g", after=0, until=note, stream=stream))
                await executing.wait()
                # An open stream must not hold the shutdown up: it ends (the client may
                # reconnect to the next process) while the tool is left to finish.
                began = trio.current_time()
                await trio.to_thread.run_sync(daemon.stop)
                # Well under Hypercorn's 5 s grace for open connections: nothing waited on
                # the stream; the shutdown waited only for the tool (1.5 s).
                assert trio.current_time() - began < 4.0
        assert stream.ended
    assert daemon.proc is not None and daemon.proc.returncode == 0
    records = [c.record for c in read_log(daemon.log)]
    [done] = [r for r in records if type(r).__name__ == "ToolCompleted"]
    assert done.output == "slowly found: q" and not done.is_error  # finished, not cut off
    assert not any(isinstance(r, RunFinished) for r in records)  # the run goes on later
    await trio.to_thread.run_sync(daemon.restart)
    async with daemon.aclient() as c:
        end = await follow(c, "g", after=stream.seqs[-1])
    assert end.events[-1].record["final_text"] == "Found it."
    executions = [r for r in read_log(daemon.log) if type(r.record).__name__ == "ToolExecuting"]
    assert len(executions) == 1  # the completed tool was not run again
