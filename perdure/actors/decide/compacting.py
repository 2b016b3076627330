"""Context compaction: when to summarise the conversation, and what a summary changes.

The model is sent the whole conversation until its context fills; then (or when a
caller asks) the items ``[start, end)`` after the last summary are summarised by a
model call, and the model is sent that summary in their place (``conversation.py``).
Each rule here is a pure function of the state and the ``Env``:

* **when** (``due``): the input tokens the last reply reported reach the policy's
  share of the model's context window (the session's policy, else the runtime's;
  the window from the policy, else the runtime's table by model). Not again for the
  same reply: a summary resets the count until the next reply reports it.
* **what** (``compaction_range``): from where the last summary ended up to the items
  kept verbatim (``keep_recent``), and never past an item that is not settled (a call
  that still runs, or waits for approval or a person, stays verbatim with its turn).
* **how**: ``CompactionStarted`` is committed first; the summary call (``Summarize``)
  is made only after it, retried after a persisted back-off
  (``CompactionRetryPending``) like a model turn; its reply commits
  ``ContextCompacted``. A restart that finds the start without a result makes the
  call again (a model call has no effects); one compaction at a time, each starting
  where the last ended, so no range is summarised twice.
* **when it cannot be made** (the provider failed past its retries, the budget is
  spent, the summary came back empty or no shorter than what it summarises):
  ``CompactionAbandoned``, nothing is cut; the run goes on uncompacted while the
  last request still fit the window, and is stopped with a reason that says so once
  it did not.
"""

from __future__ import annotations

from perdure.actors.conversation import _settled, summary_text, transcript_text
from perdure.actors.decide.verbs import _finish, _holding, model_failure_words, model_retry_at
from perdure.actors.protocol import (
    NOTHING,
    Env,
    ModelFailed,
    ModelReplied,
    Step,
    Summarize,
    View,
)
from perdure.actors.state import SessionState
from perdure.budget import CompactionPolicy, over_budget, window_of
from perdure.storage.records import (
    CompactionAbandoned,
    CompactionRetryPending,
    CompactionStarted,
    ContextCompacted,
    Usage,
)


def policy_of(s: SessionState, env: Env) -> CompactionPolicy:
    """The session's own compaction policy, else the runtime's."""
    return s.compaction if s.compaction is not None else env.limits.compaction


def window(s: SessionState, env: Env) -> int | None:
    """The context window the last request is measured against (None: not known)."""
    policy = policy_of(s, env)
    if policy.window is not None:
        return policy.window
    return window_of(s.last_model, env.limits.context_windows) if s.last_model else None


def compaction_range(s: SessionState, keep_recent: int) -> tuple[int, int] | None:
    """The items the next summary would cover, ``[start, end)``; None if there are none.

    It starts where the last summary ended and stops ``keep_recent`` items before the
    end, or earlier at the first item that is not settled (its calls are not all
    finished): such an item stays verbatim, a tool use always with its result.
    """
    start = s.compacted_end
    end = len(s.conversation) - keep_recent
    for index in range(start, max(start, end)):
        if not _settled(s, s.conversation[index]):
            end = index
            break
    return (start, end) if end > start else None


def due(s: SessionState, env: Env) -> bool:
    """Whether the context is full enough to compact before the next model turn."""
    policy = policy_of(s, env)
    size = window(s, env)
    if not policy.auto or size is None or s.last_input_tokens < policy.threshold * size:
        return False
    if s.abandoned is not None and len(s.conversation) <= s.abandoned_at:
        return False  # the last attempt made nothing: not again until the history grew
    return compaction_range(s, policy.keep_recent) is not None


def next_id(s: SessionState) -> str:
    return f"{s.session_id}.compaction{s.compactions_started + 1}"


def start(
    s: SessionState, env: Env, reason: str, request_id: str | None = None
) -> CompactionStarted | None:
    """The record that starts a compaction of what ``compaction_range`` covers now."""
    span = compaction_range(s, policy_of(s, env).keep_recent)
    if span is None:
        return None
    return CompactionStarted(
        session_id=s.session_id,
        compaction_id=next_id(s),
        run_id=s.run.run_id if s.run is not None else "",
        start=span[0],
        end=span[1],
        tokens_before=s.last_input_tokens,
        window=window(s, env) or 0,
        reason=reason,
        request_id=request_id,
        at=env.now,
    )


def before_turn(s: SessionState, env: Env) -> Step | None:
    """Before a model turn starts: NOTHING to wait for a summary in progress, a step
    that starts one or stops the run, or None to start the turn."""
    if s.compacting is not None:
        return NOTHING  # ``summarize`` makes the call; the turn waits for its summary
    if due(s, env):
        started = start(s, env, "auto")
        if started is not None:
            return Step((started,))
    size = window(s, env)
    if s.abandoned is not None and size is not None and s.last_input_tokens >= size:
        return _finish(
            s,
            env,
            "stopped",
            reason=(
                f"the conversation no longer fits the model's context window "
                f"({s.last_input_tokens} of {size} tokens) and no summary could be made: "
                f"{s.abandoned.reason}"
            ),
        )
    return None


def summarize(s: SessionState, env: Env, view: View) -> Step:
    """A compaction in progress: make its summary call, unless it is in flight, the
    session holds, or the budget is spent (then nothing is cut: it is abandoned)."""
    pending = s.compacting
    if pending is None or _holding(s, view):
        return NOTHING
    compaction_id = pending.started.compaction_id
    if compaction_id in view.models:
        return NOTHING
    budget = s.budget if s.budget is not None else env.limits.budget
    if budget is not None:
        run_spend = s.run.spend if s.run is not None else {}
        why = over_budget(budget, run_spend, s.spend, env.limits.prices)
        if why is not None:
            return Step((_abandon(s, env, f"no summary was made: {why}"),))
    return Step((), (Summarize(compaction_id, pending.attempt, pending.not_before),))


def is_summary(s: SessionState, call_id: str) -> bool:
    """Whether a model call's id is the compaction in progress."""
    return s.compacting is not None and s.compacting.started.compaction_id == call_id


def summary_replied(s: SessionState, env: Env, msg: ModelReplied) -> Step:
    """The summary came back: commit it, unless it is empty or no shorter than what it
    would stand for (then the history stays whole)."""
    pending = s.compacting
    assert pending is not None
    started = pending.started
    reply = msg.reply
    text = reply.text.strip()
    before = sum(len(transcript_text(s, item)) for item in s.conversation[started.start :])
    covered = len(summary_text(s)) + sum(
        len(transcript_text(s, item)) for item in s.conversation[started.start : started.end]
    )
    if not text:
        why = "the summary came back empty"
    elif len(text) >= covered:
        why = (
            f"the summary ({len(text)} characters) is no shorter than what it would "
            f"replace ({covered} characters)"
        )
    else:
        why = ""
    if why:
        return Step((_abandon(s, env, why, reply.usage, reply.model),))
    total = len(summary_text(s)) + before
    after = total - covered + len(text)
    tokens_after = round(started.tokens_before * after / total) if total else 0
    done = ContextCompacted(
        session_id=s.session_id,
        compaction_id=started.compaction_id,
        start=started.start,
        end=started.end,
        summary=text,
        tokens_before=started.tokens_before,
        tokens_after=tokens_after,
        model=reply.model,
        provider=reply.provider,
        usage=reply.usage,
        attempt=msg.attempt,
        at=env.now,
    )
    return Step((done,))


def summary_failed(s: SessionState, env: Env, msg: ModelFailed) -> Step:
    """The summary call failed: again after a persisted back-off, or give up (nothing
    is cut)."""
    not_before = model_retry_at(env, msg)
    if not_before is not None:
        pending = CompactionRetryPending(
            session_id=s.session_id,
            compaction_id=msg.generation_id,
            attempt=msg.attempt,
            not_before=not_before,
            error=msg.error,
            usage=msg.usage,
            model=msg.model,
            provider=msg.provider,
            fallback=msg.fallback,
            at=env.now,
        )
        return Step((pending,))
    reason = "the summary's model call " + model_failure_words(msg)
    return Step((_abandon(s, env, reason, msg.usage, msg.model),))


def _abandon(
    s: SessionState, env: Env, reason: str, usage: Usage | None = None, model: str = ""
) -> CompactionAbandoned:
    assert s.compacting is not None
    return CompactionAbandoned(
        session_id=s.session_id,
        compaction_id=s.compacting.started.compaction_id,
        reason=reason,
        usage=usage if usage is not None else Usage(),
        model=model,
        at=env.now,
    )
