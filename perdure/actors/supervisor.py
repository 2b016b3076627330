"""The supervisor: owns the session actors, starts the active ones, restarts crashed ones.

At start it reads the log's ``active`` index (sessions with unfinished work, not
the whole history) and starts those sessions' actors concurrently; each rebuilds
its state from its own records and re-issues its pending work before it reports
started. Other sessions are started on first use.

A session that stays idle (no run, no queued input, nothing in flight) for
``hibernate_after`` seconds has its actor hibernate: the task, its mailbox and
scopes go, the folded state stays here (``dormant``), and the next message starts
a new actor on it, without reading the log, if the log's last seq of the session
is still the state's. A session left dormant for ``FREEZE_AFTER`` times as long
again has its state frozen into one compact blob (``perdure.actors.dormant``):
about an eighth of the memory, paid for by unpickling it when the session wakes.
After ``idle_timeout`` seconds idle the session is evicted: its state is in the
log, so memory holds only the sessions in use, and with several nodes its lease is
given up (actors never hibernate there: another node may write the session). The
next message for it starts a fresh actor, which rebuilds the state as at start-up.

An actor that raises is restarted from its log. An actor stopped because the log
could not be reached (``LogUnavailable``, ``CommitUnknown``) or is full is
restarted with a back-off for as long as that lasts: an outage is not a broken
session. One that keeps failing otherwise
(``max_restarts`` times within ``restart_window`` seconds) is parked: a
``SessionParked`` record says why, callers get a clear refusal, and no other
session is affected. Losing ownership of the log (``LogFenced``) is different: it
stops the whole runtime at once.

Ownership of sessions goes through the log's lease hooks, so this code is the
same for one owner (LMDB, where every lease is granted) and for many nodes
(PostgreSQL). A session's actor starts only once this process holds its lease;
a command for a session another live node holds is refused with ``not_owner``
naming that node. With a multi-node log a heartbeat renews the leases every
third of their TTL, on a fixed cadence and doing nothing else; a second task, at
the same period, claims orphaned active sessions (a dead node's). A session whose
lease is lost (the heartbeat says so, or a commit is fenced) has its actor stopped
at once, its callers refused, and nothing else is touched.

Rebalancing (multi-node, ``ctx.rebalance``): each period the second task also takes
the sessions peers handed to it (``accept``), surveys the cluster, and sheds what
``perdure.actors.balance.plan`` gives it. A session to shed is asked to hand over
(``HandOver``): its actor finishes the current step, starts nothing new, and stops
at the next safe point (nothing in flight; see ``SessionActor.at_rest``). Only once
the actor's task has ended is the lease given to the target (``hand_over``: a new
epoch, so this node is fenced from the session from then on). Commands that arrive
meanwhile are served by the actor as usual; those that arrive after it stopped
wait for the lease to go, then hear ``not_owner`` naming the new owner. A hand-over
that finds no safe point within two lease TTLs gives up, and the session stays.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import traceback
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

import trio

from perdure import _libc, _threads, retention
from perdure.actors import balance, dormant
from perdure.actors.context import ActorContext
from perdure.actors.decide import sessions
from perdure.actors.decide.sessions import NewSession
from perdure.actors.protocol import Forked, Submit
from perdure.actors.session import (
    Drain,
    HandOver,
    Mailbox,
    Query,
    Reply,
    SessionActor,
    allowed_tools,
)
from perdure.actors.state import SessionState
from perdure.backoff import Backoff
from perdure.errors import (
    NotOwnerRefused,
    PerdureError,
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
    NotOwner,
    SessionFenced,
    StorageFull,
    check_session_id,
)
from perdure.storage.codec import CorruptRecord
from perdure.storage.records import (
    Budget,
    Committed,
    SessionParked,
)

log = logging.getLogger("perdure.supervisor")

T = TypeVar("T")


class Asking(Protocol[T]):
    """A message for a session actor that carries the slot its answer goes to."""

    @property
    def reply(self) -> Reply[T]: ...


MAX_OUTAGE_BACKOFF = 5.0  # seconds between restarts of a session while the log is down
# The waits before restarting an actor (``perdure.backoff``): while the log is down
# (0.1 s, doubling, at most MAX_OUTAGE_BACKOFF), and after a crash (at most 2 s).
OUTAGE_BACKOFF = Backoff(initial=0.1, cap=MAX_OUTAGE_BACKOFF)
RESTART_BACKOFF = Backoff(initial=0.1, cap=2.0)
BOOT_READ_BATCH = 100  # sessions whose records one worker-thread call reads at start-up
BOOT_READ_PARALLEL = 8  # such calls at once, for a multi-node (database) log


class _Lost:
    """What ``_supervise`` reports when the lease went before the actor started."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


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


# A dormant session's state is frozen once it has slept this many ``hibernate_after``
# periods: a session in use (a chat waiting for its user's next line) wakes on its
# objects at no cost; one left alone for longer gives most of its memory back.
FREEZE_AFTER = 10


class _Dormant:
    """A hibernated session's state as its actor left it, until it is frozen."""

    __slots__ = ("state", "unfrozen", "until")

    def __init__(self, state: SessionState, until: float) -> None:
        self.state = state
        self.until = until  # trio time of its eviction; inf without an idle_timeout
        self.unfrozen = False  # True once freezing it failed: it stays as it is


def _dormant_until(entry: _Dormant | bytes) -> float:
    return dormant.until(entry) if isinstance(entry, bytes) else entry.until


async def dormant_state(entry: _Dormant | bytes) -> SessionState:
    """The state of a dormant session (thawed, if it was frozen: a new object tree;
    a large one in a worker thread)."""
    if not isinstance(entry, bytes):
        return entry.state
    if len(entry) < dormant.OFF_LOOP_BYTES:
        return dormant.thaw(entry)
    return await _threads.run_sync(dormant.thaw, entry)


def freeze_round(
    entries: dict[str, _Dormant | bytes], seen: dict[str, float]
) -> tuple[list[str], dict[str, float]]:
    """One round of freezing: the sessions to freeze now, and the ones to look at
    again next round.

    ``seen`` is what the previous round returned: the unfrozen sessions then, by their
    eviction time. A session is frozen once it has been found asleep at two rounds
    in a row with the same eviction time; one that woke and fell asleep again in
    between has a new one, and waits a whole round again.
    """
    due: list[str] = []
    later: dict[str, float] = {}
    for session_id, entry in entries.items():
        if isinstance(entry, bytes) or entry.unfrozen:
            continue
        if seen.get(session_id) == entry.until:
            due.append(session_id)
        else:
            later[session_id] = entry.until
    return due, later


class _Unreachable:
    """What ``_supervise`` reports when the log could not be read to start the actor."""

    def __init__(self, error: LogError) -> None:
        self.error = error


class _Handing:
    """A hand-over under way: its target, and the start gate it holds until it ends."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.gate = trio.Event()


class Supervisor:
    def __init__(self, ctx: ActorContext) -> None:
        self.ctx = ctx
        self.journal = ctx.journal
        self.mailboxes: dict[str, Mailbox] = {}
        self.actors: dict[str, SessionActor] = {}
        self.parked: dict[str, str] = {}
        self._starting: dict[str, trio.Event] = {}
        self._create_lock = trio.Lock()
        self._nursery: trio.Nursery | None = None
        self._scopes: dict[str, trio.CancelScope] = {}
        self._lost: dict[str, str] = {}
        self.recovered: list[str] = []
        self.taken_over: list[str] = []  # sessions claimed by the heartbeat after start
        self.received: list[str] = []  # sessions other nodes handed to this one
        self.handed_over: list[str] = []  # sessions this node handed to another one
        self._handing: dict[str, _Handing] = {}
        self._arrived: dict[str, float] = {}  # trio time a session came from another node
        ttl = self.journal.log.lease_ttl
        self._balance = balance.Policy.for_lease_ttl(ttl)
        self._handover_timeout = 2 * ttl
        self._draining = False
        self.evictions = 0  # idle sessions evicted so far (their state dropped)
        self.hibernations = 0  # idle actors that stopped and left their state here
        # Hibernated sessions (ctx.hibernate_after): no actor, the state kept for the
        # next message (frozen by ``_freeze_dormant`` after a while); evicted by
        # ``_evict_dormant`` once idle_timeout has passed.
        self.dormant: dict[str, _Dormant | bytes] = {}
        self.freezes = 0  # dormant states frozen so far
        self.heap_trims = 0  # free heap given back after a round that froze or evicted
        self.freezes_at_trim = 0  # ``freezes`` when the heap was last trimmed
        self._trimming = False
        # Sessions whose running actor stopped because the log could not be reached,
        # while they wait to restart: commands for them are refused at once.
        self.unreachable: dict[str, LogError] = {}

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._watch_fence)
            claimed = await self.journal.claim()
            with _collector_paused():
                await self._boot(claimed, preload=True)
                # One scheduling round for the work recovery re-issued (the tasks it
                # spawned take their first step): the collector's first pass over all
                # that start-up built comes after it, not before.
                await trio.lowlevel.checkpoint()
            self.recovered = claimed
            task_status.started()
            if self.ctx.hibernate_after is not None:
                nursery.start_soon(self._freeze_dormant, self.ctx.hibernate_after)
                if self.ctx.idle_timeout is not None:
                    nursery.start_soon(self._evict_dormant)
            if self.journal.log.multi_node:
                nursery.start_soon(self._keep_leases)
                await self._take_and_shed()
            await trio.sleep_forever()

    async def _boot(self, sessions: list[str], *, preload: bool = False) -> None:
        """Start the actors of ``sessions`` concurrently.

        ``preload`` (start-up only, before the runtime answers any call, so nothing else
        can write these sessions meanwhile): their records are read first, in batches of
        ``BOOT_READ_BATCH`` sessions per worker-thread call, and handed to the actors,
        instead of two thread round trips per session. Reading everything before any
        actor starts keeps the first recovered sessions' next turns from slowing the
        reads of the others. A session whose log cannot be reached now is retried in the
        background, as when its actor cannot start; one whose read failed otherwise (a
        damaged record) is left to its actor, which reads it and reports it as always.
        """
        async with trio.open_nursery() as boot:
            if not preload:
                for session_id in sessions:
                    boot.start_soon(self._boot_one, session_id)
                return
            read: dict[str, list[Committed] | Exception] = {}

            # One batch at a time from LMDB: its reads are CPU-bound, and threads decoding
            # side by side only take turns at the GIL (measured slower). A database
            # backend's reads wait on the network: several batches at once.
            parallel = BOOT_READ_PARALLEL if self.journal.log.multi_node else 1
            limit = trio.CapacityLimiter(parallel)

            async def read_batch(batch: list[str]) -> None:
                async with limit:
                    with contextlib.suppress(LogError):  # each actor then tries for itself
                        read.update(await self.journal.read_sessions(batch))

            async with trio.open_nursery() as reads:
                for lo in range(0, len(sessions), BOOT_READ_BATCH):
                    reads.start_soon(read_batch, sessions[lo : lo + BOOT_READ_BATCH])
            for session_id in sessions:
                found = read.pop(session_id, None)
                if isinstance(found, LogUnavailable | StorageFull):
                    log.warning("session %s cannot start yet (%s); retrying", session_id, found)
                    self._nursery_start(self._boot_when_reachable, session_id)
                    continue
                records = found if isinstance(found, list) else None
                boot.start_soon(self._boot_one, session_id, records)

    async def _boot_when_reachable(self, session_id: str) -> None:
        """Start a session with unfinished work once the log can be read again."""
        tries = 0
        while session_id not in self.mailboxes and session_id not in self.parked:
            tries += 1
            await trio.sleep(OUTAGE_BACKOFF.delay(tries))
            try:
                await self.mailbox(session_id)
                return  # started (it may be evicted later: that is not ours to undo)
            except (LogUnavailable, StorageFull) as exc:
                log.warning("session %s still cannot start (%s); retrying", session_id, exc)
            except (Refused, LogError) as exc:
                log.error("session %s not started: %s", session_id, exc)
                return

    async def _keep_leases(self) -> None:
        """The lease heartbeat: every third of the TTL, renew this node's entry and its
        leases, and stop the sessions whose lease is gone. It runs on a fixed cadence and
        does nothing else, so that claiming and rebalancing never delay a renewal."""
        period = self.journal.log.lease_ttl / 3
        cadence = _Cadence(period)
        while True:
            await cadence.tick()
            try:
                lost = await self.journal.renew()
            except LogError as exc:
                log.warning("lease heartbeat failed (%s); retrying", exc)
                continue
            for session_id in lost:
                self._lose(session_id, "its lease expired and another node took it over")

    async def _take_and_shed(self) -> None:
        """Every third of the TTL: run the sessions handed to us and the orphans we
        claim, then shed what rebalancing asks."""
        period = self.journal.log.lease_ttl / 3
        cadence = _Cadence(period)
        while True:
            await cadence.tick()
            if self._draining:
                continue  # shutting down: keep what we hold, take nothing new
            try:
                received = await self.journal.accept() if self.ctx.rebalance else []
                claimed = await self.journal.claim()
            except LogError as exc:
                log.warning("claiming sessions failed (%s); retrying", exc)
                continue
            now = trio.current_time()
            for session_id in received + claimed:
                self._arrived[session_id] = now
            if received:
                log.info("received sessions %s", received)
                self.received += received
                self._nursery_start(self._boot, received)
            if claimed:
                log.info("took over sessions %s", claimed)
                self.taken_over += claimed
                self._nursery_start(self._boot, claimed)
            if self.ctx.rebalance:
                await self._rebalance()

    # -- rebalancing: hand sessions over to other nodes --------------------------------

    async def _rebalance(self) -> None:
        """Survey the cluster and ask for this node's part of the moves."""
        try:
            view = await self.journal.survey()
        except LogError as exc:
            log.warning("rebalancing survey failed (%s); retrying", exc)
            return
        moves = balance.plan(
            view,
            self.journal.log.node_id,
            self._candidates(),
            handing=len(self._handing),
            policy=self._balance,
        )
        for move in moves:
            if move.session_id in self._starting:
                continue  # an actor is starting or going: not now
            handing = self._handing[move.session_id] = _Handing(move.target)
            # Held until the hand-over ends: once the actor has stopped, a command waits
            # for the lease to go, then hears who has it.
            self._starting[move.session_id] = handing.gate
            self._nursery_start(self._hand_over, move.session_id, handing)
        if moves:
            log.info("handing over %d sessions (survey: %s)", len(moves), view)

    def _candidates(self) -> list[balance.Candidate]:
        """The running sessions with unfinished work that could move."""
        now = trio.current_time()
        cooled = [sid for sid, t in self._arrived.items() if now - t > self._balance.cooldown]
        for session_id in cooled:  # settled long enough: nothing to remember
            del self._arrived[session_id]
        found = []
        for session_id, actor in self.actors.items():
            box = self.mailboxes.get(session_id)
            if box is None or box.evicted or not actor.started:
                continue
            if session_id in self._handing or session_id in self.unreachable:
                continue
            state = actor.state
            if state.idle or state.parked:
                continue
            arrived = self._arrived.get(session_id)
            found.append(
                balance.Candidate(
                    session_id,
                    at_rest=actor.at_rest(),
                    settled_for=float("inf") if arrived is None else now - arrived,
                    # A sub-agent's parent waits for it through this node's actor.
                    pinned=state.parent is not None,
                    calling_model=actor.calling_model(),
                )
            )
        return found

    async def _hand_over(self, session_id: str, handing: _Handing) -> None:
        """Ask the actor to stop at its next safe point (``_finish_hand_over`` then
        gives the lease away); if it cannot, the session stays and cools down."""
        message = HandOver(handing.target, trio.current_time() + self._handover_timeout)
        handed = False
        try:
            box = self.mailboxes.get(session_id)
            if box is None or box.evicted:
                return
            await box.send.send(message)
            await message.reply.wait()
            handed = True
        except trio.BrokenResourceError:
            pass  # the session went away meanwhile
        except (PerdureError, LogError) as exc:
            log.info("session %s not handed over: %s", session_id, exc)
            self._arrived[session_id] = trio.current_time()  # not again for a while
        finally:
            if not handed:
                self._end_handing(session_id, handing)

    async def _finish_hand_over(
        self, session_id: str, actor: SessionActor, box: Mailbox, scope: trio.CancelScope
    ) -> None:
        """The actor stopped at a safe point: give the lease to the target now."""
        handing = self._handing.get(session_id)
        if self.mailboxes.get(session_id) is box:
            del self.mailboxes[session_id]
        self._drop(session_id, actor, scope)
        target = handing.target if handing is not None else ""
        moved = False
        try:
            if actor.state.idle or handing is None:  # its work ended meanwhile: just go
                await self.journal.release_session(session_id)
            else:
                moved = await self.journal.hand_over(session_id, target)
        except LogError as exc:
            # It is no longer renewed here: the lease lapses within a TTL for a claim.
            log.warning("session %s: could not hand its lease over: %s", session_id, exc)
        if moved:
            self.handed_over.append(session_id)
            log.info("session %s handed over to node %s", session_id, target)
            error = NotOwnerRefused(
                f"session {session_id} is no longer run by this node: it moved to node "
                f"{target}; send its commands there",
                target,
            )
        else:
            error = NotOwnerRefused(
                f"session {session_id} is no longer run by this node: its lease was "
                "released for another node to take; retry"
            )
        actor.fail_pending(error)
        _refuse_queued(box, error)
        if handing is not None:
            self._end_handing(session_id, handing)

    def _end_handing(self, session_id: str, handing: _Handing) -> None:
        if self._handing.get(session_id) is handing:
            del self._handing[session_id]
        if self._starting.get(session_id) is handing.gate:
            del self._starting[session_id]
        handing.gate.set()

    def _nursery_start(self, fn: Callable[..., Any], *args: Any) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(fn, *args)

    def _lose(self, session_id: str, reason: str) -> None:
        """The lease is gone: stop the session's actor now (its tools too)."""
        self._lost[session_id] = reason
        scope = self._scopes.get(session_id)
        if scope is not None:
            scope.cancel()

    async def _watch_fence(self) -> None:
        await self.journal.fenced.wait()
        assert self.journal.fence_error is not None
        raise self.journal.fence_error

    async def _boot_one(self, session_id: str, records: list[Committed] | None = None) -> None:
        try:
            await self.mailbox(session_id, records)
        except Refused as exc:
            log.error(
                "session %s not started: %s", session_id, exc, extra={"session_id": session_id}
            )
        except (LogUnavailable, StorageFull) as exc:
            # Its work must go on by itself: keep trying in the background, without
            # holding up the start of the others (or of the runtime).
            log.warning("session %s cannot start yet (%s); retrying", session_id, exc)
            self._nursery_start(self._boot_when_reachable, session_id)

    # -- sessions ---------------------------------------------------------------------

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
        self, source: str, session_id: str, at: int | str | None, request_id: str
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
            if isinstance(parked, _Lost):
                raise NotOwnerRefused(f"session {session_id}: {parked.reason}")
            if isinstance(parked, _Unreachable):
                raise parked.error  # the caller hears it now, not when the outage ends
            if parked is not None:
                raise SessionParkedError(session_id, parked)
            return box
        finally:
            del self._starting[session_id]
            starting.set()

    async def _acquire(self, session_id: str) -> None:
        try:
            await self.journal.acquire(session_id)
        except NotOwner as exc:
            raise NotOwnerRefused(str(exc), exc.owner) from None

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
                failures = [t for t in failures if now - t < self.ctx.restart_window] + [now]
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
                    self.ctx.restart_window,
                    summary,
                    detail,
                )
                actor.fail_pending(SessionRestarting(session_id, summary))
                if len(failures) > self.ctx.max_restarts:
                    reason = f"its actor crashed {len(failures)} times; last error: {summary}"
                    await self._park(session_id, reason)
                    if not actor.started:
                        status.started(reason)
                    await self._refuse_forever(session_id, box, reason)
                    return
                await trio.sleep(RESTART_BACKOFF.delay(len(failures)))

    def _drop(self, session_id: str, actor: SessionActor, scope: trio.CancelScope) -> None:
        """Forget this actor (not a newer one of the same session)."""
        if self.actors.get(session_id) is actor:
            del self.actors[session_id]
        if self._scopes.get(session_id) is scope:
            del self._scopes[session_id]

    async def _forget_evicted(
        self, session_id: str, actor: SessionActor, box: Mailbox, scope: trio.CancelScope
    ) -> None:
        """Drop an actor stopped while idle: keep its state if it hibernated, else
        give up its lease, unless the session is back in use."""
        if self.mailboxes.get(session_id) is box:
            del self.mailboxes[session_id]
        self._drop(session_id, actor, scope)
        if session_id in self._starting or session_id in self.mailboxes:
            if not actor.hibernated:
                self.evictions += 1
            return  # a new actor is starting (or running) and holds the lease
        if actor.hibernated:
            self.hibernations += 1
            timeout, hibernate = self.ctx.idle_timeout, self.ctx.hibernate_after
            rest = float("inf") if timeout is None else timeout - (hibernate or 0.0)
            self.dormant[session_id] = _Dormant(actor.state, trio.current_time() + rest)
            return  # the lease stays with the state (a single-owner log grants all)
        self.evictions += 1
        # Hold the start gate while the lease goes, so a new actor cannot acquire the
        # lease first and then lose it to this release.
        gate = self._starting[session_id] = trio.Event()
        try:
            await self.journal.release_session(session_id)
        except LogError as exc:
            log.warning("session %s: could not release its lease: %s", session_id, exc)
        finally:
            del self._starting[session_id]
            gate.set()

    async def _evict_dormant(self) -> None:
        """Evict hibernated sessions once they have been idle for ``idle_timeout``."""
        assert self.ctx.idle_timeout is not None
        period = min(max(self.ctx.idle_timeout / 8, 0.01), 5.0)
        while True:
            await trio.sleep(period)
            now = trio.current_time()
            expired = [sid for sid, d in self.dormant.items() if _dormant_until(d) <= now]
            for session_id in expired:
                del self.dormant[session_id]
            self.evictions += len(expired)
            if expired:
                await self._give_back_memory()

    async def _wake_state(self, session_id: str, entry: _Dormant | bytes) -> SessionState | None:
        try:
            return await dormant_state(entry)
        except Exception as exc:  # a bug, not the session's fault: its log has it all
            log.warning(
                "session %s: its frozen state did not thaw (%r); read from the log", session_id, exc
            )
            return None

    async def _freeze_dormant(self, hibernate_after: float) -> None:
        """Freeze the states that have been dormant for ``FREEZE_AFTER`` periods.

        One at a time with a checkpoint between, so that freezing a thousand idle
        sessions does not hold the loop for the whole batch.
        """
        period = max(hibernate_after * FREEZE_AFTER, 0.01)
        seen: dict[str, float] = {}
        while True:
            await trio.sleep(period)
            due, seen = freeze_round(self.dormant, seen)
            for session_id in due:
                await self._freeze(session_id)
            if due:
                await self._give_back_memory()

    async def _give_back_memory(self) -> None:
        """After a round froze or evicted idle sessions: give the heap's free pages
        back to the kernel.

        The states just frozen or dropped were most of what their sessions held, and
        the busy hours before left holes in the heap besides: free pages that stay
        resident for the life of the process unless given back
        (``perdure._libc.trim_heap``).
        When no actor is awake and every dormant state is frozen, a full collection
        comes first: it also empties the interpreter's free lists (tuples, dicts,
        floats kept for reuse, scattered through the heap by the busy hours), and it
        is cheap then, nothing of the sessions being left for the collector to walk.
        Otherwise that pass would hold the loop for every live object of theirs: the
        trim alone then. One trim at a time (the freezing and the eviction rounds
        both ask).
        """
        if self._trimming:
            return
        self._trimming = True
        try:
            if all(box.evicted for box in self.mailboxes.values()) and all(
                isinstance(entry, bytes) for entry in self.dormant.values()
            ):
                gc.collect()
            freezes = self.freezes
            await _threads.run_sync(_libc.trim_heap)
            self.heap_trims += 1
            self.freezes_at_trim = freezes
        finally:
            self._trimming = False

    async def _freeze(self, session_id: str) -> None:
        # A method of its own: no local of the round keeps a frozen state's objects.
        entry = self.dormant.get(session_id)
        if not isinstance(entry, _Dormant):  # woken (or evicted) meanwhile
            return
        try:
            if len(entry.state.conversation) < dormant.OFF_LOOP_ITEMS:
                blob = dormant.freeze(entry.state, entry.until)
            else:
                blob = await _threads.run_sync(dormant.freeze, entry.state, entry.until)
        except Exception as exc:
            # Woken while a thread pickled it, its new actor may have changed the state
            # under the pickler: that blob was not going to be used anyway.
            if self.dormant.get(session_id) is entry:  # a state that does not pickle: a bug
                entry.unfrozen = True
                log.warning("session %s: its hibernated state stays unfrozen: %r", session_id, exc)
            return
        if self.dormant.get(session_id) is entry:  # still asleep, not woken meanwhile
            self.dormant[session_id] = blob
            self.freezes += 1
        await trio.lowlevel.checkpoint()

    async def _let_lease_go(self, session_id: str) -> None:
        """The session stopped here as no longer ours: hold no lease on it any more.

        Usually the lease is gone already. If this node still holds it (a check that
        found it unsure), keeping it would renew a lease nobody runs, forever; released,
        it is claimed like an orphan. A new actor starting here meanwhile keeps it.
        """
        if session_id in self._starting or session_id in self.mailboxes:
            return
        gate = self._starting[session_id] = trio.Event()
        try:
            await self.journal.release_session(session_id)
        except LogError as exc:  # not renewed any more: it lapses within a TTL
            log.warning("session %s: could not release its lease: %s", session_id, exc)
        finally:
            del self._starting[session_id]
            gate.set()

    def _release_lost(
        self,
        session_id: str,
        actor: SessionActor,
        box: Mailbox,
        status: trio.TaskStatus[Any],
        reason: str,
    ) -> None:
        """Forget a session whose lease is gone; everyone waiting on it is refused."""
        if self._scopes.get(session_id) is not None:
            del self._scopes[session_id]
        if self.mailboxes.get(session_id) is box:
            del self.mailboxes[session_id]
        if self.actors.get(session_id) is actor:
            del self.actors[session_id]
        message = f"session {session_id} is no longer run by this node: {reason}"
        error = NotOwnerRefused(message)
        actor.fail_pending(error)
        _refuse_queued(box, error)
        box.receive.close()  # a caller still holding the box is refused by ask()
        if not actor.started:
            status.started(_Lost(reason))

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
        try:
            await box.send.send(message)  # type: ignore[arg-type]  # every Asking is a session.Message
        except trio.BrokenResourceError:
            if box.evicted:
                return await self.ask(session_id, make)  # evicted meanwhile: start it again
            # The session went away (its lease was lost) between lookup and send.
            reason = self._lost.get(session_id, "its lease was lost")
            raise NotOwnerRefused(
                f"session {session_id} is no longer run by this node: {reason}"
            ) from None
        return await message.reply.wait()

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


class _Cadence:
    """Wake every ``period`` seconds on a fixed cadence: work that takes a while does not
    push the next tick back (a tick that fell behind comes at once, never two).

    A plain object rather than an async generator: a generator abandoned by cancellation
    is finalized later by the garbage collector, outside any nursery (trio warns)."""

    def __init__(self, period: float) -> None:
        self.period = period
        self.due = trio.current_time()

    async def tick(self) -> None:
        self.due = max(self.due + self.period, trio.current_time())
        await trio.sleep_until(self.due)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """No cyclic garbage collection while the interrupted sessions start.

    Start-up turns every active session's log into long-lived objects (records, folded
    states) and makes next to no garbage; meanwhile the collector would traverse the
    growing heap again and again (with 1,000 sessions, more time than the start
    itself). The collector's state as found is restored afterwards.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _refuse_queued(box: Mailbox, error: BaseException) -> None:
    while True:
        try:
            message = box.receive.receive_nowait()
        except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
            return
        reply = getattr(message, "reply", None)
        if reply is not None:
            reply.fail(error)


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
