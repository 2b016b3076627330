"""``bench_scale.py active`` with every stage of a 1-s model turn stamped.

    python bench/latency_probe.py OUT.json LOG ACTIVE WAVES TURNS FIRST [spread]
    PROBE_YOUNG=10000 python bench/latency_probe.py ...   # a lever, set from outside

Runs ``bench_scale.py active`` in this process after wrapping, from outside, the
places a turn passes through between a model call's reply and the session's next
call, each stamping ``perf_counter`` per session:

``reply``          the model's reply leaves ``SlowProvider.complete``
``append_reply``   ``Journal.append`` called with the reply's records (the decision is made)
``commit_reply``   that append's transaction begins / ends (which thread; how many
                   appends it holds)
``woken_reply``    the append returns to the session (the commit is durable)
``tool``           the tool actor (``run_tool``) starts / ends
``append_result``  ``Journal.append`` called with the tool's result
``call``           the session's next model call starts (the end of the gap)

and, process-wide: every pass of the cyclic collector (``gc.callbacks``: start, wall
and CPU time, generation), every trio task step longer than 2 ms with its CPU time
(a step that took longer than its CPU was not running: another process had the core,
or another thread the GIL), the trio thread's run-queue wait (``/proc``), the
freezes of hibernated states, the group reads of starting sessions, and every
commit (on the loop or the writer thread, its size). OUT.json holds p50/p90/p99 of
each stage, and for the slowest 1 % of gaps the median of each stage and the
collector's passes and long steps that overlapped them.

The levers measured against the code as it is (environment variables, none set: the
code as it is): ``PROBE_GROUP_WAIT`` / ``PROBE_SPACING`` (the Journal's busy-loop
rules, in mean commit waits), ``PROBE_YOUNG`` (``tune_gc``'s young threshold),
``PROBE_MIDDLE`` (the collector's middle-generation threshold after ``tune_gc``),
``PROBE_BUSY_TO_WRITER=1`` (a busy round hands its appends to the writer thread),
``PROBE_SWITCH`` (``sys.setswitchinterval``), ``PROBE_READ_THREADS`` (the local log's
read threads). A benchmark's instrument, kept out of the product.
"""

from __future__ import annotations

import gc
import json
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import bench_scale, workload  # noqa: E402
from perdure.actors import effects  # noqa: E402
from perdure.actors.supervisor import memory  # noqa: E402
from perdure.storage.journal import Journal  # noqa: E402
from perdure.storage.records import GenerationCompleted, ToolCompleted  # noqa: E402

now = time.perf_counter
# session id -> [(time, stage, extra)]
stamps: dict[str, list[tuple[float, str, Any]]] = defaultdict(list)
gc_passes: list[tuple[float, float, int]] = []  # (start, seconds, generation)
gc_cpu: list[float] = []  # each pass's CPU seconds (its wall time less any preemption)
long_steps: list[tuple[float, float, str]] = []  # (start, seconds, task name)
long_steps_cpu: dict[str, float] = defaultdict(float)  # task name -> CPU seconds of its long steps
freezes: list[tuple[float, float]] = []
group_reads: list[tuple[float, float, int]] = []
commits: list[tuple[float, float, bool, int, int]] = []  # start, s, on loop, appends, records
_gc_began = [0.0, 0.0]
_gc_total = [0.0]  # seconds of every pass so far (taken out of the long task steps)


def _kind(records: Any) -> str | None:
    for r in records:
        if isinstance(r, GenerationCompleted):
            return "reply"
        if isinstance(r, ToolCompleted):
            return "result"
    return None


def install(provider_box: list[Any]) -> None:
    append = Journal.append

    async def stamped_append(self: Journal, records: Any, **kw: Any) -> Any:
        kind = _kind(records)
        sid = records[0].session_id if records else ""
        if kind:
            stamps[sid].append((now(), "append_" + kind, None))
        out = await append(self, records, **kw)
        if kind:
            stamps[sid].append((now(), "woken_" + kind, None))
        return out

    Journal.append = stamped_append  # type: ignore[method-assign]

    commit = Journal._commit

    def stamped_commit(self: Journal, requests: list[Any]) -> Any:
        began = now()
        out = commit(self, requests)
        ended = now()
        on_loop = threading.current_thread() is threading.main_thread()
        size = sum(len(r.records) for r in requests)
        commits.append((began, ended - began, on_loop, len(requests), size))
        for r in requests:
            kind = _kind(r.records)
            if kind:
                sid = r.records[0].session_id
                info = (on_loop, len(requests), size)
                stamps[sid].append((began, "commit_start_" + kind, info))
                stamps[sid].append((ended, "commit_end_" + kind, info))
        return out

    Journal._commit = stamped_commit  # type: ignore[method-assign]

    run_tool = effects.run_tool

    async def stamped_run_tool(ctx: Any, tool: Any, executing: Any, *args: Any) -> None:
        stamps[executing.session_id].append((now(), "tool_start", None))
        try:
            await run_tool(ctx, tool, executing, *args)
        finally:
            stamps[executing.session_id].append((now(), "tool_end", None))

    effects.run_tool = stamped_run_tool  # type: ignore[assignment]

    freeze = memory.dormant.freeze

    def timed_freeze(*args: Any) -> Any:
        began = now()
        try:
            return freeze(*args)
        finally:
            freezes.append((began, now() - began))

    memory.dormant.freeze = timed_freeze  # type: ignore[assignment]

    read = Journal.session_with_records

    async def timed_read(self: Journal, session_id: str) -> Any:
        began = now()
        out = await read(self, session_id)
        group_reads.append((began, now() - began, 1))
        return out

    Journal.session_with_records = timed_read  # type: ignore[method-assign]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            _gc_began[0], _gc_began[1] = now(), time.thread_time()
        else:
            gc_passes.append((_gc_began[0], now() - _gc_began[0], info["generation"]))
            gc_cpu.append(time.thread_time() - _gc_began[1])
            _gc_total[0] += gc_passes[-1][1]

    gc.callbacks.append(on_gc)

    class Provider(bench_scale.SlowProvider):
        def __init__(self, *args: Any, **kw: Any) -> None:
            super().__init__(*args, **kw)
            provider_box.append(self)

        async def complete(self, request: Any, emit: Any) -> Any:
            stamps[request.session_id].append((now(), "call", None))
            reply = await super().complete(request, emit)
            if reply.tool_calls:
                stamps[request.session_id].append((self.replied[request.session_id], "reply", None))
            return reply

    bench_scale.SlowProvider = Provider  # type: ignore[misc]


class LongSteps(trio.abc.Instrument):
    def __init__(self) -> None:
        self.began = 0.0
        self.cpu = 0.0
        self.gc_before = 0.0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.began = now()
        self.cpu = time.thread_time()
        self.gc_before = _gc_total[0]

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        took = now() - self.began - (_gc_total[0] - self.gc_before)  # the collector's apart
        if took > 0.002:
            long_steps.append((self.began, took, task.name))
            # Less than its wall time: the process was not running (another process had
            # the core), or a thread had the GIL.
            long_steps_cpu[task.name[-70:]] += time.thread_time() - self.cpu


def _pct(values: list[float], q: float) -> float | None:
    return round(workload.quantile(values, q) * 1e3, 2) if values else None


def analyse() -> dict[str, Any]:
    parts: dict[str, list[float]] = defaultdict(list)
    gaps: list[tuple[float, float, str]] = []
    per_gap: dict[tuple[float, float, str], dict[str, list[float]]] = {}
    for sid, seq in stamps.items():
        seq.sort(key=lambda s: s[0])
        turn: dict[str, tuple[float, Any]] | None = None
        for t, stage, info in seq:
            if stage == "reply":
                turn = {"reply": (t, None)}
                continue
            if turn is None:
                continue
            turn.setdefault(stage, (t, info))
            if stage == "call":
                gaps.append((turn["reply"][0], t, sid))
                mine: dict[str, list[float]] = defaultdict(list)
                _parts(turn, mine, seq)
                per_gap[(turn["reply"][0], t, sid)] = mine
                for k, v in mine.items():
                    parts[k].extend(v)
                turn = None
    gap_ms = [b - a for a, b, _ in gaps]
    # The collector's passes and the long task steps that fell inside gaps.
    in_gap_gc: list[float] = []
    for a, b, _ in gaps:
        in_gap_gc.append(sum(d for s, d, _ in gc_passes if s < b and s + d > a))
    by_gen: dict[int, list[float]] = defaultdict(list)
    for _, d, g in gc_passes:
        by_gen[g].append(d)
    step_names: dict[str, list[float]] = defaultdict(list)
    for _, d, name in long_steps:
        step_names[name[-70:] if name else "?"].append(d)
    # The slowest gaps (above p99): what else held the loop meanwhile.
    slow = sorted(gaps, key=lambda g: g[0] - g[1])[: max(1, len(gaps) // 100)]
    slow_gc = [sum(d for s, d, _ in gc_passes if s < b and s + d > a) for a, b, _ in slow]
    slow_steps = [sum(d for s, d, _ in long_steps if s < b and s + d > a) for a, b, _ in slow]
    slow_share = {
        "n": len(slow),
        "gap_ms_p50": _pct([b - a for a, b, _ in slow], 0.5),
        "gc_ms_p50": _pct(slow_gc, 0.5),
        "long_steps_ms_p50": _pct(slow_steps, 0.5),
        "with_gc": sum(1 for x in slow_gc if x > 0),
        "stages_ms_p50": {
            k: _pct([per_gap[g][k][0] for g in slow if per_gap[g].get(k)], 0.5) for k in parts
        },
    }
    loop_commits = [c for c in commits if c[2]]
    thread_commits = [c for c in commits if not c[2]]
    return {
        "turn_gaps": len(gaps),
        "gap_ms": {"p50": _pct(gap_ms, 0.5), "p99": _pct(gap_ms, 0.99)},
        "stages_ms": {
            k: {"p50": _pct(v, 0.5), "p90": _pct(v, 0.9), "p99": _pct(v, 0.99), "n": len(v)}
            for k, v in parts.items()
        },
        "slowest_1pct": slow_share,
        "gc_cpu_ms_max": _pct(gc_cpu, 1.0),
        "gc_in_gap_ms": {"p50": _pct(in_gap_gc, 0.5), "p99": _pct(in_gap_gc, 0.99)},
        "gc_passes": {
            str(g): {
                "n": len(v),
                "p50": _pct(v, 0.5),
                "max": _pct(v, 1.0),
                "sum_ms": round(sum(v) * 1e3, 1),
            }
            for g, v in sorted(by_gen.items())
        },
        "long_steps": {
            name: {
                "n": len(v),
                "max": _pct(v, 1.0),
                "sum_ms": round(sum(v) * 1e3, 1),
                "cpu_ms": round(long_steps_cpu[name] * 1e3, 1),
            }
            for name, v in sorted(step_names.items(), key=lambda kv: -sum(kv[1]))[:12]
        },
        "commits": {
            "on_loop": len(loop_commits),
            "writer": len(thread_commits),
            "loop_ms_p50": _pct([c[1] for c in loop_commits], 0.5),
            "loop_ms_p99": _pct([c[1] for c in loop_commits], 0.99),
            "writer_ms_p50": _pct([c[1] for c in thread_commits], 0.5),
            "writer_ms_p99": _pct([c[1] for c in thread_commits], 0.99),
            "appends_p50": _pct([c[3] / 1e3 for c in commits], 0.5),
        },
        "freezes": {
            "n": len(freezes),
            "max": _pct([d for _, d in freezes], 1.0),
            "sum_ms": round(sum(d for _, d in freezes) * 1e3, 1),
        },
        "starts_read_ms": {
            "p50": _pct([d for _, d, _ in group_reads], 0.5),
            "p99": _pct([d for _, d, _ in group_reads], 0.99),
        },
    }


def _parts(turn: dict[str, tuple[float, Any]], parts: dict[str, list[float]], seq: Any) -> None:
    order = [
        ("reply", "append_reply", "reply -> append (decide)"),
        ("append_reply", "commit_start_reply", "append -> commit start (held)"),
        ("commit_start_reply", "commit_end_reply", "reply commit"),
        ("commit_end_reply", "woken_reply", "commit end -> session woken"),
        ("woken_reply", "tool_start", "woken -> tool start"),
        ("tool_start", "tool_end", "tool"),
        ("tool_end", "append_result", "tool end -> result append"),
        ("append_result", "call", "result append -> next call"),
    ]
    for a, b, name in order:
        if a in turn and b in turn:
            parts[name].append(turn[b][0] - turn[a][0])
    info = turn.get("commit_start_reply")
    if info is not None:
        on_loop, appends, _ = info[1]
        parts["reply commit on loop (1) / writer (0)"].append(1e-3 if on_loop else 0.0)
        parts["reply commit: appends in its transaction"].append(appends * 1e-3)


def levers() -> dict[str, str]:
    """Variants to measure against the code as it is, set from outside by environment
    variables (none set: the code as it is)."""
    import os

    import perdure
    from perdure.storage import journal as journal_module

    chosen = {k: v for k, v in os.environ.items() if k.startswith("PROBE_")}
    if "PROBE_GROUP_WAIT" in chosen:
        journal_module.BUSY_GROUP_WAIT = float(chosen["PROBE_GROUP_WAIT"])  # type: ignore[misc]
    if "PROBE_SPACING" in chosen:
        journal_module.BUSY_COMMIT_SPACING = float(chosen["PROBE_SPACING"])  # type: ignore[misc]
    if "PROBE_YOUNG" in chosen:
        tune_gc, young = perdure.tune_gc, int(chosen["PROBE_YOUNG"])
        perdure.tune_gc = lambda: tune_gc(young)  # type: ignore[assignment]
    if "PROBE_MIDDLE" in chosen:
        # After tune_gc (which keeps the middle and oldest thresholds as they are).
        tune, middle = perdure.tune_gc, int(chosen["PROBE_MIDDLE"])

        def tune_then_middle() -> None:
            tune()
            young, _, oldest = gc.get_threshold()
            gc.set_threshold(young, middle, oldest)

        perdure.tune_gc = tune_then_middle  # type: ignore[assignment]
    if "PROBE_SWITCH" in chosen:
        sys.setswitchinterval(float(chosen["PROBE_SWITCH"]))
    if "PROBE_READ_THREADS" in chosen:
        journal_module.LOCAL_READ_THREADS = int(chosen["PROBE_READ_THREADS"])  # type: ignore[misc]
    if chosen.get("PROBE_BUSY_TO_WRITER"):
        # A busy round hands its appends to the writer thread (whose fsync then runs
        # beside the loop's work) instead of keeping them for a commit on the loop.
        end_round = Journal._end_round

        def busy_to_writer(self: Journal, timeout: float) -> None:
            if timeout > 0:
                end_round(self, timeout)
                return
            held = self._take_held()
            self._in_flight += len(held)
            for request in held:
                self._queue.put(request)

        Journal._end_round = busy_to_writer  # type: ignore[method-assign]
    return chosen


def _schedstat() -> tuple[int, int]:
    """The calling thread's CPU and run-queue wait (ns), from ``/proc`` (Linux)."""
    with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f:
        cpu, waited, _ = f.read().split()
    return int(cpu), int(waited)


def main(argv: list[str]) -> None:
    out_path, *args = argv
    box: list[Any] = []
    chosen = levers()
    install(box)
    trio_run = trio.run

    def run_with_probe(*a: Any, **kw: Any) -> Any:
        kw.setdefault("instruments", []).append(LongSteps())
        return trio_run(*a, **kw)

    bench_scale.trio.run = run_with_probe  # type: ignore[attr-defined]
    cpu0 = time.process_time()
    sched0 = _schedstat()
    bench_scale.main(["active", *args])
    sched1 = _schedstat()
    result = analyse()
    result["cpu_s"] = round(time.process_time() - cpu0, 2)
    result["args"] = args
    result["levers"] = chosen
    # The trio thread's time runnable but not running (the kernel ran something else on
    # its core: the machine's other processes, or this process's other threads).
    result["trio_thread_runqueue_wait_s"] = round((sched1[1] - sched0[1]) / 1e9, 2)
    result["trio_thread_cpu_s"] = round((sched1[0] - sched0[0]) / 1e9, 2)
    Path(out_path).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
