"""The generation actor: one model call of one turn, streaming deltas to the bus.

It owns nothing durable: the session commits ``GenerationStarted`` (or
``RetryPending``) and commits the reply it reports. A reply it could not report
(the process died) is simply asked for again after restart, which is safe because
a model call has no side effects.

The call may start while the commit of ``GenerationStarted`` is still in flight
(``durable`` not yet set; docs/DESIGN.md, "What must be durable before what"):
then the deltas it streams wait for that commit, so that no client sees a turn the
log might not have, and its reply reaches the session only after it (the session
handles one message at a time, after its commit; if that commit fails, the session
cancels this call and drops what it reports).
"""

from __future__ import annotations

from typing import Any

import trio

from perdure import _faults
from perdure.actors.context import ActorContext, report_last
from perdure.actors.protocol import ModelFailed, ModelReplied, Result
from perdure.providers.base import ModelRequest, Provider, classify
from perdure.storage.bus import Event


async def call_model(
    ctx: ActorContext,
    request: ModelRequest,
    outbox: trio.MemorySendChannel[Result],
    scope: trio.CancelScope,
    *,
    provider: Provider | None = None,
    publish: bool = True,
    durable: trio.Event | None = None,
) -> None:
    """Make one model call and report it. ``provider`` replaces the runtime's (a
    compaction's summary may use a cheaper one); ``publish=False`` sends no deltas
    (a summary is not a turn of the conversation)."""
    provider = provider if provider is not None else ctx.provider
    with scope:
        bus = ctx.journal.bus
        session_id, generation_id, attempt = (
            request.session_id,
            request.generation_id,
            request.attempt,
        )

        # The live argument text of a call to a tool with secret parameters is not
        # published: it would show the secret before the commit masks it.
        secret_tools = ctx.secret_tools
        hidden: set[Any] = set()  # the content-block indexes of such calls
        # Deltas streamed before the commit that started this call is durable.
        early: list[Event] = []

        def emit(kind: str, data: dict[str, Any]) -> None:
            if kind == "tool_use_start" and data.get("name") in secret_tools:
                hidden.add(data.get("index"))
            elif kind == "tool_input_delta" and data.get("index") in hidden:
                return
            if not publish or not bus.has_subscribers(session_id):
                return  # deltas are ephemeral: with nobody listening there is nothing to do
            payload = {
                "generation_id": generation_id,
                "submission_id": request.submission_id,
                "attempt": attempt,
                **data,
            }
            event = Event(session_id, kind, data=payload)
            if durable is not None and not durable.is_set():
                early.append(event)
                return
            if early:
                publish_early()
            bus.publish(event)

        def publish_early() -> None:
            held, early[:] = list(early), []
            for event in held:
                bus.publish(event)

        # Marks the start of an attempt: a frontend discards partial text of earlier ones.
        emit("model_call", {})
        result: Result
        try:
            reply = await provider.complete(request, emit)
        except Exception as exc:
            err = classify(exc)
            result = ModelFailed(
                generation_id=generation_id,
                attempt=attempt,
                error=err.message,
                retryable=err.retryable,
                retry_after=err.retry_after,
                usage=err.usage,
                jitter=ctx.rng.random(),
                # Which model the failed attempt asked, so its usage is priced right.
                model=err.model or str(getattr(provider, "model", "") or ""),
                provider=err.provider or provider.name,
                fallback=err.fallback,
            )
        else:
            if _faults.ACTIVE:
                if durable is not None and not durable.is_set():
                    _faults.hit("model.early")
                _faults.hit("model.after")
            result = ModelReplied(generation_id, attempt, reply)
        if durable is not None and not durable.is_set():
            await durable.wait()  # the session cancels this call if that commit fails
        if early:
            publish_early()
        await report_last(outbox, result)
