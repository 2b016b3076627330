"""The one workload every system runs, with the same payloads everywhere.

An agent loop of K turns. Each turn is a model call that returns one fixed tool call
(an instant, deterministic fake model) and the tool returning a ~200-byte string;
every step is durable before the next one starts. After K turns the model answers.

The fake model decides by counting the assistant messages of the conversation it is
sent, as a real provider receives the whole conversation. This module is plain
Python (no perdure import) so that the peers' processes, in their own virtual
environments, import exactly the same constants.
"""

from __future__ import annotations

import itertools
from typing import Any, Final

USER_TEXT: Final = "Look the order up until you are sure, then report its status."
TOOL_NAME: Final = "lookup"
TOOL_ARGS: Final = {"query": "order-4711"}
REPLY_TEXT: Final = ""  # the model says nothing besides its tool call
FINAL_TEXT: Final = "Order 4711 shipped on Monday; it arrives on Thursday."


def _tool_output() -> str:
    head = "order-4711: status=shipped carrier=DHL tracking=JJD000390007821 eta=Thursday "
    out = head + "".join(f"event{i}=ok " for i in range(40))
    return out[:200]


WARMUP_TURNS: Final = 5  # a short session run first, in the same process, before measuring

TOOL_OUTPUT: Final = _tool_output()
assert len(TOOL_OUTPUT.encode()) == 200


def call_id(turn: int) -> str:
    """The id of the tool call of 1-based ``turn`` (same scheme in every system)."""
    return f"call_{turn:04d}"


def wants_tool(assistant_turns: int, k: int) -> bool:
    """The fake model's whole policy: a tool call for turns 1..K, then the answer."""
    return assistant_turns < k


def median(values: list[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return float("nan")
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def turn_stats(starts: list[float]) -> dict[str, Any]:
    """Per-turn figures from the model-call timestamps of one session (K+1 calls).

    Turn i lasts from model call i to model call i+1: the commit of the reply (with
    the tool task), the tool, the commit of its result, and the next model call.
    """
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    head, tail = gaps[:10], gaps[-10:]
    return {
        "turns": len(gaps),
        "median_ms": median(gaps) * 1e3,
        "p90_ms": quantile(gaps, 0.9) * 1e3,
        "first10_median_ms": median(head) * 1e3,
        "last10_median_ms": median(tail) * 1e3,
        "last10_over_first10": median(tail) / median(head) if head else float("nan"),
        "total_s": starts[-1] - starts[0] if starts else 0.0,
        "gaps_us": [round(g * 1e6) for g in gaps],
    }
