"""The storage package's layers: the interface imports no backend, each backend imports alone.

``perdure.storage.backend`` is the interface (protocol, guard, session summary);
the errors live in ``perdure.storage.errors``; ``open_log`` in ``perdure.storage``
imports a backend only when a log of that kind is opened. A fresh interpreter
shows what each import drags in, so an import circle or an eager backend import
fails here.
"""

from __future__ import annotations

import subprocess
import sys

import attrs
import pytest

import perdure
import perdure.storage
from perdure.storage import SessionInfo, errors
from perdure.storage.records import GoalRevised, InputAccepted, RunFinished, SessionParked
from tests.support.procs import ROOT

BACKENDS = ("perdure.storage.lmdb_log", "perdure.storage.pg_log", "perdure.storage.memory_log")


def _loaded_after(statement: str) -> set[str]:
    code = f"import sys\n{statement}\nprint(' '.join(sorted(sys.modules)))\n"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return set(out.stdout.split())


def test_the_interface_and_the_package_import_no_backend() -> None:
    for statement in ("import perdure.storage.backend", "import perdure.storage", "import perdure"):
        loaded = _loaded_after(statement)
        assert not loaded & set(BACKENDS), statement


@pytest.mark.parametrize("backend", BACKENDS[:2])
def test_each_backend_imports_on_its_own(backend: str) -> None:
    # A circle between a backend and the interface shows as an ImportError here.
    assert backend in _loaded_after(f"import {backend}")


def test_the_errors_are_one_set_reexported_by_the_package() -> None:
    for name in ("LogError", "LogBusy", "LogFenced", "SessionFenced", "NotOwner", "StaleGoal"):
        assert getattr(perdure.storage, name) is getattr(errors, name)
    assert perdure.LogError is errors.LogError


def accepted(n: int) -> InputAccepted:
    return InputAccepted(
        session_id="s", submission_id=f"u{n}", request_id=f"r{n}", text="hi", body_hash="h", at=0.0
    )


def test_the_session_summary_advances_by_one_rule() -> None:
    info = SessionInfo.empty("s").advanced(7, accepted(1))
    assert info == SessionInfo(
        "s", first_seq=7, last_seq=7, records=1, goal_rev=0, open_submissions=1
    )
    info = info.advanced(8, accepted(2))
    revised = GoalRevised(session_id="s", goal_rev=2, text="g", request_id="r3", at=0.0)
    info = info.advanced(9, revised)
    assert (info.first_seq, info.last_seq, info.records, info.goal_rev) == (7, 9, 3, 2)
    assert info.open_submissions == 2
    done = RunFinished(session_id="s", run_id="run", submission_id="u1", status="completed", at=0.0)
    assert info.advanced(10, done).open_submissions == 1
    interrupted = attrs.evolve(done, status="interrupted")
    assert info.advanced(10, interrupted).open_submissions == 2
    assert (
        info.advanced(10, SessionParked(session_id="s", reason="x", at=0.0)).open_submissions == 0
    )
    assert SessionInfo.empty("s").advanced(1, done).open_submissions == 0  # never below zero


def test_a_run_of_records_advances_the_summary_as_each_one_would() -> None:
    done = RunFinished(session_id="s", run_id="run", submission_id="u1", status="completed", at=0.0)
    revised = GoalRevised(session_id="s", goal_rev=4, text="g", request_id="rg", at=0.0)
    parked = SessionParked(session_id="s", reason="x", at=0.0)
    runs = [
        [accepted(1)],
        [accepted(1), accepted(2), revised, done],
        [done, done, accepted(3)],  # never below zero on the way
        [accepted(1), parked, accepted(2)],
    ]
    for start in (SessionInfo.empty("s"), SessionInfo("s", 3, 9, 7, 1, 2)):
        for run in runs:
            one_by_one = start
            for i, record in enumerate(run):
                one_by_one = one_by_one.advanced(20 + i, record)
            assert start.advanced_all(20, run) == one_by_one, (start, run)
