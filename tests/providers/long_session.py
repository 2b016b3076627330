"""A long session against a fake vendor with a small context window: the figures per turn.

``run_long_session`` drives ``turns`` inputs through one session of a runtime whose
provider talks to a fake vendor (``tests/fake_anthropic.py``, ``tests/fake_openai.py``)
that reports each request's size as its input tokens, under a context window of
``window`` tokens. Every reply answers at length, so the conversation outgrows the
window many times over. It returns, per turn, the size of the request the model got
(JSON bytes), and for each compaction its cost (the summary call's tokens, its
seconds). The CI test (``test_compaction_long.py``) runs a few dozen turns;
``bench/compaction.py`` runs 500 and writes the figures.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import attrs

import perdure
from perdure.providers.base import Provider
from perdure.storage.records import (
    CompactionStarted,
    ContextCompacted,
    GenerationCompleted,
)
from tests.support.fake_vendor import FakeVendor

ANSWER = (
    "Here is a detailed answer with the figures you asked for, the reasoning behind them "
    "and what to check next; it is long on purpose so that the conversation grows. "
) * 2


@attrs.frozen
class Figures:
    turns: int
    request_bytes: list[int]  # the size of each turn's request to the model, in order
    compactions: list[dict[str, Any]]  # per compaction: turn, items, tokens, seconds
    completed: int  # runs that completed
    seconds: float


async def run_long_session(
    log: Path, provider: Provider, fake: FakeVendor[Any], turns: int, window: int
) -> Figures:
    policy = perdure.CompactionPolicy(window=window, keep_recent=4)
    started = time.perf_counter()
    completed = 0
    async with perdure.open_runtime(
        log, provider=provider, compaction=policy, retry_base=0.01, idle_timeout=None
    ) as rt:
        sid = await rt.create_session("long", system="Answer at length.")
        for n in range(turns):
            await rt.submit(
                sid, f"Question {n}: and what about the next figure?", request_id=f"q{n}"
            )
            outcome = await rt.wait_idle(sid)
            completed += outcome is not None and outcome.status == "completed"
        stored = [c.record for c in await rt._journal.read_session(sid)]
    seconds = time.perf_counter() - started
    sizes = [
        len(json.dumps(r.body))
        for r in fake.requests
        if json.dumps(r.body).find("Answer at length.") >= 0
    ]
    starts = {r.compaction_id: r for r in stored if isinstance(r, CompactionStarted)}
    replies = [r for r in stored if isinstance(r, GenerationCompleted)]
    compactions = []
    for done in (r for r in stored if isinstance(r, ContextCompacted)):
        began = starts[done.compaction_id]
        turn = sum(1 for r in replies if r.at <= began.at)
        compactions.append(
            {
                "turn": turn,
                "items": [done.start, done.end],
                "tokens_before": done.tokens_before,
                "tokens_after": done.tokens_after,
                "summary_input_tokens": done.usage.input_tokens,
                "summary_output_tokens": done.usage.output_tokens,
                "seconds": round(done.at - began.at, 4),
            }
        )
    return Figures(turns, sizes, compactions, completed, seconds)
