"""The EventBus: committed records and ephemeral deltas, fanned out to subscribers.

The Journal publishes each record after it is durable; actors publish ephemeral
events (streamed text, tool progress) that are never stored. Publishing never
blocks: each subscriber has a bounded buffer, and a subscriber that falls that far
behind is dropped (its iterator raises ``EventStreamLagged``) so a slow client can
never stall the runtime. It reconnects from the last sequence number it saw.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import trio
from attrs import field, frozen

from perdure.storage.records import Record


@frozen
class Event:
    """One event of a session's stream.

    ``seq`` and ``record`` are set for committed records; ephemeral events have
    ``seq is None`` and carry their payload in ``data``.
    """

    session_id: str
    kind: str
    seq: int | None = None
    record: Record | None = None
    data: dict[str, Any] = field(factory=dict)

    @property
    def ephemeral(self) -> bool:
        return self.seq is None


class EventStreamLagged(Exception):
    """The subscriber fell too far behind and was dropped; resume from the last seq seen."""


class Subscription:
    """A live feed of one session's events (or every session's, for ``None``).

    A plain queue with a parking lot rather than a memory channel: publishing is an
    append (and a wake-up if the reader waits), and a reader can take everything
    that is waiting at once (``drain``), which is what lets one wake-up of an SSE
    response carry a whole burst of events.
    """

    def __init__(self, bus: EventBus, session_id: str | None, buffer: int) -> None:
        self._bus = bus
        self.session_id = session_id
        self.buffer = buffer  # events that may wait unread before the reader is dropped
        self._queue: deque[Event] = deque()
        self._ready = trio.lowlevel.ParkingLot()  # the reader, while the queue is empty
        self._ended = False  # closed, or dropped for lagging: nothing more is queued
        self.lagged = False

    def _offer(self, event: Event) -> None:
        if self._ended:
            return
        if len(self._queue) >= self.buffer:
            self.lagged = True
            self._bus.lagged += 1
            self._end()
            return
        self._queue.append(event)
        if self._ready:
            self._ready.unpark_all()

    def _end(self) -> None:
        self._ended = True
        self._ready.unpark_all()

    def drain(self) -> list[Event]:
        """The events already waiting, without waiting for more. A dropped (lagged)
        subscription's iterator raises after these, as it would have after them."""
        out = list(self._queue)
        self._queue.clear()
        return out

    def close(self) -> None:
        self._bus._unsubscribe(self)
        self._end()

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __aiter__(self) -> AsyncIterator[Event]:
        return self

    async def __anext__(self) -> Event:
        if self._queue:
            await trio.lowlevel.checkpoint()  # a reader that never waits still yields
        while not self._queue:
            if self._ended:
                if self.lagged:
                    who = self.session_id or "all sessions"
                    raise EventStreamLagged(
                        f"the event stream of {who} fell behind and was dropped"
                    )
                raise StopAsyncIteration
            await self._ready.park()
        return self._queue.popleft()

    def waiting(self) -> int:
        """How many events wait unread."""
        return len(self._queue)


class EventBus:
    def __init__(self, buffer: int = 4096) -> None:
        self.buffer = buffer
        self._by_session: dict[str | None, set[Subscription]] = {}
        self.lagged = 0  # subscribers dropped for falling behind, since the bus opened

    def subscriptions(self) -> list[Subscription]:
        """Every live subscription (event streams: SSE clients, ``Runtime.events``)."""
        return [sub for subs in self._by_session.values() for sub in subs]

    def backlog(self) -> int:
        """Events waiting in the fullest subscriber's buffer (how far behind it is)."""
        return max((s.waiting() for s in self.subscriptions()), default=0)

    def subscribe(self, session_id: str | None, buffer: int | None = None) -> Subscription:
        sub = Subscription(self, session_id, buffer or self.buffer)
        self._by_session.setdefault(session_id, set()).add(sub)
        return sub

    def _unsubscribe(self, sub: Subscription) -> None:
        subs = self._by_session.get(sub.session_id)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._by_session[sub.session_id]

    def publish(self, event: Event) -> None:
        """Hand ``event`` to every interested subscriber. Call from the trio thread."""
        for key in (event.session_id, None):
            for sub in tuple(self._by_session.get(key, ())):
                sub._offer(event)

    def has_subscribers(self, session_id: str) -> bool:
        return bool(self._by_session.get(session_id) or self._by_session.get(None))

    def close(self) -> None:
        for subs in list(self._by_session.values()):
            for sub in list(subs):
                sub.close()
