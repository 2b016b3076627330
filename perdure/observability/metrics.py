"""Prometheus metrics of a runtime, for the daemon's ``GET /metrics``.

``RuntimeMetrics`` keeps its own ``CollectorRegistry`` (never prometheus_client's
global one, which belongs to the application) and is fed by what the runtime
commits: the Journal tells it about every durable transaction (how long the
backend's commit took, which records it held), and as a commit observer
(``perdure.observability.hooks``) it sees each tool call's replay policy in the
session's state. Gauges (resident sessions, event-stream subscribers and their
backlog) are read when scraped, and so are the stuck runs (``perdure.stuck``:
computed from the log's active sessions on each scrape, never per turn).

Names use base units and the usual suffixes (``_total``, ``_seconds``); no label
takes a session, run or call id, so the number of series stays bounded.

Requires ``prometheus-client`` (the ``perdure[metrics]`` extra).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp

from perdure.storage.records import (
    Committed,
    CompactionAbandoned,
    CompactionRetryPending,
    ContextCompacted,
    GenerationCompleted,
    Record,
    RecoveryDecision,
    RetryPending,
    RunFinished,
    ToolCancelled,
    ToolCompleted,
    ToolOutcomeUnknown,
    Usage,
)

if TYPE_CHECKING:
    from perdure import Runtime
    from perdure.view import SessionLookup

__all__ = ["CONTENT_TYPE_LATEST", "RuntimeMetrics"]

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class RuntimeMetrics:
    """The runtime's Prometheus metrics; ``attach`` it to a runtime, ``render`` to scrape."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.commits = Counter(
            "perdure_commits", "Durable transactions of the log (group commits)", registry=r
        )
        self.records = Counter(
            "perdure_records_committed", "Records committed, by type", ["type"], registry=r
        )
        self.commit_seconds = Histogram(
            "perdure_commit_duration_seconds",
            "Time the log backend took to make one transaction durable",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.commit_records = Histogram(
            "perdure_commit_records",
            "Records per durable transaction",
            buckets=_SIZE_BUCKETS,
            registry=r,
        )
        self.runs = Counter(
            "perdure_runs_finished", "Runs finished, by status", ["status"], registry=r
        )
        self.tool_calls = Counter(
            "perdure_tool_calls",
            "Tool calls that reached a result, by replay policy and outcome "
            "(ok, error, unknown, cancelled)",
            ["policy", "outcome"],
            registry=r,
        )
        self.recoveries = Counter(
            "perdure_recovery_decisions", "Recovery decisions, by action", ["action"], registry=r
        )
        self.model_retries = Counter(
            "perdure_model_retries", "Failed model attempts to be retried", ["provider"], registry=r
        )
        self.compactions = Counter(
            "perdure_context_compactions",
            "Context compactions finished, by outcome (compacted: a summary replaced older "
            "turns in what the model is sent; abandoned: none could be made)",
            ["outcome"],
            registry=r,
        )
        self.tokens = Counter(
            "perdure_tokens",
            "Model tokens, by type (input, output, cache_creation, cache_read)",
            ["type"],
            registry=r,
        )
        self.resident = Gauge(
            "perdure_resident_sessions", "Sessions in memory (running or hibernated)", registry=r
        )
        self.hibernated = Gauge(
            "perdure_hibernated_sessions",
            "Sessions in memory whose idle actor hibernated (their state only)",
            registry=r,
        )
        self.frozen = Gauge(
            "perdure_frozen_sessions",
            "Hibernated sessions whose state is frozen into one compact blob",
            registry=r,
        )
        self.subscribers = Gauge(
            "perdure_event_stream_subscribers",
            "Open event streams (SSE clients and Runtime.events readers)",
            registry=r,
        )
        self.backlog = Gauge(
            "perdure_event_stream_backlog",
            "Events waiting in the fullest event stream's buffer",
            registry=r,
        )
        self.lagged = Gauge(
            "perdure_event_stream_lagged",
            "Event streams dropped for falling behind, since the runtime opened",
            registry=r,
        )

        self.stuck = Gauge(
            "perdure_stuck_runs",
            "Sessions with unfinished work and no record committed for the runtime's "
            "stuck_after seconds, by what they wait for",
            ["waiting"],
            registry=r,
        )
        self._runtime: Runtime | None = None

    async def refresh_stuck(self, rt: Runtime) -> None:
        """Count ``rt``'s stuck runs now, by what they wait for (done on each scrape)."""
        from perdure.stuck import WAITING_KINDS

        counts = dict.fromkeys(WAITING_KINDS, 0)
        for run in await rt.stuck_runs():
            counts[run.waiting.kind] += 1
        for kind, n in counts.items():
            self.stuck.labels(kind).set(n)

    def attach(self, rt: Runtime) -> None:
        """Read ``rt``'s gauges when scraped (pass this object to ``open_runtime(telemetry=)``
        too, so that its commits, recovery's included, are counted)."""
        self.resident.set_function(lambda: len(rt.resident_sessions))
        self.hibernated.set_function(lambda: len(rt.hibernated_sessions))
        self.frozen.set_function(lambda: len(rt.frozen_sessions))
        self.subscribers.set_function(lambda: rt.stream_stats().open)
        self.backlog.set_function(lambda: rt.stream_stats().backlog)
        self.lagged.set_function(lambda: rt.stream_stats().lagged)
        self._runtime = rt  # its stuck runs are counted when scraped (they need the log)

    def render(self) -> bytes:
        """The exposition text (``CONTENT_TYPE_LATEST``)."""
        return generate_latest(self.registry)

    async def scrape(self, request: Request) -> Response:
        """A Starlette endpoint answering with the exposition."""
        if self._runtime is not None:
            await self.refresh_stuck(self._runtime)
        return Response(self.render(), media_type=CONTENT_TYPE_LATEST)

    def asgi_app(self) -> ASGIApp:
        """``GET /metrics`` alone (no auth of its own: serve it on loopback only)."""
        return Starlette(routes=[Route("/metrics", self.scrape, methods=["GET"])])

    # -- every durable transaction (the Journal) ----------------------------------------

    def on_commit(self, committed: Sequence[Committed], took: float) -> None:
        self.commits.inc()
        self.commit_seconds.observe(took)
        self.commit_records.observe(len(committed))
        for c in committed:
            record = c.record
            self.records.labels(type(record).__name__).inc()
            if isinstance(record, RunFinished):
                self.runs.labels(record.status).inc()
            elif isinstance(record, GenerationCompleted):
                self._tokens(record.usage)
            elif isinstance(record, RetryPending):
                self.model_retries.labels(record.provider or "unknown").inc()
                self._tokens(record.usage)
            elif isinstance(record, RecoveryDecision):
                self.recoveries.labels(record.action).inc()
            elif isinstance(record, ContextCompacted):
                self.compactions.labels("compacted").inc()
                self._tokens(record.usage)
            elif isinstance(record, CompactionAbandoned):
                self.compactions.labels("abandoned").inc()
                self._tokens(record.usage)
            elif isinstance(record, CompactionRetryPending):
                self.model_retries.labels(record.provider or "unknown").inc()
                self._tokens(record.usage)

    def _tokens(self, usage: Usage) -> None:
        for kind, n in (
            ("input", usage.input_tokens),
            ("output", usage.output_tokens),
            ("cache_creation", usage.cache_creation_input_tokens),
            ("cache_read", usage.cache_read_input_tokens),
        ):
            if n:
                self.tokens.labels(kind).inc(n)

    # -- the commit observer: what needs the session's state ----------------------------

    def before_commit(self, state: SessionLookup, records: Sequence[Record]) -> Sequence[Record]:
        return records

    def commit_failed(self, state: SessionLookup, records: Sequence[Record]) -> None:
        pass

    def after_commit(self, state: SessionLookup, committed: Sequence[Committed]) -> None:
        for c in committed:
            record = c.record
            if isinstance(record, ToolCompleted):
                outcome = "error" if record.is_error else "ok"
            elif isinstance(record, ToolOutcomeUnknown):
                outcome = "unknown"
            elif isinstance(record, ToolCancelled):
                outcome = "cancelled"
            else:
                continue
            executing = state.tool_attempt(record.call_id)
            # A call that never ran (invalid arguments, denied, unknown tool) has no policy.
            policy = executing.replay if executing is not None else "none"
            self.tool_calls.labels(policy, outcome).inc()
