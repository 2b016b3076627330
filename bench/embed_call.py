"""The cost of one call through ``perdure.embed`` (asyncio) against the same call on trio.

    python bench/embed_call.py WORKDIR CALLS

Opens a runtime on a fresh LMDB log three ways: ``perdure.open_runtime`` under
``trio.run`` (the baseline), and ``perdure.embed.open_runtime`` under
``asyncio.run`` with trio in its own thread and as a guest of the asyncio loop.
Each makes CALLS sequential calls of two kinds: ``state`` (a query answered by the
session's actor: no disk, so the hop between the loops is most of it) and
``session_info`` (a read of the log in the Journal's worker thread). Prints one
JSON line: the median microseconds per call, in trials of 100 calls, per way and kind.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import perdure  # noqa: E402
import perdure.embed  # noqa: E402
from perdure.providers.scripted import ScriptedProvider  # noqa: E402

BATCH = 100


def _session_id(state: Any) -> str:
    # The cheapest read of the read model (a ``SessionLookup``): the call is measured.
    return str(state.session_id)


async def _measure(
    now: Callable[[], float], call: Callable[[], Awaitable[Any]], calls: int
) -> float:
    per_call = []
    for _ in range(max(1, calls // BATCH)):
        started = now()
        for _ in range(BATCH):
            await call()
        per_call.append((now() - started) / BATCH * 1e6)
    return statistics.median(per_call)


async def on_trio(log: Path, calls: int) -> dict[str, float]:
    async with perdure.open_runtime(log, provider=ScriptedProvider([])) as rt:
        sid = await rt.create_session("s1")
        return {
            "state": await _measure(time.perf_counter, lambda: rt.state(sid, _session_id), calls),
            "session_info": await _measure(time.perf_counter, lambda: rt.session_info(sid), calls),
        }


async def on_asyncio(log: Path, calls: int, mode: perdure.embed.Mode) -> dict[str, float]:
    async with perdure.embed.open_runtime(log, mode=mode, provider=ScriptedProvider([])) as rt:
        sid = await rt.create_session("s1")
        return {
            "state": await _measure(time.perf_counter, lambda: rt.state(sid, _session_id), calls),
            "session_info": await _measure(time.perf_counter, lambda: rt.session_info(sid), calls),
        }


def main(workdir: Path, calls: int) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"calls": calls}
    out["trio_us"] = trio.run(on_trio, workdir / "trio", calls)
    out["thread_us"] = asyncio.run(on_asyncio(workdir / "thread", calls, "thread"))
    out["guest_us"] = asyncio.run(on_asyncio(workdir / "guest", calls, "guest"))
    for mode in ("thread", "guest"):
        out[f"{mode}_ratio"] = {
            kind: out[f"{mode}_us"][kind] / out["trio_us"][kind] for kind in out["trio_us"]
        }
    return out


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), int(sys.argv[2]))))
