"""The supervisor's lifecycle job: start, supervise, restart and park session actors.

``mailbox`` is the door to a session: it returns the running actor's mailbox, or
starts an actor (under the session's lease, on a woken dormant state or on the log,
recovery first) and registers it once it has started. ``_supervise`` runs the
actor's task and decides what its end means: a hand-over or an eviction (handed to
the ownership and memory jobs), a lost lease (everyone waiting is refused), or a
crash. An actor that raises is restarted from its log. One stopped because the log
could not be reached (``LogUnavailable``, ``CommitUnknown``) or is full is restarted
with a back-off for as long as that lasts: an outage is not a broken session. One
that keeps failing otherwise (``max_restarts`` times within ``restart_window``
seconds) is parked: a ``SessionParked`` record says why, callers get a clear
refusal, and no other session is affected. The waits are ``perdure.backoff``'s.

Sessions are created, forked and deleted here, as ``perdure.actors.decide.sessions``
decides: this job reads what the decision needs, takes the lease, and commits.
``ask``, ``peek`` and ``drain`` carry a caller's message, a read of the state in
memory, or the stop of dispatching to the running actors.
"""

from __future__ import annotations

import contextlib
import logging
import traceback
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol, TypeVar

import attrs
import trio

from perdure import retention
from perdure.actors.context import ActorContext
from perdure.actors.decide import sessions
from perdure.actors.decide.sessions import NewSession, allowed_tools
from perdure.actors.mailbox import CommandMsg, Drain, HandOver, Mailbox, Query, Reply, WaitIdle
from perdure.actors.protocol import Forked, Submit
from perdure.actors.session import SessionActor
from perdure.actors.state import SessionState
from perdure.actors.supervisor.agents import SubAgents
from perdure.actors.supervisor.base import (
    OUTAGE_BACKOFF,
    RESTART_BACKOFF,
    BootStarts,
    _refuse_queued,
)
from perdure.actors.supervisor.memory import dormant_state
from perdure.actors.supervisor.ownership import Ownership, _Lost
from perdure.errors import (
    NotOwnerRefused,
    Refused,
    SessionParkedError,
    SessionRestarting,
    UnknownSession,
    find_exception,
)
from perdure.observability import logs
from perdure.storage import (
    LogError,
    LogUnavailable,
    SessionFenced,
    StorageFull,
    check_session_id,
)
from perdure.storage.codec import CorruptRecord
from perdure.storage.records import (
    Budget,
    Committed,
    CompactionPolicy,
    RunFinished,
    SessionParked,
)

log = logging.getLogger("perdure.supervisor")

T = TypeVar("T")


class Asking(Protocol[T]):
    """A message for a session actor that carries the slot its answer goes to."""

    @property
    def reply(self) -> Reply[T]: ...


class _StartedOnce:
    """An actor's ``task_status``, passed on once and then forgotten.

    trio's task status holds the nursery of the task that called ``nursery.start``
    (a caller's command, the boot). Kept for the actor's lifetime it would keep that
    finished task alive, with its frames and cancel scopes, in every idle session.
    """

    __slots__ = ("_status",)

    def __init__(self, status: trio.TaskStatus[Any]) -> None:
        self._status: trio.TaskStatus[Any] | None = status

    def started(self, value: Any = None) -> None:
        status, self._status = self._status, None
        if status is None:
            raise RuntimeError("the actor reported its start twice")
        status.started(value)


class _Unreachable:
    """What ``_supervise`` reports when the log could not be read to start the actor."""

    def __init__(self, error: LogError) -> None:
        self.error = error


def _not_started(session_id: str, parked: Any) -> Refused | LogError:
    """What a starter hears when ``_supervise`` reported something else than a start."""
    if isinstance(parked, _Lost):
        return NotOwnerRefused(f"session {session_id}: {parked.reason}")
    if isinstance(parked, _Unreachable):
        return parked.error  # the caller hears it now, not when the outage ends
    return SessionParkedError(session_id, parked)


class _BootStarted:
    """The ``task_status`` of an actor start-up started on its records already read
    (``Supervisor._start_read``): when the actor reports, do what ``mailbox`` does
    once ``nursery.start`` returns, and count it in ``BootStarts``."""

    __slots__ = ("_box", "_session_id", "_starts", "_supervisor")

    def __init__(
        self, supervisor: Supervisor, session_id: str, box: Mailbox, starts: BootStarts
    ) -> None:
        self._supervisor, self._session_id, self._box, self._starts = (
            supervisor,
            session_id,
            box,
            starts,
        )

    def started(self, value: Any = None) -> None:
        supervisor, session_id = self._supervisor, self._session_id
        if value is None:
            supervisor.mailboxes[session_id] = self._box
        supervisor._starting.pop(session_id).set()
        self._starts.started()
        if value is not None:
            error = _not_started(session_id, value)
            assert isinstance(error, Refused | LogUnavailable | StorageFull), error
            supervisor._not_booted(session_id, error)


class Supervisor(Ownership):
    def __init__(self, ctx: ActorContext, caller_trace: Callable[[], str] | None = None) -> None:
        # The actors run sub-agents through this supervisor's job, which owns the
        # sessions (the context the runtime built is not changed).
        self.agents = SubAgents(self, caller_trace)
        super().__init__(attrs.evolve(ctx, agents=self.agents.run))

    """Owns the session actors of this process (the jobs: ``base``'s docstring)."""

    async def mailbox(self, session_id: str, records: list[Committed] | None = None) -> Mailbox:
        """The running session's mailbox, starting its actor (and recovery) if needed.

        ``records``: the session's whole log, already read (start-up); used only if an
        actor has to start, and only by the first one.
        """
        if session_id in self.parked:
            raise SessionParkedError(session_id, self.parked[session_id])
        box = self.mailboxes.get(session_id)
        if box is not None:
            if not box.evicted:
                return box
            del self.mailboxes[session_id]  # evicted while idle: start a fresh actor
        starting = self._starting.get(session_id)
        if starting is not None:
            await starting.wait()
            return await self.mailbox(session_id)
        starting = self._starting[session_id] = trio.Event()
        try:
            asleep = self.dormant.pop(session_id, None)
            woken: SessionState | None = None
            if not records:
                if asleep is None and not self.journal.log.multi_node:
                    # One read for both (the actor folds these records). A log other
                    # processes write is read by the actor once it holds the lease.
                    info, records = await self.journal.session_with_records(session_id)
                else:
                    info = await self.journal.session_info(session_id)
                if info is None:
                    raise UnknownSession(session_id)
                # A hibernated state is taken only if the log has nothing newer for the
                # session (it would, had anything but its own actor written to it).
                woken = None if asleep is None else await self._wake_state(session_id, asleep)
                if woken is not None and woken.last_seq != info.last_seq:
                    woken = None
            await self._acquire(session_id)
            box = Mailbox.open()
            assert self._nursery is not None
            self._lost.pop(session_id, None)
            # Shielded: a caller cancelled while the actor starts must not leave it
            # running unregistered (the next message would start a second actor of the
            # same session). The caller hears its cancellation at its next checkpoint.
            with trio.CancelScope(shield=True):
                parked = await self._nursery.start(
                    self._supervise, session_id, box, records or None, woken
                )
                if parked is None:
                    self.mailboxes[session_id] = box
            if parked is not None:
                raise _not_started(session_id, parked)
            return box
        finally:
            del self._starting[session_id]
            starting.set()

    def _start_read(self, session_id: str, records: list[Committed], starts: BootStarts) -> bool:
        """Start-up: start the actor of a session whose records were read, as
        ``mailbox`` would, but with no task of its own waiting for the start (nor
        ``nursery.start``'s nursery, cancel scope and move of the task): the actor
        reports it (``_BootStarted``). A single-node log only (its lease is granted
        at once); False for a session ``mailbox`` must start.
        """
        if (
            self.journal.log.multi_node
            or session_id in self._starting
            or session_id in self.mailboxes
            or session_id in self.parked
            or session_id in self.dormant
        ):
            return False
        self.journal.log.acquire(session_id)  # granted at once: the log's owner lock fences
        self._starting[session_id] = trio.Event()
        box = Mailbox.open()
        self._lost.pop(session_id, None)
        starts.add()
        status = _BootStarted(self, session_id, box, starts)
        assert self._nursery is not None
        self._nursery.start_soon(
            partial(self._supervise, session_id, box, records, None, task_status=status)
        )
        return True

    async def _supervise(
        self,
        session_id: str,
        box: Mailbox,
        records: list[Committed] | None = None,
        woken: SessionState | None = None,
        *,
        task_status: trio.TaskStatus[Any],
    ) -> None:
        logs.bind(session_id=session_id)
        status: trio.TaskStatus[Any] = _StartedOnce(task_status)
        del task_status  # held by ``status`` until the actor has started, then dropped
        failures: list[float] = []
        outages = 0  # consecutive restarts because the log could not be reached
        told: set[str] = set()  # crashes already logged with their traceback
        while True:
            actor = SessionActor(session_id, self.ctx, box, records, woken)
            records = woken = None  # a restarted actor reads the log afresh
            self.actors[session_id] = actor
            scope = self._scopes[session_id] = trio.CancelScope()
            try:
                with scope:
                    await actor.run(task_status=status)
                if box.handed_over:
                    await self._finish_hand_over(session_id, actor, box, scope)
                    return
                if box.evicted:
                    await self._forget_evicted(session_id, actor, box, scope)
                    return
                reason = self._lost.get(session_id, "its lease was lost")
                self._release_lost(session_id, actor, box, status, reason)
                await self._let_lease_go(session_id)
                return
            except Exception as exc:
                if self.journal.fence_error is not None:
                    raise self.journal.fence_error from None
                fenced = find_exception(exc, SessionFenced)
                if fenced is not None:
                    log.warning("session %s stopped: %s", session_id, fenced)
                    self._release_lost(session_id, actor, box, status, str(fenced))
                    await self._let_lease_go(session_id)
                    return
                if box.handed_over:  # it had stopped at a safe point; a straggler failed
                    log.warning("session %s: after its hand-over: %s", session_id, exc)
                    await self._finish_hand_over(session_id, actor, box, scope)
                    return
                if actor.started:
                    status = trio.TASK_STATUS_IGNORED
                unavailable = _transient(exc)
                if unavailable is not None:
                    # The log is down or full, not the session broken: never park for it.
                    # Nobody waits through the outage: whoever waits hears it now.
                    actor.fail_pending(unavailable)
                    _refuse_queued(box, unavailable)
                    if status is not trio.TASK_STATUS_IGNORED:
                        # A starter waits (a command or the boot): tell it, start nothing,
                        # and stop holding the lease (it lapses if it cannot be released).
                        with contextlib.suppress(LogError):
                            await self.journal.release_session(session_id)
                        self._drop(session_id, actor, scope)
                        status.started(_Unreachable(unavailable))
                        return
                    # A running session: restart it from the log when the log answers.
                    outages = 1 if actor.started else outages + 1
                    self.unreachable[session_id] = unavailable
                    log.warning(
                        "session %s waits for the log (%s); restarting it from the log",
                        session_id,
                        unavailable,
                    )
                    await trio.sleep(OUTAGE_BACKOFF.delay(outages))
                    continue
                outages = 0
                now = self.ctx.clock()
                window = self.ctx.settings.restart_window
                failures = [t for t in failures if now - t < window] + [now]
                summary = _summary(exc)
                # A damaged record is one clear line (the error names its seq), and a
                # crash that repeats is told once with its traceback, then in one line.
                damaged = find_exception(exc, CorruptRecord) is not None
                detail = (
                    ""
                    if damaged or summary in told
                    else "\n" + "".join(traceback.format_exception(exc))
                )
                # Repeats say nothing new: below the error level (the parking says it).
                level = logging.INFO if summary in told else logging.ERROR
                told.add(summary)
                log.log(
                    level,
                    "session %s actor crashed (%d in %.0fs): %s%s",
                    session_id,
                    len(failures),
                    self.ctx.settings.restart_window,
                    summary,
                    detail,
                )
                actor.fail_pending(SessionRestarting(session_id, summary))
                if len(failures) > self.ctx.settings.max_restarts:
                    reason = f"its actor crashed {len(failures)} times; last error: {summary}"
                    await self._park(session_id, reason)
                    if not actor.started:
                        status.started(reason)
                    await self._refuse_forever(session_id, box, reason)
                    return
                await trio.sleep(RESTART_BACKOFF.delay(len(failures)))

    async def _park(self, session_id: str, reason: str) -> None:
        log.error("session %s parked: %s", session_id, reason)
        self.parked[session_id] = reason
        self.mailboxes.pop(session_id, None)
        self.actors.pop(session_id, None)
        try:
            await self.journal.append(
                [SessionParked(session_id=session_id, reason=reason, at=self.ctx.clock())]
            )
        except LogError as exc:
            log.error("session %s: could not record that it is parked: %s", session_id, exc)

    async def _refuse_forever(self, session_id: str, box: Mailbox, reason: str) -> None:
        """Answer whatever was already queued for a parked session, then stop listening."""
        _refuse_queued(box, SessionParkedError(session_id, reason))

    async def create_session(
        self,
        session_id: str,
        system: str | None,
        budget: Budget | None = None,
        if_busy: str | None = None,
        *,
        parent: str | None = None,
        tools: list[str] | None = None,
        task: Submit | None = None,
        compaction: CompactionPolicy | None = None,
    ) -> bool:
        """Record a new session; False if it already existed (creation is idempotent).

        Asking again with another system prompt is a conflict: the session keeps the
        prompt it was created with, and the caller hears that it differs. ``task``: its
        first input, accepted in the same commit (a sub-agent never exists without
        its task); a caller told False submits it as usual (idempotent).
        """
        check_session_id(session_id)
        new = NewSession(
            session_id=session_id,
            system=system,
            budget=budget,
            if_busy=if_busy,
            parent=parent,
            tools=tools,
            task=task,
            compaction=compaction,
        )
        env = self.ctx.env(allowed_tools(self.ctx.tools, tools))
        async with self._create_lock:
            existing = None
            if session_id in self.mailboxes or await self.journal.session_info(session_id):
                # Its first record, to compare the prompt and grant (none read if not given).
                existing = (
                    await self.journal.read_session(session_id, 0, 1)
                    if system is not None or tools is not None
                    else []
                )
            records = sessions.create(new, existing, env, self.ctx.clock())
            if not records:
                return False
            await self._acquire(session_id)
            await self.journal.append(records)
            return True

    async def fork_session(
        self,
        source: str,
        session_id: str,
        at: int | str | None,
        request_id: str,
        files: bool = False,
    ) -> Forked:
        """Record ``session_id`` as a fork of ``source`` at a settled point, in one commit.

        Idempotent by ``request_id``: the same fork asked again answers as the first
        time (``duplicate``); another request for an existing id is a conflict.
        """
        check_session_id(session_id)
        async with self._create_lock:
            existing = history = None
            if session_id in self.mailboxes or await self.journal.session_info(session_id):
                existing = await self.journal.read_session(session_id, 0, 2)
            else:
                history = await self.journal.read_session(source)
            decided = sessions.fork(
                source,
                session_id,
                at,
                request_id,
                existing=existing,
                history=history or [],
                now=self.ctx.clock(),
                files=files,
            )
            if decided.records:
                await self._acquire(session_id)
                await self.journal.append(decided.records)
            return decided.forked

    async def delete_session(self, session_id: str, reason: str) -> int:
        """Remove a finished session from the log (``perdure.retention``); its resident
        actor is stopped first, and no actor starts for it while this runs."""
        while session_id in self._starting:
            await self._starting[session_id].wait()
        gate = self._starting[session_id] = trio.Event()
        stopped = False
        try:
            sessions.refuse_unfinished(session_id, await self.journal.session_info(session_id))
            actor = self.actors.get(session_id)
            scope = self._scopes.get(session_id)
            if actor is not None and scope is not None:
                self._lost[session_id] = "the session was deleted"
                scope.cancel()
                stopped = True
                while self.actors.get(session_id) is actor:  # noqa: ASYNC110
                    await trio.sleep(0.005)  # _supervise forgets it (its callers are told)
            self.parked.pop(session_id, None)
            self.dormant.pop(session_id, None)
            return await retention.delete_session(
                self.journal, session_id, self.ctx.clock(), reason
            )
        except Refused:
            if stopped:  # work slipped in before the actor stopped: it must go on
                self._nursery_start(self._boot_one, session_id)
            raise
        finally:
            del self._starting[session_id]
            gate.set()

    async def ask(self, session_id: str, make: Callable[[], Asking[T]]) -> T:
        """Send a message built by ``make`` to the session and wait for its reply."""
        box = await self.mailbox(session_id)
        outage = self.unreachable.get(session_id)
        if outage is not None:
            actor = self.actors.get(session_id)
            if actor is None or not actor.started:
                raise outage
            del self.unreachable[session_id]  # restarted: the log answers again
        message = make()
        reply = message.reply
        # Every Asking is one of the mailbox's messages; the check lets the type say so.
        assert isinstance(message, CommandMsg | WaitIdle | Query | Drain | HandOver), message
        try:
            await box.send.send(message)
        except trio.BrokenResourceError:
            if box.evicted:
                return await self.ask(session_id, make)  # evicted meanwhile: start it again
            # The session went away (its lease was lost) between lookup and send.
            reason = self._lost.get(session_id, "its lease was lost")
            raise NotOwnerRefused(
                f"session {session_id} is no longer run by this node: {reason}"
            ) from None
        return await reply.wait()

    async def wait_idle(self, session_id: str) -> RunFinished | None:
        """Wait until no run is in progress and no input is queued; the last outcome."""
        asleep = self.dormant.get(session_id)
        if asleep is not None:  # hibernated, so idle: no actor is woken to say so
            outcome = (await dormant_state(asleep)).last_outcome
            await trio.lowlevel.checkpoint()
            return outcome
        return await self.ask(session_id, WaitIdle)

    async def peek(self, session_id: str, fn: Callable[[SessionState], T]) -> tuple[bool, T | None]:
        """``(True, fn(state))`` on the state in memory, if the session has one: the live
        actor's (asked through its mailbox) or a dormant one's. ``(False, None)`` when
        no actor runs it here: the caller reads the log instead. Never starts an actor,
        so a read takes no lease and runs no recovery.
        """
        asleep = self.dormant.get(session_id)
        if asleep is not None:
            answer = fn(await dormant_state(asleep))
            await trio.lowlevel.checkpoint()
            return True, answer
        box = self.mailboxes.get(session_id)
        if box is None or box.evicted or session_id in self.parked:
            return False, None
        if session_id in self.unreachable:  # its actor waits for the log: so would this
            return False, None
        message: Query[T] = Query(fn)
        try:
            await box.send.send(message)
        except trio.BrokenResourceError:
            return False, None  # evicted or gone since the lookup: the log has it all
        return True, await message.reply.wait()

    async def drain(self) -> None:
        """Ask every session to stop dispatching and wait until their tools are done."""
        self._draining = True
        async with trio.open_nursery() as nursery:
            for session_id, box in list(self.mailboxes.items()):
                if box.evicted:
                    continue
                nursery.start_soon(self._drain_one, session_id, Drain)

    async def _drain_one(self, session_id: str, drain: Callable[[], Drain]) -> None:
        # Straight to the running actor: a session evicted meanwhile has nothing to
        # drain, and stopping must not start an actor.
        box = self.mailboxes.get(session_id)
        if box is None or box.evicted:
            return
        message = drain()
        try:
            await box.send.send(message)
        except trio.BrokenResourceError:
            return
        with contextlib.suppress(Refused, SessionRestarting, LogError):
            await message.reply.wait()


def _transient(exc: BaseException) -> LogError | None:
    """The error, if every failure in ``exc`` says the log cannot be reached or is full."""
    if isinstance(exc, LogUnavailable | StorageFull):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        found = [_transient(inner) for inner in exc.exceptions]
        if found and all(f is not None for f in found):
            return found[0]
    return None


def _summary(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return _summary(exc.exceptions[0])
    return f"{type(exc).__name__}: {exc}"
