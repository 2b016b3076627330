"""One back-off policy for every retry perdure makes, and its one formula.

A model call that failed with a retryable error, a tool call under its
``RetryPolicy``, a session actor the supervisor restarts after a crash or while the
log is down, a session re-read after a failed commit: each waits, before attempt
``n + 1``, ``min(cap, initial * multiplier ** (n - 1))`` seconds, scaled by a jitter
sample ``j`` of U(0, 1) to between half and all of it (``* (0.5 + j / 2)``), and never
less than a server's retry-after. A wait without jitter (``j = 1``) is the whole
ceiling: the supervisor's restarts are one process's own and need no spreading.

Pure and small: the decisions (``perdure.actors.decide``) and the tool contract
compute a retry's ``not_before`` with it and record it before the wait; the shells
compute their sleeps with it.
"""

from __future__ import annotations

import math

from attrs import frozen

# Past this exponent the cap applies anyway (and ``multiplier ** n`` may overflow).
_MAX_EXPONENT = 1000


@frozen(kw_only=True)
class Backoff:
    """``initial`` seconds after the first failure, times ``multiplier`` after each
    further one, at most ``cap``."""

    initial: float
    cap: float
    multiplier: float = 2.0

    def ceiling(self, attempt: int) -> float:
        """The longest wait after failed attempt ``attempt`` (1 for the first)."""
        exponent = min(attempt - 1, _MAX_EXPONENT)
        try:
            grown = self.initial * self.multiplier**exponent
        except OverflowError:  # a multiplier above ~2.03 passes a float before 1000
            grown = math.inf
        return min(self.cap, grown)

    def delay(self, attempt: int, jitter: float = 1.0, retry_after: float | None = None) -> float:
        """Seconds to wait after failed attempt ``attempt``; ``jitter`` is a sample of
        U(0, 1) (1: no jitter, the whole ceiling); never less than ``retry_after``."""
        wait = self.ceiling(attempt) * (0.5 + jitter / 2)
        return wait if retry_after is None else max(wait, retry_after)
