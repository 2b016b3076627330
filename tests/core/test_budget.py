"""Budgets in the pure core: a run stops before a model call once a budget in force is
spent, counted from what the log holds (replies and failed attempts), never from memory."""

from __future__ import annotations

from typing import Any

import pytest

from perdure import errors
from perdure.actors import protocol
from perdure.budget import Price, cost_summary, over_budget, price_of, spent_cost, tokens
from perdure.providers.base import ModelReply
from perdure.storage.records import Budget, RunFinished, ToolCall, Usage
from tests.core.sim import Session, kinds, only

TURN = Usage(input_tokens=10, output_tokens=5)  # 15 tokens a turn
PRICES = {"model-a": Price(input=1000.0, output=2000.0)}  # $0.01 + $0.01 = $0.02 a turn


def reply(s: Session, *calls: tuple[str, str, dict[str, Any]], model: str = "model-a") -> Any:
    gen = s.state.current_generation()
    assert gen is not None and gen.phase != "completed"
    tool_calls = tuple(ToolCall(call_id=c, name=n, input=i) for c, n, i in calls)
    answer = ModelReply(text="t", tool_calls=tool_calls, usage=TURN, model=model)
    return s.result(protocol.ModelReplied(gen.generation_id, gen.attempt, answer))


def turn_with_a_lookup(s: Session, n: int) -> Any:
    reply(s, (f"c{n}", "lookup", {"query": "q"}))
    return s.finish_tool(f"c{n}")


def stopped(step: Any) -> RunFinished | None:
    done = [r for r in only(step.records, RunFinished) if r.status == "stopped"]
    return done[0] if done else None


def test_a_run_stops_before_the_call_that_would_exceed_its_token_budget() -> None:
    s = Session(budget=Budget(run_tokens=40), prices=PRICES)
    s.command(protocol.Submit("r1", "go"))
    assert stopped(turn_with_a_lookup(s, 1)) is None  # 15 spent
    assert stopped(turn_with_a_lookup(s, 2)) is None  # 30 spent
    step = turn_with_a_lookup(s, 3)  # 45 spent: no fourth call
    finished = stopped(step)
    assert finished is not None, kinds(step)
    assert "GenerationStarted" not in kinds(step)
    assert finished.reason == "the run's token budget is spent: 45 of 40 tokens used"
    assert s.state.idle and s.state.last_outcome == finished


def test_a_run_stops_at_its_cost_budget() -> None:
    s = Session(budget=Budget(run_cost=0.05), prices=PRICES)
    s.command(protocol.Submit("r1", "go"))
    turn_with_a_lookup(s, 1)  # $0.02
    turn_with_a_lookup(s, 2)  # $0.04
    finished = stopped(turn_with_a_lookup(s, 3))  # $0.06
    assert finished is not None
    assert "cost budget is spent: $0.0600 of $0.0500" in finished.reason


def test_a_model_without_a_price_cannot_be_held_to_a_cost_budget() -> None:
    s = Session(budget=Budget(run_cost=10.0), prices=PRICES)
    s.command(protocol.Submit("r1", "go"))
    reply(s, ("c1", "lookup", {"query": "q"}), model="mystery-1")
    finished = stopped(s.finish_tool("c1"))
    assert finished is not None
    assert "no price for mystery-1" in finished.reason


def test_the_session_budget_counts_every_run_and_a_new_input_may_raise_it() -> None:
    s = Session(budget=Budget(session_tokens=30), prices=PRICES)
    s.command(protocol.Submit("r1", "one"))
    reply(s)  # 15: run 1 completes
    s.command(protocol.Submit("r2", "two"))
    reply(s)  # 30 in the session
    step, _ = s.command(protocol.Submit("r3", "three"))
    finished = stopped(step)
    assert finished is not None and finished.submission_id == "in3"
    assert "session's token budget is spent: 30 of 30" in finished.reason
    step, _ = s.command(protocol.Submit("r4", "four", budget=Budget(session_tokens=100)))
    assert "GenerationStarted" in kinds(step), "a larger budget lets the session go on"
    assert s.state.budget == Budget(session_tokens=100)


def test_a_revision_replaces_the_budget_of_the_running_request() -> None:
    s = Session(budget=Budget(run_tokens=100), prices=PRICES)
    s.command(protocol.Submit("r1", "go"))
    reply(s, ("c1", "lookup", {"query": "q"}))
    s.command(protocol.Revise("v1", "stop soon", budget=Budget(run_tokens=10)))
    finished = stopped(s.finish_tool("c1"))
    assert finished is not None, "the revision's budget is the one in force"


def test_the_session_budget_replaces_the_runtime_default() -> None:
    s = Session(budget=Budget(run_tokens=1), prices=PRICES)
    s.state.budget = Budget(run_tokens=1000)  # as SessionCreated(budget=...) folds it
    s.command(protocol.Submit("r1", "go"))
    assert stopped(turn_with_a_lookup(s, 1)) is None


def test_failed_attempts_count_and_a_retry_is_not_made_over_the_budget() -> None:
    s = Session(budget=Budget(run_tokens=25), prices=PRICES)
    s.command(protocol.Submit("r1", "go"))
    gen = s.state.current_generation()
    assert gen is not None
    failed = protocol.ModelFailed(
        generation_id=gen.generation_id,
        attempt=1,
        error="overloaded",
        retryable=True,
        usage=Usage(input_tokens=30),
        model="model-a",
    )
    step = s.result(failed)
    assert kinds(step)[0] == "RetryPending"
    finished = stopped(step)
    assert finished is not None, "the retry would start over the budget"
    assert not [e for e in step.effects if isinstance(e, protocol.CallModel)]
    assert s.state.spend == {"model-a": Usage(input_tokens=30)}


def test_the_spend_before_a_restart_counts_after_it() -> None:
    s = Session(budget=Budget(run_tokens=40), prices=PRICES)
    s.command(protocol.Submit("r1", "go"))
    turn_with_a_lookup(s, 1)
    reply(s, ("c2", "lookup", {"query": "q"}))  # 30 spent; c2 executing when it dies
    s.restart()  # c2 re-run (SAFE), the resumed run inherits nothing in memory
    assert s.state.run is not None and s.state.run.run_id == "in1.r1"
    assert s.state.spend == {"model-a": Usage(input_tokens=20, output_tokens=10)}
    s.finish_tool("c2")
    finished = stopped(turn_with_a_lookup(s, 3))  # 45 in the session, 15 in in1.r1
    assert finished is None, "a run's budget is per run: the resumed run spent 15"
    s2 = Session(budget=Budget(session_tokens=40), prices=PRICES)
    s2.command(protocol.Submit("r1", "go"))
    turn_with_a_lookup(s2, 1)
    reply(s2, ("c2", "lookup", {"query": "q"}))
    s2.restart()
    step = s2.finish_tool("c2")  # 30 spent before the crash, from the log
    assert stopped(step) is None
    finished = stopped(turn_with_a_lookup(s2, 3))  # 45
    assert finished is not None and "45 of 40" in finished.reason


def test_the_same_request_id_with_another_budget_is_a_conflict() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "go", budget=Budget(run_tokens=10)))
    s.state.requests["r1"].seq = 3
    step, answer = s.command(protocol.Submit("r1", "go", budget=Budget(run_tokens=10)))
    assert not step and isinstance(answer, protocol.Accepted) and answer.duplicate
    with pytest.raises(errors.Refused) as info:
        s.command(protocol.Submit("r1", "go", budget=Budget(run_tokens=99)))
    assert info.value.code == "conflict"


def test_prices_match_dated_model_names_by_their_family() -> None:
    table = {"claude-sonnet-4": Price(3.0, 15.0), "claude-sonnet-4-5": Price(4.0, 16.0)}
    assert price_of("claude-sonnet-4-5-20250929", table) == Price(4.0, 16.0)
    assert price_of("claude-sonnet-4-20250514", table) == Price(3.0, 15.0)
    assert price_of("gpt-4o", table) is None
    cost, unpriced = spent_cost({"claude-sonnet-4-x": Usage(input_tokens=1_000_000)}, table)
    assert (cost, unpriced) == (3.0, [])


def test_budget_limits_must_be_non_negative_numbers() -> None:
    with pytest.raises(ValueError, match="token limit"):
        Budget(run_tokens=-1)
    with pytest.raises(ValueError, match="token limit"):
        Budget(run_tokens=2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cost limit"):
        Budget(session_cost=True)
    with pytest.raises(ValueError, match="cost limit"):
        Budget(session_cost=float("inf"))
    assert Budget(run_cost=1).run_cost == 1.0 and isinstance(Budget(run_cost=1).run_cost, float)
    assert over_budget(Budget(), {}, {}, PRICES) is None


def test_a_cost_budget_names_the_budget_it_stops_on() -> None:
    """The reason says which budget is spent, run or session, with the spend; a spend
    equal to the limit is spent (no further call may start), as for tokens."""
    two_turns = {"model-a": Usage(input_tokens=20, output_tokens=10)}  # exactly $0.04
    assert over_budget(Budget(run_cost=0.04), two_turns, two_turns, PRICES) == (
        "the run's cost budget is spent: $0.0400 of $0.0400 used"
    )
    assert over_budget(Budget(run_cost=0.05), two_turns, two_turns, PRICES) is None
    # a session budget alone is checked as well (no run budget before it)
    assert over_budget(Budget(session_cost=0.03), {}, two_turns, PRICES) == (
        "the session's cost budget is spent: $0.0400 of $0.0300 used"
    )


def test_a_cost_budget_names_every_model_without_a_price() -> None:
    """Each model that spent tokens without a price is named, the unknown one too."""
    spend = {
        "": Usage(output_tokens=1),
        "mystery-1": Usage(input_tokens=3),
        "model-a": Usage(input_tokens=1),
    }
    assert over_budget(Budget(session_cost=1.0), {}, spend, PRICES) == (
        "the session's cost budget cannot be kept: no price for (unknown model), mystery-1 "
        "(add it to the price table: open_runtime(prices=...))"
    )


def test_the_cost_adds_up_every_priced_model_past_an_unpriced_one() -> None:
    """An unpriced model is listed, not counted, and the models after it are still
    priced and added up."""
    table = {"b-model": Price(input=1.0, output=2.0), "c-model": Price(input=10.0, output=0.0)}
    spend = {
        "a-unpriced": Usage(input_tokens=5),
        "b-model": Usage(input_tokens=1_000_000, output_tokens=1_000_000),  # $3
        "c-model": Usage(input_tokens=1_000_000),  # $10
        "d-unpriced": Usage(input_tokens=5),
        "e-silent": Usage(),  # no tokens: nothing to price
    }
    assert spent_cost(spend, table) == (13.0, ["a-unpriced", "d-unpriced"])


def test_cache_writes_and_reads_are_billed_tokens_at_their_own_price() -> None:
    """Tokens count input, output, cache writes and cache reads; the cost prices each
    kind by its own rate."""
    usage = Usage(
        input_tokens=1_000_000,
        output_tokens=1_000_000,
        cache_creation_input_tokens=1_000_000,
        cache_read_input_tokens=1_000_000,
    )
    assert tokens(usage) == 4_000_000
    assert Price(3.0, 15.0, 3.75, 0.30).cost(usage) == pytest.approx(22.05)
    assert over_budget(Budget(run_tokens=4_000_001), {"m": usage}, {}, {}) is None


def test_a_cost_summary_gives_dollars_to_a_millionth_and_the_unpriced_models() -> None:
    """What a session's summary and the daemon's snapshot show: the cost rounded to a
    millionth of a dollar, and the models it could not price."""
    table = {"model-a": Price(input=1.23456789, output=0.0)}
    spend = {"model-a": Usage(input_tokens=1_000_000), "mystery-1": Usage(output_tokens=2)}
    assert cost_summary(spend, table) == {"usd": 1.234568, "unpriced_models": ["mystery-1"]}
