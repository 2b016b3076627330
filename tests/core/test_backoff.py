"""One back-off formula serves every retry: the model's, a tool's, the supervisor's."""

from __future__ import annotations

import pytest

from perdure import RetryPolicy
from perdure.actors import decide
from perdure.actors.protocol import Env
from perdure.actors.session import RELOAD_BACKOFF
from perdure.actors.supervisor import MAX_OUTAGE_BACKOFF, OUTAGE_BACKOFF, RESTART_BACKOFF
from perdure.backoff import Backoff
from perdure.settings import Limits


def test_the_wait_grows_by_the_multiplier_up_to_the_cap_with_jitter_between_half_and_all() -> None:
    policy = Backoff(initial=1.0, cap=10.0, multiplier=3.0)
    assert [policy.ceiling(n) for n in (1, 2, 3, 4)] == [1.0, 3.0, 9.0, 10.0]
    assert policy.delay(2, jitter=0.0) == 1.5
    assert policy.delay(2, jitter=1.0) == 3.0 == policy.delay(2)
    assert policy.delay(2, jitter=0.0, retry_after=7.0) == 7.0
    assert Backoff(initial=1.0, cap=5.0, multiplier=1e6).ceiling(10**6) == 5.0  # no overflow


def test_model_and_tool_retries_wait_by_the_same_formula() -> None:
    env = Env(tools={}, now=0.0, limits=Limits(retry_base=2.0, retry_cap=30.0))
    same = Backoff(initial=2.0, cap=30.0)
    for attempt in (1, 2, 5, 9):
        assert decide.retry_delay(env, attempt, None, 0.25) == same.delay(attempt, 0.25)
    # A server's retry-after is believed up to ten times the model's cap.
    assert decide.retry_delay(env, 1, 1000.0, 0.0) == 300.0
    tool = RetryPolicy(initial=2.0, max_interval=30.0, multiplier=2.0)
    assert [tool.delay(n, 0.25) for n in (1, 2, 5, 9)] == [
        same.delay(n, 0.25) for n in (1, 2, 5, 9)
    ]
    assert tool.delay(1, 0.0, retry_after=1000.0) == 1000.0


@pytest.mark.parametrize(
    ("policy", "waits"),
    [
        (RESTART_BACKOFF, [0.1, 0.2, 0.4, 0.8, 1.6, 2.0]),
        (OUTAGE_BACKOFF, [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, MAX_OUTAGE_BACKOFF]),
        (RELOAD_BACKOFF, [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0]),
    ],
)
def test_the_shells_waits_are_the_same_formula_without_jitter(
    policy: Backoff, waits: list[float]
) -> None:
    assert [policy.delay(n) for n in range(1, len(waits) + 1)] == pytest.approx(waits)
