"""The actor shape alone: what perdure's message flow costs with none of its logic.

    python bench/skeleton.py LOG SESSIONS K [log|nolog]

The same workload as ``perdure_bench.py concurrency`` (SESSIONS sessions, each
submitted one input of K tool-calling turns, all at once), through a skeleton of
perdure's actors: one trio task per session with a mailbox (a memory channel); per
model call and per tool call a child task in the session's nursery, under a cancel
scope of its own, that reports back through the mailbox; and between them the very
records a perdure run commits (captured from a real run first, then re-addressed to
each session), appended through perdure's real ``Journal`` over a real ``LmdbLog``,
with group commit and commits on the idle loop, ``durability="full"``. The submit and
the wait for the session to go idle are each a message and a reply, as with the
runtime.

What it leaves out is everything perdure decides: no state, no fold, no decision,
no conversation or model request, no validation of the tool's arguments, no
supervisor. Its CPU per turn is the part of perdure's that the shape itself costs
(trio's tasks, scopes and channels, the Journal, encoding, LMDB), so perdure's CPU
per turn minus it is what its logic costs, measured in the same run. ``nolog``
replaces each append by a schedule point (the wait an append is), to split the
shape's cost between trio and the log.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import perdure
from bench import workload
from bench.agent import BenchProvider, lookup, runtime_options
from bench.common import emit
from perdure.storage.backend import Guard
from perdure.storage.journal import Journal, open_journal
from perdure.storage.lmdb_log import LmdbLog
from perdure.storage.records import Record


@attrs.frozen
class _Batches:
    """A run's commits, as perdure made them: the submit, a turn's two, the last."""

    created: tuple[Record, ...]
    submit: tuple[Record, ...]
    reply: tuple[Record, ...]  # the model's tool call, its task, its start
    result: tuple[Record, ...]  # the tool's result and the next model call's start
    final: tuple[Record, ...]  # the model's answer and the end of the run

    def for_session(self, sid: str) -> _Batches:
        def moved(batch: tuple[Record, ...]) -> tuple[Record, ...]:
            return tuple(attrs.evolve(r, session_id=sid) for r in batch)  # type: ignore[misc]

        return _Batches(*(moved(getattr(self, f.name)) for f in attrs.fields(_Batches)))


async def _capture(log: str) -> _Batches:
    """Run one 3-turn perdure session and keep the records of each of its commits."""
    k = 3
    provider = BenchProvider(k, record=False)
    batches: list[tuple[Record, ...]] = []
    async with perdure.open_runtime(
        log, provider=provider, tools=[lookup], **runtime_options(k)
    ) as rt:
        real = rt._journal.log.commit

        def keeping(pending: Sequence[Any]) -> Any:
            batches.extend(tuple(records) for records, _ in pending)
            return real(pending)

        rt._journal.log.commit = keeping  # type: ignore[method-assign]
        sid = await rt.create_session("captured")
        await rt.submit(sid, workload.USER_TEXT, request_id="captured-1")
        await rt.wait_idle(sid)
    names = [[type(r).__name__ for r in b] for b in batches]
    expected = [
        ["SessionCreated"],
        ["InputAccepted", "RunStarted", "GenerationStarted"],
        ["GenerationCompleted", "ToolTaskCreated", "ToolExecuting"],
        ["ToolCompleted", "GenerationStarted"],
    ]
    assert names[:4] == expected and names[-1] == ["GenerationCompleted", "RunFinished"], names
    return _Batches(batches[0], batches[1], batches[2], batches[3], batches[-1])


@attrs.frozen
class _Submit:
    done: trio.Event


@attrs.frozen
class _WaitIdle:
    done: trio.Event


_REPLIED = object()  # what a model or tool task reports


async def _child(
    scope: trio.CancelScope, outbox: trio.MemorySendChannel[Any], starts: list[float] | None
) -> None:
    # A model call or a tool call: its own scope, one report, as run_tool and call_model.
    # A model call notes when it starts, as the benchmark's fake provider does.
    with scope:
        if starts is not None:
            starts.append(time.perf_counter())
        outbox.send_nowait(_REPLIED)


async def _session(
    journal: Journal,
    sid: str,
    batches: _Batches,
    k: int,
    inbox: trio.MemoryReceiveChannel[Any],
    outbox: trio.MemorySendChannel[Any],
    use_log: bool,
    starts: list[float],
) -> None:
    guard = Guard(sid, 0)

    async def append(records: tuple[Record, ...]) -> None:
        if use_log:
            await journal.append(records, guard=guard)
        else:
            await trio.lowlevel.checkpoint()

    waiting: list[trio.Event] = []  # callers waiting for the run to end

    async def call(nursery: trio.Nursery, model: bool) -> None:
        nursery.start_soon(_child, trio.CancelScope(), outbox, starts if model else None)
        while True:
            message = await inbox.receive()
            if message is _REPLIED:
                return
            assert isinstance(message, _WaitIdle), message
            waiting.append(message.done)

    async with trio.open_nursery() as nursery:
        async for message in inbox:
            if isinstance(message, _WaitIdle):  # already idle
                message.done.set()
                continue
            assert isinstance(message, _Submit), message
            await append(batches.submit)
            message.done.set()
            for _ in range(k):
                await call(nursery, True)  # the model call
                await append(batches.reply)
                await call(nursery, False)  # the tool call
                await append(batches.result)
            await call(nursery, True)  # the model's answer
            await append(batches.final)
            for done in waiting:
                done.set()
            waiting.clear()


async def skeleton(log: str, sessions: int, k: int, mode: str = "log") -> dict[str, Any]:
    if mode not in ("log", "nolog"):
        raise SystemExit(f"unknown mode {mode!r}: log or nolog")
    with tempfile.TemporaryDirectory() as scratch:
        batches = await _capture(scratch)
    sids = ["warm-up"] + [f"s-{i:06d}" for i in range(sessions)]
    per_session = {sid: batches.for_session(sid) for sid in sids}
    log_backend = LmdbLog(log, durability="full")
    try:
        async with open_journal(log_backend) as journal, trio.open_nursery() as nursery:
            mailboxes = {}
            starts: dict[str, list[float]] = {sid: [] for sid in sids}
            for sid in sids:
                await journal.append(per_session[sid].created)
                send, receive = trio.open_memory_channel[Any](64)
                mailboxes[sid] = send
                nursery.start_soon(
                    _session,
                    journal,
                    sid,
                    per_session[sid],
                    k,
                    receive,
                    send,
                    mode == "log",
                    starts[sid],
                )

            async def drive(sid: str) -> None:
                submitted, idle = trio.Event(), trio.Event()
                await mailboxes[sid].send(_Submit(submitted))
                await submitted.wait()
                await mailboxes[sid].send(_WaitIdle(idle))
                await idle.wait()

            await drive("warm-up")  # one-time costs are not charged to the first turns
            sids.remove("warm-up")
            stats = journal.stats
            transactions, appends, records = stats.transactions, stats.appends, stats.records
            commit_s = [0.0]
            journal.commit_listeners.append(
                lambda _, took: commit_s.__setitem__(0, commit_s[0] + took)
            )
            cpu = time.process_time()
            start = time.perf_counter()
            async with trio.open_nursery() as drivers:
                for sid in sids:
                    drivers.start_soon(drive, sid)
            elapsed = time.perf_counter() - start
            cpu = time.process_time() - cpu
            transactions = stats.transactions - transactions
            appends, records = stats.appends - appends, stats.records - records
            for send in mailboxes.values():
                await send.aclose()
    finally:
        log_backend.close()
    result = {
        "system": "actor skeleton" + ("" if mode == "log" else ", no log"),
        "sessions": sessions,
        "k": k,
        "elapsed_s": elapsed,
        "turns_per_s": sessions * k / elapsed,
        "cpu_ms_per_turn": cpu / (sessions * k) * 1e3,
        "commits": transactions,
        "commits_per_turn": transactions / (sessions * k),
        "commits_per_s": transactions / elapsed,
        "appends_per_commit": appends / transactions if transactions else None,
        "records_per_commit": records / transactions if transactions else None,
        # The backend's commits (encoding, LMDB, the fsync's wait), per turn.
        "commit_ms_per_turn": commit_s[0] / (sessions * k) * 1e3,
        "records_per_turn": (
            len(batches.submit)
            + k * (len(batches.reply) + len(batches.result))
            + len(batches.final)
        )
        / k,
    }
    if sessions == 1:  # per-turn latency, as ``perdure_bench.py turns`` measures it
        result |= workload.turn_stats(starts[sids[0]])
    return result


if __name__ == "__main__":
    emit(trio.run(skeleton, sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:5]))
