"""Context compaction in the pure core: when, what is covered, what the model sees after.

Every rule of ``perdure.actors.decide.compacting`` and of the summary's place in
``perdure.actors.conversation`` is stated here with a case that fails if the rule is
broken: the threshold's boundary, the range (recent items and unsettled turns stay
verbatim), the order of commits (the start before the call, the call before the next
turn), retries and giving up, recovery, the fold's refusals, and what must never be
summarised away (an unknown outcome, a pending approval, a compensation in flight).
"""

from __future__ import annotations

from typing import Any

import pytest

from perdure import errors
from perdure.actors import conversation, decide, protocol
from perdure.actors.conversation import MessageCache, messages
from perdure.actors.decide import compacting
from perdure.actors.lifecycle import ImpossibleTransition
from perdure.budget import DEFAULT_CONTEXT_WINDOWS, check_compaction, window_of
from perdure.providers.base import Message, ModelReply, TextBlock, ToolUseBlock
from perdure.storage.records import (
    Budget,
    CompactionAbandoned,
    CompactionPolicy,
    CompactionRetryPending,
    CompactionStarted,
    ContextCompacted,
    GenerationStarted,
    RecoveryDecision,
    RunFinished,
    ToolCall,
    Usage,
)
from tests.core.sim import COURSE_TOOLS, Session, kinds, only

WINDOW = 1000


def session(keep_recent: int = 2, threshold: float = 0.8, **env: Any) -> Session:
    policy = CompactionPolicy(window=WINDOW, keep_recent=keep_recent, threshold=threshold)
    return Session(tools=env.pop("tools", COURSE_TOOLS), compaction=policy, **env)


def answer(
    s: Session, text: str, tokens: int, *calls: tuple[str, str, dict[str, Any]], model: str = "m"
) -> protocol.Step:
    """The current turn's reply, reporting ``tokens`` input tokens."""
    gen = s.state.current_generation()
    assert gen is not None
    reply = ModelReply(
        text=text,
        tool_calls=tuple(ToolCall(call_id=c, name=n, input=i) for c, n, i in calls),
        usage=Usage(input_tokens=tokens, output_tokens=5),
        model=model,
        provider="p",
    )
    return s.result(protocol.ModelReplied(gen.generation_id, gen.attempt, reply))


def summarised(s: Session, text: str = "SUMMARY", **reply: Any) -> protocol.Step:
    pending = s.state.compacting
    assert pending is not None
    model_reply = ModelReply(
        text=text, usage=Usage(input_tokens=50, output_tokens=7), model="small", **reply
    )
    return s.result(
        protocol.ModelReplied(pending.started.compaction_id, pending.attempt, model_reply)
    )


def summary_failed(s: Session, retryable: bool = True, **kw: Any) -> protocol.Step:
    pending = s.state.compacting
    assert pending is not None
    failed = protocol.ModelFailed(
        generation_id=pending.started.compaction_id,
        attempt=pending.attempt,
        error="overloaded",
        retryable=retryable,
        usage=Usage(input_tokens=3),
        model="small",
        **kw,
    )
    return s.result(failed)


def summaries(step: protocol.Step) -> list[protocol.Summarize]:
    return [e for e in step.effects if isinstance(e, protocol.Summarize)]


def model_calls(step: protocol.Step) -> list[protocol.CallModel]:
    return [e for e in step.effects if isinstance(e, protocol.CallModel)]


def two_runs(tokens: int, keep_recent: int = 2) -> tuple[Session, protocol.Step]:
    """Run 1 answered with ``tokens`` input tokens; the second input then arrives."""
    s = session(keep_recent=keep_recent)
    s.command(protocol.Submit("r1", "first question"))
    answer(s, "first answer", tokens)
    step, _ = s.command(protocol.Submit("r2", "second question"))
    return s, step


# -- when ------------------------------------------------------------------------------


def test_below_the_threshold_the_next_turn_starts_without_a_summary() -> None:
    s, step = two_runs(tokens=799)  # 0.8 x 1000 = 800
    assert kinds(step) == ["InputAccepted", "RunStarted", "GenerationStarted"]
    assert not summaries(step) and s.state.compacting is None


def test_at_the_threshold_the_summary_comes_before_the_next_turn() -> None:
    s, step = two_runs(tokens=800)
    assert kinds(step) == ["InputAccepted", "RunStarted", "CompactionStarted"]
    started = only(step.records, CompactionStarted)[0]
    assert (started.start, started.end) == (0, 1), "the last 2 items stay verbatim"
    assert started.tokens_before == 800 and started.window == WINDOW
    assert s.state.run is not None
    assert started.reason == "auto" and started.run_id == s.state.run.run_id
    assert summaries(step) == [protocol.Summarize(started.compaction_id, 1, None)]
    assert not model_calls(step), "the turn waits for the summary"
    assert not only(step.records, GenerationStarted)


def test_at_the_threshold_within_a_run_the_summary_comes_before_its_next_turn() -> None:
    s = session(keep_recent=0)
    s.command(protocol.Submit("r1", "question"))
    answer(s, "looking", 800, ("c1", "lookup", {"query": "q"}))
    step = s.finish_tool("c1", output="found")
    assert kinds(step) == ["ToolCompleted", "CompactionStarted"]
    assert only(step.records, CompactionStarted)[0].reason == "auto"
    assert summaries(step) and not model_calls(step), "the next turn waits for the summary"


def test_cache_reads_and_writes_count_as_input() -> None:
    s = session()
    s.command(protocol.Submit("r1", "q"))
    gen = s.state.current_generation()
    assert gen is not None
    usage = Usage(input_tokens=100, cache_read_input_tokens=600, cache_creation_input_tokens=100)
    s.result(
        protocol.ModelReplied(gen.generation_id, 1, ModelReply(text="a", usage=usage, model="m"))
    )
    assert s.state.last_input_tokens == 800
    step, _ = s.command(protocol.Submit("r2", "q2"))
    assert "CompactionStarted" in kinds(step)


def test_the_window_comes_from_the_policy_else_the_table_by_model() -> None:
    assert window_of("claude-sonnet-4-5-20250929", DEFAULT_CONTEXT_WINDOWS) == 200_000
    assert window_of("gpt-4o-mini-2024", DEFAULT_CONTEXT_WINDOWS) == 128_000
    assert window_of("unknown-model", DEFAULT_CONTEXT_WINDOWS) is None
    s = Session(context_windows={"m": 1000}, compaction=CompactionPolicy(keep_recent=1))
    s.command(protocol.Submit("r1", "q"))
    answer(s, "a", 900, model="m-2025")
    assert compacting.window(s.state, s.env()) == 1000
    step, _ = s.command(protocol.Submit("r2", "q2"))
    assert "CompactionStarted" in kinds(step), "the runtime's policy, the table's window"
    unknown = Session(context_windows={}, compaction=CompactionPolicy(keep_recent=1))
    unknown.command(protocol.Submit("r1", "q"))
    answer(unknown, "a", 10**9)
    step, _ = unknown.command(protocol.Submit("r2", "q2"))
    assert "CompactionStarted" not in kinds(step), "no window known: no automatic compaction"


def test_auto_off_compacts_only_on_demand() -> None:
    s = Session(compaction=CompactionPolicy(window=WINDOW, keep_recent=1, auto=False))
    s.command(protocol.Submit("r1", "q"))
    answer(s, "a", 999)
    step, _ = s.command(protocol.Submit("r2", "q2"))
    assert "CompactionStarted" not in kinds(step)


def test_a_sessions_own_policy_wins_over_the_runtimes() -> None:
    s = Session(compaction=CompactionPolicy(window=WINDOW, auto=False))
    s.state.compaction = CompactionPolicy(window=WINDOW, keep_recent=1)
    assert compacting.policy_of(s.state, s.env()).keep_recent == 1
    s.command(protocol.Submit("r1", "q"))
    answer(s, "a", 900)
    step, _ = s.command(protocol.Submit("r2", "q2"))
    assert "CompactionStarted" in kinds(step)


def test_a_policy_refuses_nonsense() -> None:
    for bad in ({"threshold": 0.0}, {"threshold": 1.5}, {"keep_recent": -1}, {"window": 0}):
        with pytest.raises(ValueError, match="compaction"):
            check_compaction(CompactionPolicy(**bad))  # type: ignore[arg-type]
    assert check_compaction(CompactionPolicy(threshold=1.0, keep_recent=0, window=1)).window == 1


# -- what is covered ---------------------------------------------------------------------


def test_the_range_stops_at_a_turn_that_is_not_settled() -> None:
    s = session(keep_recent=0)
    s.command(protocol.Submit("r1", "deploy it"))
    answer(s, "deploying", 100, ("c1", "deploy", {"target": "prod"}))
    assert s.state.tasks["c1"].phase == "awaiting_approval"
    assert compacting.compaction_range(s.state, 0) == (0, 1), "the waiting turn stays"
    assert compacting.compaction_range(s.state, 1) == (0, 1)
    assert compacting.compaction_range(s.state, 2) is None


def test_a_pending_approval_is_never_summarised_away() -> None:
    s = session(keep_recent=0)
    s.command(protocol.Submit("r1", "deploy it"))
    answer(s, "deploying", 900, ("c1", "deploy", {"target": "prod"}))
    step, _ = s.command(protocol.CompactContext("k1"))
    started = only(step.records, CompactionStarted)[0]
    assert (started.start, started.end) == (0, 1)
    summarised(s, "S")
    sent = messages(s.state, include_pending=True)
    assert sent[0].content[0].text.endswith("S")  # type: ignore[union-attr]
    assert ToolUseBlock("c1", "deploy", {"target": "prod"}) in sent[1].content
    assert "awaiting_approval" in str(sent[-1].content)


# -- the summary and what the model sees after ---------------------------------------------


def test_the_summary_commits_once_and_the_turn_starts_in_the_same_commit() -> None:
    s, step = two_runs(tokens=900)
    started = only(step.records, CompactionStarted)[0]
    step = summarised(s, "Q1 answered.")
    assert kinds(step) == ["ContextCompacted", "GenerationStarted"]
    done = only(step.records, ContextCompacted)[0]
    assert (done.compaction_id, done.start, done.end) == (started.compaction_id, 0, 1)
    assert done.tokens_before == 900 and 0 < done.tokens_after < 900
    assert done.model == "small" and done.usage.output_tokens == 7
    assert s.state.summary == done and s.state.compacting is None
    assert s.state.last_input_tokens == 0, "not compacted again before a reply tells"
    assert model_calls(step)
    sent = messages(s.state)
    head = sent[0].content[0].text  # type: ignore[union-attr]
    assert "Q1 answered." in head and "compacted" in head
    assert "first question" not in head
    assert sent[1] == Message("assistant", (TextBlock("first answer"),))
    assert sent[2] == Message("user", (TextBlock("second question"),))
    assert len(sent) == 3


def test_the_summarys_usage_is_counted_for_the_run_and_the_session() -> None:
    s, _ = two_runs(tokens=900)
    before = s.state.usage.output_tokens
    summarised(s)
    assert s.state.usage.output_tokens == before + 7
    assert s.state.run is not None and s.state.run.spend["small"].output_tokens == 7


def test_an_unknown_outcome_is_stated_after_the_summary_whatever_its_age() -> None:
    s = session(keep_recent=1)
    s.command(protocol.Submit("r1", "send it"))
    answer(s, "sending", 100, ("c1", "send", {"text": "wire 100 EUR"}))
    s.restart()  # the send was executing: NEVER, no reconcile -> outcome unknown
    assert s.state.tasks["c1"].phase == "outcome_unknown"
    answer(s, "it may have been sent", 900)
    s.command(protocol.Submit("r2", "and now?"))
    assert s.state.compacting is not None
    assert s.state.compacting.started.end >= 2, "the unknown call's turn is inside the range"
    summarised(s, "Something was sent.")
    head = messages(s.state)[0].content[0].text  # type: ignore[union-attr]
    assert "send (c1)" in head and "wire 100 EUR" in head
    assert "UNKNOWN" in head, "the model must never lose that an effect may have happened"
    assert s.state.summary_unknown == ("c1",)


def test_a_compensation_in_flight_is_stated_after_the_summary() -> None:
    s = session(keep_recent=0)
    s.command(protocol.Submit("r1", "open a ticket"))
    answer(s, "opening", 100, ("c1", "create_ticket", {"title": "risk"}))
    s.finish_tool("c1", output="T-7")
    answer(s, "opened T-7", 900)
    s.command(protocol.Compensate("c1", "undo-1"))  # waits for approval: in flight
    s.command(protocol.CompactContext("k1"))
    summarised(s, "A ticket was opened.")
    head = messages(s.state)[0].content[0].text  # type: ignore[union-attr]
    assert "create_ticket (c1)" in head and "comp-c1" in head and "in flight" in head
    s.command(protocol.Approve("comp-c1", True, "ok"))
    s.finish_tool("comp-c1", output="closed T-7")
    head = messages(s.state)[0].content[0].text  # type: ignore[union-attr]
    assert "comp-c1" not in head, "once finished, the note in the history says it"
    assert "compensation of create_ticket" in str(messages(s.state)[-1].content)


def test_a_second_summary_starts_where_the_first_ended_and_reads_it() -> None:
    s, _ = two_runs(tokens=900, keep_recent=1)
    summarised(s, "FIRST")
    first_end = s.state.compacted_end
    answer(s, "second answer", 950)
    step, _ = s.command(protocol.Submit("r3", "third question"))
    started = only(step.records, CompactionStarted)[0]
    assert started.start == first_end and started.end == len(s.state.conversation) - 1
    assert started.compaction_id.endswith("compaction2")
    request = conversation.summary_request(s.state, started.compaction_id, 1)
    text = request.messages[0].content[0].text  # type: ignore[union-attr]
    assert "FIRST" in text and "second answer" in text and "third question" not in text
    assert request.system == conversation.SUMMARY_SYSTEM and request.tools == ()
    summarised(s, "SECOND")
    assert [c.summary for c in s.state.compactions] == ["FIRST", "SECOND"]
    assert "FIRST" not in messages(s.state)[0].content[0].text  # type: ignore[union-attr]


def test_the_message_cache_agrees_across_a_compaction() -> None:
    s, _ = two_runs(tokens=900, keep_recent=1)
    cache = MessageCache()
    messages(s.state, cache=cache)
    summarised(s, "S1")
    assert messages(s.state, cache=cache) == messages(s.state)
    answer(s, "more", 100)
    s.command(protocol.Submit("r3", "again"))
    assert messages(s.state, cache=cache) == messages(s.state)


# -- retries, giving up ---------------------------------------------------------------------


def test_a_failed_summary_is_retried_after_a_persisted_back_off() -> None:
    s, _ = two_runs(tokens=900)
    step = summary_failed(s, jitter=1.0)
    pending = only(step.records, CompactionRetryPending)[0]
    assert pending.attempt == 1 and pending.not_before == s.now + 1.0
    assert summaries(step) == [protocol.Summarize(pending.compaction_id, 2, pending.not_before)], (
        "attempt 2, not before the back-off's end"
    )
    assert not model_calls(step)
    assert s.state.usage.input_tokens >= 3, "a failed attempt's usage counts"


def test_past_its_retries_the_summary_is_abandoned_and_the_run_goes_on_while_it_fits() -> None:
    s, _ = two_runs(tokens=900)
    step = s.result(
        protocol.ModelFailed(
            generation_id=s.state.compacting.started.compaction_id,  # type: ignore[union-attr]
            attempt=8,
            error="overloaded",
            retryable=True,
        )
    )
    assert kinds(step) == ["CompactionAbandoned", "GenerationStarted"]
    abandoned = only(step.records, CompactionAbandoned)[0]
    assert "8 attempts" in abandoned.reason
    assert s.state.summary is None, "nothing was cut"
    assert len(messages(s.state)) == 3


def test_a_run_that_no_longer_fits_is_stopped_saying_why() -> None:
    s, _ = two_runs(tokens=900)
    summary_failed(s, retryable=False)
    answer(s, "big", 1000)  # the request filled the window
    step, _ = s.command(protocol.Submit("r3", "more"))
    assert "CompactionStarted" in kinds(step), "the history grew: one more attempt"
    step = summary_failed(s, retryable=False)
    assert kinds(step) == ["CompactionAbandoned", "RunFinished"]
    finished = only(step.records, RunFinished)[0]
    assert finished.status == "stopped"
    assert "no longer fits" in finished.reason and "1000 of 1000" in finished.reason
    assert "non-retryable" in finished.reason


def test_after_giving_up_no_new_attempt_until_the_history_grew() -> None:
    s, _ = two_runs(tokens=900)
    summary_failed(s, retryable=False)
    assert s.state.abandoned_at == 3
    answer(s, "second answer", 900)
    step, _ = s.command(protocol.Submit("r3", "q3"))
    assert "CompactionStarted" in kinds(step), "two more items: a new attempt"
    s2, _ = two_runs(tokens=900, keep_recent=3)
    assert s2.state.compacting is None, "nothing to cover with 3 items kept"


def test_an_empty_or_longer_summary_cuts_nothing() -> None:
    s, _ = two_runs(tokens=900)
    step = summarised(s, "   ")
    assert kinds(step)[0] == "CompactionAbandoned"
    assert "empty" in only(step.records, CompactionAbandoned)[0].reason
    s, _ = two_runs(tokens=900)
    step = summarised(s, "x" * 500)
    assert kinds(step)[0] == "CompactionAbandoned"
    assert "no shorter" in only(step.records, CompactionAbandoned)[0].reason
    assert s.state.summary is None


def test_a_spent_budget_abandons_the_summary_before_its_call() -> None:
    s = session(budget=Budget(session_tokens=905))
    s.command(protocol.Submit("r1", "q"))
    answer(s, "a", 900)  # 905 tokens spent
    step, _ = s.command(protocol.Submit("r2", "q2"))
    assert kinds(step)[-3:] == ["CompactionStarted", "CompactionAbandoned", "RunFinished"]
    assert "budget" in only(step.records, CompactionAbandoned)[0].reason
    assert not summaries(step)


# -- recovery ---------------------------------------------------------------------------


def test_a_crash_before_the_summary_commits_makes_the_call_again_once() -> None:
    s, _ = two_runs(tokens=900)
    started = s.state.compacting.started  # type: ignore[union-attr]
    step = s.restart()
    decision = only(step.records, RecoveryDecision)[0]
    assert decision.subject == started.compaction_id and decision.action.startswith("make")
    assert decision.found == "summary call in flight"
    assert not only(step.records, CompactionStarted), "never two summaries of one range"
    assert summaries(step) == [protocol.Summarize(started.compaction_id, 1, None)]
    assert not model_calls(step)
    summarised(s)
    assert len(only(s.log, ContextCompacted)) == 1


def test_a_crash_after_the_summary_commits_uses_it() -> None:
    s, _ = two_runs(tokens=900)
    summarised(s, "KEPT")
    before = messages(s.state)
    step = s.restart()
    assert not summaries(step) and not only(step.records, CompactionStarted)
    assert messages(s.state) == before
    assert "KEPT" in before[0].content[0].text  # type: ignore[union-attr]


def test_a_retry_pending_after_a_crash_waits_out_the_rest_of_its_back_off() -> None:
    s, _ = two_runs(tokens=900)
    pending = only(summary_failed(s, jitter=1.0).records, CompactionRetryPending)[0]
    step = s.restart()
    assert only(step.records, RecoveryDecision)[0].found == "summary retry pending"
    assert summaries(step) == [protocol.Summarize(pending.compaction_id, 2, pending.not_before)]


# -- the fold refuses what cannot be ----------------------------------------------------------


def test_the_fold_refuses_a_second_start_a_gap_and_a_foreign_result() -> None:
    s, _ = two_runs(tokens=900)
    started = s.state.compacting.started  # type: ignore[union-attr]
    with pytest.raises(ImpossibleTransition):
        s.state.apply(started)
    other = ContextCompacted(session_id="s1", compaction_id="x", start=0, end=1, summary="", at=1)
    with pytest.raises(ImpossibleTransition):
        s.state.apply(other)
    wrong_range = ContextCompacted(
        session_id="s1", compaction_id=started.compaction_id, start=0, end=2, summary="", at=1
    )
    with pytest.raises(ValueError, match="was started for items"):
        s.state.apply(wrong_range)
    summarised(s)
    for start, end in ((0, 2), (1, 1), (1, 99)):
        gap = CompactionStarted(
            session_id="s1", compaction_id="y", start=start, end=end, tokens_before=0, at=1
        )
        with pytest.raises(ValueError, match="covers items"):
            s.state.apply(gap)


def test_a_compaction_in_progress_keeps_the_session_from_idling() -> None:
    s = session(keep_recent=0)
    s.command(protocol.Submit("r1", "q"))
    answer(s, "a", 10)
    assert s.state.idle
    s.command(protocol.CompactContext("k1"))
    assert not s.state.idle
    summarised(s)
    assert s.state.idle


# -- on demand ------------------------------------------------------------------------------


def test_on_demand_while_idle_deduplicated_and_refused_when_there_is_nothing() -> None:
    s = session(keep_recent=1)
    with pytest.raises(errors.Refused, match="nothing to compact"):
        s.command(protocol.CompactContext("k0"))
    s.command(protocol.Submit("r1", "q"))
    answer(s, "a", 10)
    step, done = s.command(protocol.CompactContext("k1"))
    started = only(step.records, CompactionStarted)[0]
    assert started.reason == "requested" and started.request_id == "k1"
    assert (started.start, started.end, started.run_id) == (0, 1, "")
    assert done == protocol.Done(started.compaction_id, done.seq)
    assert summaries(step)
    again, done2 = s.command(protocol.CompactContext("k1"))
    assert not again and done2.duplicate and done2.ref == started.compaction_id
    same, done3 = s.command(protocol.CompactContext("k2"))
    assert not same and done3.ref == started.compaction_id, "the one in progress"
    summarised(s, "S")
    with pytest.raises(errors.Refused, match="1 already summarised"):
        s.command(protocol.CompactContext("k3"))


def test_a_paused_session_makes_no_summary_call_until_resumed() -> None:
    s = session(keep_recent=0)
    s.command(protocol.Submit("r1", "q"))
    answer(s, "a", 10)
    s.command(protocol.Pause("p1"))
    step, _ = s.command(protocol.CompactContext("k1"))
    assert kinds(step) == ["CompactionStarted"] and not summaries(step)
    step, _ = s.command(protocol.Resume("p2"))
    assert summaries(step)


def test_decide_face_names_the_command() -> None:
    assert protocol.CompactContext in decide.COMMANDS


def test_perdure_show_says_what_the_model_is_sent() -> None:
    from perdure.inspect import render, summarize

    s, _ = two_runs(tokens=900)
    pending = summarize(s.state)["context"]
    assert pending["compacting"]["items"] == [0, 1] and pending["compactions"] == []
    assert any("compacting: items 0-1" in text for _, text in render(summarize(s.state)))
    summarised(s, "S")
    context = summarize(s.state)["context"]
    assert context["summarised"] == 1 and context["items"] == 3
    (done,) = context["compactions"]
    assert done["tokens_before"] == 900 and done["model"] == "small"
    lines = [text for _, text in render(summarize(s.state))]
    assert any("1 compaction(s)" in line and "first 1 of 3 items" in line for line in lines)
    fresh = session()
    assert not any("compaction" in text for _, text in render(summarize(fresh.state)))
