"""Runtime tests on a clock the test controls: a ``MemoryLog`` under an autojumping MockClock.

A module imports the fixtures ``log_kind``, ``clock`` and ``where``; a test that takes
``clock`` (pytest-trio runs it on that clock) and ``where`` runs twice:

* ``memory``: the log is a ``MemoryLog`` (the Journal commits inline, no thread),
  trio's clock is ``MockClock(autojump_threshold=0)`` and the runtime's record
  clock reads it too, so every back-off, heartbeat throttle, watchdog and idle
  timeout is decided by virtual time alone: a ten-minute back-off takes no real
  time, and two runs of a test see the very same times;
* ``lmdb``: a real LMDB log in a temporary directory, on a MockClock that runs at
  the wall clock's rate (trio's own class, never jumping), so the same test also
  proves the real writer thread and the real disk.

``where.open()`` is the ``log=`` of ``open_runtime``; called again it is the same
log opened anew, as a restarted process would (``MemoryLog.reopen``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from trio.testing import MockClock

from perdure.storage.memory_log import MemoryLog

# Virtual time starts at 0; records carry a plausible wall time nonetheless.
_EPOCH = 1_767_225_600.0  # 2026-01-01T00:00:00Z


class Where:
    """Where a deterministic test's runtime keeps its log, and the clock it stamps records with."""

    def __init__(self, kind: str, clock: MockClock | None, tmp_path: Path) -> None:
        self.kind = kind
        self._path = tmp_path / "log"
        self._memory: MemoryLog | None = None
        self.wall: Callable[[], float]
        if kind == "memory":
            assert clock is not None, "a MemoryLog test runs on the MockClock it is given"
            self.wall = lambda: _EPOCH + clock.current_time()
        else:
            self.wall = time.time

    @classmethod
    def real(cls, tmp_path: Path) -> Where:
        """An LMDB log in real time, for a test that must not run on a MockClock (one
        whose tool works in a thread: an autojumping clock would jump while it works)."""
        return cls("lmdb", None, tmp_path)

    @property
    def virtual(self) -> bool:
        """True when time is the MockClock's alone (a test may then assert exact times)."""
        return self.kind == "memory"

    def open(self) -> Any:
        """The ``log`` argument of the next ``open_runtime`` (the same log each time)."""
        if self.kind != "memory":
            return self._path
        if self._memory is None:
            self._memory = MemoryLog(clock=self.wall)
        else:
            self._memory = self._memory.reopen()
        return self._memory

    def options(self, **more: Any) -> dict[str, Any]:
        """``open_runtime`` keyword arguments: the log, the record clock, then ``more``."""
        return {"clock": self.wall, **more}


@pytest.fixture(params=["memory", "lmdb"])
def log_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


@pytest.fixture
def clock(log_kind: str) -> MockClock:
    if log_kind == "memory":
        return MockClock(autojump_threshold=0)
    return MockClock(rate=1.0)  # real time: the LMDB writer thread works in it


@pytest.fixture
def where(log_kind: str, clock: MockClock, tmp_path: Path) -> Where:
    return Where(log_kind, clock, tmp_path)
