"""The supervisor's boot and ownership job: start-up, leases, orphans, rebalancing.

At start it reads the log's ``active`` index (sessions with unfinished work, not
the whole history), in recovery order (the session whose last record is oldest
first), and starts those sessions' actors concurrently in that order, their records
read in batched worker-thread calls, each batch's actors started as soon as it is
read, with the cyclic garbage collector paused meanwhile; each rebuilds its state
and re-issues its pending work before it reports started. Other sessions are
started on first use (``lifecycle.mailbox``).

Ownership of sessions goes through the log's lease hooks, so this code is the
same for one owner (LMDB, where every lease is granted) and for many nodes
(PostgreSQL). A session's actor starts only once this process holds its lease; a
command for a session another live node holds is refused with ``not_owner`` naming
that node. With a multi-node log a heartbeat renews the leases every third of their
TTL, on a fixed cadence and doing nothing else; a second task, at the same period,
claims orphaned active sessions (a dead node's). A session whose lease is lost (the
heartbeat says so, or a commit is fenced) has its actor stopped at once, its
callers refused, and nothing else is touched. Losing ownership of the whole log
(``LogFenced``) stops the runtime at once.

Rebalancing (multi-node, ``ctx.settings.rebalance``): each period the second task also takes
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
import itertools
import logging
from collections.abc import Iterator
from typing import Any

import trio

from perdure.actors import balance
from perdure.actors.mailbox import HandOver, Mailbox
from perdure.actors.session import SessionActor
from perdure.actors.supervisor.base import (
    OUTAGE_BACKOFF,
    BootStarts,
    _Handing,
    _refuse_queued,
)
from perdure.actors.supervisor.memory import Memory
from perdure.errors import (
    NotOwnerRefused,
    PerdureError,
    Refused,
)
from perdure.storage import (
    LogError,
    LogUnavailable,
    StorageFull,
)
from perdure.storage.records import Committed

log = logging.getLogger("perdure.supervisor")

BOOT_READ_BATCH = 100  # sessions whose records one worker-thread call reads at start-up
# The first such calls, smaller: the longest-waiting session starts as soon as its own
# log is read, the next few as soon as theirs are, however many others wait.
BOOT_FIRST_BATCHES = (1, 10)
BOOT_READ_PARALLEL = 8  # such calls at once, for a multi-node (database) log


def boot_batches(count: int) -> list[tuple[int, int]]:
    """The ``[lo, hi)`` ranges of the batches start-up reads ``count`` sessions in:
    first ``BOOT_FIRST_BATCHES``, then ``BOOT_READ_BATCH`` each."""
    bounds = [0]
    for size in BOOT_FIRST_BATCHES:
        bounds.append(min(count, bounds[-1] + size))
    while bounds[-1] < count:
        bounds.append(min(count, bounds[-1] + BOOT_READ_BATCH))
    return [(lo, hi) for lo, hi in itertools.pairwise(bounds) if hi > lo]


class _Lost:
    """What ``_supervise`` reports when the lease went before the actor started."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


class Ownership(Memory):
    """Boot, leases, orphans, rebalancing and hand-overs."""

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
            if self.ctx.settings.hibernate_after is not None:
                nursery.start_soon(self._freeze_dormant, self.ctx.settings.hibernate_after)
                if self.ctx.settings.idle_timeout is not None:
                    nursery.start_soon(self._evict_dormant)
            if self.journal.log.multi_node:
                nursery.start_soon(self._keep_leases)
                await self._take_and_shed()
            await trio.sleep_forever()

    async def _boot(self, sessions: list[str], *, preload: bool = False) -> None:
        """Start the actors of ``sessions`` concurrently.

        ``preload`` (start-up only, before the runtime answers any call, so nothing else
        can write these sessions meanwhile): their records are read in batches, one
        worker-thread call per batch instead of two thread round trips per session, and
        each batch's actors start as soon as it is read, in the order of ``sessions``
        (the log's recovery order). The first batches are small (the first holds one
        session), so that the first resumed sessions' work starts within milliseconds
        however many others wait; the reads
        of the later batches go on meanwhile. A session whose log cannot be reached now
        is retried in the background, as when its actor cannot start; one whose read
        failed otherwise (a damaged record) is left to its actor, which reads it and
        reports it as always. On a single-node log a read session's actor is started
        by ``_start_read``, with no task of its own waiting for it (per session, that
        task, ``nursery.start``'s nursery and cancel scope were about 6 % of the
        recovery's CPU): it reports its own start, and this waits for the last of them.
        """
        starts = BootStarts()
        async with trio.open_nursery() as boot:
            if not preload:
                for session_id in sessions:
                    boot.start_soon(self._boot_one, session_id)
                return

            # One batch at a time from LMDB: its reads are CPU-bound, and threads decoding
            # side by side only take turns at the GIL (measured slower). A database
            # backend's reads wait on the network: several batches at once. trio's
            # limiter is FIFO, so the batches are read in order.
            parallel = BOOT_READ_PARALLEL if self.journal.log.multi_node else 1
            limit = trio.CapacityLimiter(parallel)

            async def read_and_start(batch: list[str]) -> None:
                read: dict[str, list[Committed] | Exception] = {}
                async with limit:
                    with contextlib.suppress(LogError):  # each actor then tries for itself
                        read = await self.journal.read_sessions(batch)
                for session_id in batch:
                    found = read.get(session_id)
                    if isinstance(found, LogUnavailable | StorageFull):
                        log.warning("session %s cannot start yet (%s); retrying", session_id, found)
                        self._nursery_start(self._boot_when_reachable, session_id)
                        continue
                    records = found if isinstance(found, list) else None
                    if records is None or not self._start_read(session_id, records, starts):
                        boot.start_soon(self._boot_one, session_id, records)

            for lo, hi in boot_batches(len(sessions)):
                boot.start_soon(read_and_start, sessions[lo:hi])
        await starts.wait()

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

    async def _boot_one(self, session_id: str, records: list[Committed] | None = None) -> None:
        try:
            await self.mailbox(session_id, records)
        except (Refused, LogUnavailable, StorageFull) as exc:
            self._not_booted(session_id, exc)

    def _not_booted(self, session_id: str, exc: Refused | LogUnavailable | StorageFull) -> None:
        """A session with work whose actor did not start at start-up: say why, and keep
        trying in the background if the log could not be reached."""
        if isinstance(exc, Refused):
            log.error(
                "session %s not started: %s", session_id, exc, extra={"session_id": session_id}
            )
            return
        # Its work must go on by itself: keep trying in the background, without
        # holding up the start of the others (or of the runtime).
        log.warning("session %s cannot start yet (%s); retrying", session_id, exc)
        self._nursery_start(self._boot_when_reachable, session_id)

    async def _watch_fence(self) -> None:
        await self.journal.fenced.wait()
        assert self.journal.fence_error is not None
        raise self.journal.fence_error

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
                received = await self.journal.accept() if self.ctx.settings.rebalance else []
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
            if self.ctx.settings.rebalance:
                await self._rebalance()

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

    def _lose(self, session_id: str, reason: str) -> None:
        """The lease is gone: stop the session's actor now (its tools too)."""
        self._lost[session_id] = reason
        scope = self._scopes.get(session_id)
        if scope is not None:
            scope.cancel()

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
