"""perdure's benchmarks, one child process per measurement, through the public API.

    python bench/perdure_bench.py turns LOG K [LEVERS] [THINK_MS]
    python bench/perdure_bench.py census LOG
    python bench/perdure_bench.py breakdown LOG K
    python bench/perdure_bench.py concurrency LOG SESSIONS K [default|off|tuned]
    python bench/perdure_bench.py busy-loop LOG SESSIONS K THINK_MS
    python bench/perdure_bench.py build-finished LOG SESSIONS K
    python bench/perdure_bench.py build-interrupted LOG SESSIONS K BLOCK_AT_TURN
    python bench/perdure_bench.py recover LOG SESSIONS K
    python bench/perdure_bench.py memory LOG SESSIONS K [burst|waves] [hibernate|awake]
    python bench/perdure_bench.py stream LOG SESSIONS SUBSCRIBERS_PER_SESSION K
    python bench/perdure_bench.py tracing LOG K off|noop|traces|on [SESSIONS]
    python bench/perdure_bench.py tracing-ab LOG K ROUNDS

Each prints one JSON object on its last stdout line (``build-interrupted`` prints
``{"ready": true}`` once every session is blocked inside its tool, and waits to be
SIGKILLed). Every runtime uses ``durability="full"``, the default.

``LEVERS`` (``turns``) names which effects start while their commit is in flight
(``perdure.actors.protocol.Overlap``): ``serial`` none (every effect after its commit),
``serial-writer`` none, every commit on the writer thread (``commit_on_loop=False``),
``model-loop`` the model call, its commit left to the Journal's usual rules (it may
commit before the call has run), ``model`` the model call, its commit held until the
call waits (``Journal.append``'s ``overlap``; perdure's default), ``safe`` a SAFE
tool's attempt too, ``safe-only`` only a SAFE tool's attempt. A ``+writer`` suffix puts
every commit on the writer thread (``commit_on_loop=False``).
``THINK_MS``: the model takes that long to answer (default: instant).
"""

from __future__ import annotations

import gc
import itertools
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import perdure
from bench import workload
from bench.agent import BenchProvider, ToolControl, lookup, runtime_options
from bench.common import current_rss_mib, emit, note, rss_split_kib
from perdure.actors.protocol import Overlap
from perdure.actors.supervisor import FREEZE_AFTER
from perdure.providers.base import Emit, ModelReply, ModelRequest
from perdure.storage.codec import encode

_BATCH = 250  # sessions driven at once while building a big log


async def _warm_up(rt: perdure.Runtime, provider: BenchProvider) -> None:
    """Run a short session first, so that one-time costs are not charged to turn 1."""
    sid = await rt.create_session("warm-up")
    provider.k_by_session[sid] = workload.WARMUP_TURNS
    await rt.submit(sid, workload.USER_TEXT, request_id="warm-up")
    await rt.wait_idle(sid)


def _sid(prefix: str, i: int) -> str:
    return f"{prefix}-{i:06d}"


async def _run_sessions(rt: perdure.Runtime, sids: list[str], tag: str) -> None:
    """Submit the workload to every session at once and wait until all are idle."""

    async def one(sid: str) -> None:
        await rt.submit(sid, workload.USER_TEXT, request_id=f"{tag}-{sid}")
        outcome = await rt.wait_idle(sid)
        if outcome is None or outcome.status != "completed":
            raise RuntimeError(f"session {sid} ended {outcome!r}")

    async with trio.open_nursery() as nursery:
        for sid in sids:
            nursery.start_soon(one, sid)


# -- per-turn latency of one session ----------------------------------------------------


LEVERS: dict[str, tuple[Overlap, bool]] = {
    "serial": (Overlap(model_calls=False), False),
    "serial-writer": (Overlap(model_calls=False), False),
    "model-loop": (Overlap(), False),
    "model": (Overlap(), True),
    "safe": (Overlap(safe_tools=True), True),
    "safe-only": (Overlap(model_calls=False, safe_tools=True), True),
}


def _levers(rt: perdure.Runtime, levers: str) -> None:
    """Set the runtime's overlap of effects and commits (``LEVERS``)."""
    name, _, writer = levers.partition("+")
    overlap, commit_after = LEVERS[name]
    rt._ctx.overlap = overlap
    rt._ctx.overlap_commit_after = commit_after
    if name == "serial-writer" or writer == "writer":  # every commit on the writer thread
        rt._journal.commit_on_loop = False


class SlowProvider(BenchProvider):
    """The workload's model, answering after ``think`` seconds every time."""

    def __init__(self, k: int, think: float) -> None:
        super().__init__(k)
        self.think = think

    async def complete(self, request: ModelRequest, emit: Emit) -> ModelReply:
        reply = await super().complete(request, emit)  # notes the call's start
        await trio.sleep(self.think)
        return reply


async def turns(log: str, k: int, levers: str = "model", think_ms: str = "0") -> dict[str, Any]:
    think = float(think_ms) / 1e3
    provider = SlowProvider(k, think) if think else BenchProvider(k)
    async with perdure.open_runtime(
        log, provider=provider, tools=[lookup], **runtime_options(k)
    ) as rt:
        _levers(rt, levers)
        await _warm_up(rt, provider)
        sid = await rt.create_session("turns")
        before = attrs.evolve(rt.stats())  # a copy: the live object keeps counting
        appends0, txns0, records0 = before.appends, before.transactions, before.records
        await rt.submit(sid, workload.USER_TEXT, request_id="turns-1")
        outcome = await rt.wait_idle(sid)
        after = attrs.evolve(rt.stats())
    assert outcome is not None and outcome.status == "completed", outcome
    assert outcome.final_text == workload.FINAL_TEXT
    starts = provider.starts[sid]
    assert len(starts) == k + 1, len(starts)
    result: dict[str, Any] = {"system": "perdure", "k": k, "levers": levers}
    result["think_ms"] = think * 1e3
    result |= workload.turn_stats(starts)
    # The whole run (submit, K turns, the answer): 2 commits per turn plus a constant.
    result["appends"] = after.appends - appends0
    result["transactions"] = after.transactions - txns0
    result["records"] = after.records - records0
    result["commits_per_turn"] = (after.transactions - txns0) / k
    return result


# -- the cost of tracing (perdure.observability) ---------------------------------------------


def _sdk_floor(spans: list[Any], turns: int) -> float:
    """CPU (ms) per turn of the OpenTelemetry SDK calls alone that tracing makes per turn.

    Replays, against a fresh SDK set up as in ``on`` mode, a turn's two spans (a ``chat``
    and an ``execute_tool`` span with the very attributes perdure gave them, under a run
    span) and its three histogram records (operation duration, input and output tokens),
    with no runtime around them: the part of tracing's cost that no change in perdure
    can remove.
    """
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    chat = next(s for s in reversed(spans) if s.name.startswith("chat"))
    tool = next(s for s in reversed(spans) if s.name.startswith("execute_tool"))
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(InMemorySpanExporter()))
    meter = MeterProvider(metric_readers=[InMemoryMetricReader()]).get_meter("floor")
    duration = meter.create_histogram("gen_ai.client.operation.duration", unit="s")
    tokens = meter.create_histogram("gen_ai.client.token.usage", unit="{token}")
    tracer = tracer_provider.get_tracer("floor")
    run = tracer.start_span("invoke_agent")
    parent = trace.set_span_in_context(run, otel_context.Context())
    chat_attrs, tool_attrs = dict(chat.attributes), dict(tool.attributes)
    names = (
        "gen_ai.operation.name",
        "gen_ai.provider.name",
        "gen_ai.request.model",
        "gen_ai.response.model",
    )
    metric_attrs = {k: v for k, v in chat_attrs.items() if k in names}
    inputs = {**metric_attrs, "gen_ai.token.type": "input"}
    outputs = {**metric_attrs, "gen_ai.token.type": "output"}
    cpu = time.process_time()
    for _ in range(turns):
        span = tracer.start_span(chat.name, context=parent, attributes=chat_attrs, start_time=1)
        span.end(end_time=2)
        duration.record(0.001, metric_attrs)
        tokens.record(120, inputs)
        tokens.record(40, outputs)
        span = tracer.start_span(tool.name, context=parent, attributes=tool_attrs, start_time=1)
        span.end(end_time=2)
    tracer_provider.force_flush()
    return (time.process_time() - cpu) / turns * 1e3


def _tracing(mode: str) -> tuple[Any, Callable[[], int], Any]:
    """The ``telemetry`` option of a mode, how to count the spans it exported, and its
    in-memory span exporter (None without one).

    ``off``: no observer. ``noop``: the OpenTelemetry API with no provider installed
    (what an application that does not trace pays). ``traces``: the SDK's tracer
    provider, a batch span processor into an in-memory exporter, no meter provider
    (the GenAI histograms go to the API's no-op meter). ``on``: the same and the SDK's
    meter provider with an in-memory metric reader.
    """
    if mode == "off":
        return None, lambda: 0, None
    if mode == "noop":
        return "auto", lambda: 0, None
    if mode not in ("on", "traces"):
        raise SystemExit(f"unknown tracing mode {mode!r}")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from perdure.observability.tracing import Tracing

    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
    meter_provider = (
        MeterProvider(metric_readers=[InMemoryMetricReader()]) if mode == "on" else None
    )

    def exported() -> int:
        tracer_provider.force_flush()
        return len(exporter.get_finished_spans())

    tracing = Tracing(tracer_provider=tracer_provider, meter_provider=meter_provider)
    return tracing, exported, exporter


async def tracing(log: str, k: int, mode: str, sessions: int = 1) -> dict[str, Any]:
    """Per-turn latency and process CPU per turn in the given mode, over ``sessions``
    sessions of K turns run one after the other (more turns per trial: one session's
    50 turns are ~70 ms of CPU, at the mercy of whatever else the machine does)."""
    telemetry, exported, exporter = _tracing(mode)
    provider = BenchProvider(k)
    gaps: list[float] = []
    turns = 0
    async with perdure.open_runtime(
        log, provider=provider, tools=[lookup], telemetry=telemetry, **runtime_options(k)
    ) as rt:
        await _warm_up(rt, provider)
        sids = [await rt.create_session(f"turns-{i}") for i in range(sessions)]
        spans0 = exported()
        cpu = time.process_time()  # every thread: the batch processor's exporter too
        for i, sid in enumerate(sids):
            await rt.submit(sid, workload.USER_TEXT, request_id=f"turns-{i}")
            outcome = await rt.wait_idle(sid)
            assert outcome is not None and outcome.status == "completed", outcome
        spans = exported() - spans0  # flushed inside the measured span of CPU
        cpu = time.process_time() - cpu
    for sid in sids:
        starts = provider.starts[sid]
        assert len(starts) == k + 1, len(starts)
        gaps += [b - a for a, b in itertools.pairwise(starts)]
        turns += k + 1
    if mode in ("on", "traces"):  # per session a run span, K + 1 chat and K tool spans
        assert spans == sessions * (2 * k + 2), spans
    result = {
        "system": f"perdure tracing {mode}",
        "k": k,
        "sessions": sessions,
        "median_ms": workload.median(gaps) * 1e3,
        "cpu_ms_per_turn": cpu / turns * 1e3,
        "spans": spans,
    }
    if mode == "on":
        result["sdk_floor_ms_per_turn"] = _sdk_floor(
            list(exporter.get_finished_spans()), max(k, 200)
        )
    return result


async def tracing_ab(log: str, k: int, rounds: int) -> dict[str, Any]:
    """Tracing off, through the bare API, traces and on in ONE process: ``rounds`` rounds,
    each running one K-turn session per mode on a fresh runtime (its own log), in an
    order that rotates from round to round. A round's sessions run within a second of
    each other, so the ratios of a round compare like with like on a VM whose speed
    drifts; ``noop`` (the API with no provider, which records nothing) is the control
    that shows how finely this method resolves."""
    setups = {mode: _tracing(mode) for mode in ("off", "noop", "traces", "on")}
    modes = list(setups)
    cpu: dict[str, list[float]] = {mode: [] for mode in modes}
    for r in range(-1, rounds):  # round -1 is not counted: the process's first of all
        order = modes[r % len(modes) :] + modes[: r % len(modes)]
        for mode in order:
            telemetry, exported, exporter = setups[mode]
            provider = BenchProvider(k, record=False)
            async with perdure.open_runtime(
                f"{log}/{mode}-{r}",
                provider=provider,
                tools=[lookup],
                telemetry=telemetry,
                **runtime_options(k),
            ) as rt:
                await _warm_up(rt, provider)
                sid = await rt.create_session("turns")
                spans = exported()
                gc.collect()  # the previous runtimes' garbage is not this session's
                began = time.process_time()
                await rt.submit(sid, workload.USER_TEXT, request_id="turns-1")
                outcome = await rt.wait_idle(sid)
                spans = exported() - spans  # flushed inside the measured span of CPU
                took = time.process_time() - began
            assert outcome is not None and outcome.status == "completed", outcome
            assert spans == (2 * k + 2 if mode in ("traces", "on") else 0), (mode, spans)
            if r >= 0:
                cpu[mode].append(took / (k + 1) * 1e3)
            if exporter is not None:
                exporter.clear()  # a real exporter sends its spans away: keep none
    ratios = {
        mode: [a / b for a, b in zip(cpu[mode], cpu["off"], strict=True)]
        for mode in ("noop", "traces", "on")
    }
    result: dict[str, Any] = {
        "system": "perdure tracing, one process",
        "k": k,
        "rounds": rounds,
        "cpu_ms_per_turn": cpu,
        "ratios": ratios,
    }
    for mode, found in ratios.items():
        result[f"{mode}_over_off_cpu"] = workload.median(found)
        result[f"{mode}_over_off_cpu_quartiles"] = [
            workload.quantile(found, 0.25),
            workload.quantile(found, 0.75),
        ]
    return result


# -- where a turn's time goes (instrumented, not used for the headline figures) -------------


async def breakdown(log: str, k: int) -> dict[str, Any]:
    """Split a turn into LMDB commit, thread hand-offs and trio-thread work.

    Wraps ``LmdbLog.commit`` (writer thread), ``codec.encode`` as the log calls it, and
    ``Journal.append`` (trio side, from the call to the caller being woken) with
    timers. The wrappers cost a few perf_counter calls per commit.
    """
    from perdure.storage import lmdb_log

    provider = BenchProvider(k)
    commits: list[float] = []
    appends: list[float] = []
    encoded = [0.0]
    module = vars(lmdb_log)  # the log calls codec.encode through this module's global
    real_encode = module["encode"]

    def timed_encode(record: Any, seq: int) -> bytes:
        t = time.perf_counter()
        frame: bytes = real_encode(record, seq)
        encoded[0] += time.perf_counter() - t
        return frame

    async with perdure.open_runtime(
        log, provider=provider, tools=[lookup], **runtime_options(k)
    ) as rt:
        journal, lmdb = rt._journal, rt._journal.log
        real_commit, real_append = lmdb.commit, journal.append

        def timed_commit(batches: Any) -> Any:
            t = time.perf_counter()
            results = real_commit(batches)
            commits.append(time.perf_counter() - t)
            return results

        async def timed_append(records: Any, **options: Any) -> Any:
            t = time.perf_counter()
            out = await real_append(records, **options)
            appends.append(time.perf_counter() - t)
            return out

        await _warm_up(rt, provider)
        sid = await rt.create_session("breakdown")
        lmdb.commit = timed_commit  # type: ignore[method-assign]
        journal.append = timed_append  # type: ignore[method-assign]
        module["encode"] = timed_encode
        try:
            cpu = time.thread_time()
            await rt.submit(sid, workload.USER_TEXT, request_id="breakdown-1")
            await rt.wait_idle(sid)
            cpu = time.thread_time() - cpu
        finally:
            module["encode"] = real_encode
    starts = provider.starts[sid]
    wall = (starts[-1] - starts[0]) / k
    n = len(commits)
    per_turn = n / (k + 1)  # the run has K+1 model turns' worth of commits
    commit_ms = sum(commits) / n * 1e3
    append_ms = sum(appends) / len(appends) * 1e3
    return {
        "k": k,
        "turn_ms": wall * 1e3,
        "commits_per_turn": per_turn,
        "commit_ms": commit_ms,
        "encode_ms_per_commit": encoded[0] / n * 1e3,
        "append_roundtrip_ms": append_ms,
        "handoff_ms_per_commit": append_ms - commit_ms,
        "trio_thread_cpu_ms_per_turn": cpu / (k + 1) * 1e3,
        "outside_appends_ms_per_turn": wall * 1e3 - per_turn * append_ms,
    }


# -- which records each commit of a turn holds (untimed) ----------------------------------


async def census(log: str) -> dict[str, Any]:
    """Record the frames of every transaction of a 5-turn run (instrumented, untimed)."""
    k = 5
    provider = BenchProvider(k, record=False)
    txns: list[list[tuple[str, int]]] = []
    async with perdure.open_runtime(
        log, provider=provider, tools=[lookup], **runtime_options(k)
    ) as rt:
        real = rt._journal.log.commit

        def counting(batches: Any) -> Any:
            results = real(batches)
            for committed_batch in results:
                if isinstance(committed_batch, list):
                    frames = [
                        (type(c.record).__name__, len(encode(c.record, c.seq)))
                        for c in committed_batch
                    ]
                    txns.append(frames)
            return results

        rt._journal.log.commit = counting  # type: ignore[method-assign]
        sid = await rt.create_session("census")
        await rt.submit(sid, workload.USER_TEXT, request_id="census-1")
        await rt.wait_idle(sid)
    # A steady-state turn: the commit that saves a tool-calling reply, and the next one.
    for i, frames in enumerate(txns):
        if i > 2 and frames[0][0] == "GenerationCompleted" and i + 1 < len(txns):
            turn = [frames, txns[i + 1]]
            break
    else:
        raise RuntimeError(f"no steady-state turn found in {txns}")
    return {
        "turn_commits": [[{"record": name, "bytes": size} for name, size in t] for t in turn],
        "value_sizes": [[size for _, size in t] for t in turn],
        "all_transactions": len(txns),
    }


# -- many sessions at once ------------------------------------------------------------------


GC_MODES = ("default", "off", "tuned")


async def concurrency(log: str, sessions: int, k: int, gc_mode: str = "default") -> dict[str, Any]:
    """``gc_mode``: ``default`` (CPython's collector as it comes), ``tuned``
    (``perdure.tune_gc()``, as ``perdure serve`` runs) or ``off`` (a diagnostic: no
    cyclic collection during the run). The share of the CPU spent in collections is
    measured in every mode (``gc.callbacks``)."""
    if gc_mode not in GC_MODES:
        raise SystemExit(f"unknown gc mode {gc_mode!r}; one of {', '.join(GC_MODES)}")
    provider = BenchProvider(k, record=False)
    async with perdure.open_runtime(
        log, provider=provider, tools=[lookup], **runtime_options(k)
    ) as rt:
        sids = [await rt.create_session(_sid("c", i)) for i in range(sessions)]
        before = attrs.evolve(rt.stats())  # a copy: the live object keeps counting
        if gc_mode == "tuned":
            perdure.tune_gc()
        in_gc = _CollectorTime()
        if gc_mode == "off":
            gc.disable()
        collections = sum(g["collections"] for g in gc.get_stats())
        cpu, trio_cpu = time.process_time(), time.thread_time()
        start = time.perf_counter()
        with in_gc:
            await _run_sessions(rt, sids, "conc")
        elapsed = time.perf_counter() - start
        cpu, trio_cpu = time.process_time() - cpu, time.thread_time() - trio_cpu
        collections = sum(g["collections"] for g in gc.get_stats()) - collections
        gc.enable()
        after = attrs.evolve(rt.stats())
    txns = after.transactions - before.transactions
    appends = after.appends - before.appends
    records = after.records - before.records
    return {
        "system": "perdure",
        "sessions": sessions,
        "k": k,
        "elapsed_s": elapsed,
        "turns_per_s": sessions * k / elapsed,
        "cpu_ms_per_turn": cpu / (sessions * k) * 1e3,
        "trio_thread_cpu_ms_per_turn": trio_cpu / (sessions * k) * 1e3,
        "commits": txns,
        "commits_per_s": txns / elapsed,
        "appends_per_commit": appends / txns,
        "records_per_commit": records / txns,
        "largest_commit_records": after.largest_transaction,
        "single_session_commits_would_be": appends,
        "gc": gc_mode,
        "gc_collections": collections,
        "gc_cpu_share": in_gc.seconds / cpu if cpu else 0.0,
        "gc_longest_ms": in_gc.longest * 1e3,
        "gc_by_generation": {
            str(g): {"collections": n, "cpu_share": s / cpu if cpu else 0.0}
            for g, (n, s) in in_gc.by_generation.items()
        },
    }


class _CollectorTime:
    """The process CPU time spent inside the cyclic collector while the block runs."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.by_generation = {0: [0, 0.0], 1: [0, 0.0], 2: [0, 0.0]}  # collections, s
        self.longest = 0.0
        self._began = 0.0

    def _note(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.thread_time()
        else:
            took = time.thread_time() - self._began
            self.seconds += took
            self.longest = max(self.longest, took)
            tally = self.by_generation[info["generation"]]
            tally[0] += 1
            tally[1] += took

    def __enter__(self) -> _CollectorTime:
        gc.callbacks.append(self._note)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._note)


# -- a busy loop ---------------------------------------------------------------------------


class ThinkingProvider(BenchProvider):
    """The workload's model, taking a while to answer: uniformly 0.5-1.5 x ``think``
    seconds (a seeded draw), so that concurrent sessions drift apart as real ones do."""

    def __init__(self, k: int, think: float) -> None:
        super().__init__(k)
        self.think = think
        self.thinks: dict[str, list[float]] = {}
        self._draw = random.Random(21)

    async def complete(self, request: ModelRequest, emit: Emit) -> ModelReply:
        took = self.think * self._draw.uniform(0.5, 1.5)
        reply = await super().complete(request, emit)  # notes the call's start
        self.thinks.setdefault(request.session_id, []).append(took)
        await trio.sleep(took)
        return reply


SPIN_STEP = 50e-6  # seconds of CPU per step of the application's own task


async def _spin(stop: trio.Event, steps: list[int]) -> None:
    """The application's CPU-bound work on the loop: 50 us of CPU, then a checkpoint."""
    while not stop.is_set():
        began = time.thread_time()
        while time.thread_time() - began < SPIN_STEP:
            pass
        steps[0] += 1
        await trio.lowlevel.checkpoint()


async def busy_loop(log: str, sessions: int, k: int, think_ms: int) -> dict[str, Any]:
    """SESSIONS x K turns of a model that thinks THINK_MS (0.5-1.5 x), once on a quiet
    loop and once beside a CPU-bound task of the application's on the same loop (a
    spinner: 50 us of CPU per step). Per turn, what the durable steps add to the
    model's thinking (the turn from one model call to the next, minus that call's
    think), and how much of the spinner's progress (steps per second, against the
    spinner alone in this process) the sessions leave it."""
    out: dict[str, Any] = {"sessions": sessions, "k": k, "think_ms": think_ms}
    stop, steps = trio.Event(), [0]
    async with trio.open_nursery() as nursery:  # the spinner alone: the baseline
        nursery.start_soon(_spin, stop, steps)
        await trio.sleep(1.0)
        stop.set()
    out["spinner_alone_steps_per_s"] = steps[0] / 1.0
    for busy in (False, True):
        provider = ThinkingProvider(k, think_ms / 1e3)
        async with perdure.open_runtime(
            f"{log}-{'busy' if busy else 'quiet'}",
            provider=provider,
            tools=[lookup],
            **runtime_options(k),
        ) as rt:
            sids = [await rt.create_session(_sid("b", i)) for i in range(sessions)]
            before = attrs.evolve(rt.stats())
            stop, steps = trio.Event(), [0]
            start = time.perf_counter()
            async with trio.open_nursery() as nursery:
                if busy:
                    nursery.start_soon(_spin, stop, steps)
                await _run_sessions(rt, sids, "busy")
                stop.set()
            elapsed = time.perf_counter() - start
            after = attrs.evolve(rt.stats())
        added = [
            (later - earlier - think) * 1e3
            for sid, starts in provider.starts.items()
            # the last call (the final answer) starts no turn: its think is left over
            for earlier, later, think in zip(starts, starts[1:], provider.thinks[sid], strict=False)
        ]
        part = {
            "turns_per_s": sessions * k / elapsed,
            "added_p50_ms": workload.quantile(added, 0.5),
            "added_p99_ms": workload.quantile(added, 0.99),
            "commits": after.transactions - before.transactions,
            "loop_commits": after.loop_transactions - before.loop_transactions,
        }
        if busy:
            part["spinner_steps_per_s"] = steps[0] / elapsed
            part["spinner_share_kept"] = (
                part["spinner_steps_per_s"] / out["spinner_alone_steps_per_s"]
            )
        out["busy" if busy else "quiet"] = part
    return out


# -- recovery ---------------------------------------------------------------------------------


async def build_finished(log: str, sessions: int, k: int) -> dict[str, Any]:
    provider = BenchProvider(k, record=False)
    start = time.perf_counter()
    async with perdure.open_runtime(
        log, provider=provider, tools=[lookup], **runtime_options(k)
    ) as rt:
        for lo in range(0, sessions, _BATCH):
            sids = [
                await rt.create_session(_sid("done", i))
                for i in range(lo, min(sessions, lo + _BATCH))
            ]
            await _run_sessions(rt, sids, "done")
            if lo and lo % 2000 == 0:
                note(f"  built {lo} finished sessions")
        active = await rt._journal.active_sessions()
    assert not active, active
    return {"finished_sessions": sessions, "k": k, "build_s": time.perf_counter() - start}


async def build_interrupted(log: str, sessions: int, k: int, block_at: int) -> None:
    provider = BenchProvider(k, record=False)
    ToolControl.block_at_turn = block_at
    ToolControl.expected_blocked = sessions
    ToolControl.all_blocked = trio.Event()
    async with perdure.open_runtime(
        log, provider=provider, tools=[lookup], **runtime_options(k)
    ) as rt:
        sids = [await rt.create_session(_sid("cut", i)) for i in range(sessions)]
        async with trio.open_nursery() as nursery:
            for sid in sids:
                nursery.start_soon(rt.submit, sid, workload.USER_TEXT)
        await ToolControl.all_blocked.wait()
        print('{"ready": true}', flush=True)
        await trio.sleep_forever()  # the parent SIGKILLs this process now


def recover(log: str, sessions: int, k: int) -> dict[str, Any]:
    """From ``open_runtime`` entry to the first re-issued action of the last interrupted run.

    The re-issued action is the SAFE tool's re-run (attempt 2), which notes its start
    time; the CPU time of the process until then is reported too. Imports and
    interpreter start-up are not counted; the open, the log read, the supervisor's scan
    of the ``active`` index, every actor's fold and recovery commit are.
    """
    provider = BenchProvider(k, record=False)
    marks: dict[str, float] = {}

    async def main() -> None:
        ToolControl.expected_reruns = sessions
        ToolControl.all_rerun = trio.Event()
        marks["enter"], marks["cpu"] = time.perf_counter(), time.process_time()
        async with perdure.open_runtime(
            log, provider=provider, tools=[lookup], **runtime_options(k)
        ) as rt:
            marks["yielded"] = time.perf_counter()
            recovered = len(rt.recovered_sessions)
            with trio.fail_after(120):
                await ToolControl.all_rerun.wait()
            marks["cpu"] = time.process_time() - marks["cpu"]
            marks["recovered"] = recovered
            marks["rss_after_recovery_mib"] = current_rss_mib()

    trio.run(main)
    reruns = sorted(ToolControl.reruns.values())
    enter = marks["enter"]
    return {
        "interrupted_sessions": sessions,
        "recovered_sessions": int(marks["recovered"]),
        "reruns": len(reruns),
        "first_rerun_ms": (reruns[0] - enter) * 1e3,
        "last_rerun_ms": (reruns[-1] - enter) * 1e3,
        "open_runtime_yield_ms": (marks["yielded"] - enter) * 1e3,
        # CPU of every thread until the last re-run: what a noisy neighbour cannot inflate.
        "cpu_ms_to_last_rerun": marks["cpu"] * 1e3,
        "rss_after_recovery_mib": marks["rss_after_recovery_mib"],
    }


# -- memory -----------------------------------------------------------------------------------


MEMORY_WAVES = 10  # ``waves``: the sessions run this many groups at a time, one after another


async def memory(
    log: str, sessions: int, k: int, arrival: str = "burst", actors: str = "hibernate"
) -> dict[str, Any]:
    """RSS per idle session: sessions created, run once each, then left idle.

    ``arrival``: ``burst`` runs every session at once (the headline, the workload the
    target was set on); ``waves`` runs them in ``MEMORY_WAVES`` groups one after
    another, as sessions arrive in a daemon, so that the peak of the busy ones does
    not stay behind as allocator fragmentation. ``actors``: ``hibernate`` (the
    runtime's default: an idle actor hibernates after ``hibernate_after``, its state
    kept) or ``awake`` (``hibernate_after=None``: every idle actor keeps running).

    Measured once idle: every session's actor hibernated and its state frozen
    (``hibernate``: ``FREEZE_AFTER`` x ``hibernate_after`` later, 5-10 s here) and the log
    quiet long enough for the writer to release the map's pages (about a second;
    ``Journal`` ``RELEASE_QUIET``). Then the sessions are evicted (``idle_timeout``)
    and the objects the garbage collector tracks are counted again.

    RSS counts two kinds of pages, reported apart as well: anonymous ones (Python's
    heap: the sessions' states, actors, and what the run left behind in the allocator)
    and file pages mapped into the process, here the LMDB map of the log (clean page
    cache, which the writer releases from the resident set once the log is quiet).
    """
    if arrival not in ("burst", "waves") or actors not in ("hibernate", "awake"):
        raise SystemExit(f"memory: unknown mode {arrival!r} {actors!r}")
    provider = BenchProvider(k, record=False)
    hibernate_after = 0.5 if actors == "hibernate" else None
    # Longer than the whole run of every session and the freezing of its state after,
    # so that none leaves before it is counted.
    freezing = 2 * FREEZE_AFTER * (hibernate_after or 0.0)
    idle_timeout = max(6.0, sessions * 0.03) + freezing
    async with perdure.open_runtime(
        log,
        provider=provider,
        tools=[lookup],
        idle_timeout=idle_timeout,
        hibernate_after=hibernate_after,
        **runtime_options(k),
    ) as rt:
        lmdb_log = rt._journal.log

        async def quiet() -> None:
            """Until the idle actors hibernated, their states were frozen and the heap
            trimmed after, and the writer released the map's pages."""
            released = getattr(lmdb_log, "map_releases", 0)

            def awake() -> bool:
                if hibernate_after is None:
                    return False
                resident = len(rt.resident_sessions)
                return len(rt.hibernated_sessions) < resident or (
                    len(rt.frozen_sessions) < resident
                )

            with trio.fail_after(idle_timeout - 1):
                while awake():  # noqa: ASYNC110 (waiting out hibernate_after)
                    await trio.sleep(0.05)
                # The trim after the round that froze the last of them (ended in its thread).
                sup = rt._sup
                while hibernate_after is not None and sup.freezes_at_trim != sup.freezes:  # noqa: ASYNC110
                    await trio.sleep(0.05)
                while getattr(lmdb_log, "map_releases", 1) == released:  # noqa: ASYNC110
                    await trio.sleep(0.05)

        # Warm up every code path once so that the delta is the sessions' own memory.
        await _run_sessions(rt, [await rt.create_session("warm")], "warm")
        await quiet()
        gc.collect()
        before, split_before = current_rss_mib(), rss_split_kib()
        objects_before = len(gc.get_objects())
        sids = [await rt.create_session(_sid("idle", i)) for i in range(sessions)]
        groups = MEMORY_WAVES if arrival == "waves" else 1
        size = -(-sessions // groups)
        for g in range(groups):
            await _run_sessions(rt, sids[g * size : (g + 1) * size], "idle")
        await quiet()
        gc.collect()
        after, split_after = current_rss_mib(), rss_split_kib()
        objects_after = len(gc.get_objects())
        heap_trims = rt._sup.heap_trims
        resident = len(rt.resident_sessions)
        hibernated = len(rt.hibernated_sessions)
        with trio.fail_after(idle_timeout * 4):
            while rt.resident_sessions:  # noqa: ASYNC110 (waiting out the idle timeout)
                await trio.sleep(0.1)
        gc.collect()
        evicted_rss = current_rss_mib()
        objects_evicted = len(gc.get_objects())
    return {
        "sessions": sessions,
        "k": k,
        "arrival": arrival,
        "actors": actors,
        "resident": resident,
        "hibernated": hibernated,
        "rss_before_mib": before,
        "rss_after_mib": after,
        "kib_per_idle_session": (after - before) * 1024 / sessions,
        "kib_anon_per_idle_session": (split_after["anon"] - split_before["anon"]) / sessions,
        "kib_file_per_idle_session": (split_after["file"] - split_before["file"]) / sessions,
        "rss_after_eviction_mib": evicted_rss,
        "heap_trims": heap_trims,  # the heap given back so far, when measured idle
        "gc_objects_per_idle_session": (objects_after - objects_before) / sessions,
        "gc_objects_per_evicted_session": (objects_evicted - objects_before) / sessions,
    }


# -- streaming, in-process --------------------------------------------------------------------


async def stream(log: str, sessions: int, per_session: int, k: int) -> dict[str, Any]:
    """Delay from a record's commit to its arrival at ``rt.events`` subscribers (in-process).

    The commit time is taken in the Journal's writer thread right after LMDB's commit
    returned (an instrumentation wrapper on the log, for this measurement only).
    """
    provider = BenchProvider(k, record=False)
    committed_at: dict[int, float] = {}
    delays: list[float] = []
    async with perdure.open_runtime(
        log, provider=provider, tools=[lookup], **runtime_options(k)
    ) as rt:
        real = rt._journal.log.commit

        def stamping(batches: Any) -> Any:
            results = real(batches)
            now = time.perf_counter()
            for committed_batch in results:
                if isinstance(committed_batch, list):
                    for c in committed_batch:
                        committed_at[c.seq] = now
            return results

        rt._journal.log.commit = stamping  # type: ignore[method-assign]
        sids = [await rt.create_session(_sid("st", i)) for i in range(sessions)]

        async def subscriber(sid: str, after: int) -> None:
            async for event in rt.events(sid, after=after):
                if event.seq is None:
                    continue
                delays.append(time.perf_counter() - committed_at[event.seq])
                if event.kind == "RunFinished":
                    return

        bus = rt._journal.bus
        async with trio.open_nursery() as nursery:
            for sid in sids:
                info = await rt._journal.session_info(sid)
                assert info is not None
                for _ in range(per_session):
                    nursery.start_soon(subscriber, sid, info.last_seq)
            # Start the runs once every subscriber has reached its live feed (rt.events
            # subscribes lazily, after replaying the log), so that every delay measured is
            # a live delivery. (Reads the bus's subscriber sets: a benchmark-only peek.)
            for _ in range(10_000):
                live = sum(len(bus._by_session.get(sid, ())) for sid in sids)
                if live >= len(sids) * per_session:
                    break
                await trio.sleep(0.001)
            else:
                raise RuntimeError("the subscribers did not all go live")
            await _run_sessions(rt, sids, "stream")
    return {
        "scope": "in-process (rt.events subscribers), not SSE",
        "sessions": sessions,
        "subscribers": len(sids) * per_session,
        "k": k,
        "deliveries": len(delays),
        "p50_ms": workload.quantile(delays, 0.5) * 1e3,
        "p99_ms": workload.quantile(delays, 0.99) * 1e3,
        "max_ms": max(delays) * 1e3 if delays else float("nan"),
    }


def _run(fn: Callable[..., Any], *args: Any) -> Any:
    return trio.run(fn, *args)


def main(argv: list[str]) -> None:
    cmd, log, *rest = argv
    nums = (
        [int(x) for x in rest] if cmd not in ("tracing", "concurrency", "memory", "turns") else []
    )
    if cmd == "turns":
        emit(_run(turns, log, int(rest[0]), *rest[1:]))
    elif cmd == "breakdown":
        emit(_run(breakdown, log, *nums))
    elif cmd == "census":
        emit(_run(census, log))
    elif cmd == "concurrency":
        emit(_run(concurrency, log, int(rest[0]), int(rest[1]), *rest[2:]))
    elif cmd == "busy-loop":
        emit(_run(busy_loop, log, *nums))
    elif cmd == "build-finished":
        emit(_run(build_finished, log, *nums))
    elif cmd == "build-interrupted":
        _run(build_interrupted, log, *nums)
    elif cmd == "recover":
        emit(recover(log, *nums))
    elif cmd == "memory":
        emit(_run(memory, log, int(rest[0]), int(rest[1]), *rest[2:]))
    elif cmd == "stream":
        emit(_run(stream, log, *nums))
    elif cmd == "tracing-ab":
        emit(_run(tracing_ab, log, *nums))
    elif cmd == "tracing":
        emit(_run(tracing, log, int(rest[0]), rest[1], *map(int, rest[2:3])))
    else:
        raise SystemExit(f"unknown command {cmd!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
