"""The session actor: the trio shell around a session's pure decisions.

It is the only writer of its session's records. Its loop is always the same:
take one message (a caller's command, a child actor's result), ask ``decide``
what it means, fold the resulting records into the state, commit them through the
Journal, and only THEN perform the effects (start a model call, run a tool, cancel
one) and answer the caller. If a commit fails, the optimistic fold is undone by
re-reading the session's log, no effect is performed, and the caller hears why.
A fenced commit (the log or, with several nodes, this session's lease went to
another owner) and a commit whose outcome is unknown (the database connection
broke during COMMIT) end the actor instead: the supervisor stops the former and
restarts the latter from the log, exactly as after a crash.

Children (generation and tool actors) run in the session's nursery and report on
the session's mailbox; the session decides what their results mean. So do its
timers. Every retry waits on one of them, whatever failed: a tool call's back-off
(``BackOff``; the timer reports ``BackOffOver``) and a model call's or a summary's
(``CallModel``/``Summarize`` whose ``not_before`` is still to come; the timer holds the
call, and only when it is due does the session start the generation actor). A cancel
or a revision during the wait cancels the timer (``StopBackOff``, ``CancelModel``), and
a hand-over stops it (the wait's end is in the log), so a call that was waiting never
starts. The throttle of heartbeats (``perdure.actors.heartbeats``) keeps timers too:
a running call's latest ``ctx.heartbeat`` is committed at most once per
``heartbeat_interval``, the latest winning, and one still held is committed before the
call's result.

What the actor leans on, each a module with one job: its ``mailbox`` (everything it is
told, and the one-shot replies it owes), ``effects`` (starting each effect as a child
task or a timer), ``inflight`` (the cancel scopes of what runs or waits on this node,
and the ``View`` the core is shown of it) and ``heartbeats`` (the throttle above). What
is left here is the actor's own: the loop, commit-then-act, eviction when idle, and the
safe point of a hand-over.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

import trio
from attrs import evolve

from perdure import _faults
from perdure.actors import conversation, decide, protocol
from perdure.actors.context import ActorContext
from perdure.actors.decide.sessions import allowed_tools
from perdure.actors.effects import Performer
from perdure.actors.heartbeats import HeartbeatThrottle
from perdure.actors.inflight import InFlight, model_key
from perdure.actors.mailbox import (
    CallDue,
    CommandMsg,
    Drain,
    FlushHeartbeat,
    HandOver,
    HandOverDue,
    Inbox,
    Mailbox,
    Query,
    Reply,
    RetryResult,
    WaitIdle,
)
from perdure.actors.readmodel import StateLookup
from perdure.actors.state import SessionState
from perdure.backoff import Backoff
from perdure.errors import Refused, SessionParkedError
from perdure.observability import logs
from perdure.observability.hooks import observe_after, observe_before, observe_failed
from perdure.providers.base import ModelRequest
from perdure.storage import CommitUnknown, Guard, LogError, LogFenced, LogUnavailable
from perdure.storage.records import Committed, ContextCompacted, RunFinished
from perdure.tools.contract import Tool

log = logging.getLogger("perdure.session")

RELOAD_TRIES = 8  # re-reads after a failed commit before the actor gives up (~6 s)
RELOAD_BACKOFF = Backoff(initial=0.05, cap=2.0)  # between those re-reads (perdure.backoff)


class SessionActor:
    """One session's actor: the only writer of its records (see the module's docstring)."""

    def __init__(
        self,
        session_id: str,
        ctx: ActorContext,
        mailbox: Mailbox,
        records: list[Committed] | None = None,
        state: SessionState | None = None,
    ) -> None:
        self.session_id = session_id
        self.ctx = ctx
        self.mailbox = mailbox
        # The session's records if the supervisor already read them (a batched read at
        # start-up); folded once by ``run``, then dropped. None: ``run`` reads them.
        self._preloaded = records
        # Or its state as a hibernated actor left it, checked against the log by the
        # supervisor (the same last seq): taken as it is, nothing read or folded.
        self._woken = state
        self.state = SessionState(session_id)
        self.started = False
        self.hibernated = False  # it stopped idle and left its state to the supervisor
        self._nursery: trio.Nursery | None = None
        self._calls = InFlight()  # its calls and timers on this node (perdure.actors.inflight)
        self._beats = HeartbeatThrottle(
            ctx.settings.heartbeat_interval, self._commit_heartbeat, mailbox.send
        )
        self._waiters: list[Reply[RunFinished | None]] = []
        self._drains: list[Reply[None]] = []
        self._draining = False
        self._handover: HandOver | None = None  # asked to move to another node
        self._handover_timer: trio.CancelScope | None = None
        self._pending: list[Reply[Any]] = []  # replies owed if this actor dies
        self._messages = conversation.MessageCache()  # the model's view, built incrementally
        self._effects = Performer(session_id, ctx, self._calls, mailbox.send, self._model_request)

    # -- lifecycle ------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        logs.bind(session_id=self.session_id)  # on every line of this actor and its children
        async with trio.open_nursery() as nursery:
            self._nursery = self._effects.nursery = nursery
            records, self._preloaded = self._preloaded, None
            woken, self._woken = self._woken, None
            if woken is not None:
                self.state = woken
            elif records is None:
                self.state = await self._load()
            else:
                self.state = SessionState.fold(self.session_id, records)
            env = self._env()
            await self._commit(decide.recover(self.state, env), env, recovering=True)
            self.started = True
            task_status.started()
            self._after_message()
            while not self._hand_off():
                message = await self._next_message()
                if message is None:
                    return  # evicted: the supervisor forgets this actor
                await self._handle(message)
                del message  # an idle actor must not keep its last message (a reply...)
                self._after_message()

    async def _next_message(self) -> Inbox | None:
        """The next message, or None once the session has stayed idle long enough.

        Eviction happens only when nothing is in flight or owed to anyone, so the
        actor holds nothing the log does not. The decision and the closing of the
        mailbox happen without a checkpoint in between: no message can slip into a
        mailbox nobody will read (a sender sees it closed and goes to a new actor).
        """
        receive = self.mailbox.receive
        timeout, hibernate = self.ctx.settings.idle_timeout, self.ctx.settings.hibernate_after
        hibernating = hibernate is not None and (timeout is None or hibernate < timeout)
        if hibernating:
            timeout = hibernate
        while True:
            if timeout is None or not self._evictable():
                return await receive.receive()
            try:
                return receive.receive_nowait()  # a queued message is always taken first
            except trio.WouldBlock:
                pass
            with trio.move_on_after(timeout):
                return await receive.receive()
            # A cancelled receive took nothing, but a message may have arrived since.
            if self._evictable() and receive.statistics().current_buffer_used == 0:
                self.mailbox.evicted = True
                self.hibernated = hibernating
                receive.close()
                return None

    def _evictable(self) -> bool:
        return (
            self.state.idle
            and self.at_rest()
            and not (self._waiters or self._drains or self._draining or self._handover)
        )

    def at_rest(self) -> bool:
        """Nothing in flight on this node: no model call, tool, reconcile or cancel
        running, no result held for a later commit, no back-off timer, no heartbeat
        held back, no command being committed."""
        return not (self._calls or self._beats or self._pending)

    def calling_model(self) -> bool:
        """A model call is in flight (its reply, then its tool calls, are still to come).
        One still waiting out its back-off is not: a hand-over stops that wait at once."""
        return bool(self._calls.models.keys() - self._calls.waiting_models)

    def _hand_off(self) -> bool:
        """At a safe point of a hand-over, stop: close the mailbox and answer it.

        The safe point is ``at_rest`` with the mailbox empty (every message received
        was handled), checked and acted on with no checkpoint in between, as eviction
        is: a sender sees the mailbox closed and goes through the supervisor, which
        gives the lease away only once this actor's task has ended.
        """
        handover = self._handover
        if handover is None or not self.at_rest():
            return False
        if self.mailbox.receive.statistics().current_buffer_used:
            return False
        self.mailbox.evicted = self.mailbox.handed_over = True
        self.mailbox.receive.close()
        if self._handover_timer is not None:
            self._handover_timer.cancel()
        handover.reply.set(None)
        return True

    def fail_pending(self, error: BaseException) -> None:
        """Called by the supervisor when this actor died: nobody may wait forever."""
        owed = self._pending + self._waiters + self._drains
        if self._handover is not None:
            owed.append(self._handover.reply)
        for reply in owed:
            reply.fail(error)

    async def _load(self) -> SessionState:
        records = await self.ctx.journal.read_session(self.session_id)
        return SessionState.fold(self.session_id, records)

    def _env(self) -> protocol.Env:
        return self.ctx.env(self._registered())

    def _registered(self) -> Mapping[str, Tool]:
        """The tools this session may use (a sub-agent may be limited to some)."""
        return allowed_tools(self.ctx.tools, self.state.allowed_tools)

    def _view(self) -> protocol.View:
        return self._calls.view(draining=self._draining, handing_over=self._handover is not None)

    # -- the loop -------------------------------------------------------------------

    async def _handle(self, message: Inbox) -> None:
        if isinstance(message, CommandMsg):
            await self._command(message)
        elif isinstance(message, protocol.ModelReplied | protocol.ModelFailed):
            if not self._calls.model_reported(message.generation_id):
                return  # the call was cancelled; its late report means nothing
            await self._result(message)
        elif isinstance(message, protocol.RestoreFinished):
            self._calls.tool_reported(message.call_id)
            await self._result(message)
        elif isinstance(message, protocol.ToolFinished | protocol.ReconcileFinished):
            await self._beats.finish(message.call_id)
            self._calls.tool_reported(message.call_id)
            await self._result(message)
        elif isinstance(message, protocol.HeartbeatReported):
            if message.call_id in self._calls.tools:  # else its attempt already reported its end
                assert self._nursery is not None
                await self._beats.offer(message, self._nursery)
        elif isinstance(message, protocol.AgentLinked):
            await self._link(message)
        elif isinstance(message, FlushHeartbeat):
            await self._beats.flush(message.call_id)
        elif isinstance(message, protocol.BackOffOver):
            if not self._calls.back_off_over(message.call_id):
                return  # the wait was stopped (the call was cancelled); nothing is due
            await self._result(message)
        elif isinstance(message, CallDue):
            if self._calls.model_due(model_key(message.effect), message.timer):
                self._effects.start_model_call(message.effect, self._run_id(), message.durable)
            # else: cancelled (or called off) while it waited; nothing is due
        elif isinstance(message, RetryResult):
            self._calls.release(message.result)
            await self._result(message.result)
        elif isinstance(message, WaitIdle):
            self._waiters.append(message.reply)
        elif isinstance(message, Query):
            try:
                message.reply.set(message.fn(self.state))
            except Exception as exc:
                message.reply.fail(exc)
        elif isinstance(message, Drain):
            self._draining = True
            self._drains.append(message.reply)
        elif isinstance(message, HandOver):
            self._start_hand_over(message)
        elif isinstance(message, HandOverDue):
            if self._handover is message.handover:
                target = message.handover.target
                await self._keep(f"no safe point before the deadline (to node {target})")
        else:
            raise TypeError(f"session {self.session_id}: unexpected message {message!r}")

    # -- hand-over to another node (perdure.actors.balance) -----------------------------

    def _start_hand_over(self, handover: HandOver) -> None:
        """From now on dispatch only the current step's tool calls (``View.handing_over``).

        Back-off timers (a tool call's retry, a model call's) stop at once: a back-off's
        end is in the log (``not_before``), so the next owner waits out the rest. A
        result held back for a later commit (an outage) keeps its place, and the session
        is not at rest until it lands.
        """
        if self._handover is not None or self._draining:
            handover.reply.fail(Refused("busy", "the session is already moving or stopping"))
            return
        self._handover = handover
        self._calls.stop_timers()
        assert self._nursery is not None
        self._handover_timer = trio.CancelScope(deadline=handover.deadline)
        self._nursery.start_soon(self._hand_over_due, handover, self._handover_timer)

    async def _hand_over_due(self, handover: HandOver, timer: trio.CancelScope) -> None:
        with timer:
            await trio.sleep_forever()
        if self._handover is handover and not self.mailbox.handed_over:  # the deadline passed
            await self.mailbox.send.send(HandOverDue(handover))

    async def _keep(self, why: str) -> None:
        """The hand-over gave up: dispatch again what it held back."""
        handover, self._handover = self._handover, None
        assert handover is not None
        handover.reply.fail(Refused("busy", f"session {self.session_id} stays: {why}"))
        await self._commit(protocol.NOTHING, self._env())

    async def _command(self, message: CommandMsg[Any]) -> None:
        reply = message.reply
        try:
            env = self._env()
            step, answer = decide.command(self.state, env, message.command)
        except Refused as exc:
            reply.fail(exc)
            return
        self._pending.append(reply)
        try:
            committed = await self._commit(step, env)
        except LogError as exc:
            if isinstance(exc, LogFenced | CommitUnknown):
                raise  # fenced: stop; unknown: restart from the log (fold + recover)
            self._pending.remove(reply)
            reply.fail(exc)
            return
        # Only an answered reply leaves ``_pending``: if the commit crashed the actor,
        # the supervisor's ``fail_pending`` tells this caller (SessionRestarting).
        self._pending.remove(reply)
        if committed and not answer.seq:
            answer = evolve(answer, seq=committed[0].seq)
        reply.set(answer)

    async def _result(self, result: protocol.Result) -> None:
        env = self._env()
        step = decide.on_result(self.state, env, result)
        try:
            await self._commit(step, env)
        except (LogFenced, CommitUnknown):
            raise
        except LogError as exc:
            # Nothing is lost: hold the result (its key stays "running" so nothing is
            # re-issued meanwhile) and try to commit it again later.
            log.warning(
                "session %s: cannot commit a result yet (%s); retrying", self.session_id, exc
            )
            self._calls.hold(result)
            assert self._nursery is not None
            self._nursery.start_soon(self._retry_later, result)

    async def _commit_heartbeat(self, beat: protocol.HeartbeatReported) -> None:
        """Commit a heartbeat the throttle lets through (``perdure.actors.heartbeats``)."""
        env = self._env()
        step = decide.on_result(self.state, env, beat)
        try:
            await self._commit(step, env)
        except (LogFenced, CommitUnknown):
            raise
        except LogError as exc:  # progress only: the next heartbeat will carry newer details
            log.warning("session %s: heartbeat of %s not saved (%s)", self.session_id, beat, exc)

    async def _link(self, link: protocol.AgentLinked) -> None:
        """A running call started a sub-agent: commit the link (``AgentStarted``).

        Not held for a later commit if the log cannot take it now (the call's attempt
        still holds its place): like a heartbeat, the link is what the parent knows of
        its child, and the child's own ``SessionCreated.parent`` keeps the other end.
        """
        env = self._env()
        step = decide.on_result(self.state, env, link)
        try:
            await self._commit(step, env)
        except (LogFenced, CommitUnknown):
            raise
        except LogError as exc:
            log.warning("session %s: sub-agent %s not linked (%s)", self.session_id, link, exc)

    async def _retry_later(self, result: protocol.Result, delay: float = 1.0) -> None:
        await trio.sleep(delay)
        await self.mailbox.send.send(RetryResult(result))

    def _after_message(self) -> None:
        if self._waiters and (self.state.idle or self.state.parked):
            outcome = self.state.last_outcome
            for reply in self._waiters:
                if self.state.parked:
                    reply.fail(SessionParkedError(self.session_id, self.state.parked))
                else:
                    reply.set(outcome)
            self._waiters.clear()
        if self._drains and not self._calls.tools:
            for drained in self._drains:
                drained.set(None)
            self._drains.clear()
        if self.state.idle:
            # Nothing will call the model before the next input: the rendered messages
            # are rebuilt from the state then, instead of held by every idle session.
            self._messages.clear()

    # -- commit, then act ------------------------------------------------------------

    async def _commit(
        self, first: protocol.Step, env: protocol.Env, *, recovering: bool = False
    ) -> list[Committed]:
        """Settle (under the ``env`` that decided ``first``), commit everything in one
        append, then perform the effects."""
        state = self.state
        rev_before = state.goal_rev
        step = decide.settle(state, env, self._view(), first, recovering=recovering)
        committed: list[Committed] = []
        effects = step.effects
        if step.records:
            seen = StateLookup(state)  # what the observers read of it (perdure.view)
            records = observe_before(self.ctx.observers, self.session_id, seen, step.records)
            overlap = self.ctx.overlap
            early = decide.overlapping(step, overlap)
            guard = Guard(self.session_id, rev_before)
            durable: trio.Event | None = None
            try:
                if early:
                    # Started while the commit is in flight (DESIGN, "What must be durable
                    # before what"): this loop handles their reports only after it.
                    durable = trio.Event()
                    effects = tuple(e for e in effects if e not in early)
                    committed = await self.ctx.journal.append(
                        records,
                        guard=guard,
                        meanwhile=lambda: self._perform_all(early, durable),
                        overlap=self.ctx.overlap_commit_after,
                    )
                else:
                    committed = await self.ctx.journal.append(records, guard=guard)
            except LogError as exc:
                self._calls.call_off(early)
                observe_failed(self.ctx.observers, self.session_id, seen, records)
                if isinstance(exc, LogFenced):
                    raise  # this actor stops; nothing more to undo
                self.state = await self._reload_after(exc)  # undo the optimistic fold
                raise
            if durable is not None:
                durable.set()
            for c in committed:
                state.note_committed(c)
            observe_after(self.ctx.observers, self.session_id, seen, committed)
            if _faults.ACTIVE and any(isinstance(c.record, ContextCompacted) for c in committed):
                _faults.hit("compaction.after")
        self._perform_all(effects)
        return committed

    def _perform_all(
        self, effects: Iterable[protocol.Effect], durable: trio.Event | None = None
    ) -> None:
        run_id = self._run_id()
        for effect in effects:
            self._effects.perform(effect, run_id, durable)

    async def _reload_after(self, failed: LogError) -> SessionState:
        """Re-read the state after a failed commit, waiting out a short outage.

        Tools keep running meanwhile. If the log stays unreachable, the state may hold
        records the log does not: the actor must stop, to restart from the log later.
        """
        for attempt in range(1, RELOAD_TRIES + 1):
            try:
                return await self._load()
            except LogUnavailable as exc:
                reread: LogError = exc
            await trio.sleep(RELOAD_BACKOFF.delay(attempt))
        raise CommitUnknown(
            f"session {self.session_id}: a commit failed ({failed}) and the log could not "
            f"be re-read ({reread})"
        ) from failed

    def _model_request(self, effect: protocol.CallModel | protocol.Summarize) -> ModelRequest:
        """What a model call (or a summary's) sends, built from the state when it starts."""
        if isinstance(effect, protocol.CallModel):
            return conversation.request(
                self.state, self._registered(), effect.generation_id, effect.attempt, self._messages
            )
        return conversation.summary_request(self.state, effect.compaction_id, effect.attempt)

    def _run_id(self) -> str | None:
        return self.state.run.run_id if self.state.run is not None else None
