"""Which session and request ``perdure run`` uses for a task: the command's identity.

The rule: a run of a task is named by the task's text and the workspace's absolute
path, in the log the command names. The first run of a task in a workspace is session
``run-<digest>``; each ``--new`` starts the next one (``run-<digest>.2``, ``.3``, …).
Without ``--new`` the command goes back to the latest of them: it continues that run if
it was interrupted (its input's request id is derived from the session and the task, so
the log deduplicates the submission and recovery carries on the same calls under the
same idempotency keys), or reports its outcome if it finished, running nothing.

Everything here but ``find_previous`` is a pure function of its arguments;
``find_previous`` reads the log, read-only, before the command takes ownership of it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

from attrs import frozen

from perdure.storage.backend import LogBackend
from perdure.storage.records import Committed, InputAccepted, RunFinished


def task_digest(workspace: Path, task: str) -> str:
    """The digest that names a task's runs: its text and the workspace's absolute path."""
    key = f"{workspace.resolve()}\x00{task}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def numbered_session(digest: str, n: int) -> str:
    """The session id of the n-th run (from 1) of the task with this digest."""
    return f"run-{digest}" if n == 1 else f"run-{digest}.{n}"


def derived_request_id(session_id: str, task: str) -> str:
    """The task's request id in a session: the same command submits it once."""
    return "run-" + hashlib.sha256(f"{session_id}\x00{task}".encode()).hexdigest()[:24]


@frozen
class Previous:
    """An earlier submission of the same request: when it was accepted, how it ended."""

    session_id: str
    submission_id: str
    accepted_at: float
    finished: RunFinished | None  # None: it was interrupted (or is still running)


def previous_submission(
    session_id: str, request_id: str, records: Sequence[Committed]
) -> Previous | None:
    """The submission of ``request_id`` among a session's records, and its final run."""
    accepted: InputAccepted | None = None
    finished: RunFinished | None = None
    for committed in records:
        rec = committed.record
        if isinstance(rec, InputAccepted) and rec.request_id == request_id:
            accepted = rec
        elif (
            accepted is not None
            and isinstance(rec, RunFinished)
            and rec.submission_id == accepted.submission_id
            and rec.status != "interrupted"
        ):
            finished = rec
    if accepted is None:
        return None
    return Previous(session_id, accepted.submission_id, accepted.at, finished)


@frozen
class Choice:
    """The session a run uses, and what an earlier run of it left (None: a fresh one)."""

    session_id: str
    request_id: str
    previous: Previous | None


def choose(
    log: LogBackend | None,
    *,
    workspace: Path,
    task: str,
    session_id: str | None,
    request_id: str | None,
    new: bool,
) -> Choice:
    """Apply the rule to the log (None: there is no log yet)."""
    if session_id is None:
        digest = task_digest(workspace, task)
        runs = 0
        while log is not None and log.session_info(numbered_session(digest, runs + 1)) is not None:
            runs += 1
        session_id = numbered_session(digest, runs + 1 if new or runs == 0 else runs)
    rid = request_id or derived_request_id(session_id, task)
    previous = None
    if log is not None and log.session_info(session_id) is not None:
        previous = previous_submission(session_id, rid, log.read_session(session_id))
    return Choice(session_id, rid, previous)
