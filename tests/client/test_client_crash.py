"""The clients through a SIGKILLed daemon: a submit retried with its request id lands
once, and an event stream resumes across the restart (after a crash or a graceful
stop) with no gap and no duplicate.

Each test runs for the sync client and the async client under asyncio and trio.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from contextlib import aclosing
from typing import Any

import anyio
import anyio.to_thread
import pytest

from perdure.client import EphemeralEvent, RecordEvent, is_final
from tests.client.conftest import run
from tests.server.conftest import WORK_SCRIPT
from tests.server.test_streams import expected_seqs
from tests.support.daemon import Daemon


def test_a_submit_whose_answer_is_lost_in_a_crash_is_retried_and_lands_once(
    flavor: str, make_daemon: Callable[..., Daemon]
) -> None:
    daemon = make_daemon(WORK_SCRIPT).start()
    with daemon.client() as http:
        assert http.post("/v1/sessions", json={"session_id": "s1"}).status_code == 201
    daemon.stop()
    # The next daemon dies right after its first Journal commit is durable (LogOpened is
    # written when the log opens, not by the Journal): the submitted input, before the
    # client has its answer.
    daemon.fault = "commit@1"
    daemon.start()
    crashed = daemon.proc
    assert crashed is not None

    async def scenario(client: Any) -> None:
        answers = []

        async def submit() -> None:
            answers.append(await client.submit("s1", "do the work"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(submit)
            # The client is retrying meanwhile (connection refused): a new daemon comes up.
            assert await anyio.to_thread.run_sync(crashed.wait) == -signal.SIGKILL
            await anyio.to_thread.run_sync(daemon.start)
        [accepted] = answers
        assert accepted.duplicate  # the first attempt was recorded; the retry was deduplicated
        outcome = await client.wait_idle("s1")
        assert outcome is not None and outcome.status == "completed"
        async with aclosing(client.events("s1", live=False)) as stream:
            records = [e async for e in stream if isinstance(e, RecordEvent)]
        inputs = [e for e in records if e.type == "InputAccepted"]
        assert [e.record["submission_id"] for e in inputs] == [accepted.submission_id]
        assert [e.seq for e in inputs] == [accepted.seq]
        finals = [e for e in records if is_final(e)]
        assert len(finals) == 1 and finals[0].record["status"] == "completed"

    run(flavor, daemon, scenario)
    assert daemon.stop() == 0


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_an_event_stream_resumes_across_a_daemon_restart_without_gap_or_duplicate(
    flavor: str, how: str, make_daemon: Callable[..., Daemon]
) -> None:
    daemon = make_daemon(WORK_SCRIPT).start()
    seen: list[RecordEvent] = []
    deltas: list[EphemeralEvent] = []

    async def scenario(client: Any) -> None:
        await client.create_session("s1")
        accepted = await client.submit("s1", "do the work", request_id="task-1")
        async with anyio.create_task_group() as tg, aclosing(client.events("s1")) as stream:
            async for event in stream:
                if isinstance(event, EphemeralEvent):
                    deltas.append(event)
                    continue
                seen.append(event)
                slow = event.type == "ToolExecuting" and event.record["tool_name"] == "slow_lookup"
                if slow and daemon.starts == 1:
                    # SIGKILL (a crash: the connection breaks) or SIGTERM (the daemon
                    # ends the stream) mid-tool, and bring the daemon back while the
                    # iterator is reconnecting on its own.
                    stop = daemon.kill if how == "SIGKILL" else daemon.stop
                    await anyio.to_thread.run_sync(stop)
                    tg.start_soon(anyio.to_thread.run_sync, daemon.restart)
                if is_final(event):
                    break
        assert daemon.starts == 2
        assert seen[-1].record["submission_id"] == accepted.submission_id
        assert seen[-1].record["status"] == "completed"
        outcome = await client.wait_idle("s1")
        assert outcome is not None and outcome.run_id == seen[-1].record["run_id"]

    run(flavor, daemon, scenario)
    assert daemon.stop() == 0
    seqs = [e.seq for e in seen]
    expected = expected_seqs(daemon.log, "s1")
    assert seqs == [s for s in expected if s <= seqs[-1]]  # no gap, no duplicate, in order
    types = [e.type for e in seen]
    assert "LogOpened" in types[types.index("ToolExecuting") :]  # the restart, in its place
    assert any(e.type == "RecoveryDecision" for e in seen)  # the interrupted run resumed
    assert all(e.session_id == "s1" for e in deltas)
