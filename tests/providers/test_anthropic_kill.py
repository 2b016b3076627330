"""SIGKILL during a retry back-off: the restarted process resumes the retry.

(The second test does the same in the middle of a tool-use loop with extended
thinking on, where the retried request must carry the reply's thinking blocks.)

A child process runs the runtime with the Anthropic provider against the fake
server in this (parent) process. The server answers 529 with a ``retry-after``;
once the ``RetryPending`` record is durable the parent kills the child with
SIGKILL in the middle of its back-off, lets the server succeed, and starts the
child again. The run must complete with exactly one committed reply, the
``RetryPending`` record must still be there, and the retry must not have been
sent before the back-off that record promised had ended.
"""

from __future__ import annotations

from pathlib import Path

from perdure.storage.records import (
    GenerationCompleted,
    RedactedThinkingBlock,
    ThinkingBlock,
)
from tests.fake_anthropic import (
    FakeAnthropic,
    HttpError,
    RedactedThinking,
    Reply,
    Text,
    Thinking,
    ToolUse,
    sent_messages,
    sign,
)
from tests.providers._kill import (
    BACK_OFF,
    child_env,
    crash_in_back_off,
    of,
    read_log,
    resumed_the_retry,
)


def test_sigkill_during_retry_back_off_resumes_the_retry(tmp_path: Path) -> None:
    with FakeAnthropic() as fake:
        fake.script(
            HttpError(
                status=529,
                type="overloaded_error",
                message="Overloaded",
                headers={"retry-after": str(BACK_OFF)},
            )
        )
        env = child_env(anthropic=fake.url)
        then = Reply(content=[Text("Recovered after the crash.")])
        result, pending = crash_in_back_off(tmp_path, fake, env, then)
        requests = fake.requests

    resumed_the_retry(tmp_path / "log", result, pending, requests, "Recovered after the crash.")


def test_sigkill_keeps_thinking_blocks_for_the_retried_continuation(tmp_path: Path) -> None:
    """Extended thinking on: the model thinks and calls ``add``; the continuation (tool
    result back to the model) meets a 529 and the process is killed in the back-off.
    The restarted process rebuilds the continuation from the log alone, and the fake
    server, like the API, accepts it only with the reply's thinking and redacted
    thinking blocks handed back first and unchanged."""
    plan = "2 + 3: call add instead of guessing."
    log = tmp_path / "log"
    with FakeAnthropic() as fake:
        fake.script(
            Reply(
                content=[
                    Thinking(plan),
                    RedactedThinking("EmwKAhgBEgy3va3pzix/LafPsn4a"),
                    Text("Adding."),
                    ToolUse("toolu_01", "add", {"a": 2, "b": 3}),
                ]
            ),
            HttpError(
                status=529,
                type="overloaded_error",
                message="Overloaded",
                headers={"retry-after": str(BACK_OFF)},
            ),
        )
        env = child_env(anthropic=fake.url)
        then = Reply(content=[Thinking("add said 5."), Text("2 + 3 = 5.")])
        result, _ = crash_in_back_off(tmp_path, fake, env, then, "thinking", sent=2)
        requests = fake.requests

    assert result["status"] == "completed", result
    assert result["text"] == "2 + 3 = 5."
    assert len(requests) == 3
    # the retry after the restart is the continuation sent before the kill, unchanged
    assert sent_messages(requests[2].body) == sent_messages(requests[1].body)
    assert requests[2].body["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    assistant = sent_messages(requests[2].body)[1]
    assert assistant == {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": plan, "signature": sign(plan)},
            {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"},
            {"type": "text", "text": "Adding."},
            {"type": "tool_use", "id": "toolu_01", "name": "add", "input": {"a": 2, "b": 3}},
        ],
    }
    first_reply, last_reply = of(GenerationCompleted, read_log(log))
    assert first_reply.thinking == [
        ThinkingBlock(plan, sign(plan)),
        RedactedThinkingBlock("EmwKAhgBEgy3va3pzix/LafPsn4a"),
    ]
    assert last_reply.thinking == [ThinkingBlock("add said 5.", sign("add said 5."))]
