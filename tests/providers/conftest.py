"""Fixtures for provider tests: a fake Messages API server and a provider wired to it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import anthropic
import pytest

from perdure.providers.anthropic import AnthropicProvider
from tests.fake_anthropic import FakeAnthropic


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as server:
        yield server


def sdk_client(url: str, *, timeout: float = 30.0) -> anthropic.AsyncAnthropic:
    """The real SDK client, pointed at ``url``, with its own retries off."""
    return anthropic.AsyncAnthropic(
        api_key="sk-ant-test", base_url=url, max_retries=0, timeout=timeout
    )


@pytest.fixture
async def provider(fake: FakeAnthropic) -> AsyncIterator[AnthropicProvider]:
    async with sdk_client(fake.url) as client:
        yield AnthropicProvider(model="claude-test", max_tokens=1024, client=client)
