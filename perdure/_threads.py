"""perdure's worker-thread calls, and the moments a busy trio loop lets them run.

A thread that needs the GIL while the trio thread is busy may wait until the loop goes
idle. CPython hands the GIL to a waiting thread only when the holder has kept it for a
whole switch interval (5 ms): a busy trio thread lets go of it at every system call
(each scheduling round polls for I/O) and takes it straight back, before the waiting
thread has woken up, and each release starts the waiter's interval over. Measured: a
loop kept busy by CPU-bound work left a session's log read waiting 4 s.

So perdure's own calls into worker threads go through ``run_sync``, which counts those
under way in this trio run, and at the end of a busy scheduling round the Journal's instrument calls
``let_in``: while any call is under way, the loop sleeps ``YIELD`` seconds (which
releases the GIL for that long) at most once per ``YIELD_EVERY``, so that a waiting
thread takes its turn and a busy loop gives up at most a tenth of its time to it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final, TypeVar

import trio

T = TypeVar("T")

YIELD: Final = 100e-6  # seconds the busy loop lets go of the GIL for
YIELD_EVERY: Final = 1e-3  # and at most this often


class _Calls:
    """One trio run's: its worker-thread calls under way, and its last yield."""

    __slots__ = ("under_way", "yielded_at", "yields")

    def __init__(self) -> None:
        self.under_way = 0
        self.yielded_at = 0.0
        self.yields = 0  # how often the loop let go of the GIL for them (diagnostics)


_CALLS: trio.lowlevel.RunVar[_Calls] = trio.lowlevel.RunVar("perdure_thread_calls")


def calls() -> _Calls:
    """This trio run's tally (made on first use)."""
    try:
        return _CALLS.get()
    except LookupError:
        tally = _Calls()
        _CALLS.set(tally)
        return tally


async def run_sync(
    fn: Callable[..., T], *args: object, limiter: trio.CapacityLimiter | None = None
) -> T:
    """``trio.to_thread.run_sync(fn, *args)``, counted while it is under way."""
    tally = calls()
    tally.under_way += 1
    try:
        return await trio.to_thread.run_sync(fn, *args, limiter=limiter)
    finally:
        tally.under_way -= 1


def let_in(tally: _Calls) -> None:
    """From a busy loop (the end of a scheduling round, on the trio thread): let go of
    the GIL for a moment, unless that happened less than ``YIELD_EVERY`` ago."""
    if time.perf_counter() - tally.yielded_at >= YIELD_EVERY:
        time.sleep(YIELD)  # the GIL is free meanwhile: the one blocking call here, bounded
        tally.yielded_at = time.perf_counter()
        tally.yields += 1
