"""A long session through both vendors' SDKs stays within its context window.

Forty turns against each fake vendor (Anthropic; OpenAI's Responses API), with a
window of 1,500 tokens that the conversation outgrows several times: every run
completes, several compactions happen, and no request after the first compaction is
larger than the one that triggered it. The 500-turn run is ``bench/compaction.py``.
"""

from __future__ import annotations

from pathlib import Path

from perdure.providers.anthropic import AnthropicProvider
from perdure.providers.openai import OpenAIProvider
from tests import fake_anthropic as fa
from tests import fake_openai as fo
from tests.providers.conftest import openai_client, sdk_client
from tests.providers.long_session import ANSWER, Figures, run_long_session

TURNS = 40
WINDOW = 1500


def bounded(figures: Figures) -> None:
    assert figures.completed == TURNS
    assert len(figures.compactions) >= 3, figures.compactions
    first = figures.compactions[0]["turn"]
    peak = max(figures.request_bytes[: first + 1])
    assert max(figures.request_bytes[first + 1 :]) <= peak, figures.request_bytes
    assert peak <= WINDOW * 4 * 1.25  # about a window's worth of characters
    for c in figures.compactions:
        assert c["tokens_after"] < c["tokens_before"]


async def test_a_long_session_through_anthropic(log_dir: Path) -> None:
    with fa.FakeAnthropic(default=fa.Reply(content=[fa.Text(ANSWER)])) as fake:
        fake.measure_input = True
        async with sdk_client(fake.url) as client:
            provider = AnthropicProvider(model="claude-test", max_tokens=1024, client=client)
            bounded(await run_long_session(log_dir, provider, fake, TURNS, WINDOW))


async def test_a_long_session_through_openai(log_dir: Path) -> None:
    with fo.FakeOpenAI(default=fo.Reply(content=[fo.Text(ANSWER)])) as fake:
        fake.measure_input = True
        async with openai_client(fake.url) as client:
            provider = OpenAIProvider(model="gpt-test", client=client, api="responses")
            bounded(await run_long_session(log_dir, provider, fake, TURNS, WINDOW))
