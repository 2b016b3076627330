"""SIGKILL right after a fallback switch: the restarted process keeps the secondary.

A child process runs ``FallbackProvider([anthropic, openai], after=1)`` against both
fake servers in this (parent) process. The model (Anthropic) calls ``add``; its
next turn meets a 529 with a long ``retry-after``, so the turn moves on to OpenAI
(``RetryPending`` with ``fallback``, no back-off). While OpenAI's answer is still
streaming, the parent kills the child with SIGKILL. The restarted child rebuilds
the request from the log alone: it must send the turn to OpenAI again, never to
Anthropic, with the whole conversation (Anthropic's tool call and its result).
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
from tests import fake_anthropic as fa
from tests import fake_openai as fo
from tests.providers._kill import (
    child_env,
    of,
    read_log,
    retry_pending,
    run_to_the_end,
    sigkill,
    start_child,
    wait_until,
)


def test_sigkill_right_after_the_switch_keeps_the_secondary(tmp_path: Path) -> None:
    log = tmp_path / "log"
    with fa.FakeAnthropic() as fake_a, fo.FakeOpenAI() as fake_o:
        fake_a.script(
            fa.Reply(content=[fa.Text("Adding."), fa.ToolUse("toolu_01", "add", {"a": 2, "b": 3})]),
            fa.HttpError(
                status=529,
                type="overloaded_error",
                message="Overloaded",
                headers={"retry-after": "60"},
            ),
        )
        # a slow answer: the child is killed while it streams
        fake_o.script(fo.Reply(content=[fo.Text("never finished " * 20)], chunk=2, event_delay=0.2))
        env = child_env(anthropic=fake_a.url, openai=fake_o.url)
        out1 = tmp_path / "child1.out"
        child = start_child(log, env, out1, "fallback")
        try:
            wait_until("a request to the secondary", lambda: fake_o.requests, child, out1)
        finally:
            sigkill(child)
        (pending,) = retry_pending(log)  # durable before the secondary was asked

        fake_o.script(fo.Reply(content=[fo.Text("2 + 3 = 5, said the secondary.")]))
        output = run_to_the_end(log, env, tmp_path / "child2.out", "fallback")
        a_requests, o_requests = fake_a.requests, fake_o.requests

    result = json.loads(output.strip().splitlines()[-1])
    assert result["status"] == "completed", result
    assert result["text"] == "2 + 3 = 5, said the secondary."
    assert result["recovered_sessions"] == ["s-kill"]
    assert (pending.provider, pending.fallback, pending.attempt) == ("anthropic", True, 1)
    assert pending.not_before == pending.at  # the switch did not wait out the retry-after
    # the primary was never asked again: not by the dead child, not by the new one
    assert len(a_requests) == 2
    assert len(o_requests) == 2
    assert o_requests[1].body == o_requests[0].body  # the same turn, rebuilt from the log
    messages = o_requests[1].body["messages"]
    assert messages[2]["tool_calls"][0]["id"] == "toolu_01"
    assert messages[3] == {"role": "tool", "tool_call_id": "toolu_01", "content": "5"}

    records = read_log(log)
    assert of(RetryPending, records) == [pending]  # preserved, not rewritten
    first, second = of(GenerationCompleted, records)
    assert (first.provider, second.provider) == ("anthropic", "openai")
    assert second.generation_id == pending.generation_id
    assert second.attempt == 2
    assert [f.status for f in of(RunFinished, records)] == ["interrupted", "completed"]
    assert any(d.subject == pending.generation_id for d in of(RecoveryDecision, records))
