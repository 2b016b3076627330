"""The Journal's timing decisions, made with a clock and a state the test chooses.

The Journal decides by the clock in three places (the docstring of
``perdure.storage.journal`` says why each rule is what it is):

* at the end of a busy scheduling round, whether the loop commits its held appends
  itself now or keeps them: a lone append once ``BUSY_COMMIT_SPACING`` mean commit
  waits have passed since the last commit ended, several once the oldest of them has
  waited ``BUSY_GROUP_WAIT`` mean commit waits;
* at the end of a busy round, whether the loop lets worker threads take the GIL:
  only while work of its threads is pending (a commit handed over, a call under
  way), never at the end of a round after which the loop sleeps anyway; and if the
  end of a round fails, its appends go to the writer thread, counted as in flight;
* on the writer thread, when the pages of a mapped log are released: after a whole
  ``RELEASE_QUIET`` with no commit (here or on the loop), and at least every
  ``RELEASE_EVERY`` while commits go on; never when nothing was committed since the
  last release.

Measuring these on a real clock would measure the machine; the tests here call the
deciding code with a chosen clock (the module's ``time``) and state and check what
it chose. Every value is exact in binary, so the boundaries are tested exactly.
"""

from __future__ import annotations

import math
import queue
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from perdure import _threads
from perdure.storage import journal as journal_module
from perdure.storage.journal import (
    _STOP,
    BUSY_COMMIT_SPACING,
    BUSY_GROUP_WAIT,
    RELEASE_EVERY,
    RELEASE_QUIET,
    Journal,
    _Append,
    open_journal,
)
from perdure.storage.lmdb_log import LmdbLog
from perdure.storage.memory_log import MemoryLog
from perdure.storage.records import ToolCompleted
from tests.storage.test_journal import busy_loop

NOW = 1024.0
MEAN = 0.25  # seconds: the mean commit wait the Journal has measured
SPACING = BUSY_COMMIT_SPACING * MEAN
GROUP_WAIT = BUSY_GROUP_WAIT * MEAN


class _Clock:
    """The Journal module's ``time``, with ``perf_counter`` and ``monotonic`` at ``now``."""

    def __init__(self, now: float) -> None:
        self.now = now

    def perf_counter(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    chosen = _Clock(NOW)
    monkeypatch.setattr(journal_module, "time", chosen)
    return chosen


def request(sid: str) -> _Append:
    return _Append([ToolCompleted(session_id=sid, call_id="c", output="ok", at=1.0)], None)


# -- the end of a busy round ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("held", "oldest_waited", "since_last_commit", "commits"),
    [
        (1, 0.0, SPACING, True),  # a lone append once the spacing has passed
        (1, 0.0, SPACING - MEAN, False),  # not before
        (1, GROUP_WAIT, 0.0, False),  # its own wait is not what counts for it
        (2, GROUP_WAIT, 0.0, True),  # several once the oldest waited the group wait
        (2, GROUP_WAIT - MEAN, 100 * SPACING, False),  # not before, whenever the last commit
        (3, GROUP_WAIT, 0.0, True),
        (3, GROUP_WAIT - MEAN, 100 * SPACING, False),
    ],
)
def test_a_busy_round_commits_on_the_loop_in_units_of_the_mean_commit_wait(
    clock: _Clock, held: int, oldest_waited: float, since_last_commit: float, commits: bool
) -> None:
    journal = Journal(MemoryLog(), commit_on_loop=True, loop_commit_budget=math.inf)
    journal._commit_seconds = MEAN
    journal._last_commit_end = NOW - since_last_commit
    journal._held_since = NOW - oldest_waited
    requests = [request(f"s{i}") for i in range(held)]
    journal._held = list(requests)

    journal._end_round(0.0)  # a busy round: work is still runnable

    assert journal._queue.empty() and journal._in_flight == 0  # never the writer's
    if commits:
        assert journal._held == [] and journal.stats.loop_transactions == 1
        assert all(r.result is not None for r in requests)
    else:  # kept for a later round
        assert journal._held == requests and journal.stats.transactions == 0
        assert all(r.result is None for r in requests)


def test_before_any_commit_a_busy_rounds_lone_append_commits_at_once(clock: _Clock) -> None:
    """No commit has ended yet, whatever the origin of ``perf_counter`` (Python leaves
    it undefined: here it reads a quarter of a second): nothing to space a lone append
    from, so a busy round commits it."""
    clock.now = 0.25
    journal = Journal(MemoryLog(), commit_on_loop=True)  # fresh: no commit measured yet
    journal._held_since = clock.now
    requests = [request("s")]
    journal._held = list(requests)

    journal._end_round(0.0)

    assert journal._held == [] and requests[0].result is not None
    assert journal.stats.loop_transactions == 1


@pytest.mark.parametrize("timeout", [0.125, 0.5, 1.0, 2.0])
def test_a_round_after_which_the_loop_would_sleep_commits_at_once_and_wakes_it(
    clock: _Clock, timeout: float
) -> None:
    """An idle loop commits whatever it holds, however recent the last commit, and then
    wakes itself: it already chose to sleep ``timeout`` seconds, and the callers it
    just answered must not wait for that."""
    journal = Journal(MemoryLog(), commit_on_loop=True, loop_commit_budget=math.inf)
    token = journal._token = _Token()  # type: ignore[assignment]
    journal._commit_seconds = MEAN
    journal._last_commit_end = journal._held_since = NOW  # a commit just ended
    requests = [request("s")]
    journal._held = list(requests)

    journal._end_round(timeout)

    assert journal._held == [] and journal.stats.loop_transactions == 1
    assert requests[0].result is not None
    assert token.soon == [journal_module._nothing]  # the loop's wake-up
    assert journal._queue.empty() and journal._in_flight == 0


async def test_the_group_wait_counts_from_the_oldest_held_append(
    clock: _Clock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a busy loop, several held appends commit once the OLDEST has waited
    ``BUSY_GROUP_WAIT`` mean commit waits: an append joining the group later does
    not restart the wait."""
    monkeypatch.setattr(journal_module, "BUSY_COMMIT_SPACING", math.inf)  # a lone one waits
    log = LmdbLog(tmp_path / "log")
    try:
        async with open_journal(log, loop_commit_budget=math.inf) as journal:
            journal._commit_seconds = MEAN
            answered: list[str] = []

            async def append(sid: str) -> None:
                await journal.append([request(sid).records[0]])
                answered.append(sid)

            async def rounds() -> None:
                for _ in range(20):
                    await trio.lowlevel.checkpoint()

            async with trio.open_nursery() as nursery, busy_loop():
                nursery.start_soon(append, "oldest")
                await rounds()
                clock.now = NOW + GROUP_WAIT - MEAN
                nursery.start_soon(append, "later")
                await rounds()
                assert answered == [] and len(journal._held) == 2  # kept on the loop
                clock.now = NOW + GROUP_WAIT  # the oldest has waited the group wait
                await rounds()
                assert sorted(answered) == ["later", "oldest"]  # while the loop is busy
                assert journal.stats.loop_transactions == journal.stats.transactions == 1
    finally:
        log.close()


def test_the_loop_commits_while_the_weighted_mean_of_recent_waits_is_within_budget(
    clock: _Clock,
) -> None:
    """The budget is held against an exponentially weighted mean of the commits' waits
    (each commit moves it a fifth of the way to its own wait): one slow commit among
    quick ones leaves the loop committing, slow ones in a row send commits to the
    writer thread."""
    journal = Journal(MemoryLog(), commit_on_loop=True, loop_commit_budget=0.1)
    token = journal._token = _Token()  # type: ignore[assignment]

    journal._deliver([], [], 0.4, 0.4)  # a slow commit (the writer thread's)
    assert journal._commit_seconds == pytest.approx(0.08)
    quick = request("s")
    journal._held = [quick]
    journal._end_round(0.5)  # within the budget: the idle loop commits it itself
    assert quick.result is not None and journal.stats.loop_transactions == 1
    assert journal._commit_seconds == pytest.approx(0.064)  # its wait was none

    journal._deliver([], [], 0.4, 0.4)
    journal._deliver([], [], 0.4, 0.4)
    assert journal._commit_seconds == pytest.approx(0.18496)
    handed = request("s")
    journal._held = [handed]
    journal._end_round(0.5)  # over the budget: the writer thread's
    assert journal._queue.get_nowait() is handed and journal._in_flight == 1
    assert journal.stats.loop_transactions == 1 and token.soon == [journal_module._nothing]


# -- letting worker threads in -------------------------------------------------------------


@pytest.mark.parametrize(
    ("timeout", "in_flight", "under_way", "lets_in"),
    [
        (0.0, 1, 0, True),  # busy, a commit in the writer thread's hands
        (0.0, 0, 1, True),  # busy, a worker-thread call under way
        (0.0, 0, 0, False),  # busy, but no thread of ours waits
        (0.5, 1, 1, False),  # the loop is about to sleep: the threads get the GIL anyway
    ],
)
def test_a_busy_round_lets_the_journals_threads_in_only_while_they_have_work(
    timeout: float, in_flight: int, under_way: int, lets_in: bool
) -> None:
    journal = Journal(MemoryLog())
    tally = journal._thread_calls = _threads._Calls()
    tally.yielded_at = -math.inf  # no yield lately
    tally.under_way = under_way
    journal._in_flight = in_flight

    journal._round_end.before_io_wait(timeout)

    assert tally.yields == (1 if lets_in else 0)


def test_a_failing_round_end_hands_its_appends_over_counted_in_flight(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """While any commit handed to the writer thread is undelivered the loop commits
    nothing itself: the appends a failed end of round hands over add to those already
    in flight."""
    journal = Journal(MemoryLog(), commit_on_loop=True)
    journal._thread_calls = _threads._Calls()
    journal._in_flight = 1  # handed over in an earlier round, not delivered yet
    held = [request("a"), request("b")]
    journal._held = list(held)

    def broken(timeout: float) -> None:
        raise RuntimeError("a bug in the round's end")

    monkeypatch.setattr(journal, "_end_round", broken)
    journal._round_end.before_io_wait(0.5)

    assert journal._in_flight == 3
    assert [journal._queue.get_nowait(), journal._queue.get_nowait()] == held
    assert journal._queue.empty() and journal._held == []
    assert journal.commit_on_loop is False
    assert "the journal's end of round failed" in caplog.text


# -- the writer's release of mapped pages --------------------------------------------------


class _Mapped(MemoryLog):
    """An in-memory log with mapped pages to release: notes the clock at each release."""

    def __init__(self, clock: _Clock) -> None:
        super().__init__()
        self.clock = clock
        self.released_at: list[float] = []

    def release_mapped_pages(self) -> int:
        self.released_at.append(self.clock.now)
        return 4096


class _Script:
    """The writer's queue, played from a script of steps ``(at, transactions, item)``:
    each ``get`` sets the clock to ``at`` and the Journal's transaction count to
    ``transactions`` (commits meanwhile, on the loop or the writer), then returns
    ``item`` or, for None, times out. Notes each timeout the writer asked for."""

    def __init__(self, journal: Journal, clock: _Clock, steps: list[tuple[float, int, Any]]):
        self.journal = journal
        self.clock = clock
        self.steps = steps
        self.timeouts: list[float | None] = []

    def get(self, timeout: float | None = None) -> Any:
        self.timeouts.append(timeout)
        at, transactions, item = self.steps.pop(0)
        self.clock.now = at
        self.journal.stats.transactions = transactions
        if item is None:
            raise queue.Empty
        return item

    def get_nowait(self) -> Any:
        raise queue.Empty


class _Token:
    """Stands for the trio token: notes what the writer hands back to the loop."""

    def __init__(self) -> None:
        self.soon: list[Callable[..., Any]] = []

    def run_sync_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        self.soon.append(fn)


def run_writer(journal: Journal, clock: _Clock, steps: list[tuple[float, int, Any]]) -> _Script:
    """Run the writer's loop on this thread over ``steps`` (the last one: ``_STOP``)."""
    script = _Script(journal, clock, steps)
    journal._queue = script  # type: ignore[assignment]
    token = journal._token = _Token()  # type: ignore[assignment]
    journal._writer()
    assert script.steps == []
    assert token.soon[-1] == journal._stopped.set  # it stopped where the script ended
    return script


def test_the_writer_releases_a_mapped_log_once_quiet_and_at_least_every_few_seconds(
    clock: _Clock,
) -> None:
    log = _Mapped(clock)
    journal = Journal(log)
    start = NOW  # when the writer began: its last release, as far as it knows
    steps = [
        (start + 1.0, 0, None),  # a quiet wait, but nothing was ever committed
        (start + 1.5, 1, None),  # a commit (on the loop) during this wait: not quiet
        (start + 2.5, 1, None),  # a whole wait without one: release
        (start + 3.5, 1, None),  # quiet again, but nothing committed since the release
        (start + 4.0, 2, None),  # commits go on...
        (start + 4.5, 2, request("s")),  # ...a batch arrives: a busy log, not a quiet one
        (start + 6.0, 3, None),
        (start + 8.0, 4, None),
        (start + 12.0, 5, None),  # 9.5 s since the release
        (start + 12.5, 6, None),  # RELEASE_EVERY since it: release though not quiet
        (start + 13.0, 7, None),
        (start + 14.0, 7, None),  # quiet: release
        (start + 15.0, 7, _STOP),
    ]
    script = run_writer(journal, clock, steps)
    assert RELEASE_EVERY == 10.0  # the script's times assume it
    assert log.released_at == [start + 2.5, start + 12.5, start + 14.0]
    assert set(script.timeouts) == {RELEASE_QUIET}
    assert [c.record.session_id for c in log.read_session("s")] == ["s"]  # the batch


def test_the_writer_of_a_log_without_mapped_pages_waits_without_a_timeout(
    clock: _Clock,
) -> None:
    log = MemoryLog()
    journal = Journal(log)
    steps = [
        (NOW + RELEASE_EVERY + 1, 1, request("s")),  # long after the start, commits meanwhile
        (NOW + RELEASE_EVERY + 2, 2, _STOP),
    ]
    script = run_writer(journal, clock, steps)
    assert script.timeouts == [None, None]
    assert [c.record.session_id for c in log.read_session("s")] == ["s"]
