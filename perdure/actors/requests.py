"""Request ids: which caller's command a record answers, for idempotent retries.

A caller may send a command again under the same request id (its answer was lost, the
actor it spoke to restarted). The core answers the retry with what the first one did,
and refuses the id reused for another command (``decide/commands.py``, ``_seen``). What a
request id did is in the log: the record its command committed carries the id. This
module reads such a record back as its command: the command's kind, the hash of its
body computed as the command computes it (``perdure.actors.protocol``), and what it
produced. The fold keeps the answers by request id (``SessionState.requests``); this
table is the one place that knows how each command is written down, so the fold itself
reads records and knows no command.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from perdure.actors.entities import RequestSeen, Run
from perdure.actors.protocol import (
    Approve,
    Cancel,
    CompactContext,
    Compensate,
    Pause,
    Resolve,
    Resume,
    Revise,
    Rewind,
    Submit,
    with_budget_hash,
)
from perdure.storage.records import (
    ApprovalDecided,
    CancelRequested,
    CompactionStarted,
    CompensationRequested,
    GoalRevised,
    InputAccepted,
    Record,
    ResolutionDecided,
    SessionPaused,
    SessionResumed,
    WorkspaceRestoreStarted,
)

__all__ = ["ANSWERS", "answered"]


def answered(record: Record, run: Run | None) -> RequestSeen | None:
    """What the command behind ``record``, a record of ``ANSWERS``, did (None: a
    compaction the core started itself answers no caller).

    ``run`` is the session's current run: a revision steered into it answers the submit
    of its request.
    """
    return ANSWERS[type(record)](record, run)


def _submitted(r: InputAccepted, run: Run | None) -> RequestSeen:
    disposition = "queued" if r.interrupts is None else "interrupted"
    return RequestSeen(Submit.kind, r.body_hash, r.submission_id, disposition=disposition)


def _approved(r: ApprovalDecided, run: Run | None) -> RequestSeen:
    return RequestSeen(Approve.kind, Approve.hash_of(r.call_id, r.approved), r.call_id)


def _resolved(r: ResolutionDecided, run: Run | None) -> RequestSeen:
    return RequestSeen(Resolve.kind, Resolve.hash_of(r.call_id, r.action, r.result), r.call_id)


def _cancelled(r: CancelRequested, run: Run | None) -> RequestSeen:
    return RequestSeen(Cancel.kind, Cancel.hash_of(), r.run_id)


def _revised(r: GoalRevised, run: Run | None) -> RequestSeen:
    body = with_budget_hash(r.text, r.budget)
    if r.steered and run is not None:  # a submit steered into the running request
        return RequestSeen(Submit.kind, body, run.submission_id, disposition="steered")
    return RequestSeen(Revise.kind, body, str(r.goal_rev))


def _paused(r: SessionPaused, run: Run | None) -> RequestSeen:
    return RequestSeen(Pause.kind, Pause.hash_of(), "")


def _resumed(r: SessionResumed, run: Run | None) -> RequestSeen:
    return RequestSeen(Resume.kind, Resume.hash_of(), "")


def _compensation(r: CompensationRequested, run: Run | None) -> RequestSeen:
    return RequestSeen(Compensate.kind, Compensate.hash_of(r.call_id), r.compensation_id)


def _compaction(r: CompactionStarted, run: Run | None) -> RequestSeen | None:
    if r.request_id is None:  # one the core started itself, no caller's
        return None
    return RequestSeen(CompactContext.kind, CompactContext.hash_of(), r.compaction_id)


def _rewind(r: WorkspaceRestoreStarted, run: Run | None) -> RequestSeen:
    return RequestSeen(Rewind.kind, Rewind.hash_of(r.position, r.tree), r.tree)


# The records a caller's command commits, each with how it is read back as that command.
ANSWERS: dict[type, Callable[[Any, Run | None], RequestSeen | None]] = {
    InputAccepted: _submitted,
    ApprovalDecided: _approved,
    ResolutionDecided: _resolved,
    CancelRequested: _cancelled,
    GoalRevised: _revised,
    SessionPaused: _paused,
    SessionResumed: _resumed,
    CompensationRequested: _compensation,
    CompactionStarted: _compaction,
    WorkspaceRestoreStarted: _rewind,
}
