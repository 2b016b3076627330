"""A model call overlaps the commit that starts it; a crash in between acts on nothing.

The next model call starts while the commit of the turn's tool results (and its
``GenerationStarted``) is in flight, and its reply is acted on only once that commit
is durable (docs/DESIGN.md, "What must be durable before what"). Each child here is
killed at ``model.early``: the model has answered, the commit is still in flight (the
child's commits are slowed so the window is wide open). A run's first call is not
among them: it waits for the run's start (the resume budget counts runs that died).
Nothing of that reply may be in the log; the restart calls the model again; and the
budget counts only the replies that were committed: with 40 tokens allowed and 15 per
reply, the run completes its three replies (45 tokens, the last call started at 30)
only if the lost reply was not counted (counted, the third call would start at 45 and
be refused).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from perdure.storage.records import GenerationCompleted, GenerationStarted
from tests.support.checker import assert_sound, read_log
from tests.support.procs import run_child

TURN = {"text": "looking", "tool_uses": [{"name": "lookup", "input": {"query": "q"}}]}
SCRIPT = [TURN, TURN, {"text": "done"}]
SLOW_COMMIT_MS = 150  # each commit of the killed child is in flight this long


def test_a_reply_that_came_before_its_commit_was_durable_is_never_acted_on(
    make_plan: Any, tmp_path: Path
) -> None:
    # The run's first call waits for the run's start: calls 2 and 3 answer early, and
    # the n-th early one (call n + 1) is where the child dies.
    for n in range(1, len(SCRIPT)):
        plan = make_plan(SCRIPT, options={"budget": {"session_tokens": 40}})
        plan["log"] = str(tmp_path / f"log-{n}")
        first = run_child(plan, fault=f"model.early@{n}", slow_commit_ms=SLOW_COMMIT_MS)
        assert first.killed, (n, first.stderr)
        assert "PERDURE_FAULT model.early" in first.stderr
        before = [c.record for c in read_log(Path(plan["log"]))]
        replies = [r for r in before if isinstance(r, GenerationCompleted)]
        assert len(replies) == n, f"model.early@{n}: the early reply reached the log"
        # The commit that started call n + 1 was in flight: it landed or not.
        started = len([r for r in before if isinstance(r, GenerationStarted)])
        assert started in (n, n + 1), (n, started)
        outcome = run_child(plan).outcome("s1")
        assert outcome["status"] == "completed", (n, outcome)
        assert outcome["final_text"] == "done"
        after = [c.record for c in read_log(Path(plan["log"]))]
        replies = [r for r in after if isinstance(r, GenerationCompleted)]
        assert len(replies) == len(SCRIPT), "each turn's reply committed exactly once"
        spent = sum(r.usage.input_tokens + r.usage.output_tokens for r in replies)
        assert spent == 15 * len(SCRIPT)
        assert_sound(plan)
