"""The Journal and the log's write path: group commit, thread confinement, guards, isolation.

* Group commit really batches: 100 concurrent appenders share far fewer
  transactions than appends, and each caller still gets its own contiguous seqs
  whose records read back identical, globally and per session.
* Every write transaction runs on the Journal's writer thread, or on the trio thread
  while nothing is in the writer's hands and commits are quick: when the loop is idle,
  and when it is busy (a lone append once the last commit is a little behind, several
  together once the oldest waited a little); the two never overlap, and a slow disk
  sends commits back to the writer thread.
  ``log.commit`` from any other thread is refused, and writes nothing.
* A guarded batch whose goal revision is stale raises ``StaleGoal``, writes nothing
  (no seq, no index entry, no session summary) and leaves the other batches of the
  same transaction intact, including a revision made earlier in that transaction.
* A batch that cannot be encoded fails alone: the other batches of its
  transaction commit, and their callers never hear of it.
* The ``commit`` fault point counts durable appends only, and kills the process
  after the append is durable but before its caller hears so.
"""

from __future__ import annotations

import gc
import math
import signal
import threading
import time
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from perdure import _faults
from perdure.storage import Guard, StaleGoal
from perdure.storage import journal as journal_module
from perdure.storage.errors import LogError
from perdure.storage.journal import Journal, open_journal
from perdure.storage.lmdb_log import LmdbLog
from perdure.storage.records import (
    Committed,
    GoalRevised,
    InputAccepted,
    Record,
    SessionCreated,
    ToolCompleted,
)
from tests.storage._check import LogModel, check_log
from tests.storage._procs import Child


def tool_result(sid: str, call: str, output: str = "ok", at: float = 1.0) -> ToolCompleted:
    return ToolCompleted(session_id=sid, call_id=call, output=output, at=at)


async def append_all(
    journal: Journal, batches: dict[int, list[Record]]
) -> dict[int, list[Committed] | Exception]:
    """Append every batch from its own task, all at once; collect each caller's outcome."""
    outcomes: dict[int, list[Committed] | Exception] = {}

    async def one(key: int) -> None:
        try:
            outcomes[key] = await journal.append(batches[key])
        except Exception as exc:
            outcomes[key] = exc

    async with trio.open_nursery() as nursery:
        for key in batches:
            nursery.start_soon(one, key)
    return outcomes


# -- group commit ------------------------------------------------------------------------


async def test_concurrent_appends_share_transactions_and_get_their_own_seqs(
    log: LmdbLog,
) -> None:
    batches: dict[int, list[Record]] = {
        i: [tool_result(f"s{i % 7}", f"c{i}.{j}", f"out {i}.{j}") for j in range(1 + i % 4)]
        for i in range(100)
    }
    async with open_journal(log) as journal:
        outcomes = await append_all(journal, batches)
        stats = journal.stats
        everything = await journal.read_global(after=1)
        per_session = {sid: await journal.read_session(sid) for sid in [f"s{i}" for i in range(7)]}

    total = sum(len(b) for b in batches.values())
    assert stats.appends == 100
    assert stats.records == total
    assert stats.transactions < stats.appends
    assert stats.transactions <= stats.appends // 2, f"barely batched: {stats}"
    seen: list[int] = []
    for key, outcome in outcomes.items():
        assert isinstance(outcome, list)
        assert [c.record for c in outcome] == batches[key]
        first = outcome[0].seq
        assert [c.seq for c in outcome] == list(range(first, first + len(batches[key])))
        seen += [c.seq for c in outcome]
    assert sorted(seen) == list(range(2, 2 + total))  # seq 1 is LogOpened
    # What the callers were told is exactly what the log holds, globally and per session.
    told = sorted((c for o in outcomes.values() if isinstance(o, list) for c in o), key=seqof)
    assert everything == told
    for sid, records in per_session.items():
        assert records == [c for c in told if c.record.session_id == sid]
    await trio.to_thread.run_sync(check_log, log, LogModel())


def seqof(c: Committed) -> int:
    return c.seq


async def test_sequential_appends_are_one_transaction_each(log: LmdbLog) -> None:
    async with open_journal(log) as journal:
        for i in range(5):
            done = await journal.append([tool_result("s", f"c{i}")])
            assert done[0].seq == i + 2
        assert journal.stats.transactions == journal.stats.appends == 5
        assert await journal.append([]) == []


# -- thread confinement ------------------------------------------------------------------


async def test_write_transactions_run_on_the_writer_thread_or_the_idle_loop(
    log: LmdbLog,
) -> None:
    # No budget: this test is about threads, not about how fast this machine's disk is.
    async with open_journal(log, loop_commit_budget=math.inf) as journal:
        writer = journal.writer_thread
        assert writer is not None
        assert writer is not threading.current_thread()
        await append_all(journal, {i: [tool_result(f"s{i % 3}", f"c{i}")] for i in range(60)})
        for i in range(5):  # and sequential ones, each in its own transaction
            await journal.append([tool_result("s", f"d{i}")])
        # A lone append on an idle loop commits right there: no thread hand-off.
        assert journal.stats.loop_transactions >= 5
        assert log.write_threads <= {writer.ident, threading.get_ident()}
        last = await trio.to_thread.run_sync(log.last_seq)

        batch: list[tuple[list[Record], Guard | None]] = [([tool_result("s", "rogue")], None)]
        with pytest.raises(RuntimeError, match="only the journal's writer thread may write"):
            await trio.to_thread.run_sync(log.commit, batch)
        assert await trio.to_thread.run_sync(log.last_seq) == last
        assert (await journal.append([tool_result("s", "after")]))[0].seq == last + 1


async def test_without_loop_commits_every_transaction_is_the_writer_threads(log: LmdbLog) -> None:
    async with open_journal(log, commit_on_loop=False) as journal:
        writer = journal.writer_thread
        assert writer is not None
        await append_all(journal, {i: [tool_result(f"s{i % 3}", f"c{i}")] for i in range(20)})
        for i in range(5):
            await journal.append([tool_result("s", f"d{i}")])
        assert journal.stats.loop_transactions == 0
        assert log.write_threads == {writer.ident}
        with pytest.raises(RuntimeError, match="only the journal's writer thread may write"):
            log.commit([([tool_result("s", "rogue")], None)])  # the trio thread: refused


async def test_the_writer_keeps_nothing_of_a_batch_it_committed(log: LmdbLog) -> None:
    # The writer thread waits for the next batch with nothing of the last one held: its
    # records, and the tasks that waited for them, belong to their callers alone (a burst
    # of sessions going idle must not leave its last batch resident).
    async with open_journal(log, commit_on_loop=False) as journal:
        records = [tool_result("s", f"c{i}") for i in range(3)]
        refs = [weakref.ref(r) for r in records]
        await journal.append(records[:2])
        await journal.append(records[2:])
        assert journal.stats.loop_transactions == 0  # both went through the writer
        del records
        gc.collect()
        assert [ref() for ref in refs] == [None, None, None]


class _Watched:
    """A backend wrapper that notes which thread ran each commit and any overlap;
    ``delay`` seconds asleep in each commit (a slow disk), or ``cpu`` seconds of work."""

    def __init__(
        self, log: LmdbLog, delay: float = 0.0, cpu: float = 0.0, clock: _CpuClock | None = None
    ) -> None:
        self.log = log
        self.delay = delay
        self.cpu = cpu
        self.clock = clock
        self.threads: list[int] = []
        self.running = 0
        self.overlaps = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.log, name)

    def commit(self, batches: object) -> object:
        self.running += 1
        self.overlaps += self.running > 1
        try:
            if self.delay:
                time.sleep(self.delay)
            if self.clock is not None:
                self.clock.spend(self.cpu)
            else:
                began = time.thread_time()
                while time.thread_time() - began < self.cpu:
                    pass
            self.threads.append(threading.get_ident())
            return self.log.commit(batches)  # type: ignore[arg-type]
        finally:
            self.running -= 1


@asynccontextmanager
async def busy_loop() -> AsyncIterator[trio.Event]:
    """A task always runnable for the block: every round ends with work left (busy)."""
    stop = trio.Event()

    async def spinner() -> None:
        while not stop.is_set():
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(spinner)
        await trio.lowlevel.checkpoint()
        yield stop
        stop.set()


async def test_a_busy_loop_commits_a_lone_append_itself_and_order_holds(log: LmdbLog) -> None:
    """A busy loop does not hand its appends to the writer thread, which would wait for the
    GIL until the loop idles: a lone append commits on the loop at a round's end."""
    watched = _Watched(log)
    journal = Journal(watched, commit_on_loop=True, loop_commit_budget=math.inf)  # type: ignore[arg-type]
    journal._start()
    try:
        async with busy_loop():
            busy = [await journal.append([tool_result("s", f"b{i}")]) for i in range(5)]
        assert journal.stats.loop_transactions == journal.stats.transactions == 5
        assert set(watched.threads) == {threading.get_ident()}  # none was the writer's
        idle = [await journal.append([tool_result("s", f"i{i}")]) for i in range(5)]
        assert journal.stats.loop_transactions == 10
        seqs = [c[0].seq for c in busy + idle]
        assert seqs == sorted(seqs) == list(range(seqs[0], seqs[0] + 10))
        assert watched.overlaps == 0
    finally:
        with trio.CancelScope(shield=True):
            await journal._stop()


async def test_a_busy_loop_spaces_its_commits_of_lone_appends(
    log: LmdbLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Within ``BUSY_COMMIT_SPACING`` mean commit times of the last commit, a lone append
    on a busy loop waits (here: forever, until the loop idles), held on the loop."""
    watched = _Watched(log)
    async with open_journal(watched, loop_commit_budget=math.inf) as journal:  # type: ignore[arg-type]
        await journal.append([tool_result("s", "first")])  # a commit: the mean is known
        monkeypatch.setattr(journal_module, "BUSY_COMMIT_SPACING", math.inf)
        got: list[list[Committed]] = []

        async def append() -> None:
            got.append(await journal.append([tool_result("s", "held")]))

        async with trio.open_nursery() as nursery, busy_loop():
            nursery.start_soon(append)
            for _ in range(200):
                await trio.lowlevel.checkpoint()
            assert got == [] and journal.stats.transactions == 1
            assert journal._in_flight == 0  # kept on the loop, not the writer's
        assert [c.record.call_id for c in got[0]] == ["held"]  # the loop went idle
        assert journal.stats.loop_transactions == journal.stats.transactions == 2


@pytest.mark.parametrize("group_wait", [0.0, math.inf])
async def test_a_busy_loop_commits_several_appends_together_after_the_group_wait(
    log: LmdbLog, monkeypatch: pytest.MonkeyPatch, group_wait: float
) -> None:
    """Several appends on a busy loop commit in one transaction once the oldest has waited
    ``BUSY_GROUP_WAIT`` mean commit times (0: at the round's end; infinite: not before the
    loop idles), and never through the writer thread."""
    watched = _Watched(log)
    monkeypatch.setattr(journal_module, "BUSY_GROUP_WAIT", group_wait)
    async with open_journal(watched, loop_commit_budget=math.inf) as journal:  # type: ignore[arg-type]
        records = [tool_result(f"s{i}", "c") for i in range(6)]
        got: list[Record] = []

        async def append(record: Record) -> None:
            got.extend(c.record for c in await journal.append([record]))

        async with trio.open_nursery() as nursery, busy_loop():
            for record in records:
                nursery.start_soon(append, record)
            for _ in range(200):
                await trio.lowlevel.checkpoint()
            busy_transactions = journal.stats.transactions
            assert journal._in_flight == 0  # kept on the loop, not the writer's
        assert sorted(got, key=records.index) == records
        assert journal.stats.loop_transactions == journal.stats.transactions == 1
        assert busy_transactions == (1 if group_wait == 0.0 else 0)
        assert set(watched.threads) == {threading.get_ident()}


class _CpuClock:
    """The Journal's view of ``time`` with CPU work added to both of its clocks, so a
    test can charge a commit seconds of encoding without spinning: on a shared, loaded
    machine a spinning thread is also descheduled, and that wait is real."""

    def __init__(self) -> None:
        self.spent = 0.0

    def spend(self, seconds: float) -> None:
        self.spent += seconds

    def perf_counter(self) -> float:
        return time.perf_counter() + self.spent

    def thread_time(self) -> float:
        return time.thread_time() + self.spent

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)


async def test_commits_long_on_cpu_but_quick_on_the_disk_stay_on_the_loop(
    log: LmdbLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The budget weighs what a commit waited, not its encoding: five times the budget of
    CPU per commit would hold the GIL on the writer thread just the same. (The budget is
    raised above any real commit's wait on a loaded machine; the CPU is charged, not
    spun: see ``_CpuClock``.)"""
    clock = _CpuClock()
    monkeypatch.setattr(journal_module, "time", clock)
    watched = _Watched(log, cpu=0.5, clock=clock)
    async with open_journal(watched, loop_commit_budget=0.1) as journal:  # type: ignore[arg-type]
        for i in range(5):
            await journal.append([tool_result("s", f"c{i}")])
        assert journal.stats.loop_transactions == 5
        assert set(watched.threads) == {threading.get_ident()}


async def test_a_failing_end_of_round_sends_commits_to_the_writer_thread(
    log: LmdbLog, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """trio drops an instrument that raises: a bug in the end of round must not leave the
    held appends (and every later one) waiting forever."""
    async with open_journal(log, loop_commit_budget=math.inf) as journal:

        def broken(timeout: float) -> None:
            raise RuntimeError("a bug in the round's end")

        monkeypatch.setattr(journal, "_end_round", broken)
        with trio.fail_after(10):
            first = await journal.append([tool_result("s", "a")])
            second = await journal.append([tool_result("s", "b")])
        assert [first[0].seq + 1] == [second[0].seq]
        assert journal.stats.loop_transactions == 0 and journal.commit_on_loop is False
    assert {r.message for r in caplog.records} == {
        "the journal's end of round failed; the writer thread commits"
    }


async def test_slow_commits_go_back_to_the_writer_thread(log: LmdbLog) -> None:
    """Past the budget, the loop stops committing itself: its I/O must not wait on a disk."""
    # 200 ms per commit, far above the budget (100 times the default). A loaded machine's
    # quick commits, fsync included, can wait tens of ms (a budget of 30 ms between them
    # failed now and then under load), so the margins are wide on both sides.
    watched = _Watched(log, delay=0.2)
    journal = Journal(watched, commit_on_loop=True)  # type: ignore[arg-type]
    journal._start()
    try:
        for i in range(12):
            await journal.append([tool_result("s", f"c{i}")])
        trio_thread = threading.get_ident()
        # The first commit may run on the loop (nothing is known yet); once the mean
        # commit time is over the budget, every commit is the writer thread's.
        assert journal.stats.loop_transactions <= 1
        assert trio_thread not in watched.threads[2:]
        watched.delay = 0.0
        journal.loop_commit_budget = 0.1  # above any quick commit, below the slow ones
        for i in range(40):  # quick again: the mean decays and the loop takes over
            await journal.append([tool_result("s", f"q{i}")])
        assert watched.threads[-1] == trio_thread
        assert watched.overlaps == 0
    finally:
        with trio.CancelScope(shield=True):
            await journal._stop()


# -- the reads of starting actors ------------------------------------------------------


async def test_sessions_starting_in_one_round_are_read_in_one_thread_call(
    log: LmdbLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``session_with_records`` from many tasks at once: one worker-thread call reads
    them all, each caller gets its own session's summary and records; an unknown
    session reads as nothing, a session whose records cannot be read gets its summary
    and None (its actor reads them itself), and an error reading a summary reaches that
    session's caller alone."""
    sids = [f"s{i}" for i in range(30)]
    async with open_journal(log) as journal:
        for sid in sids:
            await journal.append(
                [SessionCreated(session_id=sid, at=1.0), tool_result(sid, "c", f"out {sid}")]
            )
        expected = {sid: await journal.read_session(sid) for sid in sids}
        calls: list[tuple[str, ...]] = []
        real_run = journal.run

        async def counted_run(fn: Any, *args: Any) -> Any:
            if fn is journal_module._read_starts:
                calls.append(tuple(args[1]))
            return await real_run(fn, *args)

        real_info, real_read = log.session_info, log.read_session

        def session_info(sid: str) -> Any:
            if sid == "s7":
                raise LogError("the summary of s7 cannot be read")
            return real_info(sid)

        def read_session(sid: str, *args: Any, **kwargs: Any) -> Any:
            if sid == "s8":
                raise LogError("the records of s8 cannot be read")
            return real_read(sid, *args, **kwargs)

        monkeypatch.setattr(journal, "run", counted_run)
        monkeypatch.setattr(log, "session_info", session_info)
        monkeypatch.setattr(log, "read_session", read_session)
        got: dict[str, Any] = {}

        async def start(sid: str) -> None:
            try:
                got[sid] = await journal.session_with_records(sid)
            except LogError as exc:
                got[sid] = exc

        async with trio.open_nursery() as nursery:
            for sid in [*sids, "unknown"]:
                nursery.start_soon(start, sid)

    assert len(calls) == 1 and sorted(calls[0]) == sorted([*sids, "unknown"])
    assert got["unknown"] == (None, None)
    assert isinstance(got["s7"], LogError) and "s7" in str(got["s7"])
    info, records = got["s8"]
    assert info is not None and info.last_seq == expected["s8"][-1].seq and records is None
    for sid in sids:
        if sid in ("s7", "s8"):
            continue
        info, records = got[sid]
        assert records == expected[sid]
        assert info is not None and info.last_seq == expected[sid][-1].seq


async def test_a_group_read_that_fails_whole_fails_every_session_of_its_group(
    log: LmdbLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the one read of a round's starting sessions fails as a whole (not one
    session's read), every caller of that round hears its error: none waits forever,
    none is handed another session's answer. The next round reads again."""
    async with open_journal(log) as journal:
        await journal.append([SessionCreated(session_id="s0", at=1.0)])
        real_read = journal_module._read_starts
        broken = LogError("the log cannot be read")

        def failing(log: Any, session_ids: Any) -> Any:
            raise broken

        monkeypatch.setattr(journal_module, "_read_starts", failing)
        heard: dict[str, BaseException] = {}

        async def start(sid: str) -> None:
            try:
                await journal.session_with_records(sid)
            except LogError as exc:
                heard[sid] = exc

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                for i in range(5):
                    nursery.start_soon(start, f"s{i}")
        assert heard == {f"s{i}": broken for i in range(5)}
        monkeypatch.setattr(journal_module, "_read_starts", real_read)
        info, records = await journal.session_with_records("s0")
        assert info is not None and records is not None
        assert [c.record for c in records] == [SessionCreated(session_id="s0", at=1.0)]


async def test_appends_of_one_round_share_one_transaction(log: LmdbLog) -> None:
    async with open_journal(log) as journal:
        before = journal.stats.transactions
        await append_all(journal, {i: [tool_result(f"s{i}", "c")] for i in range(30)})
        # All 30 appenders run in the same scheduling round: one hand-over, one commit.
        assert journal.stats.transactions - before == 1
        assert journal.stats.appends == 30


# -- guards ------------------------------------------------------------------------------


def test_stale_guard_writes_nothing_and_spares_its_transaction(log: LmdbLog) -> None:
    (opened,) = log.commit(
        [([GoalRevised(session_id="s1", goal_rev=2, text="new", request_id="r", at=1.0)], None)]
    )
    assert isinstance(opened, list)
    a = [tool_result("s1", "a1"), tool_result("s1", "a2")]
    b = [tool_result("s1", "b1")]
    c = [tool_result("s2", "c1")]
    d = [tool_result("ghost", "d1")]
    ra, rb, rc, rd = log.commit(
        [(a, Guard("s1", 2)), (b, Guard("s1", 1)), (c, None), (d, Guard("ghost", 1))]
    )
    assert isinstance(ra, list)
    assert isinstance(rc, list)
    assert [x.seq for x in ra + rc] == [3, 4, 5]  # the refused batch took no seq
    assert isinstance(rb, StaleGoal)
    assert (rb.expected, rb.found) == (1, 2)
    assert "goal revision 1" in str(rb)
    assert isinstance(rd, StaleGoal)
    assert (rd.expected, rd.found) == (1, 0)
    assert [x.record for x in log.read_global(after=2)] == a + c
    assert [x.record for x in log.read_session("s1", after=2)] == a
    # A session that only appeared in a refused guard must not exist afterwards.
    assert log.session_info("ghost") is None
    assert "ghost" not in {info.session_id for info in log.sessions()}
    assert log.read_session("ghost") == []
    check_log(log, LogModel())


def test_a_revision_earlier_in_the_same_transaction_is_in_force(log: LmdbLog) -> None:
    revise = [GoalRevised(session_id="s1", goal_rev=1, text="t", request_id="r1", at=1.0)]
    late = [tool_result("s1", "late")]
    fresh = [tool_result("s1", "fresh")]
    r1, r2, r3 = log.commit(
        [(revise, Guard("s1", 0)), (late, Guard("s1", 0)), (fresh, Guard("s1", 1))]
    )
    assert isinstance(r1, list)
    assert isinstance(r2, StaleGoal)
    assert (r2.expected, r2.found) == (0, 1)
    assert isinstance(r3, list)
    assert [x.record for x in log.read_session("s1")] == revise + fresh
    check_log(log, LogModel())


async def test_stale_guard_through_the_journal(log: LmdbLog) -> None:
    async with open_journal(log) as journal:
        sub = journal.bus.subscribe("s1")
        await journal.append(
            [GoalRevised(session_id="s1", goal_rev=3, text="t", request_id="r", at=1.0)]
        )
        last = await trio.to_thread.run_sync(log.last_seq)
        batches: dict[int, list[Record]] = {i: [tool_result("s1", f"ok{i}")] for i in range(10)}
        stale = [tool_result("s1", "stale"), tool_result("s1", "stale2")]

        async def guarded() -> None:
            with pytest.raises(StaleGoal):
                await journal.append(stale, guard=Guard("s1", 2))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(guarded)
            outcomes = await append_all(journal, batches)
        assert all(isinstance(o, list) for o in outcomes.values())
        everything = await journal.read_global()
        assert everything[-1].seq == last + 10
        assert all(c.record not in stale for c in everything)
        sub.close()
        seen = [event.seq async for event in sub]
        assert seen == list(range(2, last + 11))  # the refused batch published nothing


# -- isolation of a bad batch ------------------------------------------------------------


def test_unencodable_batch_fails_alone_in_its_transaction(log: LmdbLog) -> None:
    good = [tool_result("s1", "g1")]
    bad = [tool_result("s1", "b1"), tool_result("s1", "b2", at=float("nan"))]
    also_good = [
        InputAccepted(
            session_id="s2", submission_id="u", request_id="r", text="t", body_hash="h", at=2.0
        )
    ]
    r1, r2, r3 = log.commit([(good, None), (bad, None), (also_good, None)])
    assert isinstance(r2, ValueError)
    assert isinstance(r1, list)
    assert isinstance(r3, list)
    assert [x.seq for x in r1 + r3] == [2, 3]
    assert [x.record for x in log.read_global(after=1)] == good + also_good
    assert log.active_sessions() == ["s2"]
    check_log(log, LogModel())


async def test_unencodable_append_does_not_fail_the_others(log: LmdbLog) -> None:
    batches: dict[int, list[Record]] = {i: [tool_result(f"s{i}", f"c{i}")] for i in range(20)}
    batches[7] = [SessionCreated(session_id="s7", system="\ud800 lone surrogate", at=1.0)]
    async with open_journal(log) as journal:
        outcomes = await append_all(journal, batches)
        assert journal.stats.transactions < 20  # they did share transactions
    assert isinstance(outcomes.pop(7), UnicodeEncodeError)
    assert all(isinstance(o, list) for o in outcomes.values())
    new = await trio.to_thread.run_sync(check_log, log, LogModel())
    assert len(new) == 20  # LogOpened and the 19 good appends


# -- the commit fault point --------------------------------------------------------------


async def test_the_commit_fault_point_counts_each_transactions_durable_appends(
    log: LmdbLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In this process, with a fault planned far ahead: the ``commit`` point counts each
    transaction's durable appends, not its refused ones (the next test kills a child
    process at the point)."""
    hits: dict[tuple[str, str | None], int] = {}
    monkeypatch.setattr(_faults, "ACTIVE", True)
    monkeypatch.setattr(_faults, "_PLAN", {("commit", None): 1_000_000})
    monkeypatch.setattr(_faults, "_HITS", hits)
    revised = GoalRevised(session_id="s", goal_rev=1, text="g", request_id="r", at=1.0)
    refused: list[Exception] = []
    async with open_journal(log) as journal:
        await journal.append([revised])
        assert hits == {("commit", None): 1}

        async def stale() -> None:
            try:
                await journal.append([tool_result("s", "stale")], guard=Guard("s", 0))
            except StaleGoal as exc:
                refused.append(exc)

        async with trio.open_nursery() as nursery:  # one round: one transaction
            nursery.start_soon(stale)
            nursery.start_soon(journal.append, [tool_result("s", "a")])
            nursery.start_soon(journal.append, [tool_result("t", "b"), tool_result("t", "c")])
        assert journal.stats.transactions == 2 and len(refused) == 1
    assert hits == {("commit", None): 3}  # the revision's, then 2 of the 3 appends


def test_commit_fault_counts_durable_appends_only(tmp_path: Path) -> None:
    """PERDURE_FAULT=commit@3 dies after the 3rd DURABLE append: refused ones do not count."""
    path = tmp_path / "log"
    child = Child("fault-script", str(path), stderr_path=tmp_path / "err", fault="commit@3")
    try:
        told = [child.read(), child.read(), child.read(), child.read()]
        assert child.wait() == -signal.SIGKILL
    finally:
        child.close()
    assert told == [{"ok": "a"}, {"refused": "StaleGoal"}, {"refused": "ValueError"}, {"ok": "c"}]
    log = LmdbLog(path)
    try:
        calls = [getattr(c.record, "call_id", None) for c in log.read_global()]
    finally:
        log.close()
    # d is durable although its caller never heard so; e was never written.
    assert calls == [None, "a", "c", "d", None]


async def test_reads_of_a_local_log_use_at_most_a_few_worker_threads(
    log: LmdbLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A burst of reads (a thousand sessions starting at once) takes turns on
    ``LOCAL_READ_THREADS`` threads instead of starting one per read up to trio's 40:
    the reads are CPU-bound, and every idle thread of trio's cache keeps its memory."""
    from perdure.storage.journal import LOCAL_READ_THREADS

    async with open_journal(log) as journal:
        await journal.append([SessionCreated(session_id="s0", at=1.0)])
        lock = threading.Lock()
        running, most, threads = 0, 0, set()
        read = log.read_session

        def slow_read(*args: object) -> list[Committed]:
            nonlocal running, most
            with lock:
                running += 1
                most = max(most, running)
                threads.add(threading.get_ident())
            time.sleep(0.01)  # long enough for every read of the burst to be waiting
            with lock:
                running -= 1
            return read(*args)  # type: ignore[arg-type]

        monkeypatch.setattr(log, "read_session", slow_read)
        found: list[int] = []

        async def one() -> None:
            found.append(len(await journal.read_session("s0")))

        async with trio.open_nursery() as nursery:
            for _ in range(30):
                nursery.start_soon(one)
    assert found == [1] * 30  # every read answered, in full
    assert most == LOCAL_READ_THREADS == len(threads)


# -- work that overlaps a commit (``meanwhile``, ``overlap``) -------------------------------


async def test_meanwhile_runs_before_the_commit_is_durable_and_overlap_waits_for_it(
    log: LmdbLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``meanwhile`` is called once, with the records in the Journal's hands and not yet
    in the log; with ``overlap`` the loop lets the work it started run first (busy rounds
    keep the commit, even where a lone append would be committed at once) and commits it
    once that work waits, on the loop, no thread involved; the caller still hears only
    once it is durable."""
    watched = _Watched(log)
    async with open_journal(watched, loop_commit_budget=math.inf) as journal:  # type: ignore[arg-type]
        await journal.append([tool_result("s", "first")])
        assert journal.stats.loop_transactions == 1  # an idle loop commits a plain append
        monkeypatch.setattr(journal_module, "BUSY_COMMIT_SPACING", 0.0)  # lone: at once
        monkeypatch.setattr(journal_module, "BUSY_GROUP_WAIT", math.inf)
        seen: list[int] = []
        work: list[int] = []  # rounds of the started work, and the log's size at each
        go_on = trio.Event()

        async def started() -> None:  # what ``meanwhile`` starts: busy rounds, then a wait
            for _ in range(50):
                work.append(len(log.read_session("s")))
                await trio.lowlevel.checkpoint()
            await go_on.wait()

        async with trio.open_nursery() as nursery:

            def meanwhile() -> None:
                seen.append(len(log.read_session("s")))  # what is durable right now
                nursery.start_soon(started)

            done = await journal.append(
                [tool_result("s", "second")], meanwhile=meanwhile, overlap=True
            )
            go_on.set()
        assert seen == [1], "called once, before the second record was in the log"
        assert work == [1] * 50, "the started work ran its busy rounds before the commit"
        assert [c.record.call_id for c in done] == ["second"]
        assert len(log.read_session("s")) == 2  # durable when the caller heard
        assert journal.stats.loop_transactions == journal.stats.transactions == 2
        assert set(watched.threads) == {threading.get_ident()}  # none was the writer's
        # Without ``overlap`` the busy loop commits a lone append at the round's end.
        async with busy_loop():
            await journal.append([tool_result("s", "third")], meanwhile=lambda: None)
        assert journal.stats.loop_transactions == 3
        assert journal._overlap_held is False
        # Nothing to commit: ``meanwhile`` still runs, and nothing is written.
        ran: list[bool] = []
        assert await journal.append([], meanwhile=lambda: ran.append(True)) == []
        assert ran == [True] and journal.stats.transactions == 3


async def test_an_overlapped_commit_is_held_at_most_the_group_wait_on_a_busy_loop(
    log: LmdbLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Work that never waits does not hold an overlapped commit for ever: it commits once
    held ``BUSY_GROUP_WAIT`` mean commit waits (0 here: at the first round's end)."""
    watched = _Watched(log)
    async with open_journal(watched, loop_commit_budget=math.inf) as journal:  # type: ignore[arg-type]
        await journal.append([tool_result("s", "first")])
        monkeypatch.setattr(journal_module, "BUSY_COMMIT_SPACING", math.inf)
        monkeypatch.setattr(journal_module, "BUSY_GROUP_WAIT", 0.0)
        async with busy_loop():
            await journal.append([tool_result("s", "second")], meanwhile=lambda: None, overlap=True)
        assert journal.stats.loop_transactions == journal.stats.transactions == 2


async def test_an_overlapped_commit_goes_to_the_writer_where_the_loop_does_not_commit(
    log: LmdbLog,
) -> None:
    """A slow disk (commits over the loop's budget) or ``commit_on_loop=False``: the
    writer thread takes an overlapped commit as any other, and its fsync runs beside the
    started work."""
    watched = _Watched(log, delay=0.02)
    async with open_journal(watched, commit_on_loop=False) as journal:  # type: ignore[arg-type]
        seen: list[int] = []
        done = await journal.append(
            [tool_result("s", "only")],
            meanwhile=lambda: seen.append(len(log.read_session("s"))),
            overlap=True,
        )
        assert seen == [0] and [c.record.call_id for c in done] == ["only"]
        assert journal.stats.loop_transactions == 0
        assert watched.threads == [journal.writer_thread.ident]  # type: ignore[union-attr]


async def test_meanwhile_on_an_inline_log_runs_after_a_commit_and_not_after_a_failed_one() -> None:
    from perdure.storage.memory_log import MemoryLog

    memory = MemoryLog()
    async with open_journal(memory) as journal:
        seen: list[int] = []

        def meanwhile() -> None:
            seen.append(len(memory.read_session("s")))

        await journal.append([tool_result("s", "a")], meanwhile=meanwhile)
        assert seen == [1]  # inline commits are durable at once: then it runs
        stale = Guard("s", goal_rev=5)  # the session's goal revision is 0
        with pytest.raises(StaleGoal):
            await journal.append([tool_result("s", "b")], guard=stale, meanwhile=meanwhile)
        assert seen == [1], "not called for a commit that failed"
