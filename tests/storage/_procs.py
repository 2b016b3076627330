"""Starting and talking to ``_child.py`` processes, with timeouts so a test never hangs."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("_child.py")


def child_env(fault: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT)
    env.pop("PERDURE_FAULT", None)
    if fault:
        env["PERDURE_FAULT"] = fault
    return env


class Child:
    """A ``_child.py`` process speaking JSON lines on stdout, commands on stdin."""

    def __init__(self, *args: str, stderr_path: Path, fault: str | None = None) -> None:
        self.stderr_path = stderr_path
        self._stderr = open(stderr_path, "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), *args],
            cwd=REPO_ROOT,
            env=child_env(fault),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            bufsize=0,
        )
        self._buffer = b""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")

    def read(self, timeout: float = 20.0) -> dict[str, Any]:
        """The next JSON line; fails the test (with the child's stderr) on timeout or EOF."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([fd], [], [], max(left, 0))
            if not ready:
                raise AssertionError(f"child {self.pid} said nothing for {timeout}s{self._err()}")
            chunk = os.read(fd, 65536)
            if not chunk:
                raise AssertionError(f"child {self.pid} closed stdout{self._err()}")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        result: dict[str, Any] = json.loads(line)
        return result

    def wait(self, timeout: float = 20.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"child {self.pid} did not exit{self._err()}") from None

    def _err(self) -> str:
        self._stderr.flush()
        text = self.stderr_path.read_text(errors="replace").strip()
        return f"; its stderr:\n{text}" if text else ""

    def stderr(self) -> str:
        return self._err()

    def close(self) -> None:
        """Kill (if still running) and reap; idempotent. SIGCONT first, in case it is stopped."""
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGCONT)
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()
        self._stderr.close()
