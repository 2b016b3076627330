"""Run the child runtime as a real process, optionally with a fault, and collect its output."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from attrs import define

ROOT = Path(__file__).resolve().parents[2]


@define
class ChildResult:
    returncode: int
    lines: list[dict[str, Any]]
    stderr: str

    @property
    def killed(self) -> bool:
        return self.returncode == -signal.SIGKILL

    def outcome(self, session: str) -> dict[str, Any]:
        for line in self.lines:
            if line.get("session") == session:
                return line
        raise AssertionError(f"no outcome for {session}; stderr:\n{self.stderr}")

    @property
    def appends(self) -> int:
        for line in self.lines:
            if "stats" in line:
                return int(line["stats"][0])
        raise AssertionError(f"no stats line; stderr:\n{self.stderr}")


def run_child(
    plan: dict[str, Any],
    fault: str | None = None,
    timeout: float = 60,
    slow_commit_ms: int | None = None,
) -> ChildResult:
    """Run a child runtime on ``plan``; ``fault`` is its ``PERDURE_FAULT``, and
    ``slow_commit_ms`` its ``PERDURE_SLOW_COMMIT_MS`` (a slow disk: it holds every
    commit in flight that long, which opens the ``model.early`` window wide)."""
    env = dict(os.environ)
    env.pop("PERDURE_FAULT", None)
    env.pop("PERDURE_SLOW_COMMIT_MS", None)
    if fault:
        env["PERDURE_FAULT"] = fault
    if slow_commit_ms:
        env["PERDURE_SLOW_COMMIT_MS"] = str(slow_commit_ms)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.child", json.dumps(plan)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = []
    for raw in proc.stdout.splitlines():
        with contextlib.suppress(ValueError):
            lines.append(json.loads(raw))
    result = ChildResult(proc.returncode, lines, proc.stderr)
    if fault is None and proc.returncode != 0:
        raise AssertionError(f"child failed ({proc.returncode}):\n{proc.stderr}")
    return result


class NodeProcess:
    """A child runtime left running (a node), its output going to files, for signal tests."""

    def __init__(self, plan: dict[str, Any], out_dir: Path, name: str) -> None:
        env = dict(os.environ)
        env.pop("PERDURE_FAULT", None)
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        self.name = name
        self.stdout_path = out_dir / f"{name}.out"
        self.stderr_path = out_dir / f"{name}.err"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.support.child", json.dumps(plan)],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=err,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def lines(self) -> list[dict[str, Any]]:
        found = []
        for raw in self.stdout_path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                found.append(json.loads(raw))
        return found

    def first(self, key: str) -> dict[str, Any] | None:
        return next((line for line in self.lines() if key in line), None)

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"node {self.name} did not exit within {timeout}s; stderr:\n{self.stderr()}"
            ) from None

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
        self.proc.wait()
