"""The history checker: the invariants of docs/DESIGN.md over a whole log and the tools' ledger.

The log part is ``perdure.check`` (the same code as ``perdure check``); this module
adds the side-effect ledger written by ``ledger_tools``: every effect must have an
``executing`` record before it, and a NEVER call takes effect at most once. The log
is an LMDB directory or a PostgreSQL URL; only LMDB promises a gap-free global
sequence (PostgreSQL's sequence may skip numbers), so for PostgreSQL the sequence
must only increase.
``check`` returns a report whose ``violations`` list is empty when the history is
sound, with counts so tests can assert the history was not vacuous.
"""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path
from typing import Any

from perdure.check import Report, check_log, check_records
from perdure.storage import is_postgres
from perdure.storage.lmdb_log import LmdbLog
from perdure.storage.records import Committed, ToolExecuting
from tests.support.ledger_tools import read_ledger

__all__ = ["Report", "assert_sound", "check", "check_history", "read_log"]


def read_log(log: Path | str) -> list[Committed]:
    if is_postgres(log):
        from perdure.storage.pg_log import PgLog

        pg = PgLog(str(log), readonly=True)
        try:
            return pg.read_global()
        finally:
            pg.close()
    lmdb_log = LmdbLog(log, readonly=True)
    try:
        return lmdb_log.read_global()
    finally:
        lmdb_log.close()


def check(log: Path | str, workspace: Path | None = None, *, settled: bool = True) -> Report:
    """Check every invariant. ``settled``: the runtime finished all its work."""
    ledger = read_ledger(workspace) if workspace is not None else None
    if not is_postgres(log):
        report = check_log(log, settled="all" if settled else "none")
        if ledger is not None:
            _check_ledger(report, read_log(log), ledger, report.never_calls)
        return report
    committed = read_log(log)
    report = check_history(committed, ledger, settled=settled)
    for before, after in itertools.pairwise(committed):
        if after.seq <= before.seq:
            report.add(f"sequence not increasing: {before.seq} then {after.seq}")
            break
    return report


def check_history(
    committed: list[Committed],
    ledger: list[dict[str, Any]] | None = None,
    *,
    settled: bool = True,
) -> Report:
    """The invariants over records held in memory (e.g. the pure-core fuzz's history)."""
    report = check_records(committed, settled="all" if settled else "none")
    if ledger is not None:
        _check_ledger(report, committed, ledger, report.never_calls)
    return report


def assert_sound(plan: dict[str, Any], *, settled: bool = True) -> Report:
    """Check a child plan's log and ledger; fail the test with every violation."""
    report = check(Path(plan["log"]), Path(plan["workspace"]), settled=settled)
    assert report.violations == [], "\n".join(report.violations)
    return report


def _check_ledger(
    report: Report,
    committed: list[Committed],
    ledger: list[dict[str, Any]],
    never: set[tuple[str, str]],
) -> None:
    # Call ids are unique within a session, so effects are counted per (session, call).
    executing = {
        (c.record.session_id, c.record.call_id)
        for c in committed
        if isinstance(c.record, ToolExecuting)
    }
    effects: Counter[tuple[str, str]] = Counter()
    for entry in ledger:
        if entry["event"] != "effect":
            continue
        key = (entry.get("session_id", "s1"), entry["call_id"])
        effects[key] += 1
        report.counts["effects"] += 1
        if key not in executing:
            report.add(f"unexpected effect of {key}: no executing record before it")
    for key in never:
        if effects[key] > 1:
            report.add(f"NEVER tool call {key} took effect {effects[key]} times")
