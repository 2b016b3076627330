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

import json
import random
import sys
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Mapping
from contextlib import aclosing, asynccontextmanager
from functools import partial
from os import PathLike
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

import attrs
import trio

from perdure.actors import conversation, protocol
from perdure.actors.context import ActorContext
from perdure.actors.session import CommandMsg, Query, WaitIdle
from perdure.actors.state import SessionState
from perdure.actors.supervisor import Supervisor
from perdure.budget import DEFAULT_PRICES, Price
from perdure.errors import UnknownSession, find_exception
from perdure.observability.hooks import (
    CommitObserver,
    TransactionObserver,
    auto_observers,
    check_traceparent,
)
from perdure.providers.base import Message, Provider
from perdure.storage import MEMORY, Durability, LogBackend, LogFenced, SessionInfo, open_log
from perdure.storage.bus import Event, Subscription
from perdure.storage.journal import WAKE, Journal, JournalStats, open_journal
from perdure.storage.records import Budget, Committed, ResolutionAction, RunFinished
from perdure.tools.contract import Tool, registry

_PAGE = 512
T = TypeVar("T")


class Runtime:
    """A running perdure runtime. Obtain one with ``open_runtime``."""

    def __init__(
        self,
        supervisor: Supervisor,
        journal: Journal,
        ctx: ActorContext,
        caller_trace: Callable[[], str] | None = None,
    ) -> None:
        self._sup = supervisor
        self.journal = journal
        self._ctx = ctx
        # The caller's current trace context, when tracing is on (perdure.observability).
        self._caller_trace = caller_trace

    @property
    def log_path(self) -> Path:
        """The LMDB directory (for a PostgreSQL log, see ``location``)."""
        path = getattr(self.journal.log, "path", None)
        if not isinstance(path, Path):
            raise AttributeError(f"{self.location} is not a directory log")
        return path

    @property
    def location(self) -> str:
        """Where the log is: a directory, or a PostgreSQL URL (without its password)."""
        return self.journal.log.location

    @property
    def node_id(self) -> str:
        """This process's name among the nodes sharing a PostgreSQL log."""
        return self.journal.log.node_id

    @property
    def epoch(self) -> int:
        return self.journal.log.epoch

    @property
    def recovered_sessions(self) -> list[str]:
        """Sessions that had unfinished work when this runtime started (and it runs)."""
        return list(self._sup.recovered)

    @property
    def taken_over_sessions(self) -> list[str]:
        """Sessions this node took over from a dead node after it started (PostgreSQL)."""
        return list(self._sup.taken_over)

    @property
    def resident_sessions(self) -> list[str]:
        """The sessions whose actor is in memory now (the others live in the log)."""
        return [sid for sid, box in self._sup.mailboxes.items() if not box.evicted]

    @property
    def evictions(self) -> int:
        """How many idle session actors have been evicted since the runtime opened."""
        return self._sup.evictions

    def stats(self) -> JournalStats:
        """A snapshot of the Journal's counters (appends, transactions, records)."""
        return attrs.evolve(self.journal.stats)

    # -- sessions -------------------------------------------------------------------

    async def create_session(
        self,
        session_id: str | None = None,
        *,
        system: str | None = None,
        budget: Budget | None = None,
    ) -> str:
        """Create a session (idempotent for an explicit ``session_id``); return its id.

        ``budget`` replaces the runtime's default budget for this session. Raises
        ``Refused("conflict")`` if the session exists with another system prompt.
        """
        sid = session_id or "s-" + uuid.uuid4().hex[:16]
        await self._sup.create_session(sid, system, budget)
        return sid

    async def ensure_session(
        self, session_id: str, *, system: str | None = None, budget: Budget | None = None
    ) -> bool:
        """Like ``create_session`` for an explicit id; True if this call created it."""
        return await self._sup.create_session(session_id, system, budget)

    async def sessions(self) -> list[SessionInfo]:
        return await self.journal.sessions()

    async def session_info(self, session_id: str) -> SessionInfo | None:
        """The log's summary of one session, or None if there is no such session."""
        return await self.journal.session_info(session_id)

    async def restarts(self) -> list[Committed]:
        """Every ``LogOpened`` record of the log (each start of a runtime or node), in order.

        System records are indexed under the empty session id, so this is a range
        scan of them alone, not of the history.
        """
        return await self.journal.run(self.journal.log.read_system)

    async def _done(self, session_id: str, command: protocol.Command) -> protocol.Done:
        return await self._sup.ask(session_id, lambda: CommandMsg[protocol.Done](command))

    async def submit(
        self,
        session_id: str,
        text: str,
        *,
        request_id: str | None = None,
        budget: Budget | None = None,
        traceparent: str | None = None,
    ) -> protocol.Accepted:
        """Queue user input; returns once it is durable. Same ``request_id`` -> same answer.

        ``budget`` (recorded with the input) replaces the session's budget from this
        input on: e.g. to continue a run that stopped at its budget. ``traceparent``
        (a W3C trace context) makes the input's runs children of that span; by default,
        with tracing on, the caller's current span.
        """
        if traceparent is None:
            traceparent = self._caller_trace() if self._caller_trace is not None else ""
        elif traceparent:
            check_traceparent(traceparent)
        command = protocol.Submit(request_id or _rid(), text, budget, traceparent)
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
        """Dispatch nothing new (running tools finish); durable across restarts."""
        return await self._done(session_id, protocol.Pause(request_id or _rid()))

    async def resume(self, session_id: str, *, request_id: str | None = None) -> protocol.Done:
        return await self._done(session_id, protocol.Resume(request_id or _rid()))

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

    async def wait_idle(self, session_id: str) -> RunFinished | None:
        """Wait until no run is in progress and no input is queued; return the last outcome."""
        return await self._sup.ask(session_id, WaitIdle)

    async def state(self, session_id: str, fn: Callable[[SessionState], T]) -> T:
        """Evaluate ``fn`` on the live state of a session, inside its actor (read-only!)."""
        return await self._sup.ask(session_id, lambda: Query(fn))

    async def load_state(self, session_id: str) -> SessionState:
        """The state folded from the log (works for any session; no actor is started)."""
        if await self.journal.session_info(session_id) is None:
            raise UnknownSession(session_id)
        return SessionState.fold(session_id, await self.journal.read_session(session_id))

    async def transcript(self, session_id: str) -> list[Message]:
        """The conversation as the model sees it (unfinished tool calls shown by phase)."""
        state = await self.load_state(session_id)
        return list(conversation.messages(state, include_pending=True))

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
        info = await self.journal.session_info(session_id)
        if info is None:
            raise UnknownSession(session_id)
        markers: list[Committed] = []
        if restarts:
            markers = [c for c in await self.restarts() if c.seq > max(after, info.first_seq)]

        with self.journal.bus.subscribe(session_id) as live_feed:
            last = after
            async with aclosing(self._replay(session_id, last, markers)) as replay:
                async for event in replay:
                    last = max(last, event.seq or last)
                    yield event
            if not live:
                return
            if self.journal.log.multi_node:
                async with aclosing(self._follow(session_id, live_feed, last)) as follow:
                    async for event in follow:
                        yield event
                return
            async for event in live_feed:
                if event.seq is not None:
                    if event.seq <= last:
                        continue
                    last = event.seq
                yield event

    async def _replay(
        self, session_id: str, after: int, markers: list[Committed] | None = None
    ) -> AsyncGenerator[Event, None]:
        """The session's records after ``after``, with ``markers`` merged in seq order."""
        pending = list(markers or ())

        def event(c: Committed) -> Event:
            return Event(session_id, type(c.record).__name__, c.seq, c.record)

        last = after
        while True:
            page = await self.journal.read_session(session_id, last, _PAGE)
            for c in page:
                while pending and pending[0].seq < c.seq:
                    yield event(pending.pop(0))
                yield event(c)
                last = c.seq
            if len(page) < _PAGE:
                break
        for c in pending:
            yield event(c)

    async def _follow(
        self, session_id: str, feed: Subscription, after: int
    ) -> AsyncGenerator[Event, None]:
        """Live part with several nodes: the log is the source of committed records.

        Any node may be writing the session (it may even move between nodes while we
        follow), so committed records are always read from the log after the last
        seq yielded; this node's bus, another node's NOTIFY (a ``WAKE`` nudge) or the
        poll interval only say *when* to read. Per-session seqs increase in commit
        order, so reading after the last one seen gives no gap and no duplicate.
        Ephemeral events come from this node's bus only.
        """
        last = after
        poll = self.journal.log.poll_interval
        with self.journal.follow(session_id, feed):
            while True:
                event: Event | None = None
                with trio.move_on_after(poll):
                    try:
                        event = await feed.__anext__()
                    except StopAsyncIteration:
                        return
                if event is not None and event.seq is None and event.kind != WAKE:
                    yield event
                    continue
                if event is not None and event.seq is not None and event.seq <= last:
                    continue
                async with aclosing(self._replay(session_id, last)) as replay:
                    async for c in replay:
                        last = c.seq or last
                        yield c


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
    budget: Budget | None = None,
    prices: Mapping[str, Price] | None = None,
    telemetry: CommitObserver | Iterable[CommitObserver] | Literal["auto"] | None = "auto",
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
    (seconds, default 10) is how long a dead node's sessions wait to be taken over.
    ``map_size`` is LMDB's initial map size. A session left idle for
    ``idle_timeout`` seconds has its actor evicted from memory (and, with
    PostgreSQL, its lease given up); its next command starts it again from the log.
    ``None`` keeps every session's actor resident. ``budget`` limits what every
    session's runs may spend (tokens, cost; ``perdure.Budget``), checked before each
    model call from the usage in the log; ``prices`` (per model, ``perdure.Price``)
    replaces the built-in price table used for cost. ``telemetry`` observes every
    commit (``perdure.observability``): ``"auto"`` traces through the application's
    OpenTelemetry providers when ``opentelemetry-api`` is installed (a no-op until
    the application installs one) and does nothing otherwise; ``None`` turns it off;
    or pass observers, e.g. ``perdure.observability.tracing.Tracing(...)``.
    """
    if idle_timeout is not None and not idle_timeout > 0:
        raise ValueError(
            f"idle_timeout must be a positive number of seconds or None, not {idle_timeout!r}"
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
        async with open_journal(the_log) as journal:
            for observer in observers:
                if isinstance(observer, TransactionObserver):
                    journal.commit_listeners.append(observer.on_commit)
            ctx = ActorContext(
                journal=journal,
                provider=provider,
                tools=by_name,
                workspace=Path(root) if root is not None else None,
                clock=clock,
                rng=random.Random(seed),
                resume_budget=resume_budget,
                max_turns=max_turns,
                max_model_attempts=max_model_attempts,
                retry_base=retry_base,
                retry_cap=retry_cap,
                idle_timeout=idle_timeout,
                forget_settled=durability == "full",
                budget=budget,
                prices=dict(DEFAULT_PRICES if prices is None else prices),
                observers=observers,
            )
            supervisor = Supervisor(ctx)
            body_error: BaseException | None = None
            try:
                async with trio.open_nursery() as nursery:
                    await nursery.start(supervisor.run)
                    try:
                        yield Runtime(supervisor, journal, ctx, _caller_trace(observers))
                    except BaseException as exc:
                        # Re-raised below, outside the nursery, so the caller sees its own
                        # exception rather than an ExceptionGroup.
                        body_error = exc
                    else:
                        with trio.CancelScope(shield=True) as grace:
                            grace.deadline = trio.current_time() + shutdown_grace
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
