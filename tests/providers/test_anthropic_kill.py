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

import json
from pathlib import Path

from perdure.storage.records import (
    GenerationCompleted,
    RecoveryDecision,
    RedactedThinkingBlock,
    RetryPending,
    RunFinished,
    RunStarted,
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
    kill_in_back_off,
    of,
    read_log,
    run_to_the_end,
    start_child,
)


def test_sigkill_during_retry_back_off_resumes_the_retry(tmp_path: Path) -> None:
    log = tmp_path / "log"
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
        out1 = tmp_path / "child1.out"
        pending = kill_in_back_off(log, start_child(log, env, out1), out1, fake, sent=1)
        assert len(fake.requests) == 1

        fake.script(Reply(content=[Text("Recovered after the crash.")]))
        output = run_to_the_end(log, env, tmp_path / "child2.out")
        requests = fake.requests

    result = json.loads(output.strip().splitlines()[-1])
    assert result["status"] == "completed", result
    assert result["text"] == "Recovered after the crash."
    assert result["recovered_sessions"] == ["s-kill"]
    # the retry waited out the back-off promised by the record, across the crash
    assert pending.not_before - pending.at >= BACK_OFF
    assert len(requests) == 2
    assert requests[1].at >= pending.not_before - 0.01
    assert requests[1].body == requests[0].body  # the same request, sent again

    records = read_log(log)
    assert of(RetryPending, records) == [pending]  # preserved, not rewritten
    (reply,) = of(GenerationCompleted, records)  # exactly one committed reply
    assert reply.text == "Recovered after the crash."
    assert reply.attempt == 2
    assert reply.generation_id == pending.generation_id
    runs = of(RunStarted, records)
    assert [r.resumed_from for r in runs] == [None, runs[0].run_id]
    assert [(f.run_id, f.status) for f in of(RunFinished, records)] == [
        (runs[0].run_id, "interrupted"),
        (runs[1].run_id, "completed"),
    ]
    decisions = of(RecoveryDecision, records)
    assert any(
        d.subject == pending.generation_id and d.found == "retry back-off" for d in decisions
    )


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
        out1 = tmp_path / "child1.out"
        kill_in_back_off(log, start_child(log, env, out1, "thinking"), out1, fake, sent=2)

        fake.script(Reply(content=[Thinking("add said 5."), Text("2 + 3 = 5.")]))
        output = run_to_the_end(log, env, tmp_path / "child2.out", "thinking")
        requests = fake.requests

    result = json.loads(output.strip().splitlines()[-1])
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
