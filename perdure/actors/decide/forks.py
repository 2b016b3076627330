"""Forks: where a session's history may be forked, and the records of a fork; and which
workspace tree a rewind (or a fork with its files) restores.

A fork is taken at a settled point (the end of a run, or of a turn, with no
compensation open; or the end of an idle session's history), so it inherits no call
whose effect is in doubt; what it does inherit is taken up by its own ``recover``.
"""

from __future__ import annotations

from collections.abc import Sequence

from attrs import evolve

from perdure.actors.state import SessionState
from perdure.errors import Refused
from perdure.storage.records import (
    FINAL_RUN_STATUSES,
    Committed,
    Record,
    RunFinished,
    SessionCreated,
    SessionForked,
    SessionParked,
    ToolCancelled,
    ToolCompleted,
    ToolOutcomeUnknown,
    WorkspaceCheckpointed,
)


def fork_points(committed: Sequence[Committed]) -> list[int]:
    """The positions (seqs) of a session's history where a fork may be taken.

    A settled point is the end of a run (its final ``RunFinished``) or the end of a turn
    (the result that made every call of the current model turn terminal), with no
    compensation unfinished; and the end of the history when the session is idle. At
    such a point nothing runs: the fork inherits no call whose effect is in doubt, and
    what it does inherit (a turn to continue, queued input) is taken up by ``recover``.
    """
    if not committed:
        return []
    s = SessionState(committed[0].record.session_id)
    points: list[int] = []
    for c in committed:
        s.apply(c.record)
        s.note_committed(c)
        if _settled_at(s, c.record):
            points.append(c.seq)
    if s.idle and not s.parked and (not points or points[-1] != committed[-1].seq):
        points.append(committed[-1].seq)
    return points


def _settled_at(s: SessionState, record: Record) -> bool:
    if s.compensations:
        return False
    if isinstance(record, RunFinished):
        return record.status in FINAL_RUN_STATUSES and s.run is None
    if not isinstance(record, ToolCompleted | ToolOutcomeUnknown | ToolCancelled):
        return False
    run, gen = s.run, s.current_generation()
    return (
        run is not None
        and not run.cancel_requested
        and gen is not None
        and gen.phase == "completed"
        and gen.goal_rev == s.goal_rev
        and record.call_id in gen.call_ids
        and all(t.terminal for t in s.tasks_of(gen))
    )


def fork_position(committed: Sequence[Committed], at: int | str | None) -> int:
    """Where a fork ``at`` (None: the latest settled point; a run id: its end; a seq)
    is taken, or ``Refused`` naming the nearest valid points."""
    sid = committed[0].record.session_id if committed else "?"
    points = fork_points(committed)
    if not points:
        raise Refused("invalid_state", f"session {sid} has no settled point to fork at yet")
    if at is None:
        return points[-1]
    if isinstance(at, str):
        ends = [(c.seq, c.record) for c in committed if isinstance(c.record, RunFinished)]
        mine = [(seq, end) for seq, end in ends if end.run_id == at]
        if not mine:
            raise Refused("not_found", f"session {sid} has no finished run {at!r}")
        seq, end = mine[-1]
        if end.status == "interrupted":  # continued by a resumed run: its end is the end
            final = [
                n
                for n, r in ends
                if r.submission_id == end.submission_id and r.status in FINAL_RUN_STATUSES
            ]
            seq = final[-1] if final else seq
        if seq in points:
            return seq
        status = next(r.status for n, r in ends if n == seq)
        what = f"run {at} did not finish (it was {status})"
    else:
        if at in points:
            return at
        seq, what = at, f"{at} is not a settled point of session {sid}"
    nearest = ", ".join(
        [f"{p} (before)" for p in points if p < seq][-1:]
        + [f"{p} (after)" for p in points if p > seq][:1]
    )
    raise Refused(
        "invalid_state",
        f"cannot fork there: {what} (the end of a run or of a turn); the nearest valid "
        f"points are {nearest}",
    )


def fork_records(
    committed: Sequence[Committed], session_id: str, position: int, request_id: str, now: float
) -> tuple[Record, ...]:
    """The records of a fork: its own ``SessionCreated`` and ``SessionForked``, then a copy
    of every record of the source up to ``position`` under the fork's id (one commit).

    Copied calls keep their results and their ``executing`` records: they are history,
    never run again. The source's ``SessionParked`` is not copied (the fork is new).
    """
    source = committed[0].record
    assert isinstance(source, SessionCreated), "a session's history starts with SessionCreated"
    copies = tuple(
        evolve(c.record, session_id=session_id)
        for c in committed
        if c.seq <= position and not isinstance(c.record, SessionCreated | SessionParked)
    )
    created = SessionCreated(
        session_id=session_id,
        system=source.system,
        request_id=request_id,
        budget=source.budget,
        if_busy=source.if_busy,
        tools=source.tools,  # a fork of a sub-agent keeps its tools (not its parent call)
        at=now,
    )
    forked = SessionForked(
        session_id=session_id,
        source=source.session_id,
        position=position,
        request_id=request_id,
        records=len(copies),
        at=now,
    )
    return (created, forked, *copies)


def workspace_at(committed: Sequence[Committed], to: int | str) -> tuple[int, str]:
    """The position and the workspace tree a rewind ``to`` restores, or ``Refused``.

    ``to`` is a call id (the workspace just before that call's first checkpointed
    attempt) or a settled point of the history (``fork_points``: the workspace after
    the last checkpointed call before it, or, with none before it, before the first
    one after it). Only checkpoints of this session count: a workspace shared with
    other sessions or changed by hand between calls is put back as this session's
    calls left it.
    """
    sid = committed[0].record.session_id if committed else "?"
    marks = [(c.seq, c.record) for c in committed if isinstance(c.record, WorkspaceCheckpointed)]
    if not marks:
        raise Refused(
            "not_found",
            f"session {sid} has no workspace checkpoint: none of its calls changed the "
            "workspace through a checkpointed tool",
        )
    if isinstance(to, str):
        for seq, mark in marks:
            if mark.call_id == to:
                return seq, mark.before
        calls = ", ".join(dict.fromkeys(mark.call_id for _, mark in marks))
        raise Refused(
            "not_found", f"session {sid} has no checkpointed call {to!r} (its calls: {calls})"
        )
    position = fork_position(committed, to)
    earlier = [mark for seq, mark in marks if seq <= position and mark.after]
    if earlier:
        return position, earlier[-1].after
    later = [mark for seq, mark in marks if seq > position]
    if later:
        return position, later[0].before
    raise Refused(
        "invalid_state",
        f"session {sid} has no complete checkpoint at {position}: the after-snapshot of "
        f"call {marks[-1][1].call_id} is missing (the store failed then)",
    )
