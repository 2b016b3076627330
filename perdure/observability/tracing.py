"""OpenTelemetry traces and GenAI client metrics, read from the records a session commits.

``Tracing`` is a commit observer (``perdure.observability.hooks``). It follows the
OpenTelemetry GenAI semantic conventions:

* a run is an ``invoke_agent`` span, opened when its ``RunStarted`` is committed and
  ended at its ``RunFinished``; ``gen_ai.conversation.id`` is the session id;
* each model attempt is a ``chat {model}`` span (CLIENT), built from the log once
  the attempt is over (``GenerationCompleted`` or ``RetryPending``): it starts when
  the attempt started (the turn's ``GenerationStarted``, or the end of the previous
  attempt's back-off) and ends when its outcome was committed;
* each tool attempt is an ``execute_tool {name}`` span, from its ``ToolExecuting``
  to the record that ended it, with the call's replay policy, attempt and outcome
  (``unknown`` included);
* recovery decisions and retries are span events on the run's span.

Spans are built from durable facts, so what a trace shows is what the log says.
The attempts' spans and the metric records are handed to the SDK in batches
(``batch_delay``): at the latest ``batch_delay`` seconds after the first of a batch
was committed, when its run finishes, or when the runtime closes. Run by run the
SDK's code then stays warm in the CPU's caches instead of running once per commit
after an fsync has left them cold, which nearly halves what tracing adds to a turn's CPU
time here (``bench/README.md``);
``batch_delay=0`` hands each one over as its record commits: a process killed by
SIGKILL then loses no more than its span processor still holds (nothing, with the
SDK's simple processor).
The run's span context is stamped on its ``RunStarted`` (a W3C ``traceparent``):
a process that resumes the run after a crash opens the resumed run's span in the
same trace and links it to the interrupted one, and puts the spans of work the
dead process had started (a call it was running) under the interrupted run's span.
A caller's ``traceparent`` (``Runtime.submit(traceparent=...)``, or the HTTP header)
makes the run a child of the caller's span.

The tracer and meter come from the providers given, or from the application's
global ones (OpenTelemetry's API returns no-op ones until the application installs
a provider); perdure never installs a provider. Message content (the user's input,
the model's reply, tool arguments and results) is recorded only with
``capture_content=True``.

Requires ``opentelemetry-api`` (the ``perdure[otel]`` extra); this module is imported
only when tracing is used.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

import attrs
import trio
from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.trace import Link, NonRecordingSpan, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from perdure.storage.records import (
    Committed,
    CompactionAbandoned,
    CompactionRetryPending,
    CompactionStarted,
    ContextCompacted,
    GenerationCompleted,
    GenerationStarted,
    Record,
    RecoveryDecision,
    RetryPending,
    RunFinished,
    RunStarted,
    SessionParked,
    ToolAwaitingHuman,
    ToolCancelled,
    ToolCompleted,
    ToolOutcomeUnknown,
    ToolRetryPending,
    Usage,
)
from perdure.storage.redact import masked

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import SpanContext, TracerProvider

    from perdure.view import SessionLookup

__all__ = ["Tracing", "current_traceparent"]

SCOPE = "perdure"
logger = logging.getLogger("perdure.tracing")
_W3C = TraceContextTextMapPropagator()
_TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304)
_DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24)
_ERROR_WORD = re.compile(r"^([A-Za-z_][\w.]{0,63}):")
# How often (seconds) the observer looks whether the application has installed its
# global providers, while it has not.
PROVIDER_LOOK_EVERY: Final = 1.0
# Seconds a finished attempt's span may wait to be handed to the SDK with others.
BATCH_DELAY: Final = 0.5
# A batch is handed over at once when it holds this many spans and records.
BATCH_LIMIT: Final = 1024
# At most this many sets of metric attributes are kept for reuse (see _metric_attributes).
METRIC_ATTRIBUTE_SETS: Final = 256
_NO_USAGE: Final = Usage()
# The API's stand-in for a global meter provider not installed yet (its class is
# private: where it cannot be found, the global meter counts as installed).
_UNSET_METER_PROVIDER: type | None = getattr(
    getattr(metrics, "_internal", None), "_ProxyMeterProvider", None
)


def _ns(at: float) -> int:
    return int(at * 1e9)


def _context_of(traceparent: str) -> SpanContext | None:
    """The span context of a W3C ``traceparent``, or None if it is empty or malformed."""
    if not traceparent:
        return None
    ctx = _W3C.extract({"traceparent": traceparent})
    span_context = trace.get_current_span(ctx).get_span_context()
    return span_context if span_context.is_valid else None


def _traceparent(span_context: SpanContext) -> str:
    carrier: dict[str, str] = {}
    _W3C.inject(carrier, trace.set_span_in_context(NonRecordingSpan(span_context)))
    return carrier.get("traceparent", "")


def current_traceparent() -> str:
    """The ``traceparent`` of the caller's current span ("" outside any span)."""
    span_context = trace.get_current_span().get_span_context()
    return _traceparent(span_context) if span_context.is_valid else ""


def _error_type(message: str) -> str:
    """A low-cardinality ``error.type`` for a provider's error text."""
    found = _ERROR_WORD.match(message)
    return found.group(1) if found else "_OTHER"


def _add_usage(attributes: dict[str, Any], usage: Usage) -> dict[str, Any]:
    """``attributes`` with the GenAI usage attributes of ``usage`` added."""
    attributes["gen_ai.usage.input_tokens"] = usage.input_tokens
    attributes["gen_ai.usage.output_tokens"] = usage.output_tokens
    # Cache counts only where caching happened (each attribute costs the SDK a check).
    if usage.cache_creation_input_tokens:
        attributes["gen_ai.usage.cache_creation.input_tokens"] = usage.cache_creation_input_tokens
    if usage.cache_read_input_tokens:
        attributes["gen_ai.usage.cache_read.input_tokens"] = usage.cache_read_input_tokens
    return attributes


@attrs.define
class _Attempt:
    """When the current model attempt of a turn started (from the log)."""

    started: float
    run_id: str


class Tracing:
    """The OpenTelemetry observer. Pass it to ``open_runtime(telemetry=...)``.

    ``tracer_provider`` / ``meter_provider`` default to the application's global ones.
    ``capture_content`` records message content on the spans (off by default: it may
    hold personal data). ``batch_delay``: the most seconds an attempt's span or a
    metric record waits to be handed to the SDK with others (0: at once; see the
    module's docstring).
    """

    def __init__(
        self,
        *,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        capture_content: bool = False,
        batch_delay: float = BATCH_DELAY,
    ) -> None:
        if not (isinstance(batch_delay, int | float) and 0 <= batch_delay < math.inf):
            raise ValueError(f"batch_delay must be a number of seconds >= 0, not {batch_delay!r}")
        self.capture_content = capture_content
        self.batch_delay = float(batch_delay)
        # With neither provider given, the observer works only once the application
        # has installed a global one (see ``recording``).
        self._recording = tracer_provider is not None or meter_provider is not None
        self._next_look = -math.inf
        self._tracer = trace.get_tracer(SCOPE, tracer_provider=tracer_provider)
        meter = metrics.get_meter(SCOPE, meter_provider=meter_provider)
        self._token_usage = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Number of input and output tokens used",
            explicit_bucket_boundaries_advisory=_TOKEN_BUCKETS,
        )
        self._duration = meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="GenAI operation duration",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
        )
        self._runs: dict[tuple[str, str], Span] = {}  # live run spans, by (session, run)
        self._current: dict[str, Span] = {}  # the live run span of each session
        self._contexts: dict[tuple[str, str], otel_context.Context] = {}  # of live runs
        self._attempts: dict[tuple[str, str], _Attempt] = {}  # by (session, generation)
        # Compactions in progress: when the current attempt started, and its run.
        self._compactions: dict[tuple[str, str], _Attempt] = {}
        self._metric_attrs: dict[
            tuple[str, str, str, str], tuple[dict[str, Any], dict[str, Any], dict[str, Any]]
        ] = {}
        # SDK calls not made yet, in commit order, and what wakes ``background`` for them.
        self._batch: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        self._batch_started = trio.Event()

    # -- the observer ---------------------------------------------------------------

    def recording(self) -> bool:
        """Whether what this observer makes can be recorded at all.

        Until the application installs a global tracer or meter provider, the API's
        stand-ins turn every span and measurement into a no-op, and building them is
        work for nothing. Providers cannot be uninstalled, so once one is found the
        answer stays yes; until then the API is asked at most once per
        ``PROVIDER_LOOK_EVERY`` seconds (asking costs a look-up in ``os.environ``,
        too much for every commit). A run already going when a provider appears is
        traced from then on, its spans the roots of their traces, as the API's
        stand-in tracer would have left them anyway.
        """
        if self._recording:
            return True
        now = time.monotonic()
        if now < self._next_look:
            return False
        self._next_look = now + PROVIDER_LOOK_EVERY
        unset = _UNSET_METER_PROVIDER
        self._recording = (
            not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
            or unset is None
            or not isinstance(metrics.get_meter_provider(), unset)
        )
        return self._recording

    def before_commit(self, state: SessionLookup, records: Sequence[Record]) -> Sequence[Record]:
        if not (self._recording or self.recording()):
            return records
        for record in records:  # a loop, not any(): this runs before every commit
            if type(record) is RunStarted and not record.traceparent:
                break
        else:
            return records
        out: list[Record] = []
        for record in records:
            if isinstance(record, RunStarted) and not record.traceparent:
                record = self._open_run(state, record)
            out.append(record)
        return out

    def after_commit(self, state: SessionLookup, committed: Sequence[Committed]) -> None:
        if not (self._recording or self.recording()):
            return
        for c in committed:
            record = c.record
            handler = _HANDLERS.get(type(record))
            if handler is not None:
                handler(self, state, record)

    def commit_failed(self, state: SessionLookup, records: Sequence[Record]) -> None:
        for record in records:
            if isinstance(record, RunStarted):
                span = self._runs.pop((record.session_id, record.run_id), None)
                self._contexts.pop((record.session_id, record.run_id), None)
                if span is not None:
                    if self._current.get(record.session_id) is span:
                        del self._current[record.session_id]
                    span.set_status(Status(StatusCode.ERROR, "the run's start was not committed"))
                    span.end()

    def flush(self) -> None:
        """Hand every span and record of the batch to the SDK now."""
        batch, self._batch = self._batch, []
        for call, args in batch:
            try:
                call(*args)
            except Exception:  # telemetry never stops a run, nor the rest of the batch
                logger.exception("the OpenTelemetry SDK failed on a span or a record")

    async def background(self) -> None:
        """Hand each batch over within ``batch_delay`` (the runtime runs this task).

        It sleeps while nothing waits, so an idle runtime is never woken for it.
        """
        while True:
            await self._batch_started.wait()
            await trio.sleep(self.batch_delay)
            # Flushed, then re-armed, with no checkpoint between: whatever is appended
            # from now on sets the new event (two runtimes may share this observer).
            self.flush()
            self._batch_started = trio.Event()

    def _later(self, call: Callable[..., Any], *args: Any) -> None:
        """Make an SDK call with the batch (or now, with ``batch_delay=0``)."""
        if not self.batch_delay:
            call(*args)
            return
        self._batch.append((call, args))
        if len(self._batch) == 1:
            self._batch_started.set()
        elif len(self._batch) >= BATCH_LIMIT:
            self.flush()

    def close(self) -> None:
        """End the spans of runs still open (the runtime stops; a later one resumes them)."""
        self.flush()
        for span in self._runs.values():
            span.add_event("perdure.shutdown")
            span.end()
        self._runs.clear()
        self._current.clear()
        self._contexts.clear()

    # -- runs -----------------------------------------------------------------------

    def _open_run(self, state: SessionLookup, r: RunStarted) -> RunStarted:
        sub = state.submission_view(r.submission_id)
        caller = _context_of(sub.traceparent) if sub is not None else None
        links: list[Link] = []
        parent = caller
        if r.resumed_from is not None:
            interrupted = self._run_context(state, r.session_id, r.resumed_from)
            if interrupted is not None:
                links.append(Link(interrupted, {"perdure.link": "resumed_from"}))
                # Without a caller's span, the interrupted run is the one parent that
                # keeps the resumed run in the same trace.
                parent = parent or interrupted
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.conversation.id": r.session_id,
            "perdure.run.id": r.run_id,
            "perdure.submission.id": r.submission_id,
            "perdure.goal_rev": r.goal_rev,
            "perdure.resume_attempt": r.resume_attempt,
        }
        if r.resumed_from is not None:
            attributes["perdure.resumed_from"] = r.resumed_from
        if self.capture_content and sub is not None:
            attributes["gen_ai.input.messages"] = json.dumps(
                [{"role": "user", "parts": [{"type": "text", "content": sub.text}]}]
            )
        parent_ctx = (
            trace.set_span_in_context(NonRecordingSpan(parent), otel_context.Context())
            if parent is not None
            else otel_context.Context()  # a root: never the ambient context of the actor
        )
        span = self._tracer.start_span(
            "invoke_agent",
            context=parent_ctx,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            links=links,
            start_time=_ns(r.at),
        )
        self._runs[(r.session_id, r.run_id)] = span
        self._current[r.session_id] = span
        own = span.get_span_context()
        # A no-op tracer hands back the parent's context: nothing of ours to record.
        if not own.is_valid or (parent is not None and own.span_id == parent.span_id):
            return r
        return attrs.evolve(r, traceparent=_traceparent(own))

    def _run_context(
        self, state: SessionLookup, session_id: str, run_id: str
    ) -> SpanContext | None:
        live = self._runs.get((session_id, run_id))
        if live is not None:
            return live.get_span_context()
        run = state.run_view(run_id)
        return _context_of(run.traceparent) if run is not None else None

    def _parent(self, state: SessionLookup, session_id: str, run_id: str) -> otel_context.Context:
        """The context to open a child of ``run_id``'s span in (live or from the log)."""
        live = self._runs.get((session_id, run_id))
        if live is not None:  # the common case: built once per run
            found = self._contexts.get((session_id, run_id))
            if found is None:
                found = trace.set_span_in_context(live, otel_context.Context())
                self._contexts[(session_id, run_id)] = found
            return found
        span_context = self._run_context(state, session_id, run_id)
        if span_context is None:
            return otel_context.Context()
        return trace.set_span_in_context(NonRecordingSpan(span_context), otel_context.Context())

    def _run_finished(self, state: SessionLookup, r: RunFinished) -> None:
        self.flush()  # the run's attempts go out before its own span ends
        span = self._runs.pop((r.session_id, r.run_id), None)
        self._contexts.pop((r.session_id, r.run_id), None)
        # Turns the run left unanswered (cancelled, failed). Looked up through its
        # submission's generations, not by a scan: this tracer holds the live attempts
        # of every session, and a scan per finished run grew with the sessions.
        sub = state.submission_view(r.submission_id)
        for generation_id in sub.generations if sub is not None else ():
            key = (r.session_id, generation_id)
            found = self._attempts.get(key)
            if found is not None and found.run_id == r.run_id:
                del self._attempts[key]
        if span is None:
            return  # started by a process that died; its span went with it
        if self._current.get(r.session_id) is span:
            del self._current[r.session_id]
        run = state.run_view(r.run_id)
        usage = run.usage if run is not None else _NO_USAGE
        span.set_attributes(_add_usage({"perdure.run.status": r.status}, usage))
        if r.status == "failed":
            span.set_status(Status(StatusCode.ERROR, r.reason or "failed"))
            span.set_attribute("error.type", "perdure.run_failed")
        if self.capture_content and r.final_text:
            span.set_attribute(
                "gen_ai.output.messages",
                json.dumps(
                    [{"role": "assistant", "parts": [{"type": "text", "content": r.final_text}]}]
                ),
            )
        span.end(end_time=max(_ns(r.at), _start_ns(span)))

    def _event(self, session_id: str, name: str, attributes: dict[str, Any], at: float) -> None:
        span = self._current.get(session_id)
        if span is not None:
            span.add_event(name, attributes, timestamp=_ns(at))

    def _recovery(self, state: SessionLookup, r: RecoveryDecision) -> None:
        self._event(
            r.session_id,
            "perdure.recovery",
            {
                "perdure.recovery.subject": r.subject,
                "perdure.recovery.found": r.found,
                "perdure.recovery.action": r.action,
                "perdure.recovery.reason": r.reason,
            },
            r.at,
        )

    def _parked(self, state: SessionLookup, r: SessionParked) -> None:
        self._event(r.session_id, "perdure.session_parked", {"perdure.reason": r.reason}, r.at)

    # -- model attempts -------------------------------------------------------------

    def _generation_started(self, state: SessionLookup, r: GenerationStarted) -> None:
        self._attempts[(r.session_id, r.generation_id)] = _Attempt(r.at, r.run_id)

    def _attempt(self, state: SessionLookup, session_id: str, generation_id: str) -> _Attempt:
        found = self._attempts.get((session_id, generation_id))
        if found is not None:
            return found
        gen = state.generation_view(generation_id)
        run_id = gen.run_id if gen is not None else ""
        if gen is not None and gen.failures:  # begun by a dead process: after its back-off
            last = gen.failures[-1]
            return _Attempt(max(last.not_before, last.at), run_id)
        run = state.run_view(run_id)
        return _Attempt(run.started_at if run is not None else 0.0, run_id)

    def _chat(
        self,
        state: SessionLookup,
        session_id: str,
        generation_id: str,
        attributes: dict[str, Any],
        usage: Usage,
        at: float,
        error: str | None,
    ) -> None:
        """An attempt's ``chat`` span and its metric records; ``attributes``: the span's."""
        attempt = self._attempt(state, session_id, generation_id)
        # The attempt's run is the turn's: both come from its GenerationStarted record.
        run_id = attempt.run_id
        provider = attributes.get("gen_ai.provider.name", "")
        model = attributes.get("gen_ai.request.model", "")
        start = min(attempt.started, at)
        parent = self._parent(state, session_id, run_id)
        name = f"chat {model}" if model else "chat"
        self._later(self._span, name, parent, SpanKind.CLIENT, attributes, start, at, error)
        duration, inputs, outputs = self._metric_attributes(
            provider,
            model,
            attributes.get("gen_ai.response.model", ""),
            attributes["error.type"] if error is not None else "",
        )
        self._later(self._duration.record, max(0.0, at - start), duration)
        if usage.input_tokens:
            self._later(self._token_usage.record, usage.input_tokens, inputs)
        if usage.output_tokens:
            self._later(self._token_usage.record, usage.output_tokens, outputs)

    def _metric_attributes(
        self, provider: str, request_model: str, response_model: str, error_type: str
    ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """The attributes of an attempt's duration, input and output token records.

        Made once per combination and shared by every record that has it (the SDK only
        reads them): a session's attempts all have the same few, and building three
        dicts per attempt was a third of this observer's own work.
        """
        key = (provider, request_model, response_model, error_type)
        found = self._metric_attrs.get(key)
        if found is not None:
            return found
        base: dict[str, Any] = {"gen_ai.operation.name": "chat"}
        if provider:
            base["gen_ai.provider.name"] = provider
        if request_model:
            base["gen_ai.request.model"] = request_model
        if response_model:
            base["gen_ai.response.model"] = response_model
        duration = {**base, "error.type": error_type} if error_type else base
        found = (
            duration,
            {**base, "gen_ai.token.type": "input"},
            {**base, "gen_ai.token.type": "output"},
        )
        # Models and error types are few, but they come from outside: bounded.
        if len(self._metric_attrs) < METRIC_ATTRIBUTE_SETS:
            self._metric_attrs[key] = found
        return found

    def _span(
        self,
        name: str,
        parent: otel_context.Context,
        kind: SpanKind,
        attributes: dict[str, Any],
        start: float,
        end: float,
        error: str | None,
    ) -> None:
        """One finished attempt's span, from start to end, through the SDK."""
        span = self._tracer.start_span(
            name, context=parent, kind=kind, attributes=attributes, start_time=_ns(start)
        )
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=_ns(end))

    def _retry_pending(self, state: SessionLookup, r: RetryPending) -> None:
        error_type = _error_type(r.error)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.conversation.id": r.session_id,
            "perdure.generation.id": r.generation_id,
            "perdure.attempt": r.attempt,
            "error.type": error_type,
        }
        if r.provider:
            attributes["gen_ai.provider.name"] = r.provider
        if r.model:
            attributes["gen_ai.request.model"] = r.model
        if r.usage != _NO_USAGE:
            _add_usage(attributes, r.usage)
        self._chat(state, r.session_id, r.generation_id, attributes, r.usage, r.at, r.error)
        self._event(
            r.session_id,
            "gen_ai.retry",
            {
                "perdure.generation.id": r.generation_id,
                "perdure.attempt": r.attempt,
                "error.type": error_type,
                "perdure.retry.delay": max(0.0, r.not_before - r.at),
                "perdure.fallback": r.fallback,
            },
            r.at,
        )
        run_id = self._attempt(state, r.session_id, r.generation_id).run_id
        self._attempts[(r.session_id, r.generation_id)] = _Attempt(max(r.not_before, r.at), run_id)

    def _generation_completed(self, state: SessionLookup, r: GenerationCompleted) -> None:
        failures = state.model_failures(r.generation_id)
        asked = failures[-1].model if failures else ""
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.conversation.id": r.session_id,
            "perdure.generation.id": r.generation_id,
            "perdure.attempt": r.attempt,
            "gen_ai.request.model": asked or r.model,
            "gen_ai.response.model": r.model,
            "gen_ai.response.id": r.response_id,
            "gen_ai.response.finish_reasons": (r.stop_reason,),
        }
        _add_usage(attributes, r.usage)
        if r.provider:
            attributes["gen_ai.provider.name"] = r.provider
        if self.capture_content:
            parts: list[dict[str, Any]] = []
            if r.text:
                parts.append({"type": "text", "content": r.text})
            parts.extend(
                {
                    "type": "tool_call",
                    "id": c.call_id,
                    "name": c.name,
                    "arguments": masked(c.input, c.secret),
                }
                for c in r.tool_calls
            )
            attributes["gen_ai.output.messages"] = json.dumps(
                [{"role": "assistant", "parts": parts, "finish_reason": r.stop_reason}]
            )
        self._chat(state, r.session_id, r.generation_id, attributes, r.usage, r.at, None)
        self._attempts.pop((r.session_id, r.generation_id), None)

    # -- context compaction: one span per summary attempt ----------------------------

    def _compaction_started(self, state: SessionLookup, r: CompactionStarted) -> None:
        self._compactions[(r.session_id, r.compaction_id)] = _Attempt(r.at, r.run_id)

    def _compaction_span(
        self,
        session_id: str,
        compaction_id: str,
        at: float,
        attributes: dict[str, Any],
        error: str | None,
        state: SessionLookup,
        *,
        over: bool,
    ) -> _Attempt:
        key = (session_id, compaction_id)
        # Begun by a dead process: its start is unknown here, the span is the moment.
        attempt = self._compactions.get(key) or _Attempt(at, "")
        if over:
            self._compactions.pop(key, None)
        attributes = {
            "gen_ai.operation.name": "compact_context",
            "gen_ai.conversation.id": session_id,
            "perdure.compaction.id": compaction_id,
            **attributes,
        }
        parent = self._parent(state, session_id, attempt.run_id)
        start = min(attempt.started, at)
        self._later(
            self._span, "compact_context", parent, SpanKind.CLIENT, attributes, start, at, error
        )
        return attempt

    def _compaction_retry(self, state: SessionLookup, r: CompactionRetryPending) -> None:
        attributes: dict[str, Any] = {"perdure.attempt": r.attempt, "error.type": "model_error"}
        if r.usage != _NO_USAGE:
            _add_usage(attributes, r.usage)
        attempt = self._compaction_span(
            r.session_id, r.compaction_id, r.at, attributes, r.error, state, over=False
        )
        self._compactions[(r.session_id, r.compaction_id)] = _Attempt(
            max(r.not_before, r.at), attempt.run_id
        )

    def _context_compacted(self, state: SessionLookup, r: ContextCompacted) -> None:
        attributes: dict[str, Any] = {
            "perdure.attempt": r.attempt,
            "perdure.compaction.items": r.end,
            "perdure.compaction.tokens_before": r.tokens_before,
            "perdure.compaction.tokens_after": r.tokens_after,
            "gen_ai.response.model": r.model,
        }
        if r.provider:
            attributes["gen_ai.provider.name"] = r.provider
        _add_usage(attributes, r.usage)
        self._compaction_span(
            r.session_id, r.compaction_id, r.at, attributes, None, state, over=True
        )

    def _compaction_abandoned(self, state: SessionLookup, r: CompactionAbandoned) -> None:
        attributes: dict[str, Any] = {"error.type": "compaction_abandoned"}
        self._compaction_span(
            r.session_id, r.compaction_id, r.at, attributes, r.reason, state, over=True
        )

    # -- tool attempts --------------------------------------------------------------

    def _tool(
        self,
        state: SessionLookup,
        session_id: str,
        call_id: str,
        outcome: str,
        at: float,
        error: str | None = None,
        output: str | None = None,
    ) -> None:
        executing = state.tool_attempt(call_id)
        if executing is None:
            return  # never executed (invalid arguments, denied, cancelled before dispatch)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.conversation.id": session_id,
            "gen_ai.tool.name": executing.tool_name,
            "gen_ai.tool.call.id": call_id,
            "gen_ai.tool.type": "function",
            "perdure.replay_policy": executing.replay,
            "perdure.attempt": executing.attempt,
            "perdure.outcome": outcome,
        }
        if error is not None:
            attributes["error.type"] = error
        if self.capture_content:
            args = masked(executing.args, executing.secret)
            attributes["gen_ai.tool.call.arguments"] = json.dumps(args)
            if output is not None:
                attributes["gen_ai.tool.call.result"] = output
        self._later(
            self._span,
            f"execute_tool {executing.tool_name}",
            self._parent(state, session_id, executing.run_id),
            SpanKind.INTERNAL,
            attributes,
            min(executing.at, at),
            at,
            error,
        )

    def _tool_completed(self, state: SessionLookup, r: ToolCompleted) -> None:
        outcome = "ok" if not r.is_error else r.kind if r.kind != "ok" else "error"
        error = None if not r.is_error else r.kind if r.kind != "ok" else "error"
        self._tool(state, r.session_id, r.call_id, outcome, r.at, error, r.output)

    def _tool_unknown(self, state: SessionLookup, r: ToolOutcomeUnknown) -> None:
        self._tool(state, r.session_id, r.call_id, "unknown", r.at, None, r.output)

    def _tool_cancelled(self, state: SessionLookup, r: ToolCancelled) -> None:
        if r.while_executing:
            self._tool(state, r.session_id, r.call_id, "cancelled", r.at, None, r.output)

    def _tool_retry(self, state: SessionLookup, r: ToolRetryPending) -> None:
        self._tool(state, r.session_id, r.call_id, "retry", r.at, _error_type(r.error) or "error")
        self._event(
            r.session_id,
            "perdure.tool.retry",
            {
                "gen_ai.tool.call.id": r.call_id,
                "perdure.attempt": r.attempt,
                "perdure.retry.delay": max(0.0, r.not_before - r.at),
            },
            r.at,
        )

    def _tool_awaiting_human(self, state: SessionLookup, r: ToolAwaitingHuman) -> None:
        self._tool(state, r.session_id, r.call_id, "awaiting_human", r.at)


def _start_ns(span: Span) -> int:
    start = getattr(span, "start_time", None)  # the SDK's spans know it; the API's may not
    return start if isinstance(start, int) else 0


_HANDLERS: dict[type, Any] = {
    CompactionStarted: Tracing._compaction_started,
    CompactionRetryPending: Tracing._compaction_retry,
    ContextCompacted: Tracing._context_compacted,
    CompactionAbandoned: Tracing._compaction_abandoned,
    RunFinished: Tracing._run_finished,
    RecoveryDecision: Tracing._recovery,
    SessionParked: Tracing._parked,
    GenerationStarted: Tracing._generation_started,
    RetryPending: Tracing._retry_pending,
    GenerationCompleted: Tracing._generation_completed,
    ToolCompleted: Tracing._tool_completed,
    ToolOutcomeUnknown: Tracing._tool_unknown,
    ToolCancelled: Tracing._tool_cancelled,
    ToolRetryPending: Tracing._tool_retry,
    ToolAwaitingHuman: Tracing._tool_awaiting_human,
}
