"""A model call overlaps the commit that starts it (docs/DESIGN.md, "What must be
durable before what"), on a real LMDB log with a slow disk.

* The next model call starts while the commit of the turn's tool result (and its
  ``GenerationStarted``) is still in flight (the run's first call waits for the
  run's start), yet a subscriber sees that record before
  any delta of the call, and the reply after it: nothing of a turn the log might not
  have reaches a client.
* When that commit fails, the early call is cancelled and whatever it reported is
  dropped: the result is committed again later, the model is asked again, and each
  reply is committed once.
"""

from __future__ import annotations

import math
import threading
import time
from contextlib import aclosing
from pathlib import Path
from typing import Any

import trio

import perdure
from perdure import ReplayPolicy, ToolContext, _faults
from perdure.providers.base import Emit, ModelReply, ModelRequest
from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse
from perdure.storage import LogUnavailable
from perdure.storage.records import GenerationCompleted, GenerationStarted, ToolCompleted


@perdure.tool(replay=ReplayPolicy.SAFE)
async def lookup(ctx: ToolContext, query: str) -> str:
    """Look something up."""
    return f"found {query}"


SCRIPT = [
    Reply(text="looking it up", tool_uses=[ToolUse("lookup", {"query": "a"})]),
    Reply(text="found it, and here is a longer answer to stream"),
]


class Probe(ScriptedProvider):
    """Notes, for every call, whether its ``GenerationStarted`` was in the log yet."""

    def __init__(self, replies: list[Reply]) -> None:
        super().__init__(replies)
        self.log: Any = None
        self.durable_at_start: list[tuple[str, bool]] = []

    async def complete(self, request: ModelRequest, emit: Emit) -> ModelReply:
        records = [c.record for c in self.log.read_session(request.session_id)]
        started = any(
            isinstance(r, GenerationStarted) and r.generation_id == request.generation_id
            for r in records
        )
        self.durable_at_start.append((request.generation_id, started))
        return await super().complete(request, emit)


async def test_a_model_call_overlaps_its_commit_and_clients_see_nothing_early(
    tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setattr(_faults, "SLOW_COMMIT", 0.05)  # the writer waits before each commit
    probe = Probe(SCRIPT)
    seen: list[tuple[str, Any]] = []
    async with perdure.open_runtime(tmp_path / "log", provider=probe, tools=[lookup]) as rt:
        probe.log = rt._journal.log
        await rt.create_session("s")

        async def watch() -> None:
            async with aclosing(rt.events("s")) as events:
                async for event in events:
                    generation = (
                        event.record.generation_id
                        if isinstance(event.record, GenerationStarted | GenerationCompleted)
                        else (event.data or {}).get("generation_id")
                    )
                    seen.append((event.kind, generation))
                    if event.kind == "RunFinished":
                        return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            await trio.sleep(0.2)  # subscribed
            await rt.submit("s", "go", request_id="r1")
            with trio.fail_after(20):
                outcome = await rt.wait_idle("s")
        assert outcome is not None and outcome.status == "completed"
    generations = [g for g, _ in probe.durable_at_start]
    assert len(generations) == 2
    # The run's first call waits for the run's start; the next turn's call does not.
    assert [durable for _, durable in probe.durable_at_start] == [True, False]
    for g in generations:
        kinds = [(i, kind) for i, (kind, gen) in enumerate(seen) if gen == g]
        started = next(i for i, kind in kinds if kind == "GenerationStarted")
        completed = next(i for i, kind in kinds if kind == "GenerationCompleted")
        deltas = [i for i, kind in kinds if kind in ("model_call", "text_delta")]
        assert deltas, f"{g}: the call streamed nothing to look at"
        assert started < min(deltas) and max(deltas) < completed, (g, seen)


async def test_a_failed_commit_calls_off_the_model_call_it_overlapped(tmp_path: Path) -> None:
    probe = Probe(SCRIPT)
    async with perdure.open_runtime(tmp_path / "log", provider=probe, tools=[lookup]) as rt:
        log: Any = rt._journal.log
        probe.log = log
        real_commit = log.commit
        failed = []

        def commit(batches: Any) -> Any:
            records = [r for records, _ in batches for r in records]
            if not failed and any(isinstance(r, ToolCompleted) for r in records):
                failed.append(True)
                time.sleep(0.1)  # the early model call has answered: it waits for this commit
                raise LogUnavailable("the disk went away for a moment")
            return real_commit(batches)

        log.commit = commit
        await rt.create_session("s")
        await rt.submit("s", "go", request_id="r1")
        with trio.fail_after(20):
            outcome = await rt.wait_idle("s")
        committed = [c.record for c in await rt._journal.read_session("s")]
    assert failed and outcome is not None and outcome.status == "completed"
    replies = [r for r in committed if isinstance(r, GenerationCompleted)]
    assert [r.text for r in replies] == [SCRIPT[0].text, SCRIPT[1].text]
    second = replies[1].generation_id
    calls = [g for g, _ in probe.durable_at_start if g == second]
    assert len(calls) == 2, "the call whose commit failed was made again"
    assert probe.calls == 3
    assert len([r for r in committed if isinstance(r, ToolCompleted)]) == 1


class Thinking(Probe):
    """A model that takes ``think`` seconds to answer; notes when each call starts and ends."""

    def __init__(self, replies: list[Reply], think: float) -> None:
        super().__init__(replies)
        self.think = think
        self.spans: list[tuple[float, float]] = []

    async def complete(self, request: ModelRequest, emit: Emit) -> ModelReply:
        began = time.perf_counter()
        reply = await super().complete(request, emit)
        await trio.sleep(self.think)
        self.spans.append((began, time.perf_counter()))
        return reply


async def test_on_a_quick_disk_the_loop_commits_the_overlapped_results_while_the_model_thinks(
    tmp_path: Path,
) -> None:
    """Where the loop commits (a quick local disk), the results' commit that a model call
    overlaps is made on the trio thread, after the call has started and before it has
    answered: no thread hand-off, and its fsync beside the model's time."""
    probe = Thinking(SCRIPT, think=0.2)
    commits: list[tuple[float, int, list[str]]] = []
    async with perdure.open_runtime(tmp_path / "log", provider=probe, tools=[lookup]) as rt:
        log: Any = rt._journal.log
        probe.log = log
        real_commit = log.commit

        def commit(batches: Any) -> Any:
            names = [type(r).__name__ for records, _ in batches for r in records]
            commits.append((time.perf_counter(), threading.get_ident(), names))
            return real_commit(batches)

        log.commit = commit
        rt._journal.loop_commit_budget = math.inf  # a quick disk, whatever this machine's
        loop_thread = threading.get_ident()
        await rt.create_session("s")
        await rt.submit("s", "go", request_id="r1")
        with trio.fail_after(20):
            outcome = await rt.wait_idle("s")
    assert outcome is not None and outcome.status == "completed"
    assert [durable for _, durable in probe.durable_at_start] == [True, False]
    at, thread, names = next(c for c in commits if "ToolCompleted" in c[2])
    assert names == ["ToolCompleted", "GenerationStarted"], names
    assert thread == loop_thread, "the overlapped commit went to the writer thread"
    began, answered = probe.spans[1]
    assert began < at < answered, "committed beside the model's time, not before the call"
