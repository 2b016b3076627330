"""Sessions as a whole: create, fork, delete, and whether one must be kept for another.

These decisions span a session's first records, or two sessions (a sub-agent and
the session whose call waits for it), so they are not a session actor's: the
supervisor and ``perdure.retention`` read what they need from the log, ask these
functions, and persist what they return. Each is pure: the records to commit, or
``Refused`` / ``UnknownSession`` naming why nothing is recorded.

* ``create`` — creation is idempotent by session id: a session that exists answers
  "already there", unless it was created with another system prompt (a conflict). A
  sub-agent's task is accepted in the creation's own commit, so a child never exists
  without its task.
* ``fork`` — a fork is idempotent by its request id; it is taken at a settled point of
  the source (``forks.fork_position``) and copies the prefix in one commit.
* ``orphaned`` — a sub-agent found with work at start-up whose parent call is over is
  cancelled (the supervisor asks once every session has recovered, so the parent's
  own recovery has settled its calls first).
* ``dependency`` / ``deletion`` — a sub-agent's session is kept while the parent call
  that waits for it is unfinished (deleting it early would let a re-run of that call
  after a crash start a second child); a session with unfinished work is not deleted.
* ``check_grant`` / ``allowed_tools`` — a session may be granted some of the registered
  tools (a sub-agent usually is): the grant is checked when the session is created and
  recorded in its ``SessionCreated``; every decision about the session then sees only
  the tools it grants (``allowed_tools`` narrows the ``Env``'s tools).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from attrs import frozen

from perdure.actors.decide.commands import command
from perdure.actors.decide.forks import fork_position, fork_records, workspace_at
from perdure.actors.protocol import Cancel, Env, Forked, Submit
from perdure.actors.state import SessionState
from perdure.errors import Refused, UnknownSession
from perdure.storage.backend import SessionInfo
from perdure.storage.records import (
    Budget,
    Committed,
    CompactionPolicy,
    Record,
    SessionCreated,
    SessionDeleted,
    SessionForked,
    WorkspaceRestoreStarted,
)
from perdure.tools.contract import Tool


def allowed_tools(tools: Mapping[str, Tool], allowed: Iterable[str] | None) -> Mapping[str, Tool]:
    """The registered tools a session may use (a sub-agent may be limited to some)."""
    if allowed is None:
        return tools
    names = set(allowed)
    return {n: t for n, t in tools.items() if n in names}


def check_grant(grant: Iterable[str] | None, tools: Mapping[str, Tool]) -> list[str] | None:
    """A session's grant of tools as it is recorded (names in order, each once), or
    ``ValueError`` naming what is wrong with it; None grants every tool."""
    if grant is None:
        return None
    if isinstance(grant, str):
        raise ValueError(f"tools must be a list of tool names, not the string {grant!r}")
    names = list(dict.fromkeys(grant))
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise ValueError(f"tools must be tool names (strings), not {bad!r}")
    unknown = [n for n in names if n not in tools]
    if unknown:
        registered = ", ".join(sorted(tools)) or "none"
        raise ValueError(
            f"tools: no tool named {', '.join(map(repr, unknown))} is registered "
            f"(registered: {registered})"
        )
    return names


@frozen(kw_only=True)
class NewSession:
    """A request to create a session: what its ``SessionCreated`` will hold, and for a
    sub-agent its ``parent`` call ("session/call_id"), allowed ``tools`` and ``task``."""

    session_id: str
    system: str | None = None
    budget: Budget | None = None
    if_busy: str | None = None
    parent: str | None = None
    tools: list[str] | None = None
    task: Submit | None = None
    compaction: CompactionPolicy | None = None  # the session's own (None: the runtime's)


def create(
    new: NewSession, existing: Sequence[Committed] | None, env: Env, now: float
) -> tuple[Record, ...]:
    """The records that create ``new``; none if it exists already (``existing``: its
    first record, as read; None if there is no such session). Asking again with
    another system prompt or another grant of tools is a conflict.

    ``env`` is the runtime's, narrowed to the session's allowed tools: the task is
    decided as that session would decide it.
    """
    if existing is not None:
        created = existing[0].record if existing else None
        if (
            new.system is not None
            and isinstance(created, SessionCreated)
            and created.system != new.system
        ):
            raise Refused(
                "conflict",
                f"session {new.session_id!r} already exists with a different system prompt",
            )
        if (
            new.tools is not None
            and new.parent is None  # a sub-agent found again by a re-run keeps its own
            and isinstance(created, SessionCreated)
            and (created.tools is None or set(created.tools) != set(new.tools))
        ):
            raise Refused(
                "conflict",
                f"session {new.session_id!r} already exists with a different grant of tools",
            )
        return ()
    record = SessionCreated(
        session_id=new.session_id,
        system=new.system,
        budget=new.budget,
        if_busy=new.if_busy,
        parent=new.parent,
        tools=new.tools,
        compaction=new.compaction,
        at=now,
    )
    if new.task is None:
        return (record,)
    fresh = SessionState.fold(new.session_id, [Committed(0, record)])
    step, _ = command(fresh, env, new.task)
    return (record, *step.records)


@frozen
class ForkDecision:
    """What a fork request comes to: the answer, and the records to commit (none for a
    fork that exists already, asked again by its request id)."""

    forked: Forked
    records: tuple[Record, ...]


def fork(
    source: str,
    session_id: str,
    at: int | str | None,
    request_id: str,
    *,
    existing: Sequence[Committed] | None,
    history: Sequence[Committed],
    now: float,
    files: bool = False,
) -> ForkDecision:
    """Fork ``source`` into ``session_id`` at ``at`` (None: its latest settled point; a
    run id: that run's end; a seq).

    ``existing``: the first two records of ``session_id`` if it exists (None if not);
    ``history``: the source's whole history (read only if ``session_id`` is new).
    ``files``: restore the workspace's files as they were at that point, too.
    """
    if existing is not None:
        lineage = existing[-1].record if len(existing) == 2 else None
        if not (
            isinstance(lineage, SessionForked)
            and lineage.request_id == request_id
            and lineage.source == source
        ):
            raise Refused(
                "conflict",
                f"session {session_id!r} already exists and is not this fork "
                f"(request id {request_id!r} of {source!r})",
            )
        return ForkDecision(Forked(session_id, source, lineage.position, duplicate=True), ())
    if not history:
        raise UnknownSession(source)
    position = fork_position(history, at)
    records = fork_records(history, session_id, position, request_id, now)
    if files:
        # The fork's recovery restores the files before its first run goes on (no run
        # starts while a restore is under way), so the fork works on the files it had.
        _, tree = workspace_at(history, position)
        restore = WorkspaceRestoreStarted(
            session_id=session_id,
            tree=tree,
            position=position,
            request_id=fork_files_request(request_id),
            at=now,
        )
        records = (*records, restore)
    return ForkDecision(Forked(session_id, source, position), records)


def fork_files_request(request_id: str) -> str:
    """The request id of the restore of a fork's files."""
    return f"{request_id}/files"


def parent_call(first: Sequence[Committed]) -> tuple[str, str] | None:
    """The (session, call id) a sub-agent's session was started by, from its first
    record; None for any other session."""
    created = first[0].record if first else None
    if not isinstance(created, SessionCreated) or not created.parent:
        return None
    # A session id never holds "/" (``check_session_id``); a model's call id may.
    parent, _, call_id = created.parent.partition("/")
    return parent, call_id


def dependency(first: Sequence[Committed], parent_history: Sequence[Committed]) -> str | None:
    """Why the session must be kept for another one, or None.

    ``first``: the session's first record; ``parent_history``: the whole log of the
    session named by ``parent_call(first)``, as read (empty: it has no records). A
    sub-agent's session is kept while the parent call that runs it is unfinished; the
    parent's log is folded here, so the shell that read it needs no fold of its own.
    """
    link = parent_call(first)
    if link is None or not parent_history:
        return None
    task = SessionState.fold(link[0], parent_history).tasks.get(link[1])
    if task is not None and not task.terminal:
        return f"its parent call {link[0]}/{link[1]} still waits for it"
    return None


def orphaned(first: Sequence[Committed], parent_history: Sequence[Committed]) -> Cancel | None:
    """The cancel of a recovered sub-agent whose parent call is over without it, or None.

    A crash between the parent's cancel (or revision) and the child's leaves a child
    whose answer nobody waits for: the parent's recovery settled its call. The cancel
    is idempotent by a request id derived from the parent call, so a second start
    decides the same and records nothing more. ``first`` and ``parent_history`` as for
    ``dependency``; a sub-agent whose parent call still waits is not an orphan.
    """
    link = parent_call(first)
    if link is None or dependency(first, parent_history) is not None:
        return None
    return Cancel(request_id=f"orphan:{link[0]}/{link[1]}")


def refuse_unfinished(session_id: str, info: SessionInfo | None) -> None:
    """A session with unfinished work (an input or a compensation open) is not deleted."""
    if info is not None and info.open_submissions:
        raise Refused("busy", f"session {session_id} has unfinished work; not deleted")


def deletion(
    session_id: str, info: SessionInfo | None, kept_for: str | None, reason: str, now: float
) -> SessionDeleted:
    """The marker whose commit removes the session's records (the log itself refuses it
    while the session has unfinished work), or why it may not be deleted."""
    if info is None:
        raise UnknownSession(session_id)
    if kept_for is not None:
        raise Refused("busy", f"session {session_id} is not deleted: {kept_for}")
    return SessionDeleted(deleted=session_id, reason=reason, at=now)
