"""What the SIGKILL tests of the providers share: a child runtime, killed and restarted.

The child is ``tests/providers/_kill_child.py``, run against fake servers in the
parent process (their URLs reach it through the vendors' own environment
variables). The parent reads the child's log read-only while it runs, kills it
with SIGKILL at the moment a test chooses, and runs it again to the end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from perdure.storage.lmdb_log import LmdbLog
from perdure.storage.records import Record, RetryPending
from tests.support.fake_vendor import FakeVendor

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
