"""open_runtime's keywords become one checked ``Settings``: a bad value is refused with
an error naming the keyword, before the log is opened (nothing is created or lost), and
what the runtime runs with is the object it built, not copies of its fields."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

import perdure
from perdure.budget import DEFAULT_PRICES, Price
from perdure.providers.scripted import Reply, ScriptedProvider
from perdure.settings import Limits, Settings


@pytest.mark.parametrize(
    ("keyword", "value", "words"),
    [
        ("resume_budget", -1, "resume_budget must be a whole number of at least 0"),
        ("max_turns", 0, "max_turns must be a whole number of at least 1"),
        ("max_turns", 2.5, "max_turns must be a whole number of at least 1"),
        ("max_model_attempts", True, "max_model_attempts must be a whole number"),
        ("retry_base", -0.5, "retry_base must be a number of seconds (0 or more)"),
        ("retry_cap", float("nan"), "retry_cap must be a number of seconds (0 or more)"),
        ("shutdown_grace", "10", "shutdown_grace must be a number of seconds (0 or more)"),
        ("stuck_after", -1, "stuck_after must be a number of seconds (0 or more)"),
        ("idle_timeout", 0, "idle_timeout must be a positive number of seconds or None"),
        ("hibernate_after", -1, "hibernate_after must be a number of seconds (0 or more) or None"),
        ("rebalance", "yes", "rebalance must be True or False"),
        ("budget", {"run_tokens": 5}, "budget must be a perdure.Budget or None"),
        ("prices", {"m": 1.0}, "prices must map model names to perdure.Price"),
        ("compaction", 0.8, "compaction must be a perdure.CompactionPolicy"),
        (
            "compaction",
            perdure.CompactionPolicy(threshold=2.0),
            "compaction must be a sensible policy: compaction threshold must be a share",
        ),
        ("context_windows", {"m": "big"}, "context_windows must map model names to context"),
    ],
)
async def test_a_bad_keyword_is_named_and_nothing_is_opened(
    log_dir: Path, keyword: str, value: Any, words: str
) -> None:
    with pytest.raises(ValueError, match=f"^{keyword} must ") as refused:
        async with perdure.open_runtime(log_dir, provider=ScriptedProvider([]), **{keyword: value}):
            pass
    assert str(refused.value).startswith(words), refused.value
    assert repr(value) in str(refused.value)  # the bad value itself is shown
    assert not await trio.Path(log_dir).exists()  # refused before the log was opened


async def test_the_runtime_runs_on_the_settings_it_was_given(log_dir: Path) -> None:
    mine = {"m": Price(input=1.0, output=2.0)}
    async with perdure.open_runtime(
        log_dir,
        provider=ScriptedProvider([Reply(text="hi")]),
        max_turns=7,
        retry_cap=9.0,
        stuck_after=42.0,
        durability="fast",
        prices=mine,
    ) as rt:
        mine["other"] = Price(input=0.0, output=0.0)  # not seen: a copy
        settings = rt._ctx.settings
        assert settings.limits == Limits(
            max_turns=7, retry_cap=9.0, forget_settled=False, prices={"m": mine["m"]}
        )
        assert rt.stuck_after == 42.0 == settings.stuck_after
        # What a decision is given is that very object, not a copy of its fields.
        assert rt._ctx.env({}).limits is settings.limits


async def test_a_summary_costs_at_the_runtimes_own_prices(log_dir: Path) -> None:
    """``Runtime.summary`` (the daemon's ``GET /v1/sessions/{id}``, ``perdure show``'s
    body) reckons cost at ``open_runtime(prices=)``, as budgets do: the scripted model
    costs nothing at the built-in table."""
    assert DEFAULT_PRICES["scripted"] == Price(input=0.0, output=0.0)
    mine = {"scripted": Price(input=1_000.0, output=10_000.0)}
    async with perdure.open_runtime(
        log_dir, provider=ScriptedProvider([Reply(text="hi")]), prices=mine
    ) as rt:
        await rt.create_session("s")
        await rt.submit("s", "go", request_id="r1")
        await rt.wait_idle("s")
        assert dict(rt.prices) == mine
        summary = await rt.summary("s")
    # 10 input and 5 output tokens (the scripted reply's usage) at $1,000 and $10,000
    # per million: 0.01 + 0.05.
    assert summary["cost"] == {"usd": 0.06, "unpriced_models": []}
    assert summary["runs"][0]["cost"] == {"usd": 0.06, "unpriced_models": []}


def test_defaults_are_the_documented_ones() -> None:
    settings = Settings()
    assert settings.limits.prices == dict(DEFAULT_PRICES)
    assert settings.limits.forget_settled is False  # only open_runtime's "full" durability
    assert (settings.idle_timeout, settings.hibernate_after, settings.shutdown_grace) == (
        300.0,
        1.0,
        10.0,
    )
