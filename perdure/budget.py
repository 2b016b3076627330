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
"""

from __future__ import annotations

from collections.abc import Mapping

from attrs import frozen

from perdure.storage.records import Budget, Usage

__all__ = [
    "DEFAULT_PRICES",
    "Budget",
    "Price",
    "over_budget",
    "price_of",
    "spent_cost",
    "spent_tokens",
    "tokens",
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


def price_of(model: str, prices: Mapping[str, Price]) -> Price | None:
    """The price of ``model``: an exact entry, else the longest entry it starts with."""
    if model in prices:
        return prices[model]
    best = max((name for name in prices if model.startswith(name)), key=len, default=None)
    return prices[best] if best is not None else None


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
