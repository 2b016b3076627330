"""Token and cost budgets, and the price table that turns token usage into cost.

A ``Budget`` holds limits: tokens and cost (US dollars) per run and per session. It is
given to ``open_runtime(budget=)`` (every session), to ``create_session(budget=)``, or
with a new input or a revision (``submit(..., budget=)``, ``revise(..., budget=)``), and
every budget given to a session is recorded in the log, so the one in force after a
restart is the one in force before it.

The session actor checks it before every model call, from the usage recorded in the log
(never from a counter in memory, which a crash would reset): a run over its budget is
finished ``stopped`` with a reason that names the budget and the spend, and nothing is
lost — a new input (or a revision) with a larger budget continues the session.

Tokens count everything a vendor bills: input, output, and cache writes and reads. Cost
uses a ``Price`` per million tokens for the model that answered; a model with no price
cannot be held to a cost budget, so a run with a cost limit stops rather than spend
without counting (add the model to the table). ``DEFAULT_PRICES`` are list prices at the
time of writing, for convenience only: pass your own table to be exact.

Beside the prices, ``DEFAULT_CONTEXT_WINDOWS`` gives each model's context window in
tokens, which context compaction measures the last request against (``window_of``;
``open_runtime(context_windows=...)`` or a ``CompactionPolicy(window=...)`` overrides it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attrs import frozen

from perdure.storage.records import Budget, CompactionPolicy, Usage

__all__ = [
    "DEFAULT_CONTEXT_WINDOWS",
    "DEFAULT_PRICES",
    "Budget",
    "CompactionPolicy",
    "Price",
    "check_compaction",
    "over_budget",
    "price_of",
    "spent_cost",
    "spent_tokens",
    "tokens",
    "window_of",
]


@frozen
class Price:
    """US dollars per million tokens of each kind."""

    input: float
    output: float
    cache_write: float = 0.0
    cache_read: float = 0.0

    def cost(self, usage: Usage) -> float:
        return (
            usage.input_tokens * self.input
            + usage.output_tokens * self.output
            + usage.cache_creation_input_tokens * self.cache_write
            + usage.cache_read_input_tokens * self.cache_read
        ) / 1_000_000


# List prices (USD per million tokens) of common models; a model name matches the longest
# entry it starts with, so dated snapshots ("claude-sonnet-4-5-20250929") find their family.
DEFAULT_PRICES: Mapping[str, Price] = {
    "claude-opus-4": Price(15.0, 75.0, 18.75, 1.50),
    "claude-opus-4-5": Price(5.0, 25.0, 6.25, 0.50),
    "claude-sonnet-4": Price(3.0, 15.0, 3.75, 0.30),
    "claude-3-7-sonnet": Price(3.0, 15.0, 3.75, 0.30),
    "claude-3-5-sonnet": Price(3.0, 15.0, 3.75, 0.30),
    "claude-haiku-4-5": Price(1.0, 5.0, 1.25, 0.10),
    "claude-3-5-haiku": Price(0.80, 4.0, 1.0, 0.08),
    "gpt-4o": Price(2.50, 10.0, 0.0, 1.25),
    "gpt-4o-mini": Price(0.15, 0.60, 0.0, 0.075),
    "gpt-4.1": Price(2.0, 8.0, 0.0, 0.50),
    "gpt-4.1-mini": Price(0.40, 1.60, 0.0, 0.10),
    "gpt-4.1-nano": Price(0.10, 0.40, 0.0, 0.025),
    "o3": Price(2.0, 8.0, 0.0, 0.50),
    "o4-mini": Price(1.10, 4.40, 0.0, 0.275),
    "scripted": Price(0.0, 0.0),  # the offline ScriptedProvider costs nothing
}


# Context windows (input tokens) of the same models, matched the same way.
DEFAULT_CONTEXT_WINDOWS: Mapping[str, int] = {
    "claude-opus-4": 200_000,
    "claude-opus-4-5": 200_000,
    "claude-sonnet-4": 200_000,
    "claude-3-7-sonnet": 200_000,
    "claude-3-5-sonnet": 200_000,
    "claude-haiku-4-5": 200_000,
    "claude-3-5-haiku": 200_000,
    "gpt-4o": 128_000,
    "gpt-4o-mini": 128_000,
    "gpt-4.1": 1_047_576,
    "gpt-4.1-mini": 1_047_576,
    "gpt-4.1-nano": 1_047_576,
    "o3": 200_000,
    "o4-mini": 200_000,
}


def check_compaction(policy: CompactionPolicy) -> CompactionPolicy:
    """``policy`` if it makes sense, else a ``ValueError`` naming what does not."""
    if not 0.0 < policy.threshold <= 1.0:
        raise ValueError(
            f"compaction threshold must be a share of the window in (0, 1], not "
            f"{policy.threshold!r}"
        )
    if policy.keep_recent < 0:
        raise ValueError(f"compaction keep_recent must be 0 or more, not {policy.keep_recent}")
    if policy.window is not None and policy.window <= 0:
        raise ValueError(f"compaction window must be a positive token count, not {policy.window}")
    return policy


def _longest_entry(model: str, table: Mapping[str, object]) -> str | None:
    if model in table:
        return model
    return max((name for name in table if model.startswith(name)), key=len, default=None)


def window_of(model: str, windows: Mapping[str, int]) -> int | None:
    """The context window of ``model``: an exact entry, else the longest entry it starts
    with; None when the table does not know it (no automatic compaction then)."""
    name = _longest_entry(model, windows)
    return windows[name] if name is not None else None


def price_of(model: str, prices: Mapping[str, Price]) -> Price | None:
    """The price of ``model``: an exact entry, else the longest entry it starts with."""
    name = _longest_entry(model, prices)
    return prices[name] if name is not None else None


def tokens(usage: Usage) -> int:
    """Every billed token of ``usage``."""
    return (
        usage.input_tokens
        + usage.output_tokens
        + usage.cache_creation_input_tokens
        + usage.cache_read_input_tokens
    )


Spend = Mapping[str, Usage]  # usage by the model that answered ("" when unknown)


def spent_tokens(spend: Spend) -> int:
    return sum(tokens(usage) for usage in spend.values())


def spent_cost(spend: Spend, prices: Mapping[str, Price]) -> tuple[float, list[str]]:
    """The cost of ``spend``, and the models (with tokens) that have no price."""
    total = 0.0
    unpriced: list[str] = []
    for model, usage in sorted(spend.items()):
        price = price_of(model, prices)
        if price is None:
            if tokens(usage):
                unpriced.append(model or "(unknown model)")
            continue
        total += price.cost(usage)
    return total, unpriced


def cost_summary(spend: Spend, prices: Mapping[str, Price]) -> dict[str, Any]:
    """What ``spend`` costs at ``prices``, as JSON-ready data (a session's summary and
    the daemon's AG-UI snapshot): ``usd`` to a millionth, and the ``unpriced_models``
    (listed, not counted)."""
    usd, unpriced = spent_cost(spend, prices)
    return {"usd": round(usd, 6), "unpriced_models": unpriced}


def over_budget(
    budget: Budget, run: Spend, session: Spend, prices: Mapping[str, Price]
) -> str | None:
    """Why a model call may not start under ``budget`` (None: it may)."""
    for limit, spend, what in (
        (budget.run_tokens, run, "run"),
        (budget.session_tokens, session, "session"),
    ):
        used = spent_tokens(spend)
        if limit is not None and used >= limit:
            return f"the {what}'s token budget is spent: {used} of {limit} tokens used"
    for cost_limit, spend, what in (
        (budget.run_cost, run, "run"),
        (budget.session_cost, session, "session"),
    ):
        if cost_limit is None:
            continue
        cost, unpriced = spent_cost(spend, prices)
        if unpriced:
            return (
                f"the {what}'s cost budget cannot be kept: no price for "
                f"{', '.join(unpriced)} (add it to the price table: open_runtime(prices=...))"
            )
        if cost >= cost_limit:
            return f"the {what}'s cost budget is spent: ${cost:.4f} of ${cost_limit:.4f} used"
    return None
