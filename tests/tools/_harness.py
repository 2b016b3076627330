"""Helpers of the crash tests: run ``tests.tools.child`` on a work directory, kill it, read it.

A ``Workdir`` holds one log, one workspace and one plan (the model's first turn).
``run`` starts the child (optionally with ``PERDURE_FAULT``, or killing it with
SIGKILL as soon as ``kill_when()`` is true) and returns its exit status and the
summary it wrote, if it got that far.
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

from attrs import frozen

ROOT = Path(__file__).resolve().parents[2]
FIRST = "toolu_001_1"  # the scripted provider's id for the first call of the first turn


def use(tool_name: str, /, **input: Any) -> dict[str, Any]:
    return {"name": tool_name, "input": input}


@frozen
class ChildRun:
    returncode: int
    stderr: str
    summary: dict[str, Any] | None

    @property
    def killed(self) -> bool:
        return self.returncode == -signal.SIGKILL

    @property
    def tasks(self) -> dict[str, Any]:
        assert self.summary is not None, self.stderr
        return self.summary["tasks"]  # type: ignore[no-any-return]

    def task(self, call_id: str = FIRST) -> dict[str, Any]:
        return self.tasks[call_id]  # type: ignore[no-any-return]

    def result(self, call_id: str = FIRST) -> dict[str, Any]:
        """The tool result the model reads in the transcript."""
        assert self.summary is not None, self.stderr
        return self.summary["results"][call_id]  # type: ignore[no-any-return]

    def decisions(self, subject: str = FIRST) -> list[str]:
        assert self.summary is not None, self.stderr
        return [d["action"] for d in self.summary["decisions"] if d["subject"] == subject]


class Workdir:
    def __init__(self, path: Path, uses: list[dict[str, Any]], port: int | None = None) -> None:
        self.path = path
        self.ws = path / "ws"
        self.ws.mkdir(parents=True, exist_ok=True)
        (path / "plan.json").write_text(json.dumps({"uses": uses, "port": port}))
        self.runs = 0

    def run(
        self,
        *flags: str,
        fault: str | None = None,
        kill_when: Callable[[], bool] | None = None,
        timeout: float = 30.0,
    ) -> ChildRun:
        self.runs += 1
        env = dict(os.environ)
        env.pop("PERDURE_FAULT", None)
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # many children: let them reuse bytecode
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        if fault:
            env["PERDURE_FAULT"] = fault
        summary = self.path / "summary.json"
        summary.unlink(missing_ok=True)
        (self.path / "marker").unlink(missing_ok=True)
        err_path = self.path / f"stderr-{self.runs}.txt"
        with open(err_path, "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.tools.child", str(self.path), *flags],
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
                    if time.monotonic() > deadline:
                        raise AssertionError(f"child run {self.runs} did not finish in {timeout}s")
                    time.sleep(0.01)
                proc.wait(timeout=timeout)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        stderr = err_path.read_text(errors="replace")
        data = json.loads(summary.read_text()) if summary.exists() else None
        return ChildRun(proc.returncode, stderr, data)

    def marker(self) -> bool:
        return (self.path / "marker").exists()

    def ledger(self) -> list[dict[str, Any]]:
        path = self.ws / "ledger.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line]

    def bash_dirs(self) -> list[Path]:
        return sorted((self.ws / ".perdure-tools" / "bash").glob("*/attempt-*"))
