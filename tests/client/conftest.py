"""Run one client scenario three ways: the sync client, the async client on asyncio and on trio.

A scenario is an async function of a client with awaitable methods. For the sync
client each call runs in a worker thread (``Threaded``), so every scenario
exercises the sync code path too; the async client runs natively under
``asyncio.run`` and ``trio.run``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from functools import partial
from typing import Any

import anyio
import anyio.to_thread
import pytest
import trio

from perdure.client import AsyncPerdureClient, PerdureClient, Retry, StreamEvent
from tests.support.daemon import Daemon

FLAVORS = ["sync", "asyncio", "trio"]
_END = object()


class Threaded:
    """``PerdureClient`` behind awaitable methods: each call runs in a worker thread."""

    def __init__(self, client: PerdureClient) -> None:
        self.client = client

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        fn = getattr(self.client, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await anyio.to_thread.run_sync(partial(fn, *args, **kwargs))

        return call

    async def events(self, session_id: str, **kwargs: Any) -> AsyncGenerator[StreamEvent, None]:
        stream = self.client.events(session_id, **kwargs)
        try:
            while True:
                event = await anyio.to_thread.run_sync(next, stream, _END)
                if event is _END:
                    return
                yield event
        finally:
            await anyio.to_thread.run_sync(stream.close)


Scenario = Callable[[Any], Awaitable[None]]


def run(flavor: str, daemon: Daemon, scenario: Scenario, *, token: str | None = None) -> None:
    """Run ``scenario(client)`` with a client of ``daemon`` of the given flavor."""
    retry = Retry(timeout=60.0)
    auth = token if token is not None else daemon.token

    async def with_async() -> None:
        with anyio.fail_after(180):
            async with AsyncPerdureClient(daemon.url, auth, retry=retry) as client:
                await scenario(client)

    if flavor == "sync":

        async def with_sync() -> None:
            with anyio.fail_after(180):
                with PerdureClient(daemon.url, auth, retry=retry) as client:
                    await scenario(Threaded(client))

        asyncio.run(with_sync())
    elif flavor == "asyncio":
        asyncio.run(with_async())
    else:
        trio.run(with_async)


@pytest.fixture(params=FLAVORS)
def flavor(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def approval_daemon(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.server.conftest import APPROVAL_SCRIPT

    daemon = Daemon(tmp_path_factory.mktemp("client"), APPROVAL_SCRIPT).start()
    yield daemon
    daemon.close()


@pytest.fixture(scope="module")
def people_daemon(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.client.tools import SCRIPT

    root = tmp_path_factory.mktemp("client-people")
    daemon = Daemon(root, SCRIPT, tools="tests.client.tools:TOOLS").start()
    yield daemon
    daemon.close()
