"""Takeover of a stuck daemon: the stopped one is fenced and stops without running anything.

Daemon A runs a session whose SAFE tool takes a while; A is SIGSTOPped mid-tool.
A second daemon B on the same log is refused while A lives, then started with
``--takeover``: B recovers the run (the SAFE call is re-run) and completes it.
When A is resumed, its pending commit fails the epoch check: A stops with a clear
message, never commits again and never starts another tool. Epochs only rise.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from perdure.storage.records import LogOpened
from tests.support.checker import check, read_log
from tests.support.daemon import Daemon, DaemonError, idle, wait_for
from tests.support.ledger_tools import read_ledger
from tests.support.stats import record_stat

SCRIPT: list[dict[str, Any]] = [
    {
        "text": "slow one first",
        "tool_uses": [{"name": "slow_lookup", "input": {"query": "q", "seconds": 1.5}}],
    },
    {"text": "then a note", "tool_uses": [{"name": "send_note", "input": {"text": "n"}}]},
    {"text": "all done"},
]


def _executing(log: Path) -> bool:
    return any(type(c.record).__name__ == "ToolExecuting" for c in read_log(log))


def test_stopped_daemon_is_fenced_after_a_takeover(make_daemon: Callable[..., Daemon]) -> None:
    a = make_daemon(SCRIPT, name="shared").start()
    with a.client() as c:
        assert c.post("/v1/sessions", json={"session_id": "t1"}).status_code == 201
        c.post("/v1/sessions/t1/messages", json={"text": "go", "request_id": "r1"})
    deadline = time.monotonic() + 30
    while not _executing(a.log):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(a.pid, signal.SIGSTOP)
    stopped_at = time.time()
    try:
        b = make_daemon(SCRIPT, name="shared")
        b.starts = 10  # its own stderr files beside A's
        b.port = 0
        with pytest.raises(DaemonError, match=f"pid {a.pid}"):
            b.start(timeout=20)  # refused: A still lives
        b.extra_args = ("--takeover",)
        b.start(timeout=20)
        with b.client() as c:
            done = wait_for(c, "t1", idle, timeout=60)
        assert done["runs"][-1]["status"] == "completed"
    finally:
        os.kill(a.pid, signal.SIGCONT)
    assert a.proc is not None
    code = a.proc.wait(30)
    assert code != 0
    assert "no longer owns the log" in a.stderr()
    assert b.stop() == 0
    # Resumed, A could only finish the call it was in the middle of (an effect cannot be
    # recalled); it started nothing new: the next turn's note is B's alone.
    ledger = read_ledger(a.workspace)
    by_a = {e["call_id"] for e in ledger if e["pid"] == a.pid and e["at"] > stopped_at}
    assert by_a <= {"toolu_001_1"}, by_a
    notes = [e for e in ledger if e["tool"] == "send_note" and e["event"] == "effect"]
    assert [e["pid"] for e in notes] == [b.pid]
    epochs = [c.record.epoch for c in read_log(a.log) if isinstance(c.record, LogOpened)]
    assert epochs == sorted(epochs)
    assert len(set(epochs)) == len(epochs) == 2
    report = check(a.log, a.workspace, settled=True)
    assert report.violations == []
    record_stat("takeover", takeovers=1, fenced=1)
