"""SIGKILL during an OpenAI retry back-off: the restarted process retries at the recorded time.

A child process runs the runtime with ``OpenAIProvider`` against the fake OpenAI
server in this (parent) process. The server answers 429 with a ``retry-after``;
once the ``RetryPending`` record is durable the parent kills the child with
SIGKILL in the middle of its back-off, lets the server succeed, and starts the
child again. The run must complete with exactly one committed reply, the record
must be unchanged, and the retry must not be sent before the time it promised.
"""

from __future__ import annotations

import json
from pathlib import Path

from perdure.storage.records import (
    GenerationCompleted,
    RecoveryDecision,
    RetryPending,
    RunFinished,
)
from tests.fake_openai import FakeOpenAI, HttpError, Reply, Text
from tests.providers._kill import (
    BACK_OFF,
    child_env,
    kill_in_back_off,
    of,
    read_log,
    run_to_the_end,
    start_child,
)


def test_sigkill_during_openai_back_off_resumes_the_retry(tmp_path: Path) -> None:
    log = tmp_path / "log"
    with FakeOpenAI() as fake:
        fake.script(
            HttpError(
                status=429,
                type="requests",
                code="rate_limit_exceeded",
                message="Rate limit reached for requests",
                headers={"retry-after": str(BACK_OFF)},
            )
        )
        env = child_env(openai=fake.url)
        out1 = tmp_path / "child1.out"
        pending = kill_in_back_off(log, start_child(log, env, out1, "openai"), out1, fake, sent=1)

        fake.script(Reply(content=[Text("Recovered after the crash.")]))
        output = run_to_the_end(log, env, tmp_path / "child2.out", "openai")
        requests = fake.requests

    result = json.loads(output.strip().splitlines()[-1])
    assert result["status"] == "completed", result
    assert result["text"] == "Recovered after the crash."
    assert result["recovered_sessions"] == ["s-kill"]
    assert pending.provider == "openai"
    assert "429" in pending.error
    assert "Rate limit reached" in pending.error
    # the retry waited out the back-off promised by the record, across the crash
    assert pending.not_before - pending.at >= BACK_OFF
    assert len(requests) == 2
    assert requests[1].at >= pending.not_before - 0.01
    assert requests[1].body == requests[0].body  # the same request, sent again

    records = read_log(log)
    assert of(RetryPending, records) == [pending]  # preserved, not rewritten
    (reply,) = of(GenerationCompleted, records)  # exactly one committed reply
    assert (reply.provider, reply.attempt) == ("openai", 2)
    assert reply.response_id == "chatcmpl-fake-0002"
    assert [f.status for f in of(RunFinished, records)] == ["interrupted", "completed"]
    assert any(
        d.subject == pending.generation_id and d.found == "retry back-off"
        for d in of(RecoveryDecision, records)
    )
