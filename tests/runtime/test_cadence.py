"""The supervisor's fixed cadence (lease heartbeat, claiming and shedding).

It is a plain object rather than an async generator: a generator abandoned by
cancellation and caught in a reference cycle is finalized by the garbage collector
after the run, and trio warns (that warning once failed CI). Time is trio's
``MockClock``.
"""

from __future__ import annotations

import trio
import trio.testing

from perdure.actors.supervisor import _Cadence


async def test_ticks_keep_a_fixed_cadence_and_a_late_tick_comes_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    start = trio.current_time()
    cadence = _Cadence(1.0)
    seen: list[float] = []
    for work in (0.0, 0.25, 2.5, 0.0, 0.0):
        await cadence.tick()
        seen.append(trio.current_time() - start)
        await trio.sleep(work)  # the work done between two ticks
    # 0.25 s of work does not push the next tick back; after 2.5 s of work (3.0 to
    # 5.5) the tick that fell behind comes at once, and only one: the next is a
    # period later.
    assert seen == [1.0, 2.0, 3.0, 5.5, 6.5]
