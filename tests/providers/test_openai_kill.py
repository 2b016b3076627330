"""SIGKILL during an OpenAI retry back-off: the restarted process retries at the recorded time.

A child process runs the runtime with ``OpenAIProvider`` against the fake OpenAI
server in this (parent) process. The server answers 429 with a ``retry-after``;
once the ``RetryPending`` record is durable the parent kills the child with
SIGKILL in the middle of its back-off, lets the server succeed, and starts the
child again. The run must complete with exactly one committed reply, the record
must be unchanged, and the retry must not be sent before the time it promised.
"""

from __future__ import annotations

from pathlib import Path

from tests.fake_openai import FakeOpenAI, HttpError, Reply, Text
from tests.providers._kill import (
    BACK_OFF,
    child_env,
    crash_in_back_off,
    resumed_the_retry,
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
        then = Reply(content=[Text("Recovered after the crash.")])
        result, pending = crash_in_back_off(
            tmp_path, fake, child_env(openai=fake.url), then, "openai"
        )
        requests = fake.requests

    reply = resumed_the_retry(log, result, pending, requests, "Recovered after the crash.")
    assert (reply.provider, reply.response_id) == ("openai", "chatcmpl-fake-0002")
    assert pending.provider == "openai"
    assert "429" in pending.error
    assert "Rate limit reached" in pending.error
