"""The one seam between the runtime and its observers: records around each commit.

An observer sees what a session actor commits, never what it merely decides:
``before_commit`` gets the records about to be appended (and may only stamp a
``RunStarted`` with the trace context of the span it opens for the run, so the log
keeps it for a process that resumes the run after a crash); ``after_commit`` gets
them back with their sequence numbers once they are durable, with the session's
state already folded over them. Observers read that state through the read model
(``perdure.SessionLookup``: one frozen submission, run, model turn or tool call by its
id, made when asked), never the fold's own dicts, whose shape is the core's to change.
Observers must be quick and must not raise; the shell calls them through
``observe_before`` / ``observe_after`` / ``observe_failed``, which log and ignore an
observer's error, since telemetry never stops a run.

This module imports nothing optional: the tracing observer (OpenTelemetry) and the
Prometheus one live in their own modules and are imported only when used.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from perdure.storage.records import Committed, Record

if TYPE_CHECKING:
    from perdure.view import SessionLookup


log = logging.getLogger("perdure.session")  # an observer's failure is the session's to log
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}$")


def check_traceparent(value: str) -> str:
    """``value`` if it is a W3C ``traceparent`` (version 00 form), else a clear ValueError."""
    found = _TRACEPARENT.match(value)
    if (
        found is None
        or found.group(1) == "ff"
        or set(found.group(2)) == {"0"}
        or set(found.group(3)) == {"0"}
    ):
        raise ValueError(
            f"not a W3C traceparent: {value!r} (expected 00-<32 hex>-<16 hex>-<2 hex>, "
            "lower case, ids not all zero)"
        )
    return value


class CommitObserver(Protocol):
    def before_commit(self, state: SessionLookup, records: Sequence[Record]) -> Sequence[Record]:
        """Return ``records`` unchanged, or with ``RunStarted.traceparent`` stamped."""
        ...

    def after_commit(self, state: SessionLookup, committed: Sequence[Committed]) -> None:
        """The records are durable; ``state`` includes them."""
        ...

    def commit_failed(self, state: SessionLookup, records: Sequence[Record]) -> None:
        """The append of ``records`` failed: nothing of it is in the log."""
        ...


def observe_before(
    observers: Sequence[CommitObserver],
    session_id: str,
    state: SessionLookup,
    records: Sequence[Record],
) -> Sequence[Record]:
    """Show each observer the records about to be appended; return them as stamped."""
    for observer in observers:
        try:
            records = observer.before_commit(state, records)
        except Exception:
            log.exception("session %s: an observer failed before a commit", session_id)
    return records


def observe_after(
    observers: Sequence[CommitObserver],
    session_id: str,
    state: SessionLookup,
    committed: Sequence[Committed],
) -> None:
    """Show each observer the records now durable."""
    for observer in observers:
        try:
            observer.after_commit(state, committed)
        except Exception:
            log.exception("session %s: an observer failed after a commit", session_id)


def observe_failed(
    observers: Sequence[CommitObserver],
    session_id: str,
    state: SessionLookup,
    records: Sequence[Record],
) -> None:
    """Tell each observer that the append of ``records`` failed."""
    for observer in observers:
        try:
            observer.commit_failed(state, records)
        except Exception:
            log.exception("session %s: an observer failed on a failed commit", session_id)


@runtime_checkable
class TransactionObserver(Protocol):
    """An observer that also wants every durable transaction of the log (any session's).

    ``open_runtime`` registers an observer's ``on_commit`` with the Journal before
    recovery, so the commits of recovery are counted too.
    """

    def on_commit(self, committed: Sequence[Committed], took: float) -> None:
        """Called on the trio thread; ``took``: seconds the backend's commit took."""
        ...


@runtime_checkable
class BackgroundObserver(Protocol):
    """An observer with work of its own to do over time (the tracing one's batches).

    ``open_runtime`` runs ``background`` as a task for the runtime's lifetime and
    cancels it when the runtime stops, before calling the observer's ``close``.
    """

    async def background(self) -> None: ...


def auto_observers() -> tuple[CommitObserver, ...]:
    """Tracing through the application's OpenTelemetry providers, if the API is installed.

    Until the application installs a provider, the API's tracer and meter are no-ops.
    Without ``opentelemetry-api`` (the ``perdure[otel]`` extra) this is empty.
    """
    try:
        from perdure.observability.tracing import Tracing
    except ImportError:
        return ()
    return (Tracing(),)
