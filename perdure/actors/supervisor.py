"""The supervisor: owns the session actors, starts the active ones, restarts crashed ones.

At start it reads the log's ``active`` index (sessions with unfinished work, not
the whole history) and starts those sessions' actors concurrently; each rebuilds
its state from its own records and re-issues its pending work before it reports
started. Other sessions are started on first use.

An actor that raises is restarted from its log. One that keeps failing
(``max_restarts`` times within ``restart_window`` seconds) is parked: a
``SessionParked`` record says why, callers get a clear refusal, and no other
session is affected. Losing ownership of the log (``LogFenced``) is different: it
stops the whole runtime at once.
"""

from __future__ import annotations

import contextlib
import logging
import traceback
from collections.abc import Callable
from typing import Any

import trio

from perdure.actors.context import ActorContext
from perdure.actors.decide import Refused
from perdure.actors.session import Drain, Mailbox, SessionActor, SessionParkedError
from perdure.storage.lmdb_log import LogError, check_session_id
from perdure.storage.records import SessionCreated, SessionParked

log = logging.getLogger("perdure.supervisor")


class UnknownSession(Refused):
    def __init__(self, session_id: str) -> None:
        super().__init__("not_found", f"no session {session_id!r} in this log")


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
        self.recovered: list[str] = []

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._watch_fence)
            active = await self.journal.active_sessions()
            async with trio.open_nursery() as boot:
                for session_id in active:
                    boot.start_soon(self._boot_one, session_id)
            self.recovered = active
            task_status.started()
            await trio.sleep_forever()

    async def _watch_fence(self) -> None:
        await self.journal.fenced.wait()
        assert self.journal.fence_error is not None
        raise self.journal.fence_error

    async def _boot_one(self, session_id: str) -> None:
        try:
            await self.mailbox(session_id)
        except Refused as exc:
            log.error("session %s not started: %s", session_id, exc)

    # -- sessions ---------------------------------------------------------------------

    async def create_session(self, session_id: str, system: str | None) -> bool:
        """Record a new session; False if it already existed (creation is idempotent)."""
        check_session_id(session_id)
        async with self._create_lock:
            if session_id in self.mailboxes or await self.journal.session_info(session_id):
                return False
            record = SessionCreated(session_id=session_id, system=system, at=self.ctx.clock())
            await self.journal.append([record])
            return True

    async def mailbox(self, session_id: str) -> Mailbox:
        """The running session's mailbox, starting its actor (and recovery) if needed."""
        if session_id in self.parked:
            raise Refused("parked", f"session {session_id} is parked: {self.parked[session_id]}")
        box = self.mailboxes.get(session_id)
        if box is not None:
            return box
        starting = self._starting.get(session_id)
        if starting is not None:
            await starting.wait()
            return await self.mailbox(session_id)
        starting = self._starting[session_id] = trio.Event()
        try:
            if await self.journal.session_info(session_id) is None:
                raise UnknownSession(session_id)
            box = Mailbox.open()
            assert self._nursery is not None
            parked = await self._nursery.start(self._supervise, session_id, box)
            if parked is not None:
                raise Refused("parked", f"session {session_id} is parked: {parked}")
            self.mailboxes[session_id] = box
            return box
        finally:
            del self._starting[session_id]
            starting.set()

    async def _supervise(
        self, session_id: str, box: Mailbox, *, task_status: trio.TaskStatus[Any]
    ) -> None:
        status: trio.TaskStatus[Any] = task_status
        failures: list[float] = []
        while True:
            actor = SessionActor(session_id, self.ctx, box)
            self.actors[session_id] = actor
            try:
                await actor.run(task_status=status)
                return
            except Exception as exc:
                if self.journal.fence_error is not None:
                    raise self.journal.fence_error from None
                if actor.started:
                    status = trio.TASK_STATUS_IGNORED
                now = self.ctx.clock()
                failures = [t for t in failures if now - t < self.ctx.restart_window] + [now]
                summary = _summary(exc)
                log.error(
                    "session %s actor crashed (%d in %.0fs): %s\n%s",
                    session_id,
                    len(failures),
                    self.ctx.restart_window,
                    summary,
                    "".join(traceback.format_exception(exc)),
                )
                actor.fail_pending(LogError(f"session {session_id} actor crashed: {summary}"))
                if len(failures) > self.ctx.max_restarts:
                    reason = f"its actor crashed {len(failures)} times; last error: {summary}"
                    await self._park(session_id, reason)
                    if not actor.started:
                        status.started(reason)
                    await self._refuse_forever(box, reason)
                    return
                await trio.sleep(min(0.05 * 2 ** len(failures), 2.0))

    async def _park(self, session_id: str, reason: str) -> None:
        self.parked[session_id] = reason
        self.mailboxes.pop(session_id, None)
        self.actors.pop(session_id, None)
        try:
            await self.journal.append(
                [SessionParked(session_id=session_id, reason=reason, at=self.ctx.clock())]
            )
        except LogError as exc:
            log.error("session %s: could not record that it is parked: %s", session_id, exc)

    async def _refuse_forever(self, box: Mailbox, reason: str) -> None:
        """Answer whatever was already queued for a parked session, then stop listening."""
        error = SessionParkedError(f"session parked: {reason}")
        while True:
            try:
                message = box.receive.receive_nowait()
            except trio.WouldBlock:
                return
            reply = getattr(message, "reply", None)
            if reply is not None:
                reply.fail(error)

    async def ask(self, session_id: str, make: Callable[[], Any]) -> Any:
        """Send a message built by ``make`` to the session and wait for its reply."""
        box = await self.mailbox(session_id)
        message = make()
        await box.send.send(message)
        return await message.reply.wait()

    async def drain(self) -> None:
        """Ask every session to stop dispatching and wait until their tools are done."""
        async with trio.open_nursery() as nursery:
            for session_id in list(self.mailboxes):
                nursery.start_soon(self._drain_one, session_id, Drain)

    async def _drain_one(self, session_id: str, drain: Any) -> None:
        with contextlib.suppress(Refused, SessionParkedError, LogError):
            await self.ask(session_id, drain)


def _summary(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return _summary(exc.exceptions[0])
    return f"{type(exc).__name__}: {exc}"
