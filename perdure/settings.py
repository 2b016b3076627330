"""A runtime's settings: one frozen object, built and checked once, passed down.

``open_runtime`` takes its settings as keywords (its public signature stays so); it
builds one ``Settings`` from them, which refuses a bad value with an error naming the
keyword before anything is opened, and every part of the runtime reads that one
object: the supervisor (restarts, memory, ownership), the session shell (heartbeats)
and, through ``Limits``, the pure decisions (``perdure.actors.protocol.Env`` carries
the ``Limits`` themselves, never a copy of their fields).

Pure and small: attrs and the price table, nothing that performs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from attrs import Attribute, field, frozen

from perdure.budget import (
    DEFAULT_CONTEXT_WINDOWS,
    DEFAULT_PRICES,
    CompactionPolicy,
    Price,
    check_compaction,
)
from perdure.storage.records import Budget
from perdure.stuck import DEFAULT_STUCK_AFTER

__all__ = ["Limits", "Settings"]

_Validator = Callable[[Any, "Attribute[Any]", Any], None]


def _count(least: int) -> _Validator:
    """A whole number (not a bool) of at least ``least``."""

    def check(_: Any, attribute: Attribute[Any], value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(
                f"{attribute.name} must be a whole number of at least {least}, not {value!r}"
            )

    return check


def _seconds(*, positive: bool = False, optional: bool = False) -> _Validator:
    """A number of seconds (0 or more; above 0 if ``positive``), or None if ``optional``."""
    wanted = "a positive number of seconds" if positive else "a number of seconds (0 or more)"
    if optional:
        wanted += " or None"

    def check(_: Any, attribute: Attribute[Any], value: Any) -> None:
        if value is None and optional:
            return
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not (number and not math.isnan(value) and (value > 0 if positive else value >= 0)):
            raise ValueError(f"{attribute.name} must be {wanted}, not {value!r}")

    return check


def _flag(_: Any, attribute: Attribute[Any], value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{attribute.name} must be True or False, not {value!r}")


def _budget(_: Any, attribute: Attribute[Any], value: Any) -> None:
    if value is not None and not isinstance(value, Budget):
        raise ValueError(f"{attribute.name} must be a perdure.Budget or None, not {value!r}")


def _price_table(value: Any) -> Any:
    """The built-in table for None; a copy of a caller's mapping (its later changes are
    not ours); anything else as it is, for the validator to name."""
    if value is None:
        return dict(DEFAULT_PRICES)
    return dict(value) if isinstance(value, Mapping) else value


def _prices(_: Any, attribute: Attribute[Any], value: Any) -> None:
    if not isinstance(value, dict) or not all(
        isinstance(model, str) and isinstance(price, Price) for model, price in value.items()
    ):
        raise ValueError(f"{attribute.name} must map model names to perdure.Price, not {value!r}")


def _compaction(_: Any, attribute: Attribute[Any], value: Any) -> None:
    if not isinstance(value, CompactionPolicy):
        raise ValueError(f"{attribute.name} must be a perdure.CompactionPolicy, not {value!r}")
    try:
        check_compaction(value)
    except ValueError as exc:
        raise ValueError(f"{attribute.name} must be a sensible policy: {exc} ({value!r})") from None


def _window_table(value: Any) -> Any:
    """The built-in table for None; a copy of a caller's mapping; anything else as it is."""
    if value is None:
        return dict(DEFAULT_CONTEXT_WINDOWS)
    return dict(value) if isinstance(value, Mapping) else value


def _windows(_: Any, attribute: Attribute[Any], value: Any) -> None:
    if not isinstance(value, dict) or not all(
        isinstance(model, str) and isinstance(n, int) and not isinstance(n, bool) and n > 0
        for model, n in value.items()
    ):
        raise ValueError(
            f"{attribute.name} must map model names to context windows (positive token "
            f"counts), not {value!r}"
        )


@frozen(kw_only=True)
class Limits:
    """What a session's decisions may consult besides its state, the tools and the time."""

    # Resumes of one task in a row, with no progress between them, before it fails.
    resume_budget: int = field(default=3, validator=_count(0))
    max_turns: int = field(default=100, validator=_count(1))  # model turns of one run
    # Attempts of a model call that fails with a retryable error.
    max_model_attempts: int = field(default=8, validator=_count(1))
    # The back-off of model and tool retries (``perdure.backoff``): first wait, ceiling.
    retry_base: float = field(default=1.0, validator=_seconds())
    retry_cap: float = field(default=60.0, validator=_seconds())
    # Let tools drop a settled call's reconcile state (``Forget``); only with durable
    # ("full") commits, so no terminal record a power loss could undo outlives it.
    forget_settled: bool = field(default=False, validator=_flag)
    budget: Budget | None = field(default=None, validator=_budget)  # a session may have its own
    prices: Mapping[str, Price] = field(
        factory=lambda: dict(DEFAULT_PRICES), converter=_price_table, validator=_prices
    )
    # Context compaction: the runtime's policy (a session may have its own) and the
    # context window of each model, matched like the price table.
    compaction: CompactionPolicy = field(factory=CompactionPolicy, validator=_compaction)
    context_windows: Mapping[str, int] = field(
        factory=lambda: dict(DEFAULT_CONTEXT_WINDOWS), converter=_window_table, validator=_windows
    )


@frozen(kw_only=True)
class Settings:
    """Everything a runtime is configured with besides its log, provider and tools."""

    limits: Limits = field(factory=Limits)
    # Seconds running tools get to finish when the runtime exits.
    shutdown_grace: float = field(default=10.0, validator=_seconds())
    # Seconds of unfinished work without a committed record before it counts as stuck.
    stuck_after: float = field(default=DEFAULT_STUCK_AFTER, validator=_seconds())
    # Seconds an idle session stays in memory before it is evicted (its state lives
    # in the log; the next message starts it again, from the log). None: never.
    idle_timeout: float | None = field(
        default=300.0, validator=_seconds(positive=True, optional=True)
    )
    # Seconds an idle session's actor runs before it hibernates: its task, mailbox and
    # scopes go, its folded state stays in memory, and the next message starts a new
    # actor on that state without reading the log. None (or not below idle_timeout):
    # the actor stays until it is evicted. Only on a single-owner log (LMDB).
    hibernate_after: float | None = field(default=1.0, validator=_seconds(optional=True))
    # With a multi-node log: move sessions between nodes so each runs its fair share
    # (perdure.actors.balance); off, a node only gets orphans and what it starts.
    rebalance: bool = field(default=True, validator=_flag)
    # A running call's heartbeats are committed at most once per this many seconds.
    heartbeat_interval: float = field(default=1.0, validator=_seconds(positive=True))
    # Actor crashes within restart_window seconds before a session is parked.
    max_restarts: int = field(default=3, validator=_count(0))
    restart_window: float = field(default=60.0, validator=_seconds(positive=True))
