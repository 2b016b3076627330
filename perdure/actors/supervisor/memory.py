"""The supervisor's memory job: hibernate, freeze, evict, and give the heap back.

A session that stays idle (no run, no queued input, nothing in flight) for
``hibernate_after`` seconds has its actor hibernate: the task, its mailbox and
scopes go, the folded state stays here (``dormant``), and the next message starts a
new actor on it, without reading the log, if the log's last seq of the session is
still the state's (``lifecycle.mailbox`` checks). A session left dormant for
``FREEZE_AFTER`` times as long again has its state frozen into one compact blob
(``perdure.actors.dormant``): about an eighth of the memory, paid for by unpickling
it when the session wakes; which sessions a round freezes is the pure
``freeze_round``. After ``idle_timeout`` seconds idle the session is evicted: its
state is in the log, so memory holds only the sessions in use, and with several
nodes its lease is given up (actors never hibernate there: another node may write
the session). The next message for it starts a fresh actor, which rebuilds the
state as at start-up. After a round that froze or evicted some, the heap's free
pages go back to the kernel (``perdure._libc``).
"""

from __future__ import annotations

import gc
import logging

import trio

from perdure import _libc, _threads
from perdure.actors import dormant
from perdure.actors.mailbox import Mailbox
from perdure.actors.session import SessionActor
from perdure.actors.state import SessionState
from perdure.actors.supervisor.base import SupervisorBase
from perdure.storage import LogError

log = logging.getLogger("perdure.supervisor")

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


class Memory(SupervisorBase):
    """Hibernated, frozen and evicted sessions, and the heap trims after them."""

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
            timeout, hibernate = self.ctx.settings.idle_timeout, self.ctx.settings.hibernate_after
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
        assert self.ctx.settings.idle_timeout is not None
        period = min(max(self.ctx.settings.idle_timeout / 8, 0.01), 5.0)
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
