"""The runtime inside an asyncio application (FastAPI, aiohttp, Django async).

    async with perdure.embed.open_runtime(".perdure", provider=..., tools=[...]) as rt:
        sid = await rt.create_session()
        await rt.submit(sid, "hello")
        async for event in rt.events(sid):
            ...

``open_runtime`` takes the same arguments as ``perdure.open_runtime`` and yields an
``AsyncioRuntime`` with the same methods as ``perdure.Runtime``, whose awaits are
asyncio awaits. perdure itself stays on trio: it runs in a dedicated thread
(``mode="thread"``, the default) or as a guest of the asyncio loop on its thread
(``mode="guest"``, ``trio.lowlevel.start_guest_run``). ``bench/embed_call.py``
measures both; the thread is the default because the runtime then keeps its own
pace (commits, heartbeats, leases) even while asyncio code blocks its loop, and
a call costs no more than through the guest run (a few hundred microseconds of
hops between the loops, next to milliseconds for a durable commit).

Each call is a trio task in the runtime's nursery; its result or exception comes
back to the asyncio caller through ``loop.call_soon_threadsafe``. Cancelling the
asyncio await cancels the trio task. ``events`` is an async iterator fed by one
trio task per stream, one event per ``__anext__``: a consumer that stops reading
holds nothing up but its own stream.

Limits:

* A tool written for asyncio (``runs_on="asyncio"``, the default for a tool whose
  module does not import trio) is awaited on the host's loop: asyncio-only clients
  just work; a timeout or a cancel of the call cancels its asyncio task, and a task
  cancelled on the host's side ends the call as cancelled. Trio tools run on the
  runtime's trio loop and reach the application's asyncio code with
  ``run_in_asyncio``; a plain ``def`` tool runs in a worker thread.
* One runtime per process and per log: leave the ``async with`` before the asyncio
  loop closes (an ASGI app's lifespan does it); on the way out, running tools get
  ``shutdown_grace`` seconds to finish and their results are committed first.
* ``state(fn)`` runs ``fn`` in the runtime's trio thread: keep it read-only and quick.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Mapping
from contextlib import aclosing, asynccontextmanager, suppress
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import outcome
import trio

from perdure import Runtime, StreamStats, StuckRun
from perdure import open_runtime as open_trio_runtime
from perdure.answers import Accepted, CallDiff, Done, Forked, IfBusy, Rewound
from perdure.budget import Price
from perdure.providers.base import Message
from perdure.storage import SessionInfo
from perdure.storage.bus import Event
from perdure.storage.journal import JournalStats
from perdure.storage.records import (
    Budget,
    Committed,
    CompactionPolicy,
    ResolutionAction,
    RunFinished,
)
from perdure.view import SessionLookup, SessionView

if TYPE_CHECKING:
    from perdure.retention import Pruned

T = TypeVar("T")
Mode = Literal["thread", "guest"]


class RuntimeClosed(RuntimeError):
    """The embedded runtime stopped while the call or the stream was pending."""


# The host's asyncio loop, for trio code running in the embedded runtime (its tools).
_HOST_LOOP: trio.lowlevel.RunVar[asyncio.AbstractEventLoop] = trio.lowlevel.RunVar(
    "perdure_embed_host_loop"
)
# Whether any embedded runtime was ever opened in this process: until one is, no run
# can hold a host loop, and ``host_runner`` (asked at every tool attempt) answers at
# once instead of looking the RunVar up, which raises inside trio when it is unset.
_EVER_EMBEDDED = False


async def run_in_asyncio(fn: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
    """From trio code in an embedded runtime (a tool): ``await fn(*args)`` on the host's
    asyncio loop, e.g. with the application's asyncio database pool or HTTP client.

    Cancelling the trio side (the tool is cancelled or times out) cancels the asyncio
    task. Outside ``perdure.embed.open_runtime`` it raises ``RuntimeError``.
    """
    try:
        loop = _HOST_LOOP.get()
    except LookupError:
        raise RuntimeError("run_in_asyncio works inside perdure.embed.open_runtime only") from None
    future = asyncio.run_coroutine_threadsafe(fn(*args), loop)
    token = trio.lowlevel.current_trio_token()
    finished = trio.Event()

    def wake(_: object) -> None:
        with suppress(trio.RunFinishedError):
            token.run_sync_soon(finished.set)

    future.add_done_callback(wake)
    try:
        await finished.wait()
    except trio.Cancelled:
        future.cancel()
        raise
    return future.result()


def host_runner() -> Callable[[Callable[[], Coroutine[Any, Any, Any]]], Awaitable[Any]] | None:
    """``run_in_asyncio`` inside an embedded runtime (the runtime awaits tools written
    for asyncio with it); None on a plain trio runtime."""
    if not _EVER_EMBEDDED:
        return None
    try:
        _HOST_LOOP.get()
    except LookupError:
        return None
    return run_in_asyncio


class _Portal:
    """Runs trio functions in the runtime's nursery for asyncio callers."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, token: trio.lowlevel.TrioToken, nursery: trio.Nursery
    ) -> None:
        self.loop = loop
        self.token = token
        self.nursery = nursery

    def to_trio(self, fn: Callable[..., object], *args: Any) -> None:
        """Run a sync function on the trio thread soon (thread-safe)."""
        try:
            self.token.run_sync_soon(fn, *args)
        except trio.RunFinishedError:
            raise RuntimeClosed("the embedded runtime has stopped") from None

    def spawn(self, fn: Callable[[], Awaitable[object]], on_closed: Callable[[], None]) -> None:
        """Start ``fn`` as a task of the runtime's nursery; ``on_closed()`` if it is too late.

        Nothing may raise out of a ``run_sync_soon`` callback (it would crash the trio
        run), so a nursery already closed (the runtime stopping) is reported this way.
        """

        def start() -> None:
            try:
                self.nursery.start_soon(fn)
            except RuntimeError:  # closed to new arrivals: the runtime is stopping
                on_closed()

        try:
            self.to_trio(start)
        except RuntimeClosed:
            on_closed()

    def settle(self, future: asyncio.Future[T], result: outcome.Outcome[T]) -> None:
        """Hand a trio task's outcome to an asyncio future (called from the trio side)."""

        def settle() -> None:
            if future.done():
                return
            if isinstance(result, outcome.Error):
                error = result.error
                if isinstance(error, trio.Cancelled):
                    error = RuntimeClosed("the embedded runtime stopped during the call")
                future.set_exception(error)
            else:
                future.set_result(result.unwrap())

        with suppress(RuntimeError):  # the asyncio loop is closed: nobody waits any more
            self.loop.call_soon_threadsafe(settle)

    async def call(self, fn: Callable[[], Awaitable[T]]) -> T:
        """``await fn()`` as a trio task; its result here. Cancelling us cancels it."""
        future: asyncio.Future[T] = self.loop.create_future()
        scope = trio.CancelScope()

        async def task() -> None:
            with scope:
                # Everything is captured, trio.Cancelled too (the runtime stopping, or
                # our caller gone): ``settle`` turns it into RuntimeClosed.
                self.settle(future, await outcome.acapture(fn))

        closed = outcome.Error(RuntimeClosed("the embedded runtime has stopped"))
        self.spawn(task, lambda: self.settle(future, closed))
        try:
            return await future
        except asyncio.CancelledError:
            with suppress(RuntimeClosed):
                self.to_trio(scope.cancel)
            raise


class EventStream(AsyncIterator[Event]):
    """A session's events (``Runtime.events``) for an asyncio consumer.

    One trio task reads the runtime's stream and hands one event per ``__anext__``
    across. A cancelled ``__anext__`` loses nothing: the next one receives the event
    that was on its way. Close it (``aclose``, or ``async with aclosing(...)``) when
    done with a live stream.
    """

    def __init__(self, portal: _Portal, open_stream: Callable[[], AsyncIterator[Event]]) -> None:
        self._portal = portal
        self._open = open_stream
        self._requests_in, self._requests_out = trio.open_memory_channel[
            asyncio.Future[Event] | None
        ](math.inf)
        self._scope = trio.CancelScope()
        self._started = False
        self._finished: asyncio.Future[None] = portal.loop.create_future()
        self._inflight: asyncio.Future[Event] | None = None
        self._closed = False

    async def _pump(self) -> None:
        waiting: list[asyncio.Future[Event]] = []
        try:
            with self._scope:
                async with aclosing(self._open()) as stream:  # type: ignore[type-var]
                    async for request in self._requests_out:
                        if request is None:
                            return
                        waiting.append(request)
                        result = await outcome.acapture(stream.__anext__)
                        if isinstance(result, outcome.Error) and isinstance(
                            result.error, trio.Cancelled
                        ):
                            raise result.error
                        self._portal.settle(waiting.pop(), result)
                        if isinstance(result, outcome.Error):
                            return
        finally:
            # Closed, or the runtime stops: whoever still waits sees the stream end
            # (as a daemon's stream ends when it stops).
            for request in waiting + _drain(self._requests_out):
                self._portal.settle(request, outcome.Error(StopAsyncIteration()))
            self._requests_out.close()
            self._portal.settle(self._finished, outcome.Value(None))

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> Event:
        if self._closed:
            raise StopAsyncIteration
        if self._inflight is None:
            inflight = self._inflight = self._portal.loop.create_future()
            ended = outcome.Error(StopAsyncIteration())
            if not self._started:
                self._started = True
                self._portal.spawn(self._pump, lambda: self._portal.settle(inflight, ended))

            def request() -> None:
                try:
                    self._requests_in.send_nowait(inflight)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    self._portal.settle(inflight, ended)  # the stream's task has ended

            try:
                self._portal.to_trio(request)
            except RuntimeClosed:
                self._portal.settle(inflight, ended)
        # Shielded: a cancelled __anext__ leaves the request in flight for the next one.
        try:
            event = await asyncio.shield(self._inflight)
        except StopAsyncIteration:
            self._closed = True
            raise
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                self._closed = True
            raise
        self._inflight = None
        return event

    async def aclose(self) -> None:
        """Stop the stream's trio task and close the runtime's generator."""
        self._closed = True
        if not self._started:
            return
        try:
            self._portal.to_trio(self._scope.cancel)
        except RuntimeClosed:
            return
        await self._finished


def _drain(channel: trio.MemoryReceiveChannel[asyncio.Future[Event] | None]) -> list[Any]:
    found: list[asyncio.Future[Event]] = []
    while True:
        try:
            item = channel.receive_nowait()
        except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
            return found
        if item is not None:
            found.append(item)


class AsyncioRuntime:
    """``perdure.Runtime`` for asyncio code: the same methods, awaited on asyncio.

    ``trio_runtime`` is the runtime itself, to be used from trio code only (e.g.
    inside ``run``).
    """

    def __init__(self, portal: _Portal, runtime: Runtime, mode: Mode) -> None:
        self._portal = portal
        self.trio_runtime = runtime
        self.mode: Mode = mode

    async def run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``await fn(*args)`` on the runtime's trio loop (a trio function); its result."""
        return await self._portal.call(partial(fn, *args))

    # -- what is fixed once it opened: properties, as on Runtime ----------------------

    @property
    def location(self) -> str:
        return self.trio_runtime.location

    @property
    def log_path(self) -> Path:
        return self.trio_runtime.log_path

    @property
    def node_id(self) -> str:
        return self.trio_runtime.node_id

    @property
    def epoch(self) -> int:
        return self.trio_runtime.epoch

    @property
    def recovered_sessions(self) -> list[str]:
        """Sessions that had unfinished work when the runtime started (and it runs)."""
        return self.trio_runtime.recovered_sessions

    # -- what changes while it runs: read on the trio thread, hence awaited here -----

    async def stats(self) -> JournalStats:
        return await self.run(_sync(self.trio_runtime.stats))

    async def stream_stats(self) -> StreamStats:
        return await self.run(_sync(self.trio_runtime.stream_stats))

    async def resident_sessions(self) -> list[str]:
        return await self.run(_sync(lambda: self.trio_runtime.resident_sessions))

    async def taken_over_sessions(self) -> list[str]:
        return await self.run(_sync(lambda: self.trio_runtime.taken_over_sessions))

    async def evictions(self) -> int:
        return await self.run(_sync(lambda: self.trio_runtime.evictions))

    async def hibernated_sessions(self) -> list[str]:
        return await self.run(_sync(lambda: self.trio_runtime.hibernated_sessions))

    async def hibernations(self) -> int:
        return await self.run(_sync(lambda: self.trio_runtime.hibernations))

    async def frozen_sessions(self) -> list[str]:
        return await self.run(_sync(lambda: self.trio_runtime.frozen_sessions))

    async def received_sessions(self) -> list[str]:
        return await self.run(_sync(lambda: self.trio_runtime.received_sessions))

    async def handed_over_sessions(self) -> list[str]:
        return await self.run(_sync(lambda: self.trio_runtime.handed_over_sessions))

    # -- the methods of Runtime ------------------------------------------------------

    async def create_session(
        self,
        session_id: str | None = None,
        *,
        system: str | None = None,
        budget: Budget | None = None,
        if_busy: IfBusy | None = None,
        tools: Iterable[str] | None = None,
        compaction: CompactionPolicy | None = None,
    ) -> str:
        create = self.trio_runtime.create_session
        return await self.run(
            partial(
                create,
                session_id,
                system=system,
                budget=budget,
                if_busy=if_busy,
                tools=tools,
                compaction=compaction,
            )
        )

    async def ensure_session(
        self,
        session_id: str,
        *,
        system: str | None = None,
        budget: Budget | None = None,
        if_busy: IfBusy | None = None,
        tools: Iterable[str] | None = None,
        compaction: CompactionPolicy | None = None,
    ) -> bool:
        ensure = self.trio_runtime.ensure_session
        return await self.run(
            partial(
                ensure,
                session_id,
                system=system,
                budget=budget,
                if_busy=if_busy,
                tools=tools,
                compaction=compaction,
            )
        )

    async def fork(
        self,
        source: str,
        /,
        *,
        at: int | str | None = None,
        session_id: str | None = None,
        request_id: str | None = None,
        files: bool = False,
    ) -> Forked:
        fork = self.trio_runtime.fork
        return await self.run(
            partial(fork, source, at=at, session_id=session_id, request_id=request_id, files=files)
        )

    async def rewind(
        self, session_id: str, *, to: int | str, request_id: str | None = None
    ) -> Rewound:
        rewind = self.trio_runtime.rewind
        return await self.run(partial(rewind, session_id, to=to, request_id=request_id))

    async def workspace_diff(self, session_id: str, call_id: str | None = None) -> list[CallDiff]:
        return await self.run(self.trio_runtime.workspace_diff, session_id, call_id)

    async def delete_session(self, session_id: str, *, reason: str = "") -> int:
        return await self.run(partial(self.trio_runtime.delete_session, session_id, reason=reason))

    async def prune(
        self, finished_before: float, *, dry_run: bool = False
    ) -> tuple[list[Pruned], list[tuple[str, str]]]:
        return await self.run(partial(self.trio_runtime.prune, finished_before, dry_run=dry_run))

    async def export_session(self, session_id: str) -> list[str]:
        return await self.run(self.trio_runtime.export_session, session_id)

    async def import_session(self, lines: Iterable[str]) -> str:
        return await self.run(self.trio_runtime.import_session, list(lines))

    async def children(self, session_id: str) -> list[str]:
        return await self.run(self.trio_runtime.children, session_id)

    async def sessions(
        self, *, after: str = "", limit: int | None = None, active: bool = False
    ) -> list[SessionInfo]:
        """The log's session summaries, or a page of them (``Runtime.sessions``)."""
        return await self.run(
            partial(self.trio_runtime.sessions, after=after, limit=limit, active=active)
        )

    async def newest_sessions(
        self, *, before: int = 0, limit: int | None = None, active: bool = False
    ) -> list[SessionInfo]:
        """The newest sessions' summaries, a page (``Runtime.newest_sessions``)."""
        page = partial(self.trio_runtime.newest_sessions, before=before, limit=limit, active=active)
        return await self.run(page)

    async def session_info(self, session_id: str) -> SessionInfo | None:
        return await self.run(self.trio_runtime.session_info, session_id)

    @property
    def stuck_after(self) -> float:
        """Seconds without a committed record after which unfinished work is stuck."""
        return self.trio_runtime.stuck_after

    @property
    def prices(self) -> Mapping[str, Price]:
        """The price table costs are reckoned at (``Runtime.prices``)."""
        return self.trio_runtime.prices

    async def stuck_runs(
        self, after: float | None = None, *, among: Iterable[SessionInfo] | None = None
    ) -> list[StuckRun]:
        """The sessions stuck for ``after`` seconds (``Runtime.stuck_runs``)."""
        return await self.run(partial(self.trio_runtime.stuck_runs, after, among=among))

    async def restarts(self) -> list[Committed]:
        return await self.run(self.trio_runtime.restarts)

    async def submit(
        self,
        session_id: str,
        text: str,
        *,
        request_id: str | None = None,
        budget: Budget | None = None,
        if_busy: IfBusy | None = None,
        traceparent: str | None = None,
    ) -> Accepted:
        return await self.run(
            partial(
                self.trio_runtime.submit,
                session_id,
                text,
                request_id=request_id,
                budget=budget,
                if_busy=if_busy,
                traceparent=traceparent,
            )
        )

    async def cancel(self, session_id: str, *, request_id: str | None = None) -> Done:
        return await self.run(partial(self.trio_runtime.cancel, session_id, request_id=request_id))

    async def approve(
        self,
        session_id: str,
        call_id: str,
        *,
        approved: bool = True,
        request_id: str | None = None,
        note: str = "",
    ) -> Done:
        return await self.run(
            partial(
                self.trio_runtime.approve,
                session_id,
                call_id,
                approved=approved,
                request_id=request_id,
                note=note,
            )
        )

    async def revise(
        self,
        session_id: str,
        text: str,
        *,
        request_id: str | None = None,
        budget: Budget | None = None,
    ) -> Done:
        return await self.run(
            partial(
                self.trio_runtime.revise, session_id, text, request_id=request_id, budget=budget
            )
        )

    async def pause(self, session_id: str, *, request_id: str | None = None) -> Done:
        return await self.run(partial(self.trio_runtime.pause, session_id, request_id=request_id))

    async def resume(self, session_id: str, *, request_id: str | None = None) -> Done:
        return await self.run(partial(self.trio_runtime.resume, session_id, request_id=request_id))

    async def compensate(
        self, session_id: str, call_id: str, *, request_id: str | None = None
    ) -> Done:
        return await self.run(
            partial(self.trio_runtime.compensate, session_id, call_id, request_id=request_id)
        )

    async def resolve(
        self,
        session_id: str,
        call_id: str,
        *,
        action: ResolutionAction,
        result: Any = None,
        request_id: str | None = None,
    ) -> Done:
        return await self.run(
            partial(
                self.trio_runtime.resolve,
                session_id,
                call_id,
                action=action,
                result=result,
                request_id=request_id,
            )
        )

    async def wait_idle(self, session_id: str) -> RunFinished | None:
        return await self.run(self.trio_runtime.wait_idle, session_id)

    async def state(
        self, session_id: str, fn: Callable[[SessionLookup], T], *, wake: bool = True
    ) -> T:
        """``fn`` on the live state (a ``perdure.SessionLookup``), inside the session's
        actor (on the trio thread); ``wake=False`` reads a session no actor runs from the
        log (``Runtime.state``)."""
        return await self.run(partial(self.trio_runtime.state, wake=wake), session_id, fn)

    async def view(self, session_id: str, *, wake: bool = True) -> SessionView:
        """A frozen snapshot of a session's headline facts (``Runtime.view``)."""
        return await self.run(partial(self.trio_runtime.view, wake=wake), session_id)

    async def summary(self, session_id: str, *, wake: bool = True) -> dict[str, Any]:
        """What the session is doing, as JSON-ready data (``Runtime.summary``)."""
        return await self.run(partial(self.trio_runtime.summary, wake=wake), session_id)

    async def transcript(self, session_id: str, *, history: bool = False) -> list[Message]:
        return await self.run(partial(self.trio_runtime.transcript, session_id, history=history))

    async def compact_context(self, session_id: str, *, request_id: str | None = None) -> Done:
        return await self.run(
            partial(self.trio_runtime.compact_context, session_id, request_id=request_id)
        )

    def events(
        self, session_id: str, *, after: int = 0, live: bool = True, restarts: bool = False
    ) -> EventStream:
        """``Runtime.events`` as an asyncio async iterator (see ``EventStream``)."""
        rt = self.trio_runtime
        return EventStream(
            self._portal, lambda: rt.events(session_id, after=after, live=live, restarts=restarts)
        )


def _sync(fn: Callable[[], T]) -> Callable[[], Awaitable[T]]:
    async def call() -> T:
        return fn()

    return call


@asynccontextmanager
async def open_runtime(
    log: Any = ".perdure", *, mode: Mode = "thread", **options: Any
) -> AsyncIterator[AsyncioRuntime]:
    """``perdure.open_runtime`` for asyncio code; the same arguments, plus ``mode``.

    Recovery happens before it yields, as with trio. On exit, running tools get
    ``shutdown_grace`` seconds and the log is closed before it returns.
    """
    if mode not in ("thread", "guest"):
        raise ValueError(f"mode must be 'thread' or 'guest', not {mode!r}")
    if mode == "guest":
        # The trio loop runs on asyncio's thread, which has work trio cannot see: it
        # must never block it for a commit.
        options.setdefault("commit_on_loop", False)
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[tuple[_Portal, Runtime, trio.Event]] = loop.create_future()
    done: asyncio.Future[None] = loop.create_future()

    async def trio_main() -> None:
        global _EVER_EMBEDDED
        _EVER_EMBEDDED = True
        _HOST_LOOP.set(loop)
        async with open_trio_runtime(log, **options) as runtime, trio.open_nursery() as nursery:
            stop = trio.Event()
            portal = _Portal(loop, trio.lowlevel.current_trio_token(), nursery)
            portal.settle(ready, outcome.Value((portal, runtime, stop)))
            await stop.wait()
            # Calls and streams still pending end with RuntimeClosed / StopAsyncIteration.
            nursery.cancel_scope.cancel()

    def finished(result: outcome.Outcome[None]) -> None:
        # Called on the trio side when trio_main has returned (or raised).
        def settle() -> None:
            error = result.error if isinstance(result, outcome.Error) else None
            if not ready.done():
                # It failed to open: the error is the caller's, raised by the ``async with``.
                ready.set_exception(error or RuntimeClosed("the runtime stopped at start"))
                error = None
            if not done.done():
                if error is not None:
                    done.set_exception(error)
                else:
                    done.set_result(None)

        with suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
            loop.call_soon_threadsafe(settle)

    if mode == "thread":

        def in_thread() -> None:
            finished(outcome.capture(trio.run, trio_main))

        threading.Thread(target=in_thread, name="perdure-trio", daemon=True).start()
    else:
        trio.lowlevel.start_guest_run(
            trio_main,
            run_sync_soon_threadsafe=loop.call_soon_threadsafe,
            run_sync_soon_not_threadsafe=loop.call_soon,
            done_callback=finished,
            host_uses_signal_set_wakeup_fd=True,
        )

    try:
        portal, runtime, stop = await asyncio.shield(ready)
    except asyncio.CancelledError:
        # Cancelled while it starts: stop it as soon as it is up, then wait for it.
        await _stop_when_ready(ready, done)
        raise
    try:
        yield AsyncioRuntime(portal, runtime, mode)
    finally:
        with suppress(RuntimeClosed):
            portal.to_trio(stop.set)
        # Waited for even if we are cancelled meanwhile: the runtime commits what
        # running tools return, and closes the log, before the loop may go away.
        await _wait_through_cancellation(done)


async def _wait_through_cancellation(future: asyncio.Future[None]) -> None:
    cancelled = False
    while True:
        try:
            await asyncio.shield(future)
            break
        except asyncio.CancelledError:
            if future.done():
                break
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError


async def _stop_when_ready(
    ready: asyncio.Future[tuple[_Portal, Runtime, trio.Event]], done: asyncio.Future[None]
) -> None:
    try:
        portal, _, stop = await ready
    except BaseException:
        return
    portal.to_trio(stop.set)
    await done
