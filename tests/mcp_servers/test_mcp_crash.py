"""Crash tests of MCP calls: the perdure process is SIGKILLed mid-call and restarted.

The child (``tests/mcp_servers/child.py``) runs the runtime with the shop server over
stdio (annotations trusted). It dies by ``PERDURE_FAULT`` at ``tool.before`` (the
executing record is durable, the request not sent) or ``tool.after`` (the server
answered, the result is not committed), or by a SIGKILL from this process while the
server is still working. A second child on the same log recovers; the test checks
what was recorded, what the server's ledger says really happened, and that
``perdure check`` finds the log sound.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from perdure.check import check_log
from tests.mcp_servers._shop import http_shop_process, read_ledger

ROOT = Path(__file__).resolve().parents[2]
FIRST = "toolu_001_1"


class Child:
    def __init__(self, path: Path, uses: list[tuple[str, dict[str, Any]]]) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        (path / "plan.json").write_text(json.dumps({"uses": uses}))
        self.runs = 0

    def run(
        self,
        *flags: str,
        fault: str | None = None,
        kill_when: Callable[[], bool] | None = None,
        timeout: float = 60.0,
    ) -> tuple[int, dict[str, Any] | None, str]:
        self.runs += 1
        env = dict(os.environ)
        env.pop("PERDURE_FAULT", None)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        if fault:
            env["PERDURE_FAULT"] = fault
        summary = self.path / "summary.json"
        summary.unlink(missing_ok=True)
        err_path = self.path / f"stderr-{self.runs}.txt"
        with open(err_path, "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.mcp_servers.child", str(self.path), *flags],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=err,
            )
            deadline = time.monotonic() + timeout
            try:
                while proc.poll() is None:
                    if kill_when is not None and kill_when():
                        proc.send_signal(signal.SIGKILL)
                        break
                    assert time.monotonic() < deadline, f"run {self.runs} took over {timeout}s"
                    time.sleep(0.01)
                proc.wait(timeout=timeout)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        stderr = err_path.read_text(errors="replace")
        data = json.loads(summary.read_text()) if summary.exists() else None
        return proc.returncode, data, stderr

    def ledger(self, tool: str | None = None) -> list[dict[str, Any]]:
        entries = read_ledger(self.path / "ledger")
        return [e for e in entries if tool is None or e["tool"] == tool]

    def check(self) -> None:
        report = check_log(self.path / "log", settled="all")
        assert report.ok, report.violations


def _crash_and_recover(
    tmp_path: Path, use: tuple[str, dict[str, Any]], fault: str
) -> tuple[Child, dict[str, Any]]:
    child = Child(tmp_path, [use])
    code, _, stderr = child.run(fault=fault)
    assert code == -signal.SIGKILL, stderr
    code, summary, stderr = child.run()
    assert code == 0 and summary is not None, stderr
    assert summary["outcome"] == "completed"
    child.check()
    return child, summary


@pytest.mark.parametrize("point", ["tool.before", "tool.after"])
def test_a_read_only_call_is_run_again(tmp_path: Path, point: str) -> None:
    child, summary = _crash_and_recover(
        tmp_path, ("shop__lookup", {"city": "Oslo"}), f"{point}:shop__lookup"
    )
    task = summary["tasks"][FIRST]
    assert (task["phase"], task["output"], task["attempt"], task["replay"]) == (
        "completed",
        "Oslo: sunny",
        2,
        "safe",
    )
    # before: the request was never sent, so one real call; after: it ran, and ran again
    assert len(child.ledger("lookup")) == (1 if point == "tool.before" else 2)
    assert any(a.startswith("re-run") for a in _actions(summary))


@pytest.mark.parametrize("point", ["tool.before", "tool.after"])
def test_an_idempotent_call_is_run_again_with_the_same_key_and_one_effect(
    tmp_path: Path, point: str
) -> None:
    child, summary = _crash_and_recover(
        tmp_path, ("shop__book", {"room": "7"}), f"{point}:shop__book"
    )
    task = summary["tasks"][FIRST]
    assert (task["phase"], task["attempt"], task["replay"]) == ("completed", 2, "keyed")
    (booked,) = child.ledger("book")  # the server recorded ONE effect
    assert booked["key"] == task["key"]  # the re-run sent the same _meta key
    if point == "tool.after":
        assert task["output"] == f"booked 7 (already, booking {booked['booking']})"
    else:
        assert task["output"] == f"booked 7 (booking {booked['booking']})"


@pytest.mark.parametrize(("tool", "replay"), [("book", "keyed"), ("append", "never")])
def test_over_streamable_http_too(tmp_path: Path, tool: str, replay: str) -> None:
    args = {"book": {"room": "8"}, "append": {"line": "y"}}[tool]
    child = Child(tmp_path, [(f"shop__{tool}", args)])
    with http_shop_process(tmp_path / "ledger") as (url, _pid):
        code, _, stderr = child.run("--url", url, fault=f"tool.after:shop__{tool}")
        assert code == -signal.SIGKILL, stderr
        code, summary, stderr = child.run("--url", url)
    assert code == 0 and summary is not None, stderr
    task = summary["tasks"][FIRST]
    assert task["replay"] == replay
    (entry,) = child.ledger(tool)  # one effect: re-run with the same key, or not re-run
    if replay == "keyed":
        assert (task["phase"], task["attempt"]) == ("completed", 2)
        assert entry["key"] == task["key"]
        assert task["output"].startswith("booked 8 (already")
    else:
        assert task["phase"] == "outcome_unknown"
    child.check()


@pytest.mark.parametrize("point", ["tool.before", "tool.after"])
def test_a_call_that_is_neither_is_reported_unknown_and_never_run_again(
    tmp_path: Path, point: str
) -> None:
    child, summary = _crash_and_recover(
        tmp_path, ("shop__append", {"line": "x"}), f"{point}:shop__append"
    )
    task = summary["tasks"][FIRST]
    assert (task["phase"], task["replay"]) == ("outcome_unknown", "never")
    assert "UNKNOWN" in task["output"]
    assert "not idempotent" in task["policy_reason"]
    assert len(child.ledger("append")) == (0 if point == "tool.before" else 1)


@pytest.mark.parametrize("point", ["tool.before", "tool.after"])
def test_a_never_call_with_a_reconcile_override_is_reconciled(tmp_path: Path, point: str) -> None:
    child = Child(tmp_path, [("shop__append", {"line": "x"})])
    code, _, stderr = child.run("--reconcile", fault=f"{point}:shop__append")
    assert code == -signal.SIGKILL, stderr
    code, summary, stderr = child.run("--reconcile")
    assert code == 0 and summary is not None, stderr
    task = summary["tasks"][FIRST]
    assert "ask the tool's reconcile()" in _actions(summary)
    assert "override: reconcile" in task["policy_reason"]
    (entry,) = child.ledger("append")  # exactly one effect either way
    assert task["phase"] == "completed"
    if point == "tool.after":  # it had happened: the real result, no second call
        assert task["output"] == "appended x (found in the shop's ledger)"
    else:  # it had not: run once more, with the same key
        assert task["output"] == "appended x"
        assert entry["key"] == task["key"]
    child.check()


def test_a_destructive_call_waiting_for_approval_still_waits_after_a_restart(
    tmp_path: Path,
) -> None:
    child = Child(tmp_path, [("shop__delete", {"item": "cart"})])
    code, _, stderr = child.run(
        "--await-approval", FIRST, kill_when=lambda: (tmp_path / "marker").exists()
    )
    assert code == -signal.SIGKILL, stderr
    code, summary, stderr = child.run("--phase-of", FIRST, "--approve", FIRST)
    assert code == 0 and summary is not None, stderr
    assert summary["phase_at_start"] == "awaiting_approval"
    task = summary["tasks"][FIRST]
    assert (task["phase"], task["output"]) == ("completed", "deleted cart")
    assert len(child.ledger("delete")) == 1
    child.check()


def test_killed_while_the_server_works_on_a_never_call(tmp_path: Path) -> None:
    """A SIGKILL while the server is inside the call (not at a fault point)."""
    child = Child(tmp_path, [("shop__hold", {"item": "x"})])
    try:
        code, _, stderr = child.run(kill_when=lambda: bool(child.ledger("hold")))
        assert code == -signal.SIGKILL, stderr
        code, summary, stderr = child.run()
        assert code == 0 and summary is not None, stderr
        task = summary["tasks"][FIRST]
        assert task["phase"] == "outcome_unknown"
        assert len(child.ledger("hold")) == 1  # never re-run
        child.check()
    finally:
        for entry in child.ledger("hold"):  # the orphaned server, if it outlived its client
            with contextlib.suppress(ProcessLookupError):
                os.kill(entry["pid"], signal.SIGKILL)


@pytest.mark.parametrize("variant", ["changed", "gone"])
def test_a_tool_that_changed_or_vanished_meanwhile_is_named_in_the_decision(
    tmp_path: Path, variant: str
) -> None:
    child = Child(tmp_path, [("shop__lookup", {"city": "Oslo"})])
    code, _, stderr = child.run(fault="tool.after:shop__lookup")
    assert code == -signal.SIGKILL, stderr
    code, summary, stderr = child.run("--variant", variant)
    assert code == 0 and summary is not None, stderr
    (decision,) = [d for d in summary["decisions"] if d["subject"] == FIRST]
    task = summary["tasks"][FIRST]
    if variant == "changed":  # still read-only, and the arguments still fit: re-run
        assert decision["action"].startswith("re-run with the same idempotency key")
        assert "the tool's definition changed since the call was dispatched" in decision["reason"]
        assert "the recorded arguments still fit it" in decision["reason"]
        assert (task["phase"], task["output"]) == ("completed", "Oslo: sunny")
    else:
        assert decision["action"] == "report outcome unknown"
        assert decision["reason"] == "its tool is no longer registered"
        assert task["phase"] == "outcome_unknown"
    child.check()


def _actions(summary: dict[str, Any]) -> list[str]:
    return [d["action"] for d in summary["decisions"] if d["subject"] == FIRST]
