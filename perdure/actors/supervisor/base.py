"""What every job of the supervisor shares: its registries of sessions, and a few helpers.

The supervisor owns the session actors of this process. It is one object,
``Supervisor``, put together from three jobs, each a module with its own theory of
operation:

* ``ownership`` — boot and ownership: start the sessions with unfinished work at
  start-up, hold their leases, claim orphans, take and shed sessions when several
  nodes share a log, and hand a session over at a safe point;
* ``memory`` — memory: let an idle actor hibernate, freeze a state that sleeps long,
  evict an idle session, give the heap's free pages back;
* ``lifecycle`` — the lifecycle of an actor: start it (and its recovery), supervise
  and restart it, park it; create, fork and delete sessions; ask, peek, wait, drain;
* ``agents`` — beside them, not a layer: the sub-agents the actors run as child
  sessions (the supervisor gives its actors ``SubAgents.run``), and the orphans a
  crash left.

They share what is kept here: the running sessions' mailboxes, actors and cancel
scopes, the start gates (``_starting``: one actor start, stop or lease move of a
session at a time), parked, dormant and unreachable sessions, hand-overs under way,
and counters the runtime reports. Each job is a class, and they stack in one
direction (this base, then ``memory``, ``ownership``, ``lifecycle``): a job calls
only the jobs below it, except that boot starts sessions through ``mailbox``, the
lifecycle's door, and ``_start_read`` (the same start on records boot has read), both
named here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from perdure.actors import balance
from perdure.actors.context import ActorContext
from perdure.actors.mailbox import Mailbox
from perdure.actors.session import SessionActor
from perdure.backoff import Backoff
from perdure.errors import NotOwnerRefused
from perdure.storage import (
    LogError,
    NotOwner,
)
from perdure.storage.records import Committed

if TYPE_CHECKING:
    from perdure.actors.supervisor.memory import _Dormant


log = logging.getLogger("perdure.supervisor")

MAX_OUTAGE_BACKOFF = 5.0  # seconds between restarts of a session while the log is down
# The waits before restarting an actor (``perdure.backoff``): while the log is down
# (0.1 s, doubling, at most MAX_OUTAGE_BACKOFF), and after a crash (at most 2 s).
OUTAGE_BACKOFF = Backoff(initial=0.1, cap=MAX_OUTAGE_BACKOFF)
RESTART_BACKOFF = Backoff(initial=0.1, cap=2.0)


class _Handing:
    """A hand-over under way: its target, and the start gate it holds until it ends."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.gate = trio.Event()


class BootStarts:
    """The actors start-up started on records it had read and has not heard from yet.

    Such an actor reports its own start (``lifecycle``'s ``_BootStarted``) instead of a
    task of its own waiting for it, and ``Ownership._boot`` waits here for the last one.
    """

    __slots__ = ("done", "left")

    def __init__(self) -> None:
        self.left = 0
        self.done = trio.Event()

    def add(self) -> None:
        self.left += 1
        if self.done.is_set():  # all had started before this batch was read
            self.done = trio.Event()

    def started(self) -> None:
        self.left -= 1
        if not self.left:
            self.done.set()

    async def wait(self) -> None:
        if self.left:
            await self.done.wait()


class SupervisorBase:
    """The registries every job of the supervisor reads and writes (``__init__``)."""

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
        # Hibernated sessions (ctx.settings.hibernate_after): no actor, the state kept for the
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

    def _nursery_start(self, fn: Callable[..., Any], *args: Any) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(fn, *args)

    def _drop(self, session_id: str, actor: SessionActor, scope: trio.CancelScope) -> None:
        """Forget this actor (not a newer one of the same session)."""
        if self.actors.get(session_id) is actor:
            del self.actors[session_id]
        if self._scopes.get(session_id) is scope:
            del self._scopes[session_id]

    async def _acquire(self, session_id: str) -> None:
        try:
            await self.journal.acquire(session_id)
        except NotOwner as exc:
            raise NotOwnerRefused(str(exc), exc.owner) from None

    async def mailbox(self, session_id: str, records: list[Committed] | None = None) -> Mailbox:
        """The running session's mailbox, starting its actor if needed (``lifecycle``)."""
        raise NotImplementedError

    def _start_read(self, session_id: str, records: list[Committed], starts: BootStarts) -> bool:
        """Start-up: start the actor of a session whose records were read, counted in
        ``starts`` until it has started (``lifecycle``); False if it must go through
        ``mailbox`` instead."""
        raise NotImplementedError


def _refuse_queued(box: Mailbox, error: BaseException) -> None:
    while True:
        try:
            message = box.receive.receive_nowait()
        except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
            return
        reply = getattr(message, "reply", None)
        if reply is not None:
            reply.fail(error)
