"""The Journal: the log's only writer, with group commit, and its trio-facing API.

One dedicated OS thread owns every LMDB write transaction (a write transaction
must begin, put and commit on one thread, and trio's worker threads change from
call to call). Actors ``await journal.append(records)``; the writer takes
everything queued at that moment, writes it in ONE transaction, commits once (one
fsync for many sessions), and only then wakes each caller with its sequence
numbers and publishes the records to the EventBus. Nothing is published before it
is durable, and deliveries happen in commit order.

Appends are handed over at the end of a scheduling round (a trio instrument's
``before_io_wait``), so that everything the actors appended in one round shares a
transaction. At that point, if the loop is about to sleep (nothing runnable, no
timer due), nothing is in the writer thread's hands and recent commits were quick
(``loop_commit_budget``), the Journal commits on the trio thread itself instead of
waking the writer thread: the loop had nothing to do during that fsync, and the two
thread hand-offs (the writer's wake-up, then the loop's) cost about as much as the
commit. The price is that I/O arriving during such a commit waits for it; a slow
disk (commits slower than the budget) sends every commit back to the writer
thread, and a log whose backend is not local (PostgreSQL) never commits on the
loop. Either way a write transaction begins and ends on one thread, the two never
overlap, and deliveries stay in commit order.

A busy loop (work still runnable at the round's end) keeps its appends instead of
handing them to the writer thread, because there the writer would wait for the GIL
until the loop idles: a busy trio thread gives the GIL up at every system call and
takes it straight back, and each release restarts the 5 ms a waiting thread lets
pass before it asks for the GIL (measured: a loop kept busy by CPU-bound work left
commits waiting seconds). The loop commits the kept appends itself at the end of a
later round, in units of a commit's mean wait (its wall time minus its thread's CPU
time in it: the fsync; the encoding holds the GIL, so it costs the loop the same on
either thread): a lone append (one session's) once ``BUSY_COMMIT_SPACING`` of them
have passed since the last commit ended, so that the loop spends at most a third of
its time waiting for such commits; several once the oldest has waited
``BUSY_GROUP_WAIT`` of them (their group grows meanwhile); any of them as soon as
the loop would sleep.

An append may let its caller start work before the commit is durable (``meanwhile``:
a session starts the turn's next model call while the turn's results commit), and may
ask that the commit wait for that work (``overlap``): where the loop commits, it keeps
the append through busy rounds (the started work runs first: building a model request,
sending it) and commits it at the end of the first round in which the loop would
sleep, so that the fsync runs while the work waits (for the model's answer) instead of
before it; held at most ``BUSY_GROUP_WAIT`` mean commit waits, as a group is. Where
the loop does not commit (a slow disk, a remote log, a commit under way on the writer
thread), the writer thread takes it as any other. The caller is still woken only once
the commit is durable. (Handing such a commit to the writer thread instead cost two
thread wake-ups per turn, each waiting for a core on a busy machine: on 2 loaded cores
a single session's turn went from 0.8 to 1-5 ms with an instant model.)

Reads run in trio worker threads, each in its own short read transaction; a local
log's at most ``LOCAL_READ_THREADS`` at once (they are CPU-bound under the GIL).

Inline mode: a backend whose ``inline`` is True (``MemoryLog``) never blocks, so
the Journal commits it right in ``append``, on the trio thread, and reads it there
too: no writer thread, no worker threads. Nothing then happens outside trio's
view, which is what lets runtime tests run under ``trio.testing.MockClock`` with
``autojump_threshold=0`` (a worker thread would let the clock jump while it works).
Each commit is still one transaction delivered in commit order; only the grouping
of concurrent appends into one transaction is lost, which no caller can observe.

The Journal works over any ``LogBackend``. With a multi-node backend
(PostgreSQL) two things are added: a losing lease fences only its session
(``SessionFenced`` fails that session's append; the runtime goes on), and a
listener thread turns other nodes' commits into wake-ups for the event streams
that follow those sessions (``follow``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, Final, TypeVar

import trio
from attrs import Factory, define

from perdure import _faults, _threads
from perdure.storage.backend import ClusterView, Guard, LogBackend, SessionInfo
from perdure.storage.bus import Event, EventBus, Subscription
from perdure.storage.errors import LogError, LogFenced, SessionFenced
from perdure.storage.records import Committed, Record

T = TypeVar("T")

logger = logging.getLogger("perdure.journal")

_STOP: Final = object()
# Worker threads that may read a local log (LMDB) at once. Its reads are CPU-bound
# once its pages are cached: more threads decoding side by side only take turns at
# the GIL, and each keeps a stack and a malloc arena resident for trio's thread cache
# (a burst of 1,000 new sessions started 26 of the default 40, 14 KiB per session).
# A remote log's reads wait on the network: trio's default limiter.
LOCAL_READ_THREADS: Final = 2
WAKE: Final = "_wake"  # the kind of the (never yielded) event that nudges a follower


@define
class _Append:
    records: Sequence[Record]
    guard: Guard | None
    # The caller parked until the commit is over (None: answered at once, inline).
    waiter: trio.lowlevel.Task | None = None
    # Work started while this commit is in flight (``append``'s ``meanwhile``): the loop
    # commits it once that work waits (``Journal.append``).
    overlap: bool = False
    result: list[Committed] | None = None
    error: BaseException | None = None


def _uncancellable(raise_cancel: Any) -> trio.lowlevel.Abort:
    # A commit handed over happens (or fails) regardless: its caller must learn which.
    return trio.lowlevel.Abort.FAILED


# What an actor starting on the log reads: the session's summary, its records.
_Start = tuple[SessionInfo | None, list[Committed] | None]


@define
class _StartReads:
    """The sessions starting in one scheduling round, read in one worker-thread call."""

    session_ids: list[str]
    waiters: list[trio.lowlevel.Task] = Factory(list)
    found: dict[str, _Start | BaseException] = Factory(dict)


def _read_starts(log: LogBackend, session_ids: Sequence[str]) -> dict[str, _Start | BaseException]:
    """``Journal.session_with_records`` for each session, in a worker thread: one
    session's error is that session's alone."""
    found: dict[str, _Start | BaseException] = {}
    for sid in session_ids:
        try:
            info = log.session_info(sid)
        except Exception as exc:
            found[sid] = exc
            continue
        if info is None:
            found[sid] = (None, None)
            continue
        try:
            found[sid] = (info, log.read_session(sid))
        except Exception:
            found[sid] = (info, None)
    return found


@define
class JournalStats:
    appends: int = 0
    transactions: int = 0
    records: int = 0
    largest_transaction: int = 0
    loop_transactions: int = 0  # of ``transactions``: committed on the trio thread


# Commits on the trio thread while the recent ones waited at most this long (an
# exponentially weighted mean, in seconds, of each commit's wall time minus the CPU time
# its thread spent in it: the fsync, not the encoding, which holds the GIL and so costs
# the loop the same on either thread; a group commit of 1,000 sessions is milliseconds
# of Python on a quick disk).
LOOP_COMMIT_BUDGET: Final = 0.002
# A mapped log's pages are released after this many seconds without a commit, and at
# least this often while commits go on (seconds).
RELEASE_QUIET: Final = 1.0
RELEASE_EVERY: Final = 10.0
_EWMA_WEIGHT: Final = 0.2
# On a busy loop (see the module's docstring), in multiples of the mean commit wait: a
# lone append commits once this long has passed since the last commit ended...
BUSY_COMMIT_SPACING: Final = 2.0
# ...and several appends once the oldest of them has waited this long.
BUSY_GROUP_WAIT: Final = 10.0


class _RoundEnd(trio.abc.Instrument):
    """Hands the round's appends over right before the loop waits for I/O."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    def before_io_wait(self, timeout: float) -> None:
        journal = self.journal
        try:
            if journal._held:
                journal._end_round(timeout)
            if timeout <= 0 and (journal._in_flight or journal._thread_calls.under_way):
                _threads.let_in(journal._thread_calls)  # a busy loop: our threads' turn
        except Exception:
            # trio drops an instrument that raises, and then nothing would ever commit
            # again: a bug here must cost the loop commits, not the log.
            logger.exception("the journal's end of round failed; the writer thread commits")
            journal.commit_on_loop = False
            held = journal._take_held()
            journal._in_flight += len(held)
            for request in held:
                journal._queue.put(request)


class Journal:
    """Single writer over a ``LogBackend``. Use ``open_journal`` to run one."""

    def __init__(
        self,
        log: LogBackend,
        bus: EventBus | None = None,
        *,
        commit_on_loop: bool | None = None,
        loop_commit_budget: float = LOOP_COMMIT_BUDGET,
    ) -> None:
        self.log = log
        self.bus = bus if bus is not None else EventBus()
        self.stats = JournalStats()
        self.fenced = trio.Event()
        self.fence_error: LogFenced | None = None
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._closed = False
        self._stopped = trio.Event()
        self._followers: dict[str, set[Subscription]] = {}
        self._listen_stop = threading.Event()
        self._listener: threading.Thread | None = None
        self._inline = log.inline
        self._reads = trio.CapacityLimiter(LOCAL_READ_THREADS) if log.local else None
        self._start_reads: _StartReads | None = None  # gathering in this round
        # Appends of this scheduling round, not yet handed over; and those handed to
        # the writer thread whose delivery has not run yet (while any are, the loop
        # never commits: one write transaction at a time, in order).
        self._held: list[_Append] = []
        self._overlap_held = False  # one of ``_held`` waits for the work started beside it
        self._in_flight = 0
        self._round_end = _RoundEnd(self)
        self.commit_on_loop = log.local if commit_on_loop is None else commit_on_loop
        self.loop_commit_budget = loop_commit_budget
        self._commit_seconds = 0.0  # the weighted mean of recent commits' waits
        self._held_since = 0.0  # when the oldest of ``_held`` was appended
        self._last_commit_end = 0.0  # of the loop's commits (perf_counter)
        # Called on the trio thread after each durable transaction with its records
        # (every session's) and the seconds the backend's commit took (metrics).
        self.commit_listeners: list[Callable[[Sequence[Committed], float], None]] = []

    # -- writing ---------------------------------------------------------------------

    async def append(
        self,
        records: Sequence[Record],
        *,
        guard: Guard | None = None,
        meanwhile: Callable[[], None] | None = None,
        overlap: bool = False,
    ) -> list[Committed]:
        """Make ``records`` durable as one atomic unit; return them with their seqs.

        The wait cannot be cancelled: once handed over, the commit will happen (or
        fail) regardless, and the caller must learn which.

        ``meanwhile`` is called once the records are in the Journal's hands and before
        their commit is durable (inline: once it is), with no schedule point in between:
        what the caller may start while the commit is in flight. Whatever it starts must
        not act on the world before this call returns, and the caller undoes it if the
        commit fails. ``overlap``: let what ``meanwhile`` started run first; where the
        loop commits, it commits this at the end of the first round in which it would
        sleep (that work then waits, for a model's answer say), so that the fsync runs
        beside the wait instead of before the work; never held longer than
        ``BUSY_GROUP_WAIT`` mean commit waits (the module's docstring).
        """
        if self.fence_error is not None:
            raise self.fence_error
        if self._closed or (self._thread is None and not self._inline):
            raise LogError("the journal is closed")
        if not records:
            if meanwhile is not None:
                meanwhile()
            return []
        request = _Append(records, guard, overlap=overlap)
        if self._inline:
            self._deliver([request], *self._commit([request]))
            if meanwhile is not None and request.error is None:
                meanwhile()
            # A schedule point, as the threaded wait is, and like it not a cancel point:
            # the caller learns the outcome of a commit that happened.
            await trio.lowlevel.cancel_shielded_checkpoint()
            if request.error is not None:
                raise request.error
            assert request.result is not None
            return request.result
        request.waiter = trio.lowlevel.current_task()
        if not self._held:
            self._held_since = time.perf_counter()
        self._held.append(request)  # handed over at the end of a round (_RoundEnd)
        if overlap:
            self._overlap_held = True
        if meanwhile is not None:
            meanwhile()  # no checkpoint since the request was held: it cannot be delivered yet
        await trio.lowlevel.wait_task_rescheduled(_uncancellable)
        if request.error is not None:
            raise request.error
        assert request.result is not None
        return request.result

    def _take_held(self) -> list[_Append]:
        held, self._held, self._overlap_held = self._held, [], False
        return held

    def _commit(self, requests: list[_Append]) -> tuple[list[Any], float, float]:
        """One transaction for ``requests``: per request, its records or its error; the
        seconds the backend took; and of those, the ones its thread was not running
        (waiting for the disk, or for the GIL)."""
        began, cpu = time.perf_counter(), time.thread_time()
        try:
            results: list[Any] = self.log.commit([(r.records, r.guard) for r in requests])
        except BaseException as exc:  # every caller of this transaction must hear it
            return [exc] * len(requests), *_since(began, cpu)
        if _faults.ACTIVE:  # pragma: no mutate
            _count_commit_fault(results)
        return results, *_since(began, cpu)

    def _end_round(self, timeout: float) -> None:
        """On the trio thread, before it waits for I/O: commit here or hand over."""
        if (
            self.commit_on_loop
            and not self._in_flight
            and self._commit_seconds <= self.loop_commit_budget
            and not _faults.SLOW_COMMIT
        ):
            if timeout > 0:  # nothing runnable and no timer due: the loop would sleep
                self._commit_on_loop()
                # The waiters were rescheduled, but the loop already chose to sleep for
                # ``timeout``: wake it (a byte on its wake-up socket; no thread involved).
                assert self._token is not None
                self._token.run_sync_soon(_nothing)
                return
            now, mean = time.perf_counter(), self._commit_seconds
            if (
                now - self._held_since >= BUSY_GROUP_WAIT * mean
                if len(self._held) > 1 or self._overlap_held
                else now - self._last_commit_end >= BUSY_COMMIT_SPACING * mean
            ):
                self._commit_on_loop()
            return  # kept for a later round (the module's docstring says why)
        held = self._take_held()
        self._in_flight += len(held)
        for request in held:
            self._queue.put(request)

    def _commit_on_loop(self) -> None:
        held = self._take_held()
        results, took, waited = self._commit(held)
        self.stats.loop_transactions += 1
        self._deliver(held, results, took, waited)
        self._last_commit_end = time.perf_counter()

    def _writer(self) -> None:
        # The pages of an LMDB map that commits fault in are released once the log has
        # been quiet for a moment, and at least every few seconds while it is busy
        # (``LmdbLog.release_mapped_pages``): transactions are counted on the trio
        # thread too (commits on the loop), so the writer compares the counter.
        release: Callable[[], int] | None = getattr(self.log, "release_mapped_pages", None)
        released_at, released_after = time.monotonic(), self.stats.transactions
        seen = released_after  # the count at the previous wake-up
        while True:
            try:
                first = self._queue.get(timeout=None if release is None else RELEASE_QUIET)
            except queue.Empty:
                first = None
            count = self.stats.transactions
            if release is not None and count != released_after:
                now = time.monotonic()
                # Quiet: a whole timeout with no commit here nor on the loop.
                if (first is None and count == seen) or now - released_at >= RELEASE_EVERY:
                    released_at, released_after = now, count
                    release()
            seen = count
            stop = first is not None and self._write_batch(first)
            first = None  # nor by this one's
            if stop:
                assert self._token is not None
                self._token.run_sync_soon(self._stopped.set)
                return

    def _write_batch(self, first: Any) -> bool:
        """Commit ``first`` and whatever else is queued (writer thread); True on stop.

        A method of its own so that the batch, its records and its waiters' tasks are
        not kept alive by the loop's locals while the writer waits for the next one.
        """
        batch = [first]
        while True:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        requests: list[_Append] = [item for item in batch if item is not _STOP]
        if requests:
            if _faults.SLOW_COMMIT:
                time.sleep(_faults.SLOW_COMMIT)  # the writer thread, never the loop
            results, took, waited = self._commit(requests)
            assert self._token is not None
            self._token.run_sync_soon(self._handed_back, requests, results, took, waited)
        return len(requests) != len(batch)

    def _handed_back(
        self, requests: list[_Append], results: list[Any], took: float, waited: float
    ) -> None:
        # The writer thread's transaction, delivered on the trio thread.
        self._in_flight -= len(requests)
        self._deliver(requests, results, took, waited)

    def _deliver(
        self, requests: list[_Append], results: list[Any], took: float, waited: float
    ) -> None:
        # Runs on the trio thread, in commit order.
        self._commit_seconds += _EWMA_WEIGHT * (waited - self._commit_seconds)
        committed_any = False
        for request, result in zip(requests, results, strict=True):
            if isinstance(result, BaseException):
                request.error = result
                if (
                    isinstance(result, LogFenced)
                    and not isinstance(result, SessionFenced)
                    and self.fence_error is None
                ):
                    self.fence_error = result
                    self.fenced.set()
            else:
                request.result = result
                committed_any = True
            if request.waiter is not None:
                trio.lowlevel.reschedule(request.waiter)
        if committed_any:
            stats = self.stats
            stats.transactions += 1
            size = 0
            for result in results:
                if isinstance(result, list):
                    stats.appends += 1
                    size += len(result)
                    bus = self.bus
                    for c in result:
                        sid = c.record.session_id
                        if bus.has_subscribers(sid):  # most records have no live reader
                            bus.publish(Event(sid, type(c.record).__name__, c.seq, c.record))
            stats.records += size
            stats.largest_transaction = max(stats.largest_transaction, size)
            if self.commit_listeners:
                done = [c for result in results if isinstance(result, list) for c in result]
                for listener in self.commit_listeners:
                    try:
                        listener(done, took)
                    except Exception:  # telemetry never stops the log
                        logger.exception("a commit listener failed")

    # -- reading ---------------------------------------------------------------------

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Call the log's blocking ``fn`` in a worker thread (inline: here, at once)."""
        if self._inline:
            result = fn(*args)
            await trio.lowlevel.cancel_shielded_checkpoint()  # as uncancellable as a thread
            return result
        return await _threads.run_sync(functools.partial(fn, *args), limiter=self._reads)

    async def read_session(
        self, session_id: str, after: int = 0, limit: int | None = None
    ) -> list[Committed]:
        return await self.run(self.log.read_session, session_id, after, limit)

    async def read_sessions(
        self, session_ids: Sequence[str]
    ) -> dict[str, list[Committed] | Exception]:
        """Every record of each session, read in ONE worker-thread call (recovery's boot:
        a thread round trip per session costs more than reading it). A session that
        cannot be read maps to the exception its read raised."""
        read = self.log.read_session

        def read_all() -> dict[str, list[Committed] | Exception]:
            out: dict[str, list[Committed] | Exception] = {}
            for sid in session_ids:
                try:
                    out[sid] = read(sid)
                except Exception as exc:  # this session's problem, not the others'
                    out[sid] = exc
            return out

        return await self.run(read_all)

    async def read_global(self, after: int = 0, limit: int | None = None) -> list[Committed]:
        return await self.run(self.log.read_global, after, limit)

    async def active_sessions(self) -> list[str]:
        return await self.run(self.log.active_sessions)

    async def sessions(
        self, *, after: str = "", limit: int | None = None, active: bool = False
    ) -> list[SessionInfo]:
        return await self.run(
            functools.partial(self.log.sessions, after=after, limit=limit, active=active)
        )

    async def newest_sessions(
        self, *, before: int = 0, limit: int | None = None, active: bool = False
    ) -> list[SessionInfo]:
        return await self.run(
            functools.partial(self.log.newest_sessions, before=before, limit=limit, active=active)
        )

    async def session_info(self, session_id: str) -> SessionInfo | None:
        return await self.run(self.log.session_info, session_id)

    async def session_with_records(self, session_id: str) -> _Start:
        """The session's summary and, if it exists, its every record: what an actor
        starting on the log needs. Records that cannot be read come back as None (the
        actor reads them itself, where its supervisor handles the error); an error
        reading the summary is raised.

        The sessions that start in one scheduling round are read together, in ONE
        worker-thread call (a group read): a thread round trip per session costs about
        as much CPU as a tool call's whole decision, and with one read for all of them
        a burst of sessions starts in the same round instead of two at a time, so
        their commits go on sharing transactions. The wait is not a cancel point, as
        a worker thread's is not.
        """
        group = self._start_reads
        if group is not None:  # a read of this round is gathering: join it
            group.session_ids.append(session_id)
            group.waiters.append(trio.lowlevel.current_task())
            await trio.lowlevel.wait_task_rescheduled(_uncancellable)
        else:
            group = self._start_reads = _StartReads([session_id])
            try:
                # Every session that starts in this round joins before the read begins.
                await trio.lowlevel.cancel_shielded_checkpoint()
            finally:
                self._start_reads = None
            try:
                group.found = await self.run(_read_starts, self.log, group.session_ids)
            except BaseException as exc:  # every session of the group must hear it
                group.found = {sid: exc for sid in group.session_ids}
                raise
            finally:
                for waiter in group.waiters:
                    trio.lowlevel.reschedule(waiter)
        found = group.found[session_id]
        if isinstance(found, BaseException):
            raise found
        return found

    # -- ownership (multi-node backends; trivial for LMDB) ----------------------------

    async def acquire(self, session_id: str) -> None:
        """Become the session's writer, or raise ``NotOwner`` naming the node that is."""
        if not self.log.multi_node:
            self.log.acquire(session_id)  # granted at once: the log's owner lock fences
            return
        await self.run(self.log.acquire, session_id)

    async def release_session(self, session_id: str) -> None:
        """Give up the session's lease (after its actor was evicted); LMDB has none."""
        if self.log.multi_node:
            await self.run(self.log.release_session, session_id)

    async def claim(self) -> list[str]:
        """The active sessions this process should run now (and now holds)."""
        return await self.run(self.log.claim)

    async def renew(self) -> list[str]:
        """Extend the leases held; return the sessions whose lease was lost."""
        return await self.run(self.log.renew)

    async def survey(self) -> ClusterView:
        """The live nodes and the active sessions each holds (for rebalancing)."""
        return await self.run(self.log.survey)

    async def hand_over(self, session_id: str, target: str) -> bool:
        """Give the session's lease to the live node ``target`` (True once it holds it)."""
        return await self.run(self.log.hand_over, session_id, target)

    async def accept(self) -> list[str]:
        """Take the sessions other nodes handed to this process (and now holds)."""
        return await self.run(self.log.accept)

    async def confirm(self, session_id: str) -> bool:
        """Whether this process certainly still holds the session (before a tool starts)."""
        if not self.log.multi_node or self.log.is_fresh(session_id):
            return True
        return await self.run(self.log.confirm, session_id)

    @contextlib.contextmanager
    def follow(self, session_id: str, subscription: Subscription) -> Iterator[None]:
        """Nudge ``subscription`` (an event of kind ``WAKE``) when another node commits
        records of ``session_id``. Only multi-node backends ever nudge."""
        followers = self._followers.setdefault(session_id, set())
        followers.add(subscription)
        try:
            yield
        finally:
            followers.discard(subscription)
            if not followers:
                self._followers.pop(session_id, None)

    def _wake(self, sessions: frozenset[str] | None) -> None:
        # On the trio thread. None: notifications may have been missed; wake everyone.
        keys = self._followers.keys() if sessions is None else sessions
        for sid in list(keys):
            for sub in tuple(self._followers.get(sid, ())):
                sub._offer(Event(sid, WAKE))

    def _listen(self) -> None:
        token = self._token
        assert token is not None

        def wake(sessions: frozenset[str] | None) -> None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(self._wake, sessions)

        self.log.listen(wake, self._listen_stop)

    # -- lifecycle -------------------------------------------------------------------

    @property
    def writer_thread(self) -> threading.Thread | None:
        return self._thread

    def _start(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        if self._inline:
            self.log.bind_writer(threading.current_thread())  # the trio thread commits
            return
        self._thread = threading.Thread(target=self._writer, name="perdure-journal", daemon=True)
        if self.commit_on_loop:
            self.log.bind_writer(self._thread, threading.current_thread())
        else:
            self.log.bind_writer(self._thread)
        self._thread_calls = _threads.calls()
        trio.lowlevel.add_instrument(self._round_end)
        self._thread.start()
        if self.log.multi_node:
            self._listener = threading.Thread(
                target=self._listen, name="perdure-listener", daemon=True
            )
            self._listener.start()

    async def _stop(self) -> None:
        self._closed = True  # inline: every append was answered as it committed
        thread = self._thread
        if thread is None:
            return
        held = self._take_held()  # appended this round: they go first
        self._in_flight += len(held)
        for request in held:
            self._queue.put(request)
        self._queue.put(_STOP)
        # Set by the writer with run_sync_soon after its last delivery (FIFO order), so
        # every caller has been answered when this returns.
        await self._stopped.wait()
        await trio.to_thread.run_sync(thread.join)
        with contextlib.suppress(KeyError):  # trio drops an instrument that failed
            trio.lowlevel.remove_instrument(self._round_end)
        self._listen_stop.set()
        if self._listener is not None:
            await trio.to_thread.run_sync(self._listener.join)


def _nothing() -> None:
    pass


def _since(began: float, cpu: float) -> tuple[float, float]:
    """(seconds since ``began``, and those this thread was not running: waiting for the
    disk or for the GIL), from ``perf_counter`` and ``thread_time`` readings."""
    took = time.perf_counter() - began
    return took, max(0.0, took - (time.thread_time() - cpu))


# Test-only (``PERDURE_FAULT=commit@n`` kills the process after the n-th durable append).
# Its proof runs in a child process (tests/storage/test_journal.py), where the mutation
# campaign cannot switch a mutant on, so it is not counted there (RELIABILITY.md).
def _count_commit_fault(results: Sequence[Any]) -> None:  # pragma: no mutate block
    durable = sum(isinstance(result, list) for result in results)  # refused ones are not
    _faults.hit("commit", count=durable)


@asynccontextmanager
async def open_journal(
    log: LogBackend,
    bus: EventBus | None = None,
    *,
    commit_on_loop: bool | None = None,
    loop_commit_budget: float = LOOP_COMMIT_BUDGET,
) -> AsyncIterator[Journal]:
    """Run a Journal over ``log`` for the duration of the block (the log stays open).

    ``commit_on_loop``: whether an idle loop may commit on the trio thread, while the
    recent commits took at most ``loop_commit_budget`` seconds (see the module's
    docstring); ``None``: where the backend is local (LMDB).
    """
    journal = Journal(
        log, bus, commit_on_loop=commit_on_loop, loop_commit_budget=loop_commit_budget
    )
    journal._start()
    try:
        yield journal
    finally:
        with trio.CancelScope(shield=True):
            await journal._stop()
