"""``perdure check``: verify a log's frames and the invariants of docs/DESIGN.md, read-only.

Two passes over one read transaction's view of the log (safe beside a running
owner: LMDB readers never block the writer):

1. every stored frame is decoded (format byte, CRC over seq + payload, known type
   and version); a damaged record is reported by its sequence number and the scan
   goes on, so one bad byte does not hide another; the sequence must be gap-free;
2. the decoded records are checked against the invariants, per session:

   * every accepted input gets exactly one final run outcome (none lost, none
     doubled) and a request id is accepted once;
   * a finished or cancelled run is never resumed, and no run starts for an input
     that already has its outcome;
   * a completed tool call is never executed again, and every call has at most one
     result (exactly one once the session is idle);
   * a NEVER call runs again only after a reconcile answered ``not_applied`` or a
     person chose ``retry``; it is never scheduled for an automatic retry, and no
     retry starts before its recorded back-off is over;
   * an unknown outcome is stated plainly to the model;
   * no model turn or tool dispatch of an old goal revision happens after a newer
     revision is in force;
   * once idle, the transcript pairs every tool call with exactly one result.

``check_log`` returns a ``Report``; an empty ``violations`` list means sound. The
test suite's history checker (``tests/support/checker.py``) adds the side-effect
ledger of its test tools on top of this one implementation.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from os import PathLike
from pathlib import Path
from typing import Any, Literal

from attrs import define, field

from perdure.actors.conversation import messages
from perdure.actors.state import SessionState
from perdure.providers.base import ToolResultBlock, ToolUseBlock
from perdure.storage import is_postgres, open_log
from perdure.storage.codec import CorruptRecord, decode
from perdure.storage.records import (
    FINAL_RUN_STATUSES,
    Committed,
    GenerationStarted,
    GoalRevised,
    InputAccepted,
    RecoveryDecision,
    ResolutionDecided,
    RunFinished,
    RunStarted,
    SessionDeleted,
    ToolCancelled,
    ToolCompleted,
    ToolExecuting,
    ToolOutcomeUnknown,
    ToolRetryPending,
    ToolTaskCreated,
    WorkspaceCheckpointed,
)

# The recovery decision after which a NEVER call may run once more (decide.results._reconciled).
RECONCILED_NOT_APPLIED = "reconcile answered not_applied"

Settled = Literal["all", "idle", "none"]
"""How finished the history must be: ``all`` sessions (the runtime finished all its
work), only the ``idle`` ones (a live or interrupted log), or ``none``."""


@define
class Report:
    violations: list[str] = field(factory=list)
    damaged: list[int] = field(factory=list)  # sequence numbers of undecodable records
    counts: Counter[str] = field(factory=Counter)
    replay_policies: set[str] = field(factory=set)
    never_calls: set[tuple[str, str]] = field(factory=set)  # (session, call) run as NEVER
    records: int = 0
    sessions: int = 0
    unfinished: list[str] = field(factory=list)  # sessions with work still pending

    def add(self, text: str) -> None:
        self.violations.append(text)

    @property
    def ok(self) -> bool:
        return not self.violations


def check_log(
    path: str | PathLike[str],
    *,
    settled: Settled = "idle",
    on_frame: Callable[[int], None] | None = None,
    workspace: str | PathLike[str] | None = None,
) -> Report:
    """Check the log at ``path`` (opened read-only). ``on_frame(seq)`` reports progress.

    ``workspace``: also check its checkpoint store against the log's checkpoints.
    """
    log = open_log(path, readonly=True)
    try:
        gap_free = not is_postgres(path)  # a PostgreSQL sequence may skip numbers
        committed = decode_frames(log.scan_frames(), report := Report(), on_frame, gap_free)
    finally:
        log.close()
    check_records(committed, settled=settled, report=report)
    if workspace is not None:
        check_workspace(committed, Path(workspace), report)
    return report


def check_workspace(committed: Iterable[Committed], workspace: Path, report: Report) -> None:
    """The workspace's checkpoint store is whole (``git fsck``) and holds every tree the
    log's ``WorkspaceCheckpointed`` records name, so that no rewind meets a missing one."""
    from perdure.tools.history import WorkspaceHistory  # runs git: only when asked

    history = WorkspaceHistory(workspace)
    marks = [c for c in committed if isinstance(c.record, WorkspaceCheckpointed)]
    if not history.exists():
        if marks:
            report.add(
                f"the workspace history store {history.store} is missing, but the log "
                f"records {len(marks)} checkpoint(s) of it: no rewind can restore them"
            )
        return
    for problem in history.check():
        report.add(problem)
    for c in marks:
        mark = c.record
        assert isinstance(mark, WorkspaceCheckpointed)
        for when, tree in (("before", mark.before), ("after", mark.after)):
            if tree and not history.has_tree(tree):
                report.add(
                    f"record {c.seq}: the {when}-checkpoint {tree[:12]} of call "
                    f"{mark.call_id} (session {mark.session_id}) is not in {history.store}"
                )


def last_seq(path: str | PathLike[str]) -> int:
    """The log's last sequence number (for a progress bar)."""
    log = open_log(path, readonly=True)
    try:
        return log.last_seq()
    finally:
        log.close()


def decode_frames(
    frames: Iterable[tuple[int, bytes]],
    report: Report,
    on_frame: Callable[[int], None] | None = None,
    gap_free: bool = True,
) -> list[Committed]:
    """Decode every frame; report damaged ones by seq, and gaps (or, where gaps are
    allowed, a sequence that does not increase).

    The records of deleted sessions leave gaps: they are sound when the numbers
    missing add up to the records the ``SessionDeleted`` markers say were removed.
    """
    out: list[Committed] = []
    expected = 1
    gaps: list[tuple[int, int]] = []  # (expected, found)
    missing = deleted = 0
    for seq, frame in frames:
        if on_frame is not None:
            on_frame(seq)
        if gap_free and seq > expected:
            gaps.append((expected, seq))
            missing += seq - expected
        elif seq < expected:
            report.add(f"sequence not increasing: record {seq} after {expected - 1}")
        expected = seq + 1
        try:
            record = decode(seq, frame)
        except CorruptRecord as exc:
            report.damaged.append(seq)
            report.add(str(exc))
            continue
        out.append(Committed(seq, record))
        if isinstance(record, SessionDeleted):
            deleted += record.records
    if gap_free and missing != deleted:
        for want, found in gaps:
            report.add(f"sequence gap: expected record {want}, found {found}")
        if deleted:
            report.add(
                f"{missing} sequence numbers are missing, but deleted sessions account "
                f"for {deleted} records"
            )
    return out


def check_records(
    committed: Iterable[Committed], *, settled: Settled = "idle", report: Report | None = None
) -> Report:
    """Check the invariants over decoded records (in sequence order)."""
    report = report if report is not None else Report()
    by_session: dict[str, list[Committed]] = defaultdict(list)
    for c in committed:
        report.records += 1
        report.counts[type(c.record).__name__] += 1
        if c.record.session_id:
            by_session[c.record.session_id].append(c)
    report.sessions = len(by_session)
    for session_id, records in by_session.items():
        _check_session(report, session_id, records, settled, bool(report.damaged))
    return report


def _check_session(
    report: Report, sid: str, records: list[Committed], settled: Settled, damaged: bool
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
    last_run: dict[str, ToolExecuting] = {}
    may_run_again: set[str] = set()  # NEVER calls a reconcile or a person allowed once more
    backing_off: dict[str, ToolRetryPending] = {}
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
        elif isinstance(r, RecoveryDecision):
            if r.found == RECONCILED_NOT_APPLIED:
                may_run_again.add(r.subject)
        elif isinstance(r, ResolutionDecided):
            if r.action == "retry":
                may_run_again.add(r.call_id)
                backing_off.pop(r.call_id, None)
        elif isinstance(r, ToolRetryPending):
            before = last_run.get(r.call_id)
            if before is not None and before.replay == "never":
                report.add(f"{sid}: NEVER call {r.call_id} was scheduled for an automatic retry")
            backing_off[r.call_id] = r
        elif isinstance(r, ToolExecuting):
            report.replay_policies.add(r.replay)
            if r.replay == "never":
                report.never_calls.add((sid, r.call_id))
            if r.call_id in completed_at:
                report.add(f"{sid}: {r.call_id} executed again after it had completed")
            _check_rerun(report, sid, r, last_run.get(r.call_id), may_run_again)
            pending = backing_off.pop(r.call_id, None)
            if pending is not None and r.at < pending.not_before:
                report.add(
                    f"{sid}: {r.call_id} attempt {r.attempt} started "
                    f"{pending.not_before - r.at:.3f}s before its back-off was over"
                )
            last_run[r.call_id] = r
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
    for call_id, found in results.items():
        if len(found) > 1:
            kinds = [type(x).__name__ for x in found]
            report.add(f"{sid}: {call_id} has {len(found)} results: {kinds}")

    state: SessionState | None = None
    if settled != "none":
        if damaged:
            # Any damaged record may belong to this session: a fold would be a guess, and
            # the damage is already reported by its sequence number.
            return
        try:
            state = SessionState.fold(sid, records)
        except Exception as exc:  # the fold is total on a sound history
            report.add(f"{sid}: its records do not fold into a state: {type(exc).__name__}: {exc}")
            return
        if not (state.idle or state.parked):
            report.unfinished.append(sid)
    complete = settled == "all" or (settled == "idle" and state is not None and state.idle)
    if not complete:
        return
    for sub in accepted:
        if finals[sub] == 0:
            report.add(f"{sid}: input {sub} was accepted but never answered (lost)")
    for call_id in created:
        if call_id not in results:
            report.add(f"{sid}: tool call {call_id} has no result")
    _check_transcript(report, sid, state if state is not None else SessionState.fold(sid, records))


def _check_rerun(
    report: Report,
    sid: str,
    executing: ToolExecuting,
    before: ToolExecuting | None,
    may_run_again: set[str],
) -> None:
    """A NEVER call's second execution needs a reason recorded before it (used once)."""
    if before is None:
        return
    if "never" not in (before.replay, executing.replay):
        return
    if executing.call_id in may_run_again:
        may_run_again.discard(executing.call_id)
        return
    report.add(
        f"{sid}: NEVER call {executing.call_id} ran again (attempt {executing.attempt}) "
        "without a reconcile answering not_applied or a person choosing retry"
    )


def _check_transcript(report: Report, sid: str, state: SessionState) -> None:
    uses: Counter[str] = Counter()
    answered: Counter[str] = Counter()
    for message in messages(state):
        for block in message.content:
            if isinstance(block, ToolUseBlock):
                uses[block.id] += 1
            elif isinstance(block, ToolResultBlock):
                answered[block.tool_use_id] += 1
    for call_id in uses:
        if answered[call_id] != 1:
            report.add(f"{sid}: transcript pairs {call_id} with {answered[call_id]} results")
    for task in state.tasks.values():
        if isinstance(task.result, ToolOutcomeUnknown):
            report.counts["unknown_stated"] += 1
