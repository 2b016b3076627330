"""Settings of CPython's cyclic garbage collector for a long-running agent process.

A process that keeps many sessions live holds many long-lived objects (their folded
states, their actors), and CPython's collector keeps walking them: with its default
settings a young collection runs every 700 new container objects, and every tenth of
those scans the middle generation, so at a thousand busy sessions a third of the CPU
went to the collector (``bench/run.py``, concurrency). ``tune_gc`` is what a daemon
does about it. perdure never calls it by itself: the collector's settings belong to
the whole process, and a library must not change them behind the application's back;
``perdure serve``, which owns its process, calls it once recovery is done.
"""

from __future__ import annotations

import gc
from typing import Final

# Why 50,000 (bench/README.md, "Levers tried"): a young collection walks every young
# object still alive, and at a thousand busy sessions that is mostly their in-flight
# work (actor coroutines, new states), ~60,000 objects whatever the threshold; so the
# higher the threshold, the fewer walks of that same set. 20,000 -> 50,000 halved the
# collector's share at 1,000 x 30 turns (12.5 % -> 6.2 %) and doubled its longest
# pause (185 -> 357 ms, a middle-generation pass); at 100 sessions both are small.
YOUNG_THRESHOLD: Final = 50_000


def tune_gc(young: int = YOUNG_THRESHOLD, *, freeze: bool = True) -> None:
    """Tune the collector of this process for a long-lived runtime.

    * The youngest generation is collected every ``young`` new container objects
      instead of 700 (the older generations keep their ratios): cyclic garbage waits
      a little longer, while the long-lived states are walked far less often.
    * With ``freeze``, one full collection, then ``gc.freeze()``: everything alive now
      (modules, registries, the sessions recovered so far) is left out of every later
      collection. Call it again after a bulk load. Frozen objects are still freed by
      reference counting; only a cycle among them would stay until ``gc.unfreeze()``.
    """
    if not young >= 1:
        raise ValueError(f"young must be a positive number of objects, not {young!r}")
    if freeze:
        gc.collect()
        gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(young, middle, oldest)
