"""What the SIGKILL tests of the providers share: a child runtime, killed and restarted.

The child is ``tests/providers/_kill_child.py``, run against fake servers in the
parent process (their URLs reach it through the vendors' own environment
variables). The parent reads the child's log read-only while it runs, kills it
with SIGKILL at the moment a test chooses, and runs it again to the end.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from perdure.storage.lmdb_log import LmdbLog
from perdure.storage.records import (
    GenerationCompleted,
    Record,
    RecoveryDecision,
    RetryPending,
    RunFinished,
    RunStarted,
)
from tests.support.fake_vendor import FakeVendor, Received

ROOT = Path(__file__).resolve().parents[2]
BACK_OFF = 4.0  # the server's retry-after: longer than it takes to notice and kill


def child_env(*, anthropic: str | None = None, openai: str | None = None) -> dict[str, str]:
    """The child's environment: keys and base URLs of the fake servers it may call."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ANTHROPIC_", "OPENAI_", "PERDURE_"))
    }
    env.update(PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    if anthropic is not None:
        env.update(ANTHROPIC_API_KEY="sk-ant-test", ANTHROPIC_BASE_URL=anthropic)
    if openai is not None:
        env.update(OPENAI_API_KEY="sk-test", OPENAI_BASE_URL=openai)
    return env


def start_child(log: Path, env: dict[str, str], out: Path, *args: str) -> subprocess.Popen[bytes]:
    with out.open("wb") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.providers._kill_child", str(log), *args],
            cwd=ROOT,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )


def read_log(log: Path) -> list[Record]:
    reader = LmdbLog(log, readonly=True)
    try:
        return [c.record for c in reader.read_global()]
    finally:
        reader.close()


def wait_until(
    what: str,
    found: Callable[[], Any],
    child: subprocess.Popen[bytes],
    out: Path,
    timeout: float = 90.0,
) -> Any:
    """Poll ``found`` until it returns something truthy; the child must stay alive."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise AssertionError(f"the child exited early ({child.returncode}):\n{out.read_text()}")
        value = found()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"no {what} within {timeout}s:\n{out.read_text()}")


def retry_pending(log: Path) -> list[RetryPending]:
    try:
        return [r for r in read_log(log) if isinstance(r, RetryPending)]
    except FileNotFoundError:  # the child has not created (or finished creating) it yet
        return []


def sigkill(child: subprocess.Popen[bytes]) -> None:
    try:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL


def kill_in_back_off(
    log: Path, child: subprocess.Popen[bytes], out: Path, fake: FakeVendor[Any], sent: int
) -> RetryPending:
    """Wait for the child's RetryPending, check it has sent ``sent`` requests, SIGKILL it."""
    try:
        pending: list[RetryPending] = wait_until(
            "RetryPending", lambda: retry_pending(log), child, out
        )
        assert len(fake.requests) == sent, "the child retried before it was killed"
    finally:
        sigkill(child)
    return pending[0]


def run_to_the_end(log: Path, env: dict[str, str], out: Path, *args: str) -> str:
    """Run a restarted child until it exits; it must succeed. Returns its output."""
    child = start_child(log, env, out, *args)
    try:
        child.wait(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    output = out.read_text()
    assert child.returncode == 0, output
    return output


def of(kind: type, records: list[Record]) -> list[Any]:
    return [r for r in records if isinstance(r, kind)]


def crash_in_back_off(
    tmp_path: Path,
    fake: FakeVendor[Any],
    env: dict[str, str],
    then: Any,
    *args: str,
    sent: int = 1,
) -> tuple[dict[str, Any], RetryPending]:
    """Run the child until its RetryPending is durable (``fake`` scripted by the caller
    to fail the ``sent``-th request), SIGKILL it in the back-off, script ``then`` and run
    the child again to the end. Returns its outcome (JSON) and the RetryPending record."""
    log = tmp_path / "log"
    out1 = tmp_path / "child1.out"
    pending = kill_in_back_off(log, start_child(log, env, out1, *args), out1, fake, sent=sent)
    fake.script(then)
    output = run_to_the_end(log, env, tmp_path / "child2.out", *args)
    result: dict[str, Any] = json.loads(output.strip().splitlines()[-1])
    return result, pending


def resumed_the_retry(
    log: Path,
    result: dict[str, Any],
    pending: RetryPending,
    requests: list[Received],
    text: str,
) -> GenerationCompleted:
    """The checks after ``crash_in_back_off`` of a single turn answering ``text``: the run
    completed in the restarted child, the retry waited out the back-off the record
    promised, and the log holds that record unchanged and exactly one reply."""
    assert result["status"] == "completed", result
    assert result["text"] == text
    assert result["recovered_sessions"] == ["s-kill"]
    assert pending.not_before - pending.at >= BACK_OFF
    assert len(requests) == 2
    assert requests[1].at >= pending.not_before - 0.01
    assert requests[1].body == requests[0].body  # the same request, sent again
    records = read_log(log)
    assert of(RetryPending, records) == [pending]  # preserved, not rewritten
    (reply,) = of(GenerationCompleted, records)  # exactly one committed reply
    assert (reply.text, reply.attempt) == (text, 2)
    assert reply.generation_id == pending.generation_id
    runs = of(RunStarted, records)
    assert [r.resumed_from for r in runs] == [None, runs[0].run_id]
    assert [(f.run_id, f.status) for f in of(RunFinished, records)] == [
        (runs[0].run_id, "interrupted"),
        (runs[1].run_id, "completed"),
    ]
    assert any(
        d.subject == pending.generation_id and d.found == "retry back-off"
        for d in of(RecoveryDecision, records)
    )
    return reply
