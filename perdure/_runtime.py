"""The Python API: ``open_runtime`` and ``Runtime``, a thin face over the supervisor.

``open_runtime`` opens (or creates) the log, takes ownership of it, starts the
Journal and the supervisor, and recovers every interrupted session before it
yields: by the time your code runs, pending work has already been re-issued.
On a normal exit it stops dispatching and lets running tools finish (up to
``shutdown_grace`` seconds) so that a deploy is a non-event; their results are
committed before the log is closed.

The log is a location: a directory (LMDB, one process) or a ``postgresql://`` URL
(PostgreSQL, several processes sharing sessions through leases; see
``perdure.storage.pg_log``). Everything above the log is the same code.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import sys
import time
import uuid
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Callable,
    Iterable,
    Mapping,
    Sequence,
)
from contextlib import aclosing, asynccontextmanager
from functools import partial
from os import PathLike
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

import attrs
import trio

from perdure import _threads, retention
from perdure import errors as perdure_errors
from perdure.actors import conversation, protocol
from perdure.actors.context import ActorContext
from perdure.actors.decide.forks import workspace_at
from perdure.actors.decide.sessions import check_grant, fork_files_request
from perdure.actors.mailbox import CommandMsg, Query
from perdure.actors.readmodel import StateLookup, session_view
from perdure.actors.state import SessionState
from perdure.actors.supervisor import Supervisor, dormant_state
from perdure.answers import CallDiff, Rewound
from perdure.budget import CompactionPolicy, Price, check_compaction
from perdure.errors import UnknownSession, find_exception
from perdure.inspect import summarize
from perdure.observability.hooks import (
    BackgroundObserver,
    CommitObserver,
    TransactionObserver,
    auto_observers,
    check_traceparent,
)
from perdure.providers.base import Message, Provider
from perdure.settings import Limits, Settings
from perdure.storage import (
    MEMORY,
    Durability,
    LogBackend,
    LogFenced,
    SessionInfo,
    open_log,
)
from perdure.storage.bus import Event, Subscription
from perdure.storage.journal import WAKE, Journal, JournalStats, open_journal
from perdure.storage.records import (
    AgentStarted,
    Budget,
    Committed,
    LogOpened,
    Record,
    ResolutionAction,
    RunFinished,
    ToolHeartbeat,
    WorkspaceRestored,
)
from perdure.stuck import DEFAULT_STUCK_AFTER, StuckRun, last_progress_at, stuck_run
from perdure.tools.contract import Tool, registry
from perdure.tools.history import WorkspaceHistory
from perdure.view import SessionLookup, SessionView

if TYPE_CHECKING:  # the mcp extra is imported only when MCP servers are configured
    from perdure.tools.mcp import McpHub, McpServer

log = logging.getLogger("perdure.runtime")
_PAGE = 512
SESSION_DELETED = "session_deleted"  # the last event of a deleted session's streams
T = TypeVar("T")
# What input does while a run is busy (``submit(if_busy=...)``), for the edges to check.
IfBusy = protocol.IfBusy
check_if_busy = protocol.check_if_busy


@attrs.frozen
class StreamStats:
    """The event streams of a runtime, at one moment (``Runtime.stream_stats``)."""

    open: int  # subscriptions: SSE clients and ``Runtime.events`` readers
    backlog: int  # events waiting in the fullest subscription's buffer
    lagged: int  # subscriptions dropped for falling behind, since the runtime opened


class Runtime:
    """A running perdure runtime. Obtain one with ``open_runtime``."""

    def __init__(
        self,
        supervisor: Supervisor,
        journal: Journal,
        mcp: McpHub | None = None,
        caller_trace: Callable[[], str] | None = None,
    ) -> None:
        self._sup = supervisor
        self._journal = journal
        self._ctx = supervisor.ctx
        self._mcp = mcp
        # The caller's current trace context, when tracing is on (perdure.observability).
        self._caller_trace = caller_trace

    @property
    def mcp(self) -> McpHub:
        """The MCP servers' connections (``open_runtime(..., mcp_servers=...)``)."""
        if self._mcp is None:
            raise AttributeError("this runtime was opened without mcp_servers")
        return self._mcp

    @property
    def tools(self) -> dict[str, Tool]:
        """Every tool the model may call, by name (MCP tools included)."""
        return dict(self._ctx.tools)

    @property
    def log_path(self) -> Path:
        """The LMDB directory (for a PostgreSQL log, see ``location``)."""
        path = getattr(self._journal.log, "path", None)
        if not isinstance(path, Path):
            raise AttributeError(f"{self.location} is not a directory log")
        return path

    @property
    def location(self) -> str:
        """Where the log is: a directory, or a PostgreSQL URL (without its password)."""
        return self._journal.log.location

    @property
    def node_id(self) -> str:
        """This process's name among the nodes sharing a PostgreSQL log."""
        return self._journal.log.node_id

    @property
    def epoch(self) -> int:
        return self._journal.log.epoch

    @property
    def recovered_sessions(self) -> list[str]:
        """Sessions that had unfinished work when this runtime started (and it runs)."""
        return list(self._sup.recovered)

    @property
    def taken_over_sessions(self) -> list[str]:
        """Sessions this node took over from a dead node after it started (PostgreSQL)."""
        return list(self._sup.taken_over)

    @property
    def received_sessions(self) -> list[str]:
        """Sessions other nodes handed to this one by rebalancing (PostgreSQL)."""
        return list(self._sup.received)

    @property
    def handed_over_sessions(self) -> list[str]:
        """Sessions this node handed to another one by rebalancing (PostgreSQL)."""
        return list(self._sup.handed_over)

    @property
    def resident_sessions(self) -> list[str]:
        """The sessions in memory now: with a running actor, or hibernated (the
        others live in the log only)."""
        running = [sid for sid, box in self._sup.mailboxes.items() if not box.evicted]
        return running + [sid for sid in self._sup.dormant.keys() - set(running)]

    @property
    def hibernated_sessions(self) -> list[str]:
        """The resident sessions whose actor hibernated: their state only, no task."""
        return list(self._sup.dormant)

    @property
    def frozen_sessions(self) -> list[str]:
        """The hibernated sessions whose state has been frozen into a compact blob
        (asleep for ``FREEZE_AFTER`` times ``hibernate_after``; unpickled when they wake)."""
        return [sid for sid, entry in self._sup.dormant.items() if isinstance(entry, bytes)]

    @property
    def evictions(self) -> int:
        """How many idle sessions have been evicted from memory since the runtime opened."""
        return self._sup.evictions

    @property
    def hibernations(self) -> int:
        """How many times an idle session's actor hibernated since the runtime opened."""
        return self._sup.hibernations

    def stream_stats(self) -> StreamStats:
        """The event streams open now (SSE clients, ``events`` readers), the events waiting
        in the fullest one's buffer, and how many were dropped for falling behind."""
        bus = self._journal.bus
        return StreamStats(len(bus.subscriptions()), bus.backlog(), bus.lagged)

    def stats(self) -> JournalStats:
        """A snapshot of the Journal's counters (appends, transactions, records)."""
        return attrs.evolve(self._journal.stats)

    # -- sessions -------------------------------------------------------------------

    async def create_session(
        self,
        session_id: str | None = None,
        *,
        system: str | None = None,
        budget: Budget | None = None,
        if_busy: protocol.IfBusy | None = None,
        tools: Iterable[str] | None = None,
        compaction: CompactionPolicy | None = None,
    ) -> str:
        """Create a session (idempotent for an explicit ``session_id``); return its id.

        ``budget`` replaces the runtime's default budget for this session; ``if_busy``
        is the session's default for input sent while a run is busy (see ``submit``).
        ``tools`` grants the session only these of the runtime's tools (None: all of
        them): the model is offered only those, and a call to any other is refused
        without running. The grant is recorded with the session, so it holds after a
        restart, in its forks and (at most) in its sub-agents. A name the runtime does
        not register raises ``ValueError``. Raises ``Refused("conflict")`` if the
        session exists with another system prompt or another grant. ``compaction``
        replaces the runtime's context compaction policy for this session (recorded
        with it; docs/COMPACTION.md).
        """
        sid = session_id or "s-" + uuid.uuid4().hex[:16]
        await self.ensure_session(
            sid, system=system, budget=budget, if_busy=if_busy, tools=tools, compaction=compaction
        )
        return sid

    async def ensure_session(
        self,
        session_id: str,
        *,
        system: str | None = None,
        budget: Budget | None = None,
        if_busy: protocol.IfBusy | None = None,
        tools: Iterable[str] | None = None,
        compaction: CompactionPolicy | None = None,
    ) -> bool:
        """Like ``create_session`` for an explicit id; True if this call created it."""
        policy = protocol.check_if_busy(if_busy)
        grant = check_grant(tools, self._ctx.tools)
        own = check_compaction(compaction) if compaction is not None else None
        return await self._sup.create_session(
            session_id, system, budget, policy, tools=grant, compaction=own
        )

    async def fork(
        self,
        source: str,
        /,
        *,
        at: int | str | None = None,
        session_id: str | None = None,
        request_id: str | None = None,
        files: bool = False,
    ) -> protocol.Forked:
        """Start a new session from the history of ``source`` up to a settled point.

        ``at`` is None (the latest end of a run or of a turn), a run id (the end of that
        run) or a sequence number of the source that is such a point; anything else is
        refused (``Refused("invalid_state")``) naming the nearest valid points. The
        fork's records (its ``SessionForked`` lineage and a copy of the prefix) are one
        commit; the source is untouched. Calls copied into the fork keep their results
        and are never run again; a turn left to continue or input left waiting in the
        prefix is taken up at once, as recovery would. The workspace is NOT rewound.
        ``session_id`` defaults to one derived from ``source`` and ``request_id``, so
        the same request forks once (the answer says ``duplicate``).

        ``files=True`` also puts the workspace's files back as they were at that point
        (from the source's checkpoints, ``rewind``), durably, before the fork's pending
        work goes on; this call returns once they are (a damaged checkpoint store is
        ``Refused``, the fork stays). Without it the workspace is NOT rewound.
        """
        if isinstance(at, bool) or not (at is None or isinstance(at, int | str)):
            raise ValueError(f"at must be None, a run id or a sequence number, not {at!r}")
        rid = request_id or _rid()
        if session_id is None:
            digest = hashlib.sha256(f"{source}\x00{rid}".encode()).hexdigest()[:16]
            session_id = f"fork-{digest}"
        forked = await self._sup.fork_session(source, session_id, at, rid, files)
        if self._ctx.workspace is not None:  # the fork keeps the checkpoints it copied
            copied = await self._fold(forked.session_id)
            trees = [t for m in copied.checkpoints for t in (m.before, m.after) if t]
            history = WorkspaceHistory(self._ctx.workspace)
            await _threads.run_sync(history.keep_for, forked.session_id, trees)
        info = await self._journal.session_info(forked.session_id)
        if info is not None and info.open_submissions:
            await self._sup.mailbox(forked.session_id)  # its pending work starts now
        if files:
            await self._restored(forked.session_id, fork_files_request(rid))
        return forked

    async def rewind(
        self, session_id: str, *, to: int | str, request_id: str | None = None
    ) -> Rewound:
        """Put the workspace's files back as they were at ``to``; the conversation stays.

        ``to`` is a call id (the workspace just before that call) or a settled point of
        the session's log (as for ``fork``: after the last workspace call before it).
        Durable: the rewind is recorded before a file is touched, and a crash halfway
        through the restore finishes it after the restart. Refused
        (``Refused("invalid_state")``) while the session has a run, waiting input or a
        compensation: cancel or wait, then rewind. To rewind the conversation too,
        ``fork(session_id, at=..., files=True)``. Tracked files are restored byte for
        byte (ignored files and files over the size limit are left alone), and the
        workspace just before is kept in the store (``Rewound.before``). Returns once
        the files are back; a checkpoint the store cannot prove whole is refused
        (``Refused("invalid_state")``) and no file is written.
        """
        if isinstance(to, bool) or not isinstance(to, int | str):
            raise ValueError(f"to must be a call id or a sequence number, not {to!r}")
        if self._ctx.workspace is None:
            raise perdure_errors.Refused(
                "invalid_state",
                "this runtime has no workspace (open_runtime(..., workspace=...)) to rewind",
            )
        rid = request_id or _rid()
        history = await self._journal.read_session(session_id)
        if not history:
            raise UnknownSession(session_id)
        position, tree = workspace_at(history, to)
        done = await self._done(session_id, protocol.Rewind(rid, position, tree))
        restored = await self._restored(session_id, rid)
        return Rewound(session_id, restored.tree, position, restored.before, done.duplicate)

    async def _restored(self, session_id: str, request_id: str) -> WorkspaceRestored:
        """Wait for the restore of ``request_id`` to be recorded; a refused one raises."""
        restored = None
        async with aclosing(self.events(session_id)) as events:
            async for event in events:
                record = event.record
                if isinstance(record, WorkspaceRestored) and record.request_id == request_id:
                    restored = record
                    break
        assert restored is not None
        if restored.error:
            raise perdure_errors.Refused(
                "invalid_state", f"the workspace was not restored: {restored.error}"
            )
        return restored

    async def workspace_diff(self, session_id: str, call_id: str | None = None) -> list[CallDiff]:
        """What each checkpointed call of the session changed in the workspace (or only
        ``call_id``'s attempts), with a unified diff of each, in log order."""
        state = await self._fold(session_id)
        marks = [m for m in state.checkpoints if call_id is None or m.call_id == call_id]
        if call_id is not None and not marks:
            raise perdure_errors.Refused(
                "not_found", f"session {session_id} has no checkpointed call {call_id!r}"
            )
        workspace = self._ctx.workspace
        diffs: list[CallDiff] = []
        for mark in marks:
            patch = ""
            if workspace is not None and mark.after:
                history = WorkspaceHistory(workspace)
                patch = await _threads.run_sync(history.patch, mark.before, mark.after)
            task = state.tasks.get(mark.call_id)
            diffs.append(
                CallDiff(
                    call_id=mark.call_id,
                    attempt=mark.attempt,
                    tool_name=task.tool_name if task is not None else "",
                    before=mark.before,
                    after=mark.after,
                    changed=tuple(mark.changed),
                    skipped=tuple(mark.skipped),
                    patch=patch,
                )
            )
        return diffs

    async def sessions(
        self, *, after: str = "", limit: int | None = None, active: bool = False
    ) -> list[SessionInfo]:
        """The log's summaries of its sessions, in session-id order: a page of at most
        ``limit`` after the id ``after`` ("": from the start), or every session (each
        call then reads every summary: page through a big log instead); ``active``:
        only the sessions with unfinished work, read from the log's index of them."""
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be 0 or more, not {limit!r}")
        return await self._journal.sessions(after=after, limit=limit, active=active)

    async def newest_sessions(
        self, *, before: int = 0, limit: int | None = None, active: bool = False
    ) -> list[SessionInfo]:
        """The log's summaries of its sessions, newest first (by creation, each one's
        ``first_seq``): a page of at most ``limit`` created before ``before`` (the
        ``first_seq`` of the previous page's last; 0: from the newest), read from the
        log's index by creation, so a page costs its own sessions, not the log's size;
        ``active``: only the sessions with unfinished work (from the log's index of
        them). ``GET /v1/sessions?order=newest``."""
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be 0 or more, not {limit!r}")
        if before < 0:
            raise ValueError(f"before must be 0 or more, not {before!r}")
        return await self._journal.newest_sessions(before=before, limit=limit, active=active)

    async def session_info(self, session_id: str) -> SessionInfo | None:
        """The log's summary of one session, or None if there is no such session."""
        return await self._journal.session_info(session_id)

    @property
    def stuck_after(self) -> float:
        """Seconds without a committed record after which unfinished work is stuck."""
        return self._ctx.settings.stuck_after

    @property
    def prices(self) -> Mapping[str, Price]:
        """The price table costs are reckoned at (``open_runtime(prices=)``, else the
        built-in one), by model: budgets, ``summary`` and the daemon's views."""
        return MappingProxyType(self._ctx.settings.limits.prices)

    async def stuck_runs(
        self, after: float | None = None, *, among: Iterable[SessionInfo] | None = None
    ) -> list[StuckRun]:
        """The sessions with unfinished work and no record committed for ``after``
        seconds (default: ``open_runtime(stuck_after=)``), each with what it waits for;
        ``among``: only those of these summaries (a page of ``sessions``).

        Computed now, from the log's index of active sessions (never every session's
        summary), each one's latest record and its state (read where it lives; no actor
        is woken): nothing is kept per turn.
        """
        threshold = self.stuck_after if after is None else after
        if threshold < 0:
            raise ValueError(f"after must be 0 seconds or more, not {threshold!r}")
        found: list[StuckRun] = []
        infos = await self._journal.sessions(active=True) if among is None else among
        for info in infos:
            if not info.open_submissions:
                continue
            latest = await self._journal.read_session(info.session_id, after=info.last_seq - 1)
            last = last_progress_at(latest)
            if last is None:
                continue
            now = self._ctx.clock()
            if now - last < threshold:
                continue  # moved recently: no need to read its state
            run = await self._read(
                info.session_id,
                partial(stuck_run, last_progress=last, now=now, after=threshold),
                wake=False,
            )
            if run is not None:
                found.append(run)
        return found

    async def restarts(self) -> list[Committed]:
        """Every ``LogOpened`` record of the log (each start of a runtime or node), in order.

        System records are indexed under the empty session id, so this is a range
        scan of them alone, not of the history.
        """
        system = await self._journal.run(self._journal.log.read_system)
        return [c for c in system if isinstance(c.record, LogOpened)]  # not SessionDeleted

    async def _done(self, session_id: str, command: protocol.Command) -> protocol.Done:
        return await self._sup.ask(session_id, lambda: CommandMsg[protocol.Done](command))

    async def submit(
        self,
        session_id: str,
        text: str,
        *,
        request_id: str | None = None,
        budget: Budget | None = None,
        if_busy: protocol.IfBusy | None = None,
        traceparent: str | None = None,
    ) -> protocol.Accepted:
        """Queue user input; returns once it is durable. Same ``request_id`` -> same answer.

        ``budget`` (recorded with the input) replaces the session's budget from this
        input on: e.g. to continue a run that stopped at its budget. ``if_busy`` says
        what the input does while a run is busy (default: the session's, else
        ``"queue"``): ``"queue"`` waits its turn; ``"interrupt"`` cancels the run at
        once (its unfinished calls' fates are reported as for ``cancel``) and runs
        next; ``"reject"`` raises ``Refused("busy")`` and records nothing; ``"steer"``
        revises the running request with it (as ``revise``). The answer's
        ``disposition`` says which happened (``queued``, ``interrupted``, ``steered``).
        ``traceparent`` (a W3C trace context) makes the input's runs children of that
        span; by default, with tracing on, the caller's current span.
        """
        policy = protocol.check_if_busy(if_busy)
        if traceparent is None:
            traceparent = self._caller_trace() if self._caller_trace is not None else ""
        elif traceparent:
            check_traceparent(traceparent)
        command = protocol.Submit(request_id or _rid(), text, budget, policy, traceparent)
        return await self._sup.ask(session_id, lambda: CommandMsg[protocol.Accepted](command))

    async def cancel(self, session_id: str, *, request_id: str | None = None) -> protocol.Done:
        """Cancel the current run (queued input still runs afterwards)."""
        return await self._done(session_id, protocol.Cancel(request_id or _rid()))

    async def approve(
        self,
        session_id: str,
        call_id: str,
        *,
        approved: bool = True,
        request_id: str | None = None,
        note: str = "",
    ) -> protocol.Done:
        """Record a human decision on a tool call that awaits approval."""
        cmd = protocol.Approve(call_id, approved, request_id or _rid(), note)
        return await self._done(session_id, cmd)

    async def revise(
        self,
        session_id: str,
        text: str,
        *,
        request_id: str | None = None,
        budget: Budget | None = None,
    ) -> protocol.Done:
        """Change the request of the current run; returns the new goal revision in ``ref``.

        ``budget`` replaces the session's budget from this revision on.
        """
        return await self._done(session_id, protocol.Revise(request_id or _rid(), text, budget))

    async def pause(self, session_id: str, *, request_id: str | None = None) -> protocol.Done:
        """Dispatch nothing new (running tools finish); durable across restarts.

        The running sub-agents of the session's calls are paused too (and theirs).
        """
        rid = request_id or _rid()
        done = await self._done(session_id, protocol.Pause(rid))
        for child in await self.children(session_id):
            await self.pause(child, request_id=f"{rid}/{child}")
        return done

    async def compact_context(
        self, session_id: str, *, request_id: str | None = None
    ) -> protocol.Done:
        """Summarise the session's conversation now, without waiting for its context to
        fill (the policy's ``keep_recent`` items stay verbatim). Returns once the
        compaction is recorded, with its id as ``ref``; the summary is made by a model
        call after that (``wait_idle`` waits for it). The log keeps every record: this
        changes only what the model is sent. ``Refused("invalid_state")`` if there is
        nothing to summarise. Not to be confused with ``perdure compact``, which
        compacts the log file.
        """
        command = protocol.CompactContext(request_id or _rid())
        return await self._done(session_id, command)

    async def resume(self, session_id: str, *, request_id: str | None = None) -> protocol.Done:
        """Dispatch again after ``pause``; the running sub-agents resume too."""
        rid = request_id or _rid()
        done = await self._done(session_id, protocol.Resume(rid))
        for child in await self.children(session_id):
            await self.resume(child, request_id=f"{rid}/{child}")
        return done

    async def compensate(
        self, session_id: str, call_id: str, *, request_id: str | None = None
    ) -> protocol.Done:
        """Undo a completed call with its tool's compensation (a durable task of its own).

        ``ref`` of the answer is the compensation's call id; its result arrives like
        any tool result (events, transcript note).
        """
        return await self._done(session_id, protocol.Compensate(call_id, request_id or _rid()))

    async def resolve(
        self,
        session_id: str,
        call_id: str,
        *,
        action: ResolutionAction,
        result: Any = None,
        request_id: str | None = None,
    ) -> protocol.Done:
        """Answer a tool call that raised ``NeedsHuman`` (durably waiting for a person).

        ``action="retry"`` runs the call again with the same idempotency key (a NEVER
        call too: a person chose it); ``"skip"`` records ``result`` (any JSON value) as
        the call's result; ``"fail"`` hands the error to the model (with ``result`` as
        what it is told, if given). Same ``request_id`` -> same answer.
        """
        return await self._done(session_id, resolution(call_id, action, result, request_id))

    async def children(self, session_id: str) -> list[str]:
        """The sub-agent sessions started by the session's unfinished tool calls."""
        return await self._read(session_id, running_children)

    # -- retention ----------------------------------------------------------------------

    async def delete_session(self, session_id: str, *, reason: str = "") -> int:
        """Remove a finished session and its records from the log; return how many went.

        Refused (``busy``, nothing removed) while it has unfinished work or a parent
        call still waits for it (a sub-agent). Its event streams end with a
        ``session_deleted`` event. Forks of it are unaffected (they hold a copy).
        Its workspace checkpoints go too (those a fork copied stay, for the fork).
        """
        count = await self._sup.delete_session(session_id, reason)
        if self._ctx.workspace is not None:  # its checkpoints go with it
            history = WorkspaceHistory(self._ctx.workspace)
            await _threads.run_sync(history.drop_session, session_id)
        data = {"session_id": session_id, "records": count, "reason": reason}
        self._journal.bus.publish(Event(session_id, SESSION_DELETED, data=data))
        return count

    async def prune(
        self, finished_before: float, *, dry_run: bool = False
    ) -> tuple[list[retention.Pruned], list[tuple[str, str]]]:
        """Delete every session without unfinished work whose last record is older than
        ``finished_before`` (wall-clock seconds); one transaction per session. Returns
        (deleted or, with ``dry_run``, to delete; kept, with why)."""
        deleted: list[retention.Pruned] = []
        kept: list[tuple[str, str]] = []
        for found in await retention.prunable(self._journal, finished_before):
            why = await retention.dependency(self._journal, found.session_id)
            if why is not None:
                kept.append((found.session_id, why))
            elif dry_run:
                deleted.append(found)
            else:
                try:
                    count = await self.delete_session(found.session_id, reason="pruned")
                except perdure_errors.Refused as exc:
                    kept.append((found.session_id, exc.message))
                    continue
                deleted.append(attrs.evolve(found, records=count))
        return deleted, kept

    async def export_session(self, session_id: str) -> list[str]:
        """The session as JSON lines (a header, then every record with its seq)."""
        records = await self._journal.read_session(session_id)
        if not records:
            raise UnknownSession(session_id)
        return list(retention.export_lines(session_id, records))

    async def import_session(self, lines: Iterable[str]) -> str:
        """Restore an exported session into this log (one commit); return its id."""
        session_id, _ = await retention.import_session(self._journal, lines)
        info = await self._journal.session_info(session_id)
        if info is not None and info.open_submissions:
            await self._sup.mailbox(session_id)  # its unfinished work goes on here
        return session_id

    async def wait_idle(self, session_id: str) -> RunFinished | None:
        """Wait until no run is in progress and no input is queued; return the last outcome."""
        return await self._sup.wait_idle(session_id)

    async def state(
        self, session_id: str, fn: Callable[[SessionLookup], T], *, wake: bool = True
    ) -> T:
        """Evaluate ``fn`` on the live state of a session, inside its actor (read-only!).

        ``fn`` is handed the state as a ``perdure.SessionLookup``: the read model, whose
        answers are frozen records made when asked (one input, run, model turn or tool
        call by its id, every run or call, a ``SessionView`` snapshot). A hibernated
        session's state is read where it sleeps: no actor is woken for it.
        ``wake=False``: a session no actor runs here (evicted, parked, never started on
        this node) is read from the log instead; the read then starts no actor, takes
        no lease and runs no recovery.
        """
        return await self._read(session_id, lambda state: fn(StateLookup(state)), wake=wake)

    async def view(self, session_id: str, *, wake: bool = True) -> SessionView:
        """A frozen snapshot of a session's headline facts (``perdure.SessionView``):
        safe to keep, never changed by later commits. ``wake`` as for ``state``."""
        return await self._read(session_id, session_view, wake=wake)

    async def summary(self, session_id: str, *, wake: bool = True) -> dict[str, Any]:
        """What the session is doing, as JSON-ready data (``perdure.inspect.summarize``:
        the request in force, what is done, what happens next, the unconfirmed side
        effects, every run and call, usage and cost): the body of the daemon's
        ``GET /v1/sessions/{id}`` and what ``perdure show`` prints. ``wake`` as for
        ``state``."""
        # Cost at the runtime's own price table (open_runtime(prices=)), as budgets are.
        prices = self._ctx.settings.limits.prices
        return await self._read(session_id, partial(summarize, prices=prices), wake=wake)

    async def _read(
        self, session_id: str, fn: Callable[[SessionState], T], *, wake: bool = True
    ) -> T:
        """``fn`` on the fold's own state (the runtime's reads; ``state`` is the face)."""
        if not wake:
            found, answer = await self._sup.peek(session_id, fn)
            if found:
                return cast(T, answer)  # T itself may allow None
            return fn(await self._fold(session_id))
        asleep = self._sup.dormant.get(session_id)
        if asleep is not None:
            answer = fn(await dormant_state(asleep))
            await trio.lowlevel.checkpoint()
            return answer
        return await self._sup.ask(session_id, lambda: Query(fn))

    async def _fold(self, session_id: str) -> SessionState:
        """The state folded from the log (any session; no actor is started)."""
        if await self._journal.session_info(session_id) is None:
            raise UnknownSession(session_id)
        return SessionState.fold(session_id, await self._journal.read_session(session_id))

    async def transcript(self, session_id: str, *, history: bool = False) -> list[Message]:
        """The conversation as the model sees it (unfinished tool calls shown by phase):
        after a context compaction, its summary in place of what it covers. With
        ``history``, every message of the session instead, as if nothing was compacted
        (the log keeps them all)."""
        return await self._read(
            session_id,
            lambda state: list(conversation.messages(state, include_pending=True, history=history)),
            wake=False,
        )

    async def events(
        self, session_id: str, *, after: int = 0, live: bool = True, restarts: bool = False
    ) -> AsyncGenerator[Event, None]:
        """Committed records with seq > ``after`` from the log, then live events.

        No gap and no duplicate between the replay and the live part: live events
        are buffered from before the replay starts and de-duplicated by sequence
        number. Ephemeral events (``seq is None``) are only ever live.

        ``restarts=True`` also yields, in sequence order, the ``LogOpened`` records
        (runtime starts) that fall within the session's lifetime, so a viewer can mark
        where the runtime restarted. They all precede this process's own records, so
        they belong to the replay part.
        """
        batches = self.event_batches(session_id, after=after, live=live, restarts=restarts)
        async with aclosing(batches) as stream:
            async for batch in stream:
                for event in batch:
                    yield event

    async def event_batches(
        self, session_id: str, *, after: int = 0, live: bool = True, restarts: bool = False
    ) -> AsyncGenerator[list[Event], None]:
        """The events of ``events``, in the same order, as lists: each step takes
        everything that is already waiting (a page of the replay; the live events
        published since the last step, such as the records of one commit), never
        waiting for more. A consumer that writes them somewhere (the daemon's event
        streams) can then write them at once, and wakes once per burst instead of
        once per event. Never an empty list.
        """
        info = await self._journal.session_info(session_id)
        if info is None:
            raise UnknownSession(session_id)
        markers: list[Committed] = []
        if restarts:
            markers = [c for c in await self.restarts() if c.seq > max(after, info.first_seq)]

        with self._journal.bus.subscribe(session_id) as live_feed:
            last = after
            async with aclosing(self._replay(session_id, last, markers)) as replay:
                async for page in replay:
                    last = max(last, page[-1].seq or last)
                    yield page
            if not live:
                return
            if self._journal.log.multi_node:
                async with aclosing(self._follow(session_id, live_feed, last)) as follow:
                    async for followed in follow:
                        yield followed
                return
            while True:
                try:
                    first = await live_feed.__anext__()
                except StopAsyncIteration:
                    return
                batch: list[Event] = []
                for event in (first, *live_feed.drain()):
                    if event.seq is not None:
                        if event.seq <= last:
                            continue
                        last = event.seq
                    batch.append(event)
                    if event.kind == SESSION_DELETED:
                        yield batch
                        return  # the session is gone: nothing more will come
                if batch:
                    yield batch

    @asynccontextmanager
    async def watch(
        self, session_id: str, *, after: int = 0, agents: bool = True
    ) -> AsyncIterator[trio.MemoryReceiveChannel[Event]]:
        """The session's events (as ``events``) with, if ``agents``, those of its sub-agents
        nested in: each child's stream (and its children's) joins as soon as the parent
        records it (``AgentStarted``). Tell them apart by ``Event.session_id``. Events of
        one session keep their order; the streams interleave as they happen.
        """
        send, receive = trio.open_memory_channel[Event](1024)
        joined: set[str] = {session_id}
        async with trio.open_nursery() as nursery:

            async def pump(sid: str, start: int) -> None:
                async with aclosing(self.events(sid, after=start)) as stream:
                    async for event in stream:
                        await send.send(event)
                        if not agents:
                            continue
                        for child in children_named(event.record):
                            if child not in joined:
                                joined.add(child)
                                nursery.start_soon(pump, child, 0)

            nursery.start_soon(pump, session_id, after)
            try:
                yield receive
            finally:
                nursery.cancel_scope.cancel()

    async def _replay(
        self, session_id: str, after: int, markers: list[Committed] | None = None
    ) -> AsyncGenerator[list[Event], None]:
        """The session's records after ``after``, a page at a time, with ``markers``
        merged in seq order (never an empty page)."""
        pending = list(markers or ())

        def event(c: Committed) -> Event:
            return Event(session_id, type(c.record).__name__, c.seq, c.record)

        last = after
        while True:
            page = await self._journal.read_session(session_id, last, _PAGE)
            out: list[Event] = []
            for c in page:
                while pending and pending[0].seq < c.seq:
                    out.append(event(pending.pop(0)))
                out.append(event(c))
                last = c.seq
            if out:
                yield out
            if len(page) < _PAGE:
                break
        if pending:
            yield [event(c) for c in pending]

    async def _follow(
        self, session_id: str, feed: Subscription, after: int
    ) -> AsyncGenerator[list[Event], None]:
        """Live part with several nodes: the log is the source of committed records.

        Any node may be writing the session (it may even move between nodes while we
        follow), so committed records are always read from the log after the last
        seq yielded; this node's bus, another node's NOTIFY (a ``WAKE`` nudge) or the
        poll interval only say *when* to read. Per-session seqs increase in commit
        order, so reading after the last one seen gives no gap and no duplicate.
        Ephemeral events come from this node's bus only.
        """
        last = after
        poll = self._journal.log.poll_interval
        with self._journal.follow(session_id, feed):
            while True:
                event: Event | None = None
                with trio.move_on_after(poll):
                    try:
                        event = await feed.__anext__()
                    except StopAsyncIteration:
                        return
                if event is not None and event.seq is None and event.kind != WAKE:
                    yield [event]
                    if event.kind == SESSION_DELETED:
                        return
                    continue
                if event is not None and event.seq is not None and event.seq <= last:
                    continue
                async with aclosing(self._replay(session_id, last)) as replay:
                    async for page in replay:
                        last = page[-1].seq or last
                        yield page


def children_named(record: Record | None) -> list[str]:
    """The sub-agent sessions a parent's record links: an ``AgentStarted``'s child, or
    (in logs written before that record) the ``agents`` a heartbeat listed."""
    if isinstance(record, AgentStarted):
        return [record.child]
    if not isinstance(record, ToolHeartbeat) or not isinstance(record.details, dict):
        return []
    named = record.details.get("agents")
    return [child for child in named if isinstance(child, str)] if isinstance(named, list) else []


def _rid() -> str:
    return "req-" + uuid.uuid4().hex


RESOLUTIONS = ("retry", "skip", "fail")


def resolution(
    call_id: str, action: ResolutionAction, result: Any = None, request_id: str | None = None
) -> protocol.Resolve:
    """The ``Resolve`` command for ``rt.resolve``, or a ValueError naming what is wrong."""
    if action not in RESOLUTIONS:
        raise ValueError(f"action must be one of {', '.join(RESOLUTIONS)}, not {action!r}")
    if action == "retry" and result is not None:
        raise ValueError("result= goes with action='skip' or 'fail'; a retry runs the call again")
    try:
        json.dumps(result, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"result must be a JSON value: {exc}") from None
    return protocol.Resolve(call_id, action, request_id or _rid(), result)


def running_children(state: SessionState) -> list[str]:
    """The sub-agent sessions started by ``state``'s unfinished tool calls (each linked
    by an ``AgentStarted`` of the call); pause and resume reach them too."""
    return [child for t in state.tasks.values() if not t.terminal for child in t.children]


@asynccontextmanager
async def open_runtime(
    log: str | PathLike[str] | LogBackend = ".perdure",
    *,
    provider: Provider,
    tools: Iterable[Tool] = (),
    workspace: str | PathLike[str] | None = None,
    durability: Durability = "full",
    takeover: bool = False,
    resume_budget: int = 3,
    max_turns: int = 100,
    max_model_attempts: int = 8,
    retry_base: float = 1.0,
    retry_cap: float = 60.0,
    shutdown_grace: float = 10.0,
    map_size: int | None = None,
    clock: Callable[[], float] = time.time,
    seed: int | None = None,
    node_id: str | None = None,
    lease_ttl: float | None = None,
    idle_timeout: float | None = 300.0,
    hibernate_after: float | None = 1.0,
    rebalance: bool = True,
    budget: Budget | None = None,
    prices: Mapping[str, Price] | None = None,
    compaction: CompactionPolicy | None = None,
    context_windows: Mapping[str, int] | None = None,
    compaction_provider: Provider | None = None,
    mcp_servers: Sequence[McpServer] = (),
    telemetry: CommitObserver | Iterable[CommitObserver] | Literal["auto"] | None = "auto",
    commit_on_loop: bool | None = None,
    stuck_after: float = DEFAULT_STUCK_AFTER,
) -> AsyncIterator[Runtime]:
    """Open the runtime on ``log``, recover it, and yield a ``Runtime``.

    ``log`` is a directory (an LMDB log, the default ``.perdure``) or a
    ``postgresql://`` URL. ``durability="fast"`` skips the meta-page fsync (LMDB) or
    sets ``synchronous_commit = off`` (PostgreSQL): a power loss (a database crash)
    may undo the last commits, never part of one; a killed process loses nothing in
    either mode. ``takeover=True`` takes the log from an owner that is alive but
    stuck (stopped, hung), or with PostgreSQL every session from the nodes that
    started before this one, without waiting for their leases to expire; whoever is
    taken over is fenced and can never write again. PostgreSQL only: ``node_id``
    names this process among the nodes (default: host-pid-random), ``lease_ttl``
    (seconds, default 10) is how long a dead node's sessions wait to be taken over,
    and ``rebalance`` (default True) moves sessions between live nodes, at safe
    points, so that each runs its fair share (docs/SCALE-OUT.md, "Rebalancing").
    ``map_size`` is LMDB's initial map size. A session left idle for
    ``idle_timeout`` seconds has its actor evicted from memory (and, with
    PostgreSQL, its lease given up); its next command starts it again from the log.
    ``None`` keeps every session resident. Before that, an idle session's actor
    hibernates after ``hibernate_after`` seconds: its task, mailbox and cancel scopes
    go, its folded state stays in memory, and its next command starts a new actor on
    that state without reading the log (``None``: actors stay until evicted; always
    so with PostgreSQL, whose other nodes may write a session meanwhile).
    ``budget`` limits what every
    session's runs may spend (tokens, cost; ``perdure.Budget``), checked before each
    model call from the usage in the log; ``prices`` (per model, ``perdure.Price``)
    replaces the built-in price table used for cost. ``compaction``
    (``perdure.CompactionPolicy``) says when a session's context is summarised: once
    the input tokens the last reply reported reach its share of the model's context
    window (``context_windows`` replaces the built-in table of windows by model), and
    how many recent items stay verbatim; ``compaction_provider`` makes the summaries
    (default: ``provider``); docs/COMPACTION.md. ``mcp_servers``
    (``perdure.tools.mcp.McpServer``, the ``mcp`` extra) are connected and listed before
    recovery runs; their tools join ``tools`` as ``<server>__<tool>``, and the
    connections are closed when the runtime exits. ``telemetry`` observes every
    commit (``perdure.observability``): ``"auto"`` traces through the application's
    OpenTelemetry providers when ``opentelemetry-api`` is installed (a no-op until
    the application installs one) and does nothing otherwise; ``None`` turns it off;
    or pass observers, e.g. ``perdure.observability.tracing.Tracing(...)``.
    ``commit_on_loop`` lets an idle trio loop commit to a local (LMDB) log itself,
    sparing two thread hand-offs per commit, while commits stay under ~2 ms (a slow
    disk goes back to the writer thread); ``None``: on for LMDB, ``False``: always
    through the writer thread (I/O never waits for a commit).
    ``stuck_after`` (seconds, default 600) is how long a session with unfinished work
    may go without a committed record before ``Runtime.stuck_runs``, the metrics and
    the page report it as stuck (``perdure.stuck``).
    """
    # Every setting checked before anything is opened (an error names the keyword).
    settings = Settings(
        limits=Limits(
            resume_budget=resume_budget,
            max_turns=max_turns,
            max_model_attempts=max_model_attempts,
            retry_base=retry_base,
            retry_cap=retry_cap,
            forget_settled=durability == "full",
            budget=budget,
            prices=prices,
            compaction=compaction if compaction is not None else CompactionPolicy(),
            context_windows=context_windows,
        ),
        shutdown_grace=shutdown_grace,
        stuck_after=stuck_after,
        idle_timeout=idle_timeout,
        hibernate_after=hibernate_after,
        rebalance=rebalance,
    )
    by_name = registry(tools)
    observers = _observers(telemetry)
    opened = partial(
        open_log,
        log,
        durability=durability,
        takeover=takeover,
        map_size=map_size,
        clock=clock,
        node_id=node_id,
        lease_ttl=lease_ttl,
    )
    if isinstance(log, str | PathLike) and log != MEMORY:
        the_log = await trio.to_thread.run_sync(opened)
    else:  # in memory (":memory:", or a MemoryLog the caller keeps): nothing blocks
        the_log = opened()
    root = None if workspace is None else await trio.Path(workspace).resolve()
    try:
        async with (
            _mcp_connections(mcp_servers, seed) as hub,
            open_journal(the_log, commit_on_loop=commit_on_loop) as journal,
        ):
            for observer in observers:
                if isinstance(observer, TransactionObserver):
                    journal.commit_listeners.append(observer.on_commit)
            if journal.log.multi_node:
                # Another node may write a session of a shared log while it sleeps.
                settings = attrs.evolve(settings, hibernate_after=None)
            ctx = ActorContext(
                journal=journal,
                provider=provider,
                tools=by_name if hub is None else _with_mcp(by_name, hub),
                workspace=Path(root) if root is not None else None,
                clock=clock,
                rng=random.Random(seed),
                settings=settings,
                compaction_provider=compaction_provider,
                observers=observers,
            )
            caller_trace = _caller_trace(observers)
            supervisor = Supervisor(ctx, caller_trace)
            runtime = Runtime(supervisor, journal, hub, caller_trace)
            body_error: BaseException | None = None
            try:
                async with trio.open_nursery() as nursery:
                    for observer in observers:
                        if isinstance(observer, BackgroundObserver):
                            nursery.start_soon(observer.background)
                    await nursery.start(supervisor.run)
                    await supervisor.agents.stop_orphans(supervisor.recovered)
                    try:
                        yield runtime
                    except BaseException as exc:
                        # Re-raised below, outside the nursery, so the caller sees its own
                        # exception rather than an ExceptionGroup.
                        body_error = exc
                    else:
                        with trio.CancelScope(shield=True) as grace:
                            grace.deadline = trio.current_time() + settings.shutdown_grace
                            await supervisor.drain()
                    nursery.cancel_scope.cancel()
            except BaseExceptionGroup as group:
                fenced = find_exception(group, LogFenced)
                if fenced is not None:
                    raise fenced from None
                raise
            if body_error is not None:
                raise body_error
    finally:
        for observer in observers:
            close = getattr(observer, "close", None)
            if close is not None:
                close()
        if the_log.inline:
            the_log.close()
        else:
            await trio.to_thread.run_sync(the_log.close)


@asynccontextmanager
async def _mcp_connections(
    servers: Sequence[McpServer], seed: int | None
) -> AsyncIterator[McpHub | None]:
    """The MCP servers' connections for the runtime's lifetime (None without servers)."""
    if not servers:
        yield None
        return
    try:
        from perdure.tools.mcp import connect
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise ImportError("mcp_servers needs the mcp extra: pip install 'perdure[mcp]'") from exc
    async with connect(list(servers), seed=seed) as hub:
        yield hub


def _with_mcp(native: dict[str, Tool], hub: McpHub) -> dict[str, Tool]:
    """The native tools and the MCP servers' (a name collision is an error naming both)."""
    from perdure.tools.mcp import merge

    return registry(merge(native.values(), hub.tools()))


def _observers(
    telemetry: CommitObserver | Iterable[CommitObserver] | Literal["auto"] | None,
) -> tuple[CommitObserver, ...]:
    if telemetry is None:
        return ()
    if telemetry == "auto":
        return auto_observers()
    if isinstance(telemetry, str):
        raise ValueError(f"telemetry must be 'auto', None or observers, not {telemetry!r}")
    if hasattr(telemetry, "after_commit"):
        return (cast(CommitObserver, telemetry),)
    return tuple(telemetry)


def _caller_trace(observers: tuple[CommitObserver, ...]) -> Callable[[], str] | None:
    """How ``submit`` reads the caller's span, if a tracing observer is in use."""
    tracing = sys.modules.get("perdure.observability.tracing")  # imported if one is in use
    if tracing is None or not any(isinstance(o, tracing.Tracing) for o in observers):
        return None
    return cast(Callable[[], str], tracing.current_traceparent)
