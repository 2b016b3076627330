"""One trace across a SIGKILL: the resumed run continues the interrupted run's trace.

The runtime runs in a child process whose spans go to a file as each ends; the
first child is killed with SIGKILL after a NEVER tool acted but before its result
was committed; a second child recovers the session from the same log.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from perdure.storage.records import (
    InputAccepted,
    RecoveryDecision,
    RunStarted,
    ToolOutcomeUnknown,
)
from tests.observability.spans import read_spans
from tests.support.checker import assert_sound, read_log
from tests.support.procs import run_child

SCRIPT = [
    {
        "text": "working",
        "fail_attempts": 1,  # one model retry before the reply
        "tool_uses": [
            {"name": "lookup", "input": {"query": "q"}},
            {"name": "send_note", "input": {"text": "hi"}},
        ],
    },
    {"text": "all done"},
]


def test_spans_survive_a_sigkill_in_one_trace_linked_to_the_interrupted_run(
    make_plan: Any, tmp_path: Path
) -> None:
    first_file, second_file = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    plan = make_plan(SCRIPT)
    first = run_child({**plan, "trace_file": str(first_file)}, fault="tool.after:send_note")
    assert first.killed, first.stderr
    second = run_child({**plan, "trace_file": str(second_file)})
    assert second.outcome("s1")["status"] == "completed"
    assert_sound(plan)

    log = [c.record for c in read_log(Path(plan["log"]))]
    interrupted, resumed = [r for r in log if isinstance(r, RunStarted)]
    assert resumed.resumed_from == interrupted.run_id
    _, trace_id, interrupted_span, _ = interrupted.traceparent.split("-")
    assert resumed.traceparent.split("-")[1] == trace_id
    (unknown,) = [r for r in log if isinstance(r, ToolOutcomeUnknown)]

    before, after = read_spans(first_file), read_spans(second_file)
    # Every span of both processes is in the trace recorded when the run started.
    for span in before + after:
        assert span["context"]["trace_id"] == "0x" + trace_id, span["name"]

    # The dead process finished its model attempts under the interrupted run's span.
    chats = [s for s in before if s["name"].startswith("chat")]
    assert sorted(s["attributes"]["perdure.attempt"] for s in chats) == [1, 2]
    for span in chats:
        assert span["parent_id"] == "0x" + interrupted_span
    assert not [s for s in before if s["name"] == "invoke_agent"], "it never ended"

    # The resumed run: a span of its own, linked to the interrupted one.
    (run,) = [s for s in after if s["name"] == "invoke_agent"]
    assert run["attributes"]["perdure.resumed_from"] == interrupted.run_id
    assert run["attributes"]["perdure.run.status"] == "completed"
    assert [(link["context"]["span_id"], link["attributes"]) for link in run["links"]] == [
        ("0x" + interrupted_span, {"perdure.link": "resumed_from"})
    ]
    assert run["context"]["span_id"] == "0x" + resumed.traceparent.split("-")[2]
    recovery = [e for e in run["events"] if e["name"] == "perdure.recovery"]
    actions = {e["attributes"]["perdure.recovery.subject"]: e["attributes"] for e in recovery}
    decisions = [r for r in log if isinstance(r, RecoveryDecision)]
    (decided,) = [d for d in decisions if d.subject == unknown.call_id]
    assert actions[unknown.call_id]["perdure.recovery.action"] == decided.action
    assert "unknown" in decided.action
    assert len(recovery) == len(decisions)

    # The call the dead process was running ends, unknown, under the interrupted run.
    notes = [s for s in after if s["name"] == "execute_tool send_note"]
    (note,) = notes
    assert note["attributes"]["perdure.outcome"] == "unknown"
    assert note["attributes"]["perdure.replay_policy"] == "never"
    assert note["attributes"]["gen_ai.tool.call.id"] == unknown.call_id
    assert note["parent_id"] == "0x" + interrupted_span
    # The final reply belongs to the resumed run.
    (final,) = [s for s in after if s["name"].startswith("chat")]
    assert final["parent_id"] == run["context"]["span_id"]


def test_a_resumed_run_stays_the_child_of_the_callers_span(make_plan: Any, tmp_path: Path) -> None:
    caller_trace, caller_span = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    first_file, second_file = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    plan = make_plan(SCRIPT)
    traceparent = f"00-{caller_trace}-{caller_span}-01"
    plan["sessions"]["s1"][0]["traceparent"] = traceparent
    first = run_child({**plan, "trace_file": str(first_file)}, fault="tool.after:send_note")
    assert first.killed, first.stderr
    second = run_child({**plan, "trace_file": str(second_file)})
    assert second.outcome("s1")["status"] == "completed"

    log = [c.record for c in read_log(Path(plan["log"]))]
    (accepted,) = [r for r in log if isinstance(r, InputAccepted)]
    assert accepted.traceparent == traceparent
    interrupted, _ = [r for r in log if isinstance(r, RunStarted)]
    for span in read_spans(first_file) + read_spans(second_file):
        assert span["context"]["trace_id"] == "0x" + caller_trace, span["name"]
    (run,) = [s for s in read_spans(second_file) if s["name"] == "invoke_agent"]
    assert run["parent_id"] == "0x" + caller_span
    (link,) = run["links"]
    assert link["context"]["span_id"] == "0x" + interrupted.traceparent.split("-")[2]
