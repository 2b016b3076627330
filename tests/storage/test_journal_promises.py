"""What the Journal promises its callers and watchers, beside group commit.

``test_journal.py`` proves batching, thread confinement, guards and isolation on
LMDB. This module proves the rest of the Journal's contract, on both kinds of
backend it drives (the threaded LMDB log and the inline in-memory one):

* an append returns its records with their seqs, or raises what refused it;
* nothing is appended once the Journal has closed, and every caller of the last
  round was answered before it closed;
* every durable record is published to the session's subscribers, once, in commit
  order, as exactly the record that was committed; nothing else is;
* commit listeners get each transaction's durable records and how long it took,
  and one that fails is logged once and stops nothing;
* the stats count appends, transactions and records exactly;
* a taken-over log fences the whole Journal, a lost session lease only its append;
* reads return the log's records (a session that cannot be read maps to its error).

These tests run in the test process, so the mutation campaign (docs/RELIABILITY.md)
can switch a mutant of ``perdure/storage/journal.py`` on under them.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from perdure import _faults
from perdure.storage import Guard, StaleGoal
from perdure.storage.backend import Batch, CommitResult, LogBackend
from perdure.storage.bus import EventBus
from perdure.storage.errors import LogError, LogFenced, SessionFenced
from perdure.storage.journal import Journal, _Append, open_journal
from perdure.storage.lmdb_log import LmdbLog
from perdure.storage.memory_log import MemoryLog
from perdure.storage.records import Committed, GoalRevised, InputAccepted, ToolCompleted
from tests.storage.test_journal import _Watched, append_all

KINDS = ["lmdb", "memory"]


def revision() -> GoalRevised:
    return GoalRevised(session_id="s", goal_rev=1, text="t", request_id="r", at=1.0)


def result(sid: str, call: str) -> ToolCompleted:
    return ToolCompleted(session_id=sid, call_id=call, output=f"out of {call}", at=1.0)


@asynccontextmanager
async def journal_on(kind: str, tmp_path: Path) -> AsyncIterator[tuple[Journal, LogBackend]]:
    log: LogBackend = LmdbLog(tmp_path / "log") if kind == "lmdb" else MemoryLog()
    try:
        async with open_journal(log) as journal:
            yield journal, log
    finally:
        log.close()


@asynccontextmanager
async def started(watched: _Watched, **options: Any) -> AsyncIterator[Journal]:
    """A Journal over a watched LMDB log (which thread commits, any overlap); the log is
    closed after the block."""
    try:
        async with open_journal(watched, **options) as journal:  # type: ignore[arg-type]
            yield journal
    finally:
        watched.log.close()


# -- answers -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_an_append_returns_its_records_with_their_seqs(kind: str, tmp_path: Path) -> None:
    async with journal_on(kind, tmp_path) as (journal, _log):
        # The in-memory log commits inline, on the trio thread: no writer thread at all.
        assert (journal.writer_thread is None) == (kind == "memory")
        first = await journal.append([result("s", "a"), result("s", "b")])
        second = await journal.append([result("t", "c")])
        assert [(c.seq, c.record) for c in first] == [(2, result("s", "a")), (3, result("s", "b"))]
        assert [(c.seq, c.record) for c in second] == [(4, result("t", "c"))]
        assert await journal.read_session("s") == first
        assert await journal.read_global(after=1) == first + second
        assert await journal.read_global(after=2, limit=1) == first[1:]
        assert await journal.read_session("s", after=2) == first[1:]
        assert await journal.read_session("s", limit=1) == first[:1]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_refused_append_raises_and_writes_nothing(kind: str, tmp_path: Path) -> None:
    async with journal_on(kind, tmp_path) as (journal, _log):
        await journal.append([revision()])
        with pytest.raises(StaleGoal) as refused:
            await journal.append([result("s", "late")], guard=Guard("s", 0))
        assert (refused.value.expected, refused.value.found) == (0, 1)
        kept = await journal.append([result("s", "fresh")], guard=Guard("s", 1))
        records = [c.record for c in await journal.read_session("s")]
        assert result("s", "late") not in records
        assert records[-1] == result("s", "fresh") == kept[0].record


@pytest.mark.parametrize("kind", KINDS)
async def test_nothing_is_appended_once_the_journal_closed(kind: str, tmp_path: Path) -> None:
    log: LogBackend = LmdbLog(tmp_path / "log") if kind == "lmdb" else MemoryLog()
    answered: list[list[Committed]] = []
    try:
        async with open_journal(log) as journal:

            async def append_late() -> None:
                answered.append(await journal.append([result("s", "last-round")]))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(append_late)
                await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(LogError, match=r"^the journal is closed$"):
            await journal.append([result("s", "after")])
        assert [c.record for c in log.read_session("s")] == [result("s", "last-round")]
        assert answered[0][0].record == result("s", "last-round")
    finally:
        log.close()


async def test_appends_in_flight_when_the_journal_closes_are_answered(tmp_path: Path) -> None:
    """Appends the writer thread holds when the Journal closes are committed, and each
    caller hears so before ``open_journal`` returns."""
    log = LmdbLog(tmp_path / "log")
    outcomes: list[list[Committed]] = []
    try:
        async with trio.open_nursery() as nursery:
            async with open_journal(log, commit_on_loop=False) as journal:

                async def one(i: int) -> None:
                    outcomes.append(await journal.append([result("s", f"c{i}")]))

                for i in range(5):
                    nursery.start_soon(one, i)
                await trio.testing.wait_all_tasks_blocked()  # handed to the writer
            assert len(outcomes) == 5  # before the block returned, not after
        assert sorted(o[0].record.call_id for o in outcomes) == [f"c{i}" for i in range(5)]
        assert len(log.read_session("s")) == 5
        assert journal.stats.appends == 5
    finally:
        log.close()


class _Gated:
    """An LMDB log whose commits wait until the test opens ``gate`` (a slow disk, held)."""

    def __init__(self, log: LmdbLog) -> None:
        self.log = log
        self.gate = threading.Event()

    def __getattr__(self, name: str) -> object:
        return getattr(self.log, name)

    def commit(self, batches: Sequence[Batch]) -> CommitResult:
        assert self.gate.wait(10), "the test never opened the gate"
        return self.log.commit(batches)


async def test_the_appends_of_the_closing_round_follow_those_in_flight(tmp_path: Path) -> None:
    """When the Journal closes, what the writer thread holds commits first, then the
    appends of the closing round (held on the loop, not yet handed over); each is
    answered, and once closed nothing counts as in flight."""
    gated = _Gated(LmdbLog(tmp_path / "log"))
    last = _Append([result("s", "last")], None)  # appended in the round the Journal closes
    answered: list[list[Committed]] = []
    try:
        async with (
            trio.open_nursery() as nursery,
            open_journal(gated, commit_on_loop=False) as journal,  # type: ignore[arg-type]
        ):

            async def first() -> None:
                answered.append(await journal.append([result("s", "first")]))

            async def open_once_closing() -> None:
                while not journal._closed:
                    await trio.lowlevel.checkpoint()
                gated.gate.set()

            nursery.start_soon(first)
            while journal._in_flight == 0:  # handed to the writer, which waits at the gate
                await trio.lowlevel.checkpoint()
            nursery.start_soon(open_once_closing)
            journal._held.append(last)  # no schedule point until the block closes
        assert journal._in_flight == 0
        assert [c.record for c in answered[0]] == [result("s", "first")]
        assert last.result is not None and last.error is None
        assert [c.record.call_id for c in gated.log.read_session("s")] == ["first", "last"]
        assert [c.seq for c in last.result] == [answered[0][0].seq + 1]
    finally:
        gated.log.close()


async def test_a_journal_whose_round_hook_was_dropped_still_closes(tmp_path: Path) -> None:
    """trio drops an instrument that raised; the Journal's close removes its hook only if
    trio still holds it, and closes cleanly either way."""
    log = LmdbLog(tmp_path / "log")
    try:
        async with open_journal(log) as journal:
            await journal.append([result("s", "a")])
            trio.lowlevel.remove_instrument(journal._round_end)  # as trio would have
        assert [c.record for c in log.read_session("s")] == [result("s", "a")]
    finally:
        log.close()


async def test_records_are_published_on_the_bus_the_journal_was_given(tmp_path: Path) -> None:
    bus = EventBus()
    log = MemoryLog()
    sub = bus.subscribe("s")
    async with open_journal(log, bus) as journal:
        assert journal.bus is bus
        done = await journal.append([result("s", "a")])
    sub.close()
    assert [(e.kind, e.seq) async for e in sub] == [("ToolCompleted", done[0].seq)]
    log.close()


async def test_a_caller_cancelled_while_its_commit_runs_still_learns_it(tmp_path: Path) -> None:
    """Once handed over, the commit happens regardless: the caller's wait cannot be
    cancelled, so it hears the outcome (its seqs) and only then sees the cancellation."""
    watched = _Watched(LmdbLog(tmp_path / "log"), delay=0.05)
    got: list[list[Committed]] = []
    async with started(watched, commit_on_loop=False) as journal:
        with trio.CancelScope() as scope:
            scope.deadline = trio.current_time() + 0.01  # inside the 50 ms commit
            got.append(await journal.append([result("s", "a")]))
            await trio.sleep(1)  # the first cancel point after it: cancelled here
        assert scope.cancelled_caught
        assert [c.record for c in got[0]] == [result("s", "a")]
        assert [c.record for c in await journal.read_session("s")] == [result("s", "a")]


# -- publication ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_every_durable_record_is_published_once_in_commit_order(
    kind: str, tmp_path: Path
) -> None:
    async with journal_on(kind, tmp_path) as (journal, _log):
        mine, everyone = journal.bus.subscribe("s"), journal.bus.subscribe(None)
        outcomes: list[list[Committed]] = []

        async def one(sid: str, i: int) -> None:
            outcomes.append(await journal.append([result(sid, f"c{i}"), result(sid, f"d{i}")]))

        async with trio.open_nursery() as nursery:
            for i in range(6):
                nursery.start_soon(one, "s" if i % 2 else "t", i)
        await journal.append([revision()])
        with pytest.raises(StaleGoal):
            await journal.append([result("s", "refused")], guard=Guard("s", 0))
        mine.close()
        everyone.close()
        got_mine = [e async for e in mine]
        got_all = [e async for e in everyone]
        committed = await journal.read_global(after=1)
    assert [(e.session_id, e.kind, e.seq, e.record) for e in got_all] == [
        (c.record.session_id, type(c.record).__name__, c.seq, c.record) for c in committed
    ]
    assert [(e.seq, e.record) for e in got_mine] == [
        (c.seq, c.record) for c in committed if c.record.session_id == "s"
    ]
    assert len(got_mine) == 7  # three appends of two, the revision; not the refused one


# -- listeners and stats -------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_listeners_get_each_transactions_durable_records_and_its_time(
    kind: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    heard: list[tuple[list[Committed], float]] = []

    def failing(done: Sequence[Committed], took: float) -> None:
        raise RuntimeError("a broken exporter")

    async with journal_on(kind, tmp_path) as (journal, _log):
        journal.commit_listeners += [lambda done, took: heard.append((list(done), took)), failing]
        with caplog.at_level(logging.ERROR, logger="perdure.journal"):
            first = await journal.append([result("s", "a"), result("t", "b")])
            second = await journal.append([result("s", "c")])
            await journal.append([revision()])
        with pytest.raises(StaleGoal):
            await journal.append([result("s", "refused")], guard=Guard("s", 0))
    assert [done for done, _ in heard[:2]] == [first, second]
    assert all(took > 0 for _, took in heard)
    assert len(heard) == 3  # the refused append committed nothing: no transaction heard
    failures = [r for r in caplog.records if r.message == "a commit listener failed"]
    assert len(failures) == 3  # one line per failed call, and the log went on


async def test_listeners_hear_the_writer_threads_transactions_with_their_time(
    tmp_path: Path,
) -> None:
    """A transaction committed by the writer thread (not on the loop) reaches the
    listeners the same way, once delivered on the trio thread: its records and the
    seconds its commit took."""
    heard: list[tuple[list[Committed], float, int]] = []
    log = LmdbLog(tmp_path / "log")
    try:
        async with open_journal(log, commit_on_loop=False) as journal:
            journal.commit_listeners.append(
                lambda done, took: heard.append((list(done), took, threading.get_ident()))
            )
            first = await journal.append([result("s", "a")])
            second = await journal.append([result("t", "b"), result("t", "c")])
            assert journal.stats.loop_transactions == 0  # both were the writer thread's
    finally:
        log.close()
    assert [done for done, _, _ in heard] == [first, second]
    assert all(isinstance(took, float) and took > 0 for _, took, _ in heard)
    assert {thread for _, _, thread in heard} == {threading.get_ident()}


@pytest.mark.parametrize("kind", KINDS)
async def test_the_stats_count_appends_transactions_and_records(kind: str, tmp_path: Path) -> None:
    async with journal_on(kind, tmp_path) as (journal, _log):
        await journal.append([result("s", "a"), result("s", "b"), result("s", "c")])
        await journal.append([result("s", "d")])
        await journal.append([revision()])
        with pytest.raises(StaleGoal):
            await journal.append([result("s", "refused")], guard=Guard("s", 0))
        stats = journal.stats
        assert (stats.appends, stats.transactions, stats.records) == (3, 3, 5)
        assert stats.largest_transaction == 3


# -- fencing ---------------------------------------------------------------------------------


async def test_a_taken_over_log_fences_the_whole_journal() -> None:
    log = MemoryLog()
    async with open_journal(log) as journal:
        await journal.append([result("s", "before")])
        successor = log.reopen(takeover=True)
        with pytest.raises(LogFenced) as fenced:
            await journal.append([result("s", "after")])
        assert journal.fenced.is_set()
        assert journal.fence_error is fenced.value
        with pytest.raises(LogFenced) as again:  # refused at once, not tried again
            await journal.append([result("t", "other")])
        assert again.value is fenced.value
    assert [c.record for c in successor.read_session("s")] == [result("s", "before")]
    assert successor.read_session("t") == []
    successor.close()


class LostLease(MemoryLog):
    """A log on which this node lost the lease of session ``lost`` (as a PostgreSQL node
    does when another takes the session over): that session's batches are refused with
    ``SessionFenced``, the others commit."""

    lost = "gone"

    def commit(self, batches: Sequence[Batch]) -> CommitResult:
        kept = [b for b in batches if b[0][0].session_id != self.lost]
        done = iter(super().commit(kept) if kept else [])
        return [
            SessionFenced(self.lost, "its lease was taken")
            if b[0][0].session_id == self.lost
            else next(done)
            for b in batches
        ]


async def test_a_lost_lease_fences_only_its_session() -> None:
    log = LostLease()
    async with open_journal(log) as journal:
        with pytest.raises(SessionFenced):
            await journal.append([result("gone", "x")])
        assert not journal.fenced.is_set()
        assert journal.fence_error is None
        done = await journal.append([result("kept", "y")])
        assert done[0].record == result("kept", "y")
    log.close()


# -- reads ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_reads_of_many_sessions_map_each_to_its_records_or_its_error(
    kind: str, tmp_path: Path
) -> None:
    async with journal_on(kind, tmp_path) as (journal, log):
        a = await journal.append([result("a", "1"), result("a", "2")])
        b = await journal.append([result("b", "3")])
        real = log.read_session

        def read(sid: str, after: int = 0, limit: int | None = None) -> list[Committed]:
            if sid == "broken":
                raise LogError("a damaged record")
            return real(sid, after, limit)

        log.read_session = read  # type: ignore[method-assign]
        found = await journal.read_sessions(["a", "broken", "b", "none"])
        assert found["a"] == a and found["b"] == b and found["none"] == []
        assert isinstance(found["broken"], LogError)
        assert list(found) == ["a", "broken", "b", "none"]
        info = await journal.session_info("a")
        assert info is not None and info.records == 2
        assert {i.session_id: i.records for i in await journal.sessions()} == {"a": 2, "b": 1}
        assert await journal.active_sessions() == []  # no open submission in either
        assert await journal.run(lambda x, y: x + y, 2, 3) == 5


# -- where commits run ---------------------------------------------------------------------


async def test_an_idle_loop_commits_itself_even_with_a_timer_due_soon(tmp_path: Path) -> None:
    """Idle means nothing runnable: a timer 0.2 s away does not send the commit away."""
    log = LmdbLog(tmp_path / "log")
    try:
        async with (
            open_journal(log, loop_commit_budget=math.inf) as journal,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(trio.sleep, 0.2)
            await trio.testing.wait_all_tasks_blocked()  # the sleeper waits on its timer
            await journal.append([result("s", "a")])
            assert journal.stats.loop_transactions == 1
    finally:
        log.close()


async def test_the_loop_commits_while_the_mean_is_at_most_the_budget(tmp_path: Path) -> None:
    """With a budget of 0 only the first commit (nothing measured yet) runs on the loop."""
    log = LmdbLog(tmp_path / "log")
    try:
        async with open_journal(log, commit_on_loop=True, loop_commit_budget=0.0) as journal:
            for i in range(3):
                await journal.append([result("s", f"c{i}")])
            assert journal.stats.loop_transactions == 1
            assert journal.stats.transactions == 3
    finally:
        log.close()


async def test_the_writer_takes_everything_queued_in_one_transaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A slow disk (the writer waits before each transaction): appends queue up meanwhile.
    monkeypatch.setattr(_faults, "SLOW_COMMIT", 0.02)
    log = LmdbLog(tmp_path / "log")
    try:
        async with open_journal(log) as journal:
            batches = {i: [result(f"s{i}", "c")] for i in range(30)}
            outcomes = await append_all(journal, batches)
            assert journal.stats.loop_transactions == 0  # a slow disk: never the loop
            assert journal.stats.transactions <= 4, journal.stats
        assert all(outcomes[i][0].record == batches[i][0] for i in batches)
    finally:
        log.close()


async def test_the_loop_never_commits_while_any_handed_commit_is_pending(tmp_path: Path) -> None:
    """Two rounds handed to a slow writer, the first answered: the second is still the
    writer's, so the next idle round must hand over too (one write transaction at a
    time, in order)."""
    watched = _Watched(LmdbLog(tmp_path / "log"), delay=0.05)
    got: dict[str, list[Committed]] = {}
    # A budget below any commit: a and b go to the writer thread.
    async with started(watched, commit_on_loop=True, loop_commit_budget=-1.0) as journal:

        async def append(name: str, wait: float = 0.0) -> None:
            await trio.sleep(wait)
            got[name] = await journal.append([result("s", name)])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(append, "a")
            nursery.start_soon(append, "b", 0.01)  # while the writer is inside a's commit
            while "a" not in got:
                await trio.lowlevel.checkpoint()
            assert "b" not in got  # b is still the writer's
            journal.loop_commit_budget = math.inf  # the loop may commit again, but...
            await append("c")  # ...b's commit is not over: c is handed over too
        assert watched.overlaps == 0
        seqs = [got[name][0].seq for name in "abc"]
        assert seqs == sorted(seqs)
        assert journal.stats.loop_transactions == 0
        await append("d")  # nothing in the writer's hands any more: the idle loop's
        assert journal.stats.loop_transactions == 1


@pytest.mark.parametrize("kind", KINDS)
async def test_reads_start_at_the_first_record_by_default(kind: str, tmp_path: Path) -> None:
    async with journal_on(kind, tmp_path) as (journal, _log):
        await journal.append([result("s", "a")])
        everything = await journal.read_global()
        system = await journal.read_session("")  # records of no session: the log's own
    assert [(c.seq, type(c.record).__name__) for c in everything] == [
        (1, "LogOpened"),
        (2, "ToolCompleted"),
    ]
    assert [(c.seq, type(c.record).__name__) for c in system] == [(1, "LogOpened")]


class FailsOnce(_Watched):
    """The log's next commit fails as a damaged disk would; later ones succeed."""

    failing = True

    def commit(self, batches: object) -> object:
        if self.failing:
            self.failing = False
            raise LogError("an I/O error")
        return super().commit(batches)


async def test_a_failed_commit_does_not_keep_the_loop_from_committing(tmp_path: Path) -> None:
    """The failure is the callers' to hear; how long it took (not long) is what the loop's
    commit budget weighs, so the next idle commit runs on the loop again."""
    async with started(FailsOnce(LmdbLog(tmp_path / "log")), commit_on_loop=True) as journal:
        with pytest.raises(LogError, match="an I/O error"):
            await journal.append([result("s", "lost")])
        done = await journal.append([result("s", "kept")])
        assert journal.stats.loop_transactions == 2  # the failed one, and the one after it
        assert [c.record for c in await journal.read_session("s")] == [done[0].record]


@pytest.mark.parametrize("kind", KINDS)
async def test_following_a_session_on_a_single_node_log_is_harmless(
    kind: str, tmp_path: Path
) -> None:
    """``follow`` (an event stream's nudges from other nodes) registers and cleans up
    on any backend; a single-node log never nudges, and its records still arrive."""
    async with journal_on(kind, tmp_path) as (journal, _log):
        sub = journal.bus.subscribe("s")
        with journal.follow("s", sub), journal.follow("s", journal.bus.subscribe("s")):
            done = await journal.append([result("s", "a")])
        assert journal._followers == {}
        sub.close()
        assert [(e.kind, e.seq) async for e in sub] == [("ToolCompleted", done[0].seq)]


@pytest.mark.parametrize("kind", KINDS)
async def test_the_session_list_pages_and_filters_as_asked(kind: str, tmp_path: Path) -> None:
    """``Journal.sessions`` passes its page (after, limit) and its active filter to the log:
    every session in id order by default, a page after a given id, at most ``limit``, and
    only the sessions with an unfinished input when ``active``."""
    waiting = InputAccepted(
        session_id="b", submission_id="in1", request_id="r1", text="q", body_hash="h", at=1.0
    )
    async with journal_on(kind, tmp_path) as (journal, _log):
        await journal.append([result("0", "c1"), result("a", "c1"), waiting, result("c", "c1")])
        every = [i.session_id for i in await journal.sessions()]
        page = [i.session_id for i in await journal.sessions(after="a", limit=1)]
        rest = [i.session_id for i in await journal.sessions(after="a")]
        active = [i.session_id for i in await journal.sessions(active=True)]
    assert every == ["0", "a", "b", "c"]  # "0" sorts before any letter
    assert page == ["b"]
    assert rest == ["b", "c"]
    assert active == ["b"]


@pytest.mark.parametrize("kind", KINDS)
async def test_the_newest_sessions_page_back_by_creation_as_asked(
    kind: str, tmp_path: Path
) -> None:
    """``Journal.newest_sessions`` passes its page (before, limit) and its active filter
    to the log: every session newest first by default, only those created before a
    given seq, at most ``limit``, and only the sessions with an unfinished input when
    ``active``."""
    waiting = InputAccepted(
        session_id="mid", submission_id="in1", request_id="r1", text="q", body_hash="h", at=1.0
    )
    async with journal_on(kind, tmp_path) as (journal, _log):
        await journal.append([result("old", "c1")])
        (created,) = await journal.append([waiting])
        await journal.append([result("new", "c1")])
        await journal.append([result("old", "c2")])  # no newer for it: it was created first

        async def newest(**page: Any) -> list[str]:
            return [i.session_id for i in await journal.newest_sessions(**page)]

        every = await newest()
        first_two = await newest(limit=2)
        before_new = await newest(before=created.seq + 1)
        older = await newest(before=created.seq, limit=5)
        active = await newest(active=True)
    assert every == ["new", "mid", "old"]
    assert first_two == ["new", "mid"]
    assert before_new == ["mid", "old"]
    assert older == ["old"]
    assert active == ["mid"]


async def test_the_writer_is_a_named_daemon_thread(tmp_path: Path) -> None:
    """The writer thread is named ``perdure-journal`` (what a stack dump, py-spy or a
    log's ``threadName`` shows) and is a daemon: a process that exits without closing
    its runtime is not kept alive by it."""
    async with journal_on("lmdb", tmp_path) as (journal, _log):
        await journal.append([result("s", "a")])
        writers = [t for t in threading.enumerate() if t.name == "perdure-journal"]
        assert len(writers) == 1
        assert writers[0].daemon is True


@pytest.mark.parametrize("kind", KINDS)
async def test_a_closed_journal_leaves_no_instrument_on_the_loop(kind: str, tmp_path: Path) -> None:
    """The hook that ends each round of the trio loop (commit or hand over) is removed
    when the Journal closes: a closed Journal costs the loop nothing afterwards."""
    async with journal_on(kind, tmp_path) as (journal, _log):
        await journal.append([result("s", "a")])
        round_end = journal._round_end
    with pytest.raises(KeyError):  # trio's answer for an instrument it does not hold
        trio.lowlevel.remove_instrument(round_end)
