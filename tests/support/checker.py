"""The history checker: DESIGN.md's invariants over a whole log and the tools' ledger.

It reads every record of the log (read-only, so it can run beside a live owner)
and the side-effect ledger written by ``ledger_tools``, and reports violations in
words. The log is an LMDB directory or a PostgreSQL URL; only LMDB promises a
gap-free global sequence (PostgreSQL's sequence may skip numbers), so only there
is that checked. ``check`` returns the list of violations; an empty list means the history
is sound. It also returns counts so tests can assert the history was not vacuous.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from attrs import define, field

from perdure.actors.conversation import messages
from perdure.actors.state import SessionState
from perdure.providers.base import ToolResultBlock, ToolUseBlock
from perdure.storage.backend import is_postgres
from perdure.storage.lmdb_log import LmdbLog
from perdure.storage.records import (
    FINAL_RUN_STATUSES,
    Committed,
    GenerationStarted,
    GoalRevised,
    InputAccepted,
    RunFinished,
    RunStarted,
    ToolCancelled,
    ToolCompleted,
    ToolExecuting,
    ToolOutcomeUnknown,
    ToolTaskCreated,
)
from tests.support.ledger_tools import read_ledger


@define
class Report:
    violations: list[str] = field(factory=list)
    counts: Counter[str] = field(factory=Counter)
    replay_policies: set[str] = field(factory=set)

    def add(self, text: str) -> None:
        self.violations.append(text)


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
    return check_history(read_log(log), ledger, settled=settled, gap_free=not is_postgres(log))


def check_history(
    committed: list[Committed],
    ledger: list[dict[str, Any]] | None = None,
    *,
    settled: bool = True,
    gap_free: bool = True,
) -> Report:
    """The invariants over records in log order (and, if given, the effect ledger).

    ``gap_free``: the global sequence must run 1, 2, 3, ... (LMDB). Otherwise it
    must only increase strictly (PostgreSQL allows gaps).
    """
    report = Report()
    for i, c in enumerate(committed, start=1):
        if gap_free and c.seq != i:
            report.add(f"sequence gap: expected {i}, found {c.seq}")
            break
        if not gap_free and i > 1 and c.seq <= committed[i - 2].seq:
            report.add(f"sequence not increasing: {committed[i - 2].seq} then {c.seq}")
            break
    by_session: dict[str, list[Committed]] = defaultdict(list)
    for c in committed:
        report.counts[type(c.record).__name__] += 1
        if c.record.session_id:
            by_session[c.record.session_id].append(c)
    never_calls: set[tuple[str, str]] = set()  # (session id, call id)
    for session_id, records in by_session.items():
        _check_session(report, session_id, records, settled, never_calls)
    if ledger is not None:
        _check_ledger(report, committed, ledger, never_calls)
    return report


def _check_session(
    report: Report,
    sid: str,
    records: list[Committed],
    settled: bool,
    never_calls: set[tuple[str, str]],
) -> None:
    finals: Counter[str] = Counter()
    final_runs: set[str] = set()
    final_subs: set[str] = set()
    accepted: list[str] = []
    requests: Counter[str] = Counter()
    created: dict[str, ToolTaskCreated] = {}
    results: dict[str, list[Any]] = defaultdict(list)
    completed_at: dict[str, int] = {}
    goal_rev = 0
    task_rev: dict[str, int] = {}
    for c in records:
        r = c.record
        if isinstance(r, InputAccepted):
            accepted.append(r.submission_id)
            requests[r.request_id] += 1
        elif isinstance(r, RunStarted):
            if r.submission_id in final_subs:
                report.add(f"{sid}: run {r.run_id} started after its input had a final outcome")
            if r.resumed_from in final_runs:
                report.add(f"{sid}: run {r.run_id} resumes the finished run {r.resumed_from}")
        elif isinstance(r, RunFinished):
            if r.status in FINAL_RUN_STATUSES:
                finals[r.submission_id] += 1
                final_subs.add(r.submission_id)
                final_runs.add(r.run_id)
        elif isinstance(r, GoalRevised):
            goal_rev = r.goal_rev
        elif isinstance(r, GenerationStarted):
            if r.goal_rev < goal_rev:
                report.add(f"{sid}: generation {r.generation_id} started under old revision")
        elif isinstance(r, ToolTaskCreated):
            created[r.call_id] = r
            # A compensation undoes an old goal's action on request: it advances no goal.
            if not r.compensates:
                task_rev[r.call_id] = r.goal_rev
        elif isinstance(r, ToolExecuting):
            report.replay_policies.add(r.replay)
            if r.replay == "never":
                never_calls.add((sid, r.call_id))
            if r.call_id in completed_at:
                report.add(f"{sid}: {r.call_id} executed again after it had completed")
            if task_rev.get(r.call_id, goal_rev) < goal_rev:
                report.add(f"{sid}: {r.call_id} of an old revision was dispatched after a revision")
        elif isinstance(r, ToolCompleted | ToolOutcomeUnknown | ToolCancelled):
            results[r.call_id].append(r)
            if isinstance(r, ToolCompleted):
                completed_at[r.call_id] = c.seq
            if isinstance(r, ToolOutcomeUnknown) and "UNKNOWN" not in r.output:
                report.add(f"{sid}: unknown outcome of {r.call_id} is not stated plainly")
    for request_id, n in requests.items():
        if n > 1:
            report.add(f"{sid}: request {request_id} accepted {n} times")
    for sub in accepted:
        if finals[sub] > 1:
            report.add(f"{sid}: input {sub} has {finals[sub]} final outcomes")
        if settled and finals[sub] == 0:
            report.add(f"{sid}: input {sub} was accepted but never answered (lost)")
    for call_id, found in results.items():
        if len(found) > 1:
            kinds = [type(x).__name__ for x in found]
            report.add(f"{sid}: {call_id} has {len(found)} results: {kinds}")
    if settled:
        for call_id in created:
            if call_id not in results:
                report.add(f"{sid}: tool call {call_id} has no result")
        _check_transcript(report, sid, records)


def _check_transcript(report: Report, sid: str, records: list[Committed]) -> None:
    state = SessionState.fold(sid, records)
    uses: Counter[str] = Counter()
    answered: Counter[str] = Counter()
    for message in messages(state):
        for block in message.content:
            if isinstance(block, ToolUseBlock):
                uses[block.id] += 1
            elif isinstance(block, ToolResultBlock):
                answered[block.tool_use_id] += 1
    for call_id, _n in uses.items():
        if answered[call_id] != 1:
            report.add(f"{sid}: transcript pairs {call_id} with {answered[call_id]} results")
    for task in state.tasks.values():
        if isinstance(task.result, ToolOutcomeUnknown):
            report.counts["unknown_stated"] += 1


def _check_ledger(
    report: Report,
    committed: list[Committed],
    ledger: list[dict[str, Any]],
    never: set[tuple[str, str]],
) -> None:
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
