"""What the runtime-level provider tests share: tools the model may call, and a runtime.

``runtime`` opens a runtime with fast back-offs on a test's log; ``ask`` submits one
input to a new session and waits for its outcome; ``ask_collecting`` does the same
while collecting the session's live events. ``retried_durably``, ``failed_at_once``
and ``gave_up`` are what every SDK-backed provider must show inside the runtime.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing, asynccontextmanager
from pathlib import Path
from typing import Any

import trio

import perdure
from perdure import Event, ReplayPolicy, Runtime, open_runtime
from perdure.providers.base import Provider
from perdure.storage.records import GenerationCompleted, Record, RetryPending, RunFinished
from tests.support.fake_vendor import FakeVendor
from tests.support.fold import fold_of

# -- tools the model may call ------------------------------------------------------------------


@perdure.tool(replay=ReplayPolicy.SAFE)
async def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


LOOKUPS_STARTED: dict[str, trio.Event] = {}


@perdure.tool(replay=ReplayPolicy.SAFE)
async def lookup(key: str) -> str:
    """Look a key up in a small table."""
    # Each lookup waits until the other one has started: two calls of one turn that ran
    # one after the other would never get here (and time out instead). A lone lookup
    # (no partner in the turn) waits for nobody.
    LOOKUPS_STARTED.setdefault(key, trio.Event()).set()
    other = "omega" if key == "alpha" else "alpha"
    if other in PARTNERS.get(key, ()):
        with trio.fail_after(10):
            await LOOKUPS_STARTED.setdefault(other, trio.Event()).wait()
    await trio.sleep(0.01 if key == "alpha" else 0)  # finish out of order
    return {"alpha": "first letter", "omega": "last letter"}[key]


PARTNERS: dict[str, tuple[str, ...]] = {}  # a test sets which lookups must overlap


@perdure.tool(replay=ReplayPolicy.NEVER)
async def deploy(service: str) -> str:
    """Deploy a service (always fails here)."""
    raise RuntimeError(f"cluster for {service} is unreachable")


# -- helpers --------------------------------------------------------------------------------


@asynccontextmanager
async def runtime(log_dir: Path, provider: Provider, **options: Any) -> AsyncIterator[Runtime]:
    options.setdefault("retry_base", 0.01)
    options.setdefault("retry_cap", 1.0)
    options.setdefault("tools", [add, lookup, deploy])
    async with open_runtime(log_dir, provider=provider, seed=7, **options) as rt:
        yield rt


async def ask(rt: Runtime, text: str, *, system: str | None = None) -> tuple[str, RunFinished]:
    sid = await rt.create_session(system=system)
    await rt.submit(sid, text)
    outcome = await rt.wait_idle(sid)
    assert outcome is not None
    return sid, outcome


async def records(rt: Runtime, sid: str) -> list[Record]:
    return [c.record for c in await rt._journal.read_session(sid)]


def of(kind: type, items: Sequence[Record]) -> list[Any]:
    return [r for r in items if isinstance(r, kind)]


async def ask_collecting(
    rt: Runtime, text: str, *, system: str | None = None
) -> tuple[str, list[Event]]:
    """Submit ``text`` while collecting the session's live events until the run finishes."""
    sid = await rt.create_session(system=system)
    events: list[Event] = []

    async def collect(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with aclosing(rt.events(sid)) as stream:
            async for event in stream:
                events.append(event)
                if len(events) == 1:  # the replayed SessionCreated: subscribed
                    task_status.started()
                if event.kind == "RunFinished":
                    return

    async with trio.open_nursery() as nursery:
        await nursery.start(collect)
        await rt.submit(sid, text)
    return sid, events


# -- checks every SDK-backed provider must pass --------------------------------------------


async def retried_durably(
    log_dir: Path, provider: Provider, fake: FakeVendor[Any], failure: Any, answer: Any
) -> tuple[RetryPending, GenerationCompleted, list[Record]]:
    """``failure`` then ``answer``: one durable RetryPending, then the reply of attempt 2.
    ``answer`` must say "Recovered answer."; partial text of the failure must never be
    stored (write it as "PARTIAL ...")."""
    fake.script(failure, answer)
    async with runtime(log_dir, provider) as rt:
        sid, outcome = await ask(rt, "Say something.")
        committed = await records(rt, sid)
        state = await fold_of(rt, sid)
    assert outcome.status == "completed"
    assert outcome.final_text == "Recovered answer."
    (pending,) = of(RetryPending, committed)
    assert pending.attempt == 1
    assert pending.error
    (gen,) = of(GenerationCompleted, committed)
    assert gen.attempt == 2
    # the RetryPending record was committed before the reply (and so before the sleep)
    assert committed.index(pending) < committed.index(gen)
    assert state.generations[gen.generation_id].attempt == 2
    assert len(fake.requests) == 2
    assert "PARTIAL" not in repr(committed)  # no partial text in any record
    return pending, gen, committed


async def failed_at_once(
    log_dir: Path, provider: Provider, fake: FakeVendor[Any], failure: Any
) -> RunFinished:
    """A non-retryable ``failure``: the run fails after one request, with no retry."""
    fake.script(failure)
    async with runtime(log_dir, provider) as rt:
        sid, outcome = await ask(rt, "Go.")
        committed = await records(rt, sid)
    assert outcome.status == "failed"
    assert "non-retryable" in outcome.reason
    assert of(RetryPending, committed) == []
    assert of(GenerationCompleted, committed) == []
    assert len(fake.requests) == 1
    return outcome


async def gave_up(
    log_dir: Path, provider: Provider, fake: FakeVendor[Any], failure: Any
) -> RunFinished:
    """``failure`` every time: the run fails after ``max_model_attempts=3`` attempts."""
    fake.set_default(failure)
    async with runtime(log_dir, provider, max_model_attempts=3) as rt:
        sid, outcome = await ask(rt, "Go.")
        committed = await records(rt, sid)
    assert outcome.status == "failed"
    assert "3 attempts" in outcome.reason
    assert [p.attempt for p in of(RetryPending, committed)] == [1, 2]
    assert len(fake.requests) == 3
    return outcome
