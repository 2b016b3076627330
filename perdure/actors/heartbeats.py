"""A running call's heartbeats, committed throttled: at most one per interval, the latest winning.

A tool reports progress with ``ctx.heartbeat(details)`` as often as it likes; each
report reaches its session as a ``HeartbeatReported`` message. Committing every one
would tie the log's pace to the tool's, so the session's actor passes them through
this throttle:

* a call's first heartbeat, or the first after ``interval`` has passed since its last
  commit, is committed at once;
* a later one within the interval replaces the one held back, and a timer posts
  ``FlushHeartbeat`` on the session's mailbox when the interval is over: the actor
  then commits whichever is held (``flush``);
* when the call's attempt ends, the heartbeat still held is committed before its
  result (a re-run after a crash resumes from the latest details the log has), and
  the call's timer is stopped (``finish``).

The throttle keeps time on trio's clock and decides when; committing is the
session's (``commit``, which also says what a failed commit means), and its timers run
in the nursery the session gives them. While any call has a throttle, the session is
not at rest (``__bool__``): a held heartbeat is something the log does not have yet.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio
from attrs import define

from perdure.actors.mailbox import FlushHeartbeat, Inbox
from perdure.actors.protocol import HeartbeatReported


@define
class _Throttle:
    """One running call's heartbeats: when one was last committed, and the latest held."""

    last_commit: float = -float("inf")  # trio clock
    held: HeartbeatReported | None = None
    timer: trio.CancelScope | None = None  # a pending FlushHeartbeat


class HeartbeatThrottle:
    """The heartbeats of one session's running calls (see the module's docstring)."""

    def __init__(
        self,
        interval: float,
        commit: Callable[[HeartbeatReported], Awaitable[None]],
        mailbox: trio.MemorySendChannel[Inbox],
    ) -> None:
        self._interval = interval
        self._commit = commit
        self._mailbox = mailbox
        self._calls: dict[str, _Throttle] = {}

    def __bool__(self) -> bool:
        """Some running call has heartbeats throttled (one may be held back)."""
        return bool(self._calls)

    async def offer(self, beat: HeartbeatReported, nursery: trio.Nursery) -> None:
        """A running call's new heartbeat: commit it now, or hold it until its interval ends."""
        throttle = self._calls.setdefault(beat.call_id, _Throttle())
        throttle.held = beat
        due = throttle.last_commit + self._interval
        if trio.current_time() >= due:
            await self._commit_held(throttle)
        elif throttle.timer is None:
            throttle.timer = trio.CancelScope(deadline=due)
            nursery.start_soon(self._flush_at, beat.call_id, throttle.timer)

    async def flush(self, call_id: str) -> None:
        """The interval of ``call_id``'s heartbeats is over (``FlushHeartbeat``)."""
        throttle = self._calls.get(call_id)
        if throttle is not None and throttle.held is not None:
            await self._commit_held(throttle)

    async def finish(self, call_id: str) -> None:
        """The call's attempt is over: commit the heartbeat still held, before its result."""
        throttle = self._calls.pop(call_id, None)
        if throttle is None:
            return
        if throttle.held is not None:
            await self._commit_held(throttle)
        elif throttle.timer is not None:
            timer, throttle.timer = throttle.timer, None
            timer.cancel()

    async def _flush_at(self, call_id: str, timer: trio.CancelScope) -> None:
        with timer:
            await trio.sleep_forever()  # until the timer's deadline, or until it is stopped
        throttle = self._calls.get(call_id)
        if throttle is not None and throttle.timer is timer:  # not stopped: still due
            await self._mailbox.send(FlushHeartbeat(call_id))

    async def _commit_held(self, throttle: _Throttle) -> None:
        beat, throttle.held = throttle.held, None
        if throttle.timer is not None:
            timer, throttle.timer = throttle.timer, None
            timer.cancel()
        throttle.last_commit = trio.current_time()
        assert beat is not None
        await self._commit(beat)
