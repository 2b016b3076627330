"""What the runtime-level provider tests share: tools the model may call, and a runtime.

``runtime`` opens a runtime with fast back-offs on a test's log; ``ask`` submits one
input to a new session and waits for its outcome; ``ask_collecting`` does the same
while collecting the session's live events.
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
from perdure.storage.records import Record, RunFinished

# -- tools the model may call ------------------------------------------------------------------


@perdure.tool(replay=ReplayPolicy.SAFE)
async def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@perdure.tool(replay=ReplayPolicy.SAFE)
async def lookup(key: str) -> str:
    """Look a key up in a small table."""
    await trio.sleep(0.01 if key == "alpha" else 0)  # finish out of order
    return {"alpha": "first letter", "omega": "last letter"}[key]


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
    return [c.record for c in await rt.journal.read_session(sid)]


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
