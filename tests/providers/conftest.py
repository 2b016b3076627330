"""Fixtures for provider tests: fake Anthropic and OpenAI servers, providers wired to them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import anthropic
import openai
import pytest

from perdure.providers.anthropic import AnthropicProvider
from perdure.providers.openai import Api, OpenAIProvider
from tests.fake_anthropic import FakeAnthropic
from tests.fake_openai import FakeOpenAI


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


@pytest.fixture
def fake_oa() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


def openai_client(url: str, *, timeout: float = 30.0) -> openai.AsyncOpenAI:
    """The real ``openai`` SDK client, pointed at ``url``, with its own retries off."""
    return openai.AsyncOpenAI(api_key="sk-test", base_url=url, max_retries=0, timeout=timeout)


@pytest.fixture(params=["chat", "responses"])
def api(request: pytest.FixtureRequest) -> Api:
    """Both OpenAI APIs: Chat Completions and Responses."""
    value: Api = request.param
    return value


@pytest.fixture
async def oa_provider(fake_oa: FakeOpenAI, api: Api) -> AsyncIterator[OpenAIProvider]:
    async with openai_client(fake_oa.url) as client:
        yield OpenAIProvider(model="gpt-test", client=client, api=api)
