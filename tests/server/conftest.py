"""Fixtures for the daemon tests: real ``perdure serve`` processes on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.daemon import Daemon

# Every session of a daemon follows the same script (replies are chosen by turn).

# Two tools, then a call that waits for a human, then the answer.
APPROVAL_SCRIPT: list[dict[str, Any]] = [
    {
        "text": "Looking it up and booking a slot.",
        "tool_uses": [
            {"name": "lookup", "input": {"query": "site"}},
            {"name": "book", "input": {"item": "slot"}},
        ],
    },
    {"text": "Deploying now.", "tool_uses": [{"name": "deploy", "input": {"target": "prod"}}]},
    {"text": "Deployed: all done."},
]

# Three model turns and four tools (SAFE, KEYED, a slow SAFE one, NEVER): about a
# second per run, long enough to be killed in the middle.
WORK_SCRIPT: list[dict[str, Any]] = [
    {
        "text": "Step one: looking up and booking.",
        "delay": 0.1,
        "tool_uses": [
            {"name": "lookup", "input": {"query": "q1"}},
            {"name": "book", "input": {"item": "room"}},
        ],
    },
    {
        "text": "Step two: a slow lookup, and a note.",
        "delay": 0.1,
        "tool_uses": [
            {"name": "slow_lookup", "input": {"query": "q2", "seconds": 0.4}},
            {"name": "send_note", "input": {"text": "booked"}},
        ],
    },
    {"text": "All done: looked up, booked, and noted.", "delay": 0.1},
]


@pytest.fixture(scope="module")
def api_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    daemon = Daemon(tmp_path_factory.mktemp("api"), APPROVAL_SCRIPT).start()
    yield daemon
    daemon.close()
