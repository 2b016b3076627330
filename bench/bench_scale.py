"""100,000 sessions on one box: memory, disk, the lists, and recovery of 10,000 runs.

    python bench/bench_scale.py run WORKDIR [--sessions 100000] [--turns 3]
                                [--active 1000] [--waves 5] [--interrupted 10000]
                                [--recover-model-wait 1.0]
    python bench/run.py --only scale   # the same, with the targets met / not met

Not part of CI (it takes minutes). ``run`` does, each step in its own process:

1. ``build``: a log of SESSIONS finished sessions of TURNS turns each. One real
   session is run through ``open_runtime`` (the benchmark's instant model and
   ``lookup`` tool); its records are then written again under SESSIONS session ids
   straight through the storage layer (``LmdbLog.commit``, 500 sessions per
   transaction, ``durability="fast"``), which is what a runtime would have
   committed for each, without the runtime's per-turn work. Disk per session is the
   file's allocated size over SESSIONS.
2. ``active`` (once per size of ``--active 100,1000``): ``open_runtime`` on that log,
   WAVES waves of ACTIVE sessions each,
   one new run of TURNS turns each (a model that takes 1 s per call), so the earlier
   waves' sessions hibernate and freeze while the last wave runs: RSS with ACTIVE
   sessions mid-turn, and what perdure adds to a turn whose model takes 1 s: the gap
   from a call's reply to the session's next call (commits and the instant tool),
   p50/p99 over every turn of every wave, and a whole run's time beyond its calls
   per turn (which also holds the submission, a session's first read from the log
   and the wait for the run's end). Each size runs twice: *in step* (a wave's
   sessions submitted at once, every call taking exactly 1 s, so every reply of the
   wave arrives in the same instant and the gap is mostly the queue of a thousand
   turns' work at once) and *spread* (the wave's submissions spread evenly over one
   model call's time, each call taking 1 s +- 10 %, seeded: the replies arrive as a
   daemon's many independent sessions would send them).
3. ``lists``: a real ``perdure serve`` on the log: ``GET /v1/sessions`` (every
   session, the first page of 100 by id, and the newest 100, the web page's request),
   the daemon's RSS; then ``perdure sessions``.
4. ``interrupt``: ``open_runtime`` on the log, a new submission to INTERRUPTED of the
   finished sessions with a model that never answers; once every one of those
   model calls has started, the parent SIGKILLs the process.
5. ``recover``: a new process opens the log; the time from its spawn (and from
   ``open_runtime``'s entry) to each session's first model call, first / p50 / p99 /
   last across the INTERRUPTED sessions, and the process's CPU time (every thread,
   from its start) at the first and at the last of those calls. The model answers
   each of those calls at once with the run's final text, so the figures to the last
   call also hold the end of every run resumed before it: the conservative figure,
   the one the targets read. ``run`` then recovers the killed log again (a fresh
   copy) with a model that takes ``--recover-model-wait`` seconds (default 1; 0: not),
   ``recover_waiting``: the runs resumed first are then still waiting for their model
   when the last call starts, so its CPU is what resuming alone costs. Alone:
   ``bench_scale.py recover LOG COUNT SPAWNED [--model-wait S]`` (SPAWNED: a
   ``time.time()`` taken before the process starts).

Prints one JSON object on its last stdout line; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import perdure  # noqa: E402
from bench import workload  # noqa: E402
from bench.agent import BenchProvider, lookup, runtime_options  # noqa: E402
from bench.common import current_rss_mib, emit, note  # noqa: E402
from perdure.providers.base import Emit, ModelReply, ModelRequest  # noqa: E402

BUILD_BATCH = 500  # sessions per transaction while building
MODEL_S = 1.0  # how long each model call of the ``active`` step takes
SPREAD_JITTER = 0.10  # the ``spread`` variant: each call takes MODEL_S +- 10 %


def sid_of(i: int) -> str:
    return f"s-{i:06d}"


def _pct(values: list[float], q: float) -> float:
    return workload.quantile(values, q)


# -- 1. build ---------------------------------------------------------------------------------


def build(log_dir: str, sessions: int, turns: int) -> dict[str, Any]:
    from perdure.storage import open_log

    template_dir = tempfile.mkdtemp(prefix="perdure-scale-template-")

    async def template() -> None:
        async with perdure.open_runtime(
            template_dir,
            provider=BenchProvider(turns, record=False),
            tools=[lookup],
            **runtime_options(turns),
        ) as rt:
            sid = await rt.create_session("template")
            await rt.submit(sid, workload.USER_TEXT, request_id="first")
            outcome = await rt.wait_idle(sid)
            assert outcome is not None and outcome.status == "completed", outcome

    trio.run(template)
    source = open_log(template_dir, readonly=True)
    records = [c.record for c in source.read_session("template")]
    source.close()
    began = time.perf_counter()
    log = open_log(log_dir, durability="fast")
    log.bind_writer(__import__("threading").current_thread())
    try:
        for lo in range(0, sessions, BUILD_BATCH):
            batches = [
                ([attrs.evolve(r, session_id=sid_of(i)) for r in records], None)
                for i in range(lo, min(sessions, lo + BUILD_BATCH))
            ]
            for result in log.commit(batches):
                if isinstance(result, Exception):
                    raise result
            if lo and lo % 20_000 == 0:
                note(f"  built {lo} sessions")
    finally:
        log.close()
    data = Path(log_dir) / "data.mdb"
    allocated = data.stat().st_blocks * 512
    return {
        "sessions": sessions,
        "turns": turns,
        "records_per_session": len(records),
        "build_s": round(time.perf_counter() - began, 1),
        "disk_mib": round(allocated / (1 << 20), 1),
        "disk_kib_per_session": round(allocated / sessions / 1024, 2),
    }


# -- 2. active ------------------------------------------------------------------------------


class SlowProvider(BenchProvider):
    """The benchmark's model, each call taking ``MODEL_S`` (a real model's latency).

    ``gaps`` holds, per turn, the time from one call's reply to the start of the
    session's next call: the reply's commit, the tool's executing record, the tool,
    its result's commit, and the next call's start, everything perdure adds to a turn
    whose model takes ``MODEL_S``."""

    def __init__(self, k: int, jitter: float = 0.0) -> None:
        super().__init__(k, record=False)
        self.replied: dict[str, float] = {}
        self.gaps: list[float] = []
        self.jitter = jitter
        self.random = random.Random(7)
        self.model_s: dict[str, float] = {}  # per session, the time its calls took

    async def complete(self, request: ModelRequest, emit: Emit) -> ModelReply:
        began = time.perf_counter()
        last = self.replied.pop(request.session_id, None)
        if last is not None:
            self.gaps.append(began - last)
        took = MODEL_S * self.random.uniform(1 - self.jitter, 1 + self.jitter)
        self.model_s[request.session_id] = self.model_s.get(request.session_id, 0.0) + took
        await trio.sleep(took)
        reply = await super().complete(request, emit)
        if reply.tool_calls:
            self.replied[request.session_id] = time.perf_counter()
        return reply


async def active(
    log_dir: str, active_n: int, waves: int, turns: int, first: int, spread: bool = False
) -> dict[str, Any]:
    perdure.tune_gc()  # as ``perdure serve`` does: this step is a daemon's day
    provider = SlowProvider(turns, SPREAD_JITTER if spread else 0.0)
    rss_mid: list[float] = []
    added: list[float] = []  # per turn, what a run took beyond its model calls
    async with perdure.open_runtime(
        log_dir, provider=provider, tools=[lookup], **runtime_options(2 * turns + 2)
    ) as rt:
        for wave in range(waves):
            sids = [sid_of(first + wave * active_n + i) for i in range(active_n)]
            for sid in sids:  # one more run of TURNS turns after the first TURNS + 1 replies
                provider.k_by_session[sid] = 2 * turns + 1

            async def one(sid: str, offset: float) -> None:
                await trio.sleep(offset)
                began = time.perf_counter()
                await rt.submit(sid, workload.USER_TEXT, request_id=f"wave-{sid}")
                outcome = await rt.wait_idle(sid)
                assert outcome is not None and outcome.status == "completed", outcome
                # TURNS tool turns and the answer: TURNS + 1 model calls.
                took = time.perf_counter() - began - provider.model_s.pop(sid)
                added.append(took / (turns + 1))

            async def sample() -> None:
                await trio.sleep((turns + 1) * MODEL_S / 2)
                rss_mid.append(current_rss_mib())

            async with trio.open_nursery() as nursery:
                nursery.start_soon(sample)
                for i, sid in enumerate(sids):
                    nursery.start_soon(one, sid, i * MODEL_S / active_n if spread else 0.0)
            note(f"  wave {wave + 1}/{waves}: RSS {rss_mid[-1]:.0f} MiB")
        await trio.sleep(2.5)  # the last wave hibernates
        resident = len(rt.resident_sessions)
        hibernated = len(rt.hibernated_sessions)
        frozen = len(rt.frozen_sessions)
    return {
        "active": active_n,
        "arrivals": "spread" if spread else "in step",
        "waves": waves,
        "rss_mib_with_active": round(max(rss_mid), 1),
        "rss_mib_by_wave": [round(r, 1) for r in rss_mid],
        "resident_at_end": resident,
        "hibernated_at_end": hibernated,
        "frozen_at_end": frozen,
        "run_added_ms_per_turn_p50": round(_pct(added, 0.5) * 1e3, 2),
        "run_added_ms_per_turn_p99": round(_pct(added, 0.99) * 1e3, 2),
        "turn_gap_ms_p50": round(_pct(provider.gaps, 0.5) * 1e3, 2),
        "turn_gap_ms_p99": round(_pct(provider.gaps, 0.99) * 1e3, 2),
        "turn_gaps": len(provider.gaps),
    }


# -- 3. lists -----------------------------------------------------------------------------------


def lists(workdir: Path, log_dir: str) -> dict[str, Any]:
    import httpx

    from bench.sse import start_daemon

    daemon_dir = workdir / "daemon"
    daemon_dir.mkdir(exist_ok=True)
    log_link = daemon_dir / "log"
    if not log_link.exists():
        log_link.symlink_to(Path(log_dir).resolve())
    began = time.perf_counter()
    proc, url, token = start_daemon(daemon_dir, 1, None)
    out: dict[str, Any] = {"serve_start_s": round(time.perf_counter() - began, 2)}
    try:
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=url, headers=headers, timeout=300) as client:
            pages: tuple[tuple[str, dict[str, str]], ...] = (
                ("all", {}),
                ("page_100", {"limit": "100"}),
                # What the web page asks for every 3 s: the newest 100.
                ("newest_100", {"order": "newest", "limit": "100"}),
            )
            for name, params in pages:
                times, count = [], 0
                for _ in range(3):
                    t0 = time.perf_counter()
                    response = client.get("/v1/sessions", params=params)
                    times.append(time.perf_counter() - t0)
                    response.raise_for_status()
                    count = len(response.json()["sessions"])
                out[f"list_{name}_ms"] = round(workload.median(times) * 1e3, 1)
                out[f"list_{name}_count"] = count
        with open(f"/proc/{proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    out["serve_rss_mib"] = round(int(line.split()[1]) / 1024, 1)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    # ``perdure sessions`` as a user types it (a page: the newest 50), and with --all.
    for name, extra in (("cli_sessions_s", ()), ("cli_sessions_all_s", ("--all",))):
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "perdure.cli", "sessions", "--log", log_dir, *extra],
                check=True,
                stdout=subprocess.DEVNULL,
                cwd=ROOT,
            )
            times.append(time.perf_counter() - t0)
        out[name] = round(workload.median(times), 2)
    return out


# -- 4. interrupt and 5. recover ---------------------------------------------------------------


class HangingProvider:
    """A model that never answers: every call it starts is in flight at the SIGKILL."""

    name = "bench"

    def __init__(self, expected: int) -> None:
        self.started: set[str] = set()
        self.expected = expected
        self.all_started = trio.Event()

    async def complete(self, request: ModelRequest, emit: Emit) -> ModelReply:
        self.started.add(request.session_id)
        if len(self.started) >= self.expected:
            self.all_started.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")


async def interrupt(log_dir: str, first: int, count: int) -> None:
    provider = HangingProvider(count)
    async with perdure.open_runtime(
        log_dir, provider=provider, tools=[lookup], **runtime_options(10)
    ) as rt:
        async with trio.open_nursery() as nursery:
            for i in range(first, first + count):
                nursery.start_soon(rt.submit, sid_of(i), workload.USER_TEXT)
        await provider.all_started.wait()
        print('{"ready": true}', flush=True)
        await trio.sleep_forever()  # the parent SIGKILLs this process now


class FirstCallProvider(BenchProvider):
    """Notes the wall-clock time of each session's first model call, and answers it
    with the run's final text (so that what is measured is recovery, not the turns
    the resumed runs would go on with).

    ``wait``: seconds each call takes before it answers (0: at once). An instant
    answer makes the CPU to the last resumed call also hold the end of every run
    resumed before it (the reply's commit, the run's end, hibernation); with a wait
    as long as a real model's, the runs resumed first are still waiting for their
    model when the last call starts, so the CPU to it is what resuming costs."""

    def __init__(self, expected: int, wait: float = 0.0) -> None:
        super().__init__(0, record=False)
        self.first: dict[str, float] = {}
        self.expected = expected
        self.wait = wait
        self.all_called = trio.Event()
        # The process's CPU time (every thread, since its start) at the first and the
        # last of those calls: what the recovery costs, whatever the machine's load.
        self.cpu_at: list[float] = []

    async def complete(self, request: ModelRequest, emit: Emit) -> ModelReply:
        if request.session_id not in self.first:
            self.first[request.session_id] = time.time()
            if len(self.first) == 1:
                self.cpu_at.append(time.process_time())
            if len(self.first) >= self.expected:
                self.cpu_at.append(time.process_time())
                self.all_called.set()
        if self.wait:
            await trio.sleep(self.wait)
        return await super().complete(request, emit)


def recover(log_dir: str, count: int, spawned: float, model_wait: float = 0.0) -> dict[str, Any]:
    provider = FirstCallProvider(count, model_wait)
    marks: dict[str, float] = {}

    async def main() -> None:
        marks["enter"] = time.time()
        async with perdure.open_runtime(
            log_dir, provider=provider, tools=[lookup], **runtime_options(10)
        ) as rt:
            marks["yielded"] = time.time()
            marks["recovered"] = len(rt.recovered_sessions)
            with trio.fail_after(300):
                await provider.all_called.wait()
            marks["rss"] = current_rss_mib()

    trio.run(main)
    from_spawn = sorted(t - spawned for t in provider.first.values())
    from_open = sorted(t - marks["enter"] for t in provider.first.values())
    return {
        "interrupted": count,
        "model_wait_s": model_wait,
        "recovered_sessions": int(marks["recovered"]),
        "resumed_calls": len(from_spawn),
        "imports_s": round(marks["enter"] - spawned, 3),
        "open_runtime_yield_s": round(marks["yielded"] - marks["enter"], 3),
        "first_call_s": round(from_spawn[0], 3),
        "p50_call_s": round(_pct(from_spawn, 0.5), 3),
        "p99_call_s": round(_pct(from_spawn, 0.99), 3),
        "last_call_s": round(from_spawn[-1], 3),
        "first_call_from_open_s": round(from_open[0], 3),
        "last_call_from_open_s": round(from_open[-1], 3),
        "cpu_to_first_call_s": round(provider.cpu_at[0], 3),
        "cpu_to_last_call_s": round(provider.cpu_at[-1], 3),
        "rss_mib_after": round(marks["rss"], 1),
    }


# -- the orchestration ----------------------------------------------------------------------


def _child(*args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, __file__, *args], check=True, stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _interrupt_and_kill(log_dir: str, first: int, count: int) -> float:
    proc = subprocess.Popen(
        [sys.executable, __file__, "interrupt", log_dir, str(first), str(count)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert proc.stdout is not None
    began = time.perf_counter()
    line = proc.stdout.readline()
    if '"ready"' not in line:
        proc.kill()
        raise SystemExit(f"the interrupt step did not get ready: {line!r}")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return time.perf_counter() - began


def run(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    log_dir = str(workdir / "log")
    out: dict[str, Any] = {}
    used = 0  # sessions the steps so far gave a new run
    if not (Path(log_dir) / "data.mdb").exists():
        note(f"building {args.sessions} sessions of {args.turns} turns ...")
        out["build"] = _child("build", log_dir, str(args.sessions), str(args.turns))
    actives = [int(a) for a in str(args.active).split(",") if int(a)]
    for n in actives:
        # Each size on sessions no other step touched (the waves of several sizes, in
        # step and spread, must fit in the log: SESSIONS >= 2 x sum(ACTIVE x WAVES) +
        # INTERRUPTED).
        note(f"{args.waves} waves of {n} active sessions ...")
        counts = (str(n), str(args.waves), str(args.turns), str(used))
        out[f"active_{n}"] = _child("active", log_dir, *counts)
        used += n * args.waves
        note(f"{args.waves} waves of {n} active sessions, spread ...")
        counts = (str(n), str(args.waves), str(args.turns), str(used))
        out[f"active_{n}"]["spread"] = _child("active", log_dir, *counts, "spread")
        used += n * args.waves
    note("lists ...")
    out["lists"] = lists(workdir, log_dir)
    if args.interrupted:
        # Sessions after those the waves used, so each interrupted run is the second.
        first = used
        note(f"interrupting {args.interrupted} runs, then SIGKILL ...")
        out["interrupt_s"] = round(_interrupt_and_kill(log_dir, first, args.interrupted), 1)
        # The log as the SIGKILL left it, to run ``recover`` on again:
        # ``cp -r WORKDIR/log-killed/. WORKDIR/log/`` first.
        killed = workdir / "log-killed"
        shutil.copytree(log_dir, str(killed), dirs_exist_ok=True)
        note("recovering ...")
        # The copy's dirty pages on disk first: else the recovery's first fsync writes
        # them all out, and its first resumed call waits for that.
        os.sync()
        spawned = time.time()
        out["recover"] = _child("recover", log_dir, str(args.interrupted), repr(spawned))
        if args.recover_model_wait:
            # Again on the log as the SIGKILL left it, with a model that takes a while:
            # the CPU to the last resumed call without the ends of the runs before it.
            wait = args.recover_model_wait
            note(f"recovering again, the model taking {wait} s per call ...")
            shutil.rmtree(log_dir)
            shutil.copytree(str(killed), log_dir)
            os.sync()
            spawned = time.time()
            out["recover_waiting"] = _child(
                "recover", log_dir, str(args.interrupted), repr(spawned), "--model-wait", str(wait)
            )
    return out


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run")
    p.add_argument("workdir")
    p.add_argument("--sessions", type=int, default=100_000)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--active", default="1000", help="sessions active at once; a list: 100,1000")
    p.add_argument("--waves", type=int, default=5)
    p.add_argument("--interrupted", type=int, default=10_000)
    p.add_argument(
        "--recover-model-wait",
        type=float,
        default=1.0,
        help="recover a second time with a model taking this many seconds per call (0: not)",
    )
    for name, nargs in (("build", 3), ("active", "+"), ("interrupt", 3), ("recover", 3)):
        step = sub.add_parser(name)
        step.add_argument("args", nargs=nargs)
        if name == "recover":
            step.add_argument(
                "--model-wait",
                type=float,
                default=0.0,
                help="seconds each resumed model call takes before it answers (0: at once)",
            )
    args = parser.parse_args(argv)
    a = getattr(args, "args", [])
    if args.cmd == "run":
        emit(run(args))
    elif args.cmd == "build":
        emit(build(a[0], int(a[1]), int(a[2])))
    elif args.cmd == "active":
        spread = a[5:] == ["spread"]
        emit(trio.run(active, a[0], int(a[1]), int(a[2]), int(a[3]), int(a[4]), spread))
    elif args.cmd == "interrupt":
        trio.run(interrupt, a[0], int(a[1]), int(a[2]))
    elif args.cmd == "recover":
        emit(recover(a[0], int(a[1]), float(a[2]), args.model_wait))


if __name__ == "__main__":
    main(sys.argv[1:])
