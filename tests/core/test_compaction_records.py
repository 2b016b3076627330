"""What each compaction record says, field by field.

``test_compaction.py`` proves when a summary is made and what the model reads after it;
this file pins what the records carry, because the timeline, the metrics and the budget
read them: a failed or refused summary still names its model and what it cost, a retry
keeps the provider it failed on and the server's retry-after, the summary's boundary
("no shorter than what it replaces") and its estimate of the tokens left.
"""

from __future__ import annotations

from perdure.actors import protocol
from perdure.actors.conversation import summary_text, transcript_text
from perdure.actors.decide import compacting
from perdure.budget import Price
from perdure.providers.base import ModelReply
from perdure.storage.records import (
    Budget,
    CompactionAbandoned,
    CompactionPolicy,
    CompactionRetryPending,
    CompactionStarted,
    ContextCompacted,
    Usage,
)
from tests.core.sim import Session, kinds, only
from tests.core.test_compaction import answer, session, summarised, summary_failed, two_runs


def _covered(s: Session) -> tuple[int, int]:
    """The characters the pending summary would replace, and the history's total."""
    pending = s.state.compacting
    assert pending is not None
    start, end = pending.started.start, pending.started.end
    items = s.state.conversation
    covered = len(summary_text(s.state)) + sum(
        len(transcript_text(s.state, item)) for item in items[start:end]
    )
    total = len(summary_text(s.state)) + sum(
        len(transcript_text(s.state, item)) for item in items[start:]
    )
    return covered, total


def test_an_abandoned_summary_names_the_model_and_the_cost_of_its_last_attempt() -> None:
    s, _ = two_runs(tokens=900)
    step = summary_failed(s, retryable=False)
    abandoned = only(step.records, CompactionAbandoned)[0]
    assert abandoned.model == "small" and abandoned.usage == Usage(input_tokens=3)
    assert "failed after a non-retryable error: overloaded" in abandoned.reason

    s, _ = two_runs(tokens=900)
    step = summarised(s, "   ")
    abandoned = only(step.records, CompactionAbandoned)[0]
    assert abandoned.reason == "the summary came back empty"
    assert abandoned.model == "small"
    assert abandoned.usage == Usage(input_tokens=50, output_tokens=7)


def test_a_summary_abandoned_before_any_call_names_no_model_and_no_cost() -> None:
    s = session(budget=Budget(session_tokens=905))
    s.command(protocol.Submit("r1", "q"))
    answer(s, "a", 900)
    step, _ = s.command(protocol.Submit("r2", "q2"))
    abandoned = only(step.records, CompactionAbandoned)[0]
    assert abandoned.model == "" and abandoned.usage == Usage()


def test_a_retry_keeps_what_the_failed_attempt_reported() -> None:
    s, _ = two_runs(tokens=900)
    step = summary_failed(s, jitter=1.0, provider="primary", fallback=False)
    pending = only(step.records, CompactionRetryPending)[0]
    assert (pending.model, pending.provider, pending.fallback) == ("small", "primary", False)
    assert pending.usage == Usage(input_tokens=3) and pending.error == "overloaded"


def test_a_fallback_retries_at_once_and_a_retry_after_is_waited_out() -> None:
    s, _ = two_runs(tokens=900)
    step = summary_failed(s, jitter=1.0, fallback=True)
    pending = only(step.records, CompactionRetryPending)[0]
    assert pending.fallback and pending.not_before == s.now, "the next provider at once"

    s, _ = two_runs(tokens=900)
    step = summary_failed(s, jitter=0.0, retry_after=7.0)
    pending = only(step.records, CompactionRetryPending)[0]
    assert pending.not_before >= s.now + 7.0, "never sooner than the server asked"


def test_a_summary_exactly_as_long_as_what_it_replaces_cuts_nothing() -> None:
    s, _ = two_runs(tokens=900)
    covered, _ = _covered(s)
    step = summarised(s, "x" * covered)
    abandoned = only(step.records, CompactionAbandoned)[0]
    assert f"({covered} characters) is no shorter" in abandoned.reason
    assert f"replace ({covered} characters)" in abandoned.reason

    s, _ = two_runs(tokens=900)
    step = summarised(s, "x" * (covered - 1))
    assert kinds(step)[0] == "ContextCompacted"


def test_the_tokens_left_are_the_tokens_before_times_the_share_of_characters_left() -> None:
    s, _ = two_runs(tokens=900)
    covered, total = _covered(s)
    text = "short summary"
    step = summarised(s, text, provider="cheap")
    done = only(step.records, ContextCompacted)[0]
    assert done.tokens_after == round(900 * (total - covered + len(text)) / total)
    assert done.provider == "cheap" and done.attempt == 1


def test_the_window_is_recorded_with_the_start_and_is_zero_when_unknown() -> None:
    _, step = two_runs(tokens=900)
    assert only(step.records, CompactionStarted)[0].window == 1000
    unknown = Session(tools={}, compaction=CompactionPolicy(keep_recent=1))
    unknown.command(protocol.Submit("r1", "q"))
    gen = unknown.state.current_generation()
    assert gen is not None
    reply = ModelReply(text="a", usage=Usage(input_tokens=10), model="no-such-model")
    unknown.result(protocol.ModelReplied(gen.generation_id, gen.attempt, reply))
    unknown.command(protocol.Submit("r2", "q2"))
    step, _ = unknown.command(protocol.CompactContext("rc"))
    started = only(step.records, CompactionStarted)
    assert started and started[0].window == 0


def test_a_summary_made_on_its_second_attempt_says_so() -> None:
    s, _ = two_runs(tokens=900)
    summary_failed(s, jitter=1.0)
    s.now += 10.0
    step = summarised(s, "short summary")
    assert only(step.records, ContextCompacted)[0].attempt == 2


def test_the_summary_is_held_to_the_sessions_own_budget_and_the_runs_spend() -> None:
    """Before its call the summary is checked against the session's own budget (else the
    runtime's), the spend of the run it serves, and, between runs, the session's cost at
    the runtime's prices: a spent budget abandons it, saying which."""
    own = session()
    own.state.budget = Budget(session_tokens=905)  # the runtime has no budget
    own.command(protocol.Submit("r1", "q"))
    answer(own, "a", 900)
    step, _ = own.command(protocol.Submit("r2", "q2"))
    assert only(step.records, CompactionAbandoned)[0].reason == (
        "no summary was made: the session's token budget is spent: 905 of 905 tokens used"
    )

    run = session(keep_recent=0, budget=Budget(run_tokens=905))
    run.command(protocol.Submit("r1", "q"))
    answer(run, "a", 900, ("c1", "lookup", {"query": "x"}))
    step = run.finish_tool("c1", output="found")  # the next turn of the same run
    assert only(step.records, CompactionAbandoned)[0].reason == (
        "no summary was made: the run's token budget is spent: 905 of 905 tokens used"
    )

    idle = session(keep_recent=0, budget=Budget(session_cost=0.0009), prices={"m": Price(1.0, 1.0)})
    idle.command(protocol.Submit("r1", "q"))
    answer(idle, "a", 900)
    assert idle.state.run is None
    step, _ = idle.command(protocol.CompactContext("k1"))
    assert only(step.records, CompactionAbandoned)[0].reason == (
        "no summary was made: the session's cost budget is spent: $0.0009 of $0.0009 used"
    )


def test_before_any_reply_the_window_is_unknown_even_with_a_catch_all_entry() -> None:
    """The window is the one of the model that answered last: before any reply there is
    none, so a compaction asked for then records 0, even when the runtime's table has an
    entry "" that every model name starts with."""
    s = Session(tools={}, compaction=CompactionPolicy(keep_recent=0), context_windows={"": 800})
    s.command(protocol.Submit("r1", "q"))
    assert s.state.last_model == ""
    assert compacting.window(s.state, s.env()) is None
    step, _ = s.command(protocol.CompactContext("rc"))
    assert only(step.records, CompactionStarted)[0].window == 0
