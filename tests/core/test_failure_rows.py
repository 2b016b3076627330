"""The rows of the core for a call that fails, proven as data in, data out.

A transient failure under a ``RetryPolicy`` (back-off, attempt + 1 with the same key,
giving up), a timeout, a heartbeat, a call that needs a person (``Resolve``), and what
a restart decides for each of them. These rows were first proven only through whole
runtimes; mutation testing (docs/RELIABILITY.md) found the pure core around them
unguarded, so each test here states the promise a change of the core would break.
"""

from __future__ import annotations

from typing import Any

import pytest

import perdure
from perdure import errors
from perdure.actors import decide, protocol
from perdure.actors.protocol import Step, View
from perdure.settings import Limits
from perdure.storage.records import (
    RecoveryDecision,
    ResolutionDecided,
    ToolAwaitingHuman,
    ToolCancelled,
    ToolCompleted,
    ToolExecuting,
    ToolHeartbeat,
    ToolOutcomeUnknown,
    ToolRetryPending,
)
from tests.core.sim import TOOLS, Session, kinds, only, runs

POLICY = perdure.RetryPolicy(max_attempts=3, initial=2.0, multiplier=3.0, max_interval=60.0)


@perdure.tool(replay=perdure.ReplayPolicy.SAFE, retry=POLICY)
async def fetch(url: str) -> str:
    """Fetch a page (transient failures retried)."""
    return url


@perdure.tool(
    replay=perdure.ReplayPolicy.KEYED,
    retry=perdure.RetryPolicy(max_attempts=5, retry_timeouts=False),
)
async def charge(amount: int) -> str:
    """Charge once per key; timeouts are not retried."""
    return str(amount)


@perdure.tool(replay=perdure.ReplayPolicy.NEVER)
async def launch(target: str) -> str:
    """Launch (never re-run blindly)."""
    return target


async def _reconcile_cancel(ctx: perdure.ToolContext, result: str, city: str) -> perdure.Reconciled:
    return perdure.Reconciled.unknown()


FAILING = {**TOOLS, **{t.name: t for t in (fetch, charge, launch)}}


class Shell(Session):
    """``Session`` that also keeps the back-offs it was asked to wait out (``View.waiting``)."""

    def __init__(self, tools: dict[str, Any] | None = None, **env: Any) -> None:
        self.waiting: set[str] = set()
        super().__init__(FAILING if tools is None else tools, **env)

    def _commit(self, first: Step, *, recovering: bool = False) -> Step:
        self.view = View(
            models=self.view.models, tools=self.view.tools, waiting=frozenset(self.waiting)
        )
        step = super()._commit(first, recovering=recovering)
        for effect in step.effects:
            if isinstance(effect, protocol.BackOff):
                self.waiting.add(effect.call_id)
            elif isinstance(effect, protocol.StopBackOff):
                self.waiting.discard(effect.call_id)
        return step

    def back_off_over(self, call_id: str) -> Step:
        self.waiting.discard(call_id)
        task = self.state.tasks[call_id]
        return self.result(protocol.BackOffOver(call_id=call_id, attempt=task.attempt))

    def restart(self, **env: Any) -> Step:
        self.waiting = set()
        return super().restart(**env)


def started(tool: str, args: dict[str, Any], **env: Any) -> Shell:
    s = Shell(**env)
    s.command(protocol.Submit("r1", "go"))
    s.reply("calling", ("c1", tool, args))
    assert s.state.tasks["c1"].phase == "executing"
    return s


def backoffs(step: Step) -> list[protocol.BackOff]:
    return [e for e in step.effects if isinstance(e, protocol.BackOff)]


# -- a transient failure under a RetryPolicy --------------------------------------------------


def test_a_transient_failure_waits_out_its_back_off_then_runs_attempt_two_with_the_same_key() -> (
    None
):
    s = started("fetch", {"url": "u"})
    first = s.state.tasks["c1"].executing
    assert first is not None
    step = s.finish_tool("c1", output="503 from upstream", outcome="retryable", jitter=1.0)
    pending = only(step.records, ToolRetryPending)
    assert kinds(step) == ["ToolRetryPending"], "the retry is recorded, nothing else happens"
    assert pending[0].attempt == 1 and pending[0].error == "503 from upstream"
    assert pending[0].not_before == s.now + POLICY.initial, "jitter 1.0: the whole first delay"
    assert backoffs(step) == [protocol.BackOff("c1", 1, s.now + POLICY.initial)]
    assert not runs(step), "no attempt before the back-off is over"
    task = s.state.tasks["c1"]
    assert (task.phase, task.last_error, task.not_before) == (
        "retry_pending",
        "503 from upstream",
        s.now + POLICY.initial,
    )
    s.now += POLICY.initial
    step = s.back_off_over("c1")
    assert runs(step) == [("c1", 2)]
    second = only(step.records, ToolExecuting)[0]
    assert second.idempotency_key == first.idempotency_key and second.args == first.args
    assert second.run_id == first.run_id == "in1.r0"
    assert s.state.tasks["c1"].not_before is None and s.state.tasks["c1"].phase == "executing"


def test_a_back_off_not_yet_over_is_waited_out_not_skipped() -> None:
    s = started("fetch", {"url": "u"})
    s.finish_tool("c1", output="503", outcome="retryable", jitter=0.0)
    not_before = s.state.tasks["c1"].not_before
    assert not_before == s.now + POLICY.initial / 2, "jitter 0: half the delay"
    s.waiting.clear()  # the shell lost its timer: advance asks for the wait again
    s.now = not_before - 0.01
    step = s._commit(Step())
    assert backoffs(step) == [protocol.BackOff("c1", 1, not_before)] and not runs(step)
    s.now = not_before
    step = s.back_off_over("c1")
    assert runs(step) == [("c1", 2)], "at not_before exactly, the wait is over"


def test_the_delay_grows_with_each_attempt_and_the_last_failure_gives_up_with_the_count() -> None:
    s = started("fetch", {"url": "u"})
    s.finish_tool("c1", output="e1", outcome="retryable", jitter=1.0)
    s.now += 10
    s.back_off_over("c1")
    step = s.finish_tool("c1", output="e2", outcome="retryable", jitter=1.0)
    pending = only(step.records, ToolRetryPending)[0]
    assert pending.attempt == 2
    assert pending.not_before == s.now + POLICY.initial * POLICY.multiplier
    s.now += 10
    assert runs(s.back_off_over("c1")) == [("c1", 3)]
    step = s.finish_tool("c1", output="e3", outcome="retryable")
    done = only(step.records, ToolCompleted)[0]
    assert (done.kind, done.is_error, done.attempt) == ("error", True, 3)
    assert "failed 3 times" in done.output and "allows 3 attempts" in done.output
    assert done.output.endswith("The last error: e3")
    assert "GenerationStarted" in kinds(step), "the model reads the failure and goes on"


def test_a_timeout_is_retried_only_if_the_policy_retries_timeouts() -> None:
    s = started("fetch", {"url": "u"})
    step = s.finish_tool("c1", output="timed out", outcome="timeout")
    assert kinds(step) == ["ToolRetryPending"]
    s = started("charge", {"amount": 5})
    step = s.finish_tool("c1", output="timed out", outcome="timeout")
    done = only(step.records, ToolCompleted)[0]
    assert (done.kind, done.is_error, done.output) == ("timeout", True, "timed out")


def test_a_timeout_given_up_on_keeps_its_kind() -> None:
    s = started("fetch", {"url": "u"})
    for _ in range(2):
        s.finish_tool("c1", output="slow", outcome="timeout")
        s.now += 100
        s.back_off_over("c1")
    step = s.finish_tool("c1", output="slow", outcome="timeout", duration=4.5)
    done = only(step.records, ToolCompleted)[0]
    assert (done.kind, done.attempt, done.duration) == ("timeout", 3, 4.5)


def test_a_retryable_failure_without_a_policy_is_an_error_for_the_model() -> None:
    s = started("lookup", {"query": "q"})
    step = s.finish_tool("c1", output="flaky", outcome="retryable")
    done = only(step.records, ToolCompleted)[0]
    assert (done.kind, done.is_error, done.output) == ("error", True, "flaky")


def test_a_call_recorded_never_is_not_retried_even_if_its_tool_has_a_policy_now() -> None:
    s = started("launch", {"target": "t"})
    s.tools = {
        **FAILING,
        "launch": perdure.tool(name="launch", replay=perdure.ReplayPolicy.SAFE, retry=POLICY)(
            launch.fn
        ),
    }
    step = s.finish_tool("c1", output="flaky", outcome="retryable")
    assert not only(step.records, ToolRetryPending)
    assert only(step.records, ToolCompleted)[0].kind == "error"


def test_a_call_now_never_is_not_retried_even_if_it_was_recorded_safe() -> None:
    s = started("fetch", {"url": "u"})
    now_never = perdure.tool(name="fetch", replay=perdure.ReplayPolicy.NEVER)(fetch.fn)
    s.tools = {**FAILING, "fetch": now_never}
    step = s.finish_tool("c1", output="flaky", outcome="retryable")
    assert not only(step.records, ToolRetryPending)


def test_a_failure_after_a_revision_or_a_cancel_is_not_retried() -> None:
    s = started("fetch", {"url": "u"})
    s.command(protocol.Revise("v1", "do something else"))
    step = s.finish_tool("c1", output="flaky", outcome="retryable")
    assert not only(step.records, ToolRetryPending), "the request it served was revised"
    s = started("fetch", {"url": "u"})
    s.command(protocol.Cancel("x1"))
    step = s.finish_tool("c1", output="flaky", outcome="retryable")
    assert not only(step.records, ToolRetryPending), "its run is being cancelled"
    assert only(step.records, ToolCompleted)[0].is_error


def test_a_report_of_another_attempt_or_call_changes_nothing() -> None:
    s = started("fetch", {"url": "u"})
    stale = protocol.ToolFinished(call_id="c1", attempt=2, outcome="ok", output="from the future")
    assert not decide.on_result(s.state, s.env(), stale)
    assert not decide.on_result(
        s.state, s.env(), protocol.ToolFinished(call_id="c9", attempt=1, outcome="ok", output="x")
    )
    s.finish_tool("c1")
    again = protocol.ToolFinished(call_id="c1", attempt=1, outcome="ok", output="twice")
    assert not decide.on_result(s.state, s.env(), again), "a duplicate of a settled call"


# -- a pending retry that may no longer run ---------------------------------------------------


def pending_retry(tool: str = "fetch", args: dict[str, Any] | None = None) -> Shell:
    s = started(tool, args or {"url": "u"})
    s.finish_tool("c1", output="503", outcome="retryable", jitter=1.0)
    s.now += 100
    return s


def test_a_pending_retry_whose_tool_became_never_gives_the_last_error_instead() -> None:
    s = pending_retry()
    s.tools = {
        **FAILING,
        "fetch": perdure.tool(name="fetch", replay=perdure.ReplayPolicy.NEVER)(fetch.fn),
    }
    step = s.back_off_over("c1")
    done = only(step.records, ToolCompleted)[0]
    assert not runs(step)
    assert (done.kind, done.is_error, done.attempt) == ("error", True, 1)
    assert done.output.startswith("503\n(perdure: attempt 1 failed and was not retried: ")
    assert "recorded policy safe, registered policy never" in done.output


def test_a_pending_retry_whose_tool_is_gone_gives_the_last_error_instead() -> None:
    s = pending_retry()
    s.tools = {k: v for k, v in FAILING.items() if k != "fetch"}
    step = s.back_off_over("c1")
    done = only(step.records, ToolCompleted)[0]
    assert not runs(step)
    assert "its tool is no longer registered" in done.output


def test_a_pending_retry_whose_tool_changed_runs_only_if_its_arguments_still_fit() -> None:
    s = pending_retry()
    v2 = perdure.tool(name="fetch", replay=perdure.ReplayPolicy.SAFE, retry=POLICY, version="2")(
        fetch.fn
    )
    s.tools = {**FAILING, "fetch": v2}
    assert runs(s.back_off_over("c1")) == [("c1", 2)]

    async def fetch_v3(address: str) -> str:
        """Fetch by address."""
        return address

    s = pending_retry()
    v3 = perdure.tool(name="fetch", replay=perdure.ReplayPolicy.SAFE, retry=POLICY)(fetch_v3)
    s.tools = {**FAILING, "fetch": v3}
    step = s.back_off_over("c1")
    assert not runs(step)
    done = only(step.records, ToolCompleted)[0]
    assert "definition changed" in done.output and "no longer fit" in done.output
    assert not done.output.count("; ;"), "the words are joined once"


# -- heartbeats -------------------------------------------------------------------------------


def test_a_heartbeat_is_recorded_and_handed_to_the_next_attempt() -> None:
    s = started("fetch", {"url": "u"})
    report = protocol.HeartbeatReported(call_id="c1", attempt=1, details={"offset": 40})
    step = s._commit(decide.on_result(s.state, s.env(), report))  # the attempt still runs
    beat = only(step.records, ToolHeartbeat)
    assert [(b.call_id, b.attempt, b.details) for b in beat] == [("c1", 1, {"offset": 40})]
    assert s.state.tasks["c1"].last_heartbeat == beat[0]
    s.finish_tool("c1", output="reset", outcome="retryable")
    s.now += 100
    step = s.back_off_over("c1")
    run = [e for e in step.effects if isinstance(e, protocol.RunTool)]
    assert [r.last_heartbeat for r in run] == [{"offset": 40}]


def test_a_first_attempt_starts_without_a_heartbeat() -> None:
    s = Shell()
    s.command(protocol.Submit("r1", "go"))
    step = s.reply("calling", ("c1", "fetch", {"url": "u"}))
    assert [e.last_heartbeat for e in step.effects if isinstance(e, protocol.RunTool)] == [None]


def test_a_heartbeat_of_an_attempt_that_is_over_is_not_recorded() -> None:
    s = started("fetch", {"url": "u"})
    assert not decide.on_result(
        s.state, s.env(), protocol.HeartbeatReported(call_id="c1", attempt=2, details=1)
    )
    assert not decide.on_result(
        s.state, s.env(), protocol.HeartbeatReported(call_id="c9", attempt=1, details=1)
    )
    s.finish_tool("c1")
    assert not decide.on_result(
        s.state, s.env(), protocol.HeartbeatReported(call_id="c1", attempt=1, details=1)
    )


# -- a call that needs a person ---------------------------------------------------------------


def waiting_for_a_person(tool: str = "fetch", args: dict[str, Any] | None = None) -> Shell:
    s = started(tool, args or {"url": "u"})
    step = s.finish_tool("c1", output="card declined: ask the customer", outcome="needs_human")
    waiting = only(step.records, ToolAwaitingHuman)
    assert [(w.call_id, w.attempt, w.reason) for w in waiting] == [
        ("c1", 1, "card declined: ask the customer")
    ]
    assert kinds(step) == ["ToolAwaitingHuman"], "the run waits; nothing else happens"
    assert s.state.tasks["c1"].phase == "awaiting_human"
    return s


def test_a_person_retries_the_call_with_the_same_key_even_for_a_never_tool() -> None:
    s = waiting_for_a_person("launch", {"target": "t"})
    key = s.state.tasks["c1"].executing.idempotency_key  # type: ignore[union-attr]
    step, answer = s.command(protocol.Resolve("c1", "retry", "h1"))
    assert answer == protocol.Done("c1")
    assert kinds(step) == ["ResolutionDecided", "ToolExecuting"], "at once: no back-off"
    assert runs(step) == [("c1", 2)]
    assert only(step.records, ToolExecuting)[0].idempotency_key == key


def test_a_person_skips_the_call_with_a_result_the_model_reads() -> None:
    s = waiting_for_a_person()
    step, _ = s.command(protocol.Resolve("c1", "skip", "h1", result={"page": "cached"}))
    assert kinds(step)[:2] == ["ResolutionDecided", "ToolCompleted"]
    decided = only(step.records, ResolutionDecided)[0]
    assert (decided.action, decided.result, decided.request_id) == (
        "skip",
        {"page": "cached"},
        "h1",
    )
    done = only(step.records, ToolCompleted)[0]
    assert (done.kind, done.is_error, done.attempt) == ("resolved", False, 1)
    assert done.output == perdure.tools.contract.render_result({"page": "cached"})
    assert "GenerationStarted" in kinds(step)


def test_a_person_fails_the_call_and_the_model_reads_why() -> None:
    s = waiting_for_a_person()
    step, _ = s.command(protocol.Resolve("c1", "fail", "h1", result="wrong card"))
    done = only(step.records, ToolCompleted)[0]
    assert (done.kind, done.is_error) == ("resolved", True)
    assert done.output == (
        "perdure: this call needed a person (card declined: ask the customer); they chose to "
        "fail it. They said: wrong card"
    )
    s = waiting_for_a_person()
    step, _ = s.command(protocol.Resolve("c1", "fail", "h1"))
    assert only(step.records, ToolCompleted)[0].output.endswith("they chose to fail it.")


def test_a_resolution_is_idempotent_by_request_id_and_refused_when_nobody_waits() -> None:
    s = waiting_for_a_person()
    s.command(protocol.Resolve("c1", "skip", "h1", result="r"))
    s.state.requests["h1"].seq = 9
    step, answer = s.command(protocol.Resolve("c1", "skip", "h1", result="r"))
    assert not step and answer == protocol.Done("c1", 9, duplicate=True)
    with pytest.raises(errors.Refused) as info:
        s.command(protocol.Resolve("c1", "skip", "h1", result="other"))
    assert info.value.code == "conflict"
    with pytest.raises(errors.Refused) as info:
        s.command(protocol.Resolve("c1", "retry", "h2"))
    assert info.value.code == "invalid_state" and "not waiting for a person" in str(info.value)
    with pytest.raises(errors.Refused) as info:
        s.command(protocol.Resolve("c9", "retry", "h3"))
    assert info.value.code == "not_found" and "'c9'" in str(info.value)


# -- what a restart decides for each ---------------------------------------------------------


def decision_for(step: Step, subject: str) -> RecoveryDecision:
    return next(d for d in only(step.records, RecoveryDecision) if d.subject == subject)


def test_a_restart_during_a_back_off_waits_out_what_is_left_then_retries() -> None:
    s = started("fetch", {"url": "u"})
    s.finish_tool("c1", output="503", outcome="retryable", jitter=1.0)
    s.now += 0.5  # 1.5 s of the 2 s back-off left
    step = s.restart()
    decision = decision_for(step, "c1")
    assert decision.found == "retry back-off after attempt 1"
    assert decision.action == "wait out the back-off (1.5s left), then run attempt 2"
    assert decision.reason == "the same arguments and idempotency key; attempt 1: 503"
    assert not runs(step) and backoffs(step) == [protocol.BackOff("c1", 1, 1002.0)]
    assert only(step.records, ToolRetryPending) == []
    s.now = 1002.0
    assert runs(s.back_off_over("c1")) == [("c1", 2)]


def test_a_restart_after_the_back_off_ran_out_retries_at_once() -> None:
    s = started("fetch", {"url": "u"})
    s.finish_tool("c1", output="503", outcome="retryable", jitter=1.0)
    s.now += 60
    step = s.restart()
    decision = decision_for(step, "c1")
    assert decision.action == "run attempt 2 now (its back-off is over)"
    assert runs(step) == [("c1", 2)]
    assert only(step.records, ToolExecuting)[0].run_id == "in1.r1", "the resumed run owns it"


def test_a_restart_does_not_retry_what_may_no_longer_be_retried() -> None:
    s = started("fetch", {"url": "u"})
    s.finish_tool("c1", output="503", outcome="retryable", jitter=1.0)
    s.tools = {
        **FAILING,
        "fetch": perdure.tool(name="fetch", replay=perdure.ReplayPolicy.NEVER)(fetch.fn),
    }
    s.now += 100
    step = s.restart()
    decision = decision_for(step, "c1")
    assert decision.action == "record the last error; do not retry"
    assert "never retried automatically" in decision.reason
    assert not runs(step) and only(step.records, ToolCompleted)[0].is_error


def test_a_restart_after_a_person_chose_to_retry_runs_the_call() -> None:
    s = waiting_for_a_person("launch", {"target": "t"})
    s.state.paused = False
    s.command(protocol.Pause("p1"))  # the retry is decided but waits for the resume
    step, _ = s.command(protocol.Resolve("c1", "retry", "h1"))
    assert kinds(step) == ["ResolutionDecided"] and not runs(step)
    task = s.state.tasks["c1"]
    assert (task.phase, task.retry_by_human, task.not_before) == ("retry_pending", True, s.now)
    step = s.restart()
    decision = decision_for(step, "c1")
    assert decision.found == "a person chose to retry (attempt 1 asked for one)"
    assert "run attempt 2" in decision.action, "a NEVER call a person retries does run"
    step, _ = s.command(protocol.Resume("p2"))
    assert runs(step) == [("c1", 2)]


def test_a_restart_keeps_a_call_waiting_for_a_person() -> None:
    s = waiting_for_a_person()
    step = s.restart()
    assert not runs(step) and not only(step.records, ToolCompleted)
    run_decision = decision_for(step, "in1.r0")
    assert run_decision.found == "awaiting a person to resolve c1"
    assert run_decision.action == "keep waiting"


# -- a cancellation or a pause met by a restart -----------------------------------------------


def test_a_restart_during_a_cancellation_finishes_it_and_never_resumes() -> None:
    s = Shell()
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "launch", {"target": "t"}), ("c2", "deploy", {"target": "d"}))
    s.command(protocol.Cancel("x1"))
    assert s.state.run is not None and s.state.run.cancel_requested
    step = s.restart()
    decision = decision_for(step, "in1.r0")
    assert (decision.found, decision.action, decision.reason) == (
        "cancellation in progress",
        "finish cancelling",
        "never resumed",
    )
    unknown = only(step.records, ToolOutcomeUnknown)
    assert [u.call_id for u in unknown] == ["c1"]
    assert unknown[0].reason == "interrupted while the run was being cancelled"
    assert not runs(step) and "RunStarted" not in kinds(step)
    assert s.state.run is None and s.state.last_outcome is not None
    assert s.state.last_outcome.status == "cancelled"


def test_a_call_found_not_applied_while_paused_is_reconciled_again_after_the_resume() -> None:
    s = Shell()
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "send_checked", {"text": "hi"}))
    s.restart()  # NEVER with a reconcile: recovery asks it
    s.command(protocol.Pause("p1"))
    s.view = View(models=s.view.models, tools=s.view.tools - {"c1"})
    step = s._commit(
        decide.on_result(
            s.state, s.env(), protocol.ReconcileFinished(call_id="c1", status="not_applied")
        )
    )
    assert decision_for(step, "c1").action == "run it once the session is resumed"
    assert not runs(step) and s.state.tasks["c1"].phase == "executing"
    step, _ = s.command(protocol.Resume("p2"))
    reconcile = [e for e in step.effects if isinstance(e, protocol.Reconcile)]
    assert [e.call_id for e in reconcile] == ["c1"], "asked again: the world may have changed"


def test_an_executing_call_nobody_runs_whose_tool_went_away_is_unknown() -> None:
    s = Shell()
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "send_checked", {"text": "hi"}))
    s.restart()
    s.command(protocol.Pause("p1"))
    s.view = View(models=s.view.models, tools=s.view.tools - {"c1"})
    s._commit(
        decide.on_result(
            s.state, s.env(), protocol.ReconcileFinished(call_id="c1", status="not_applied")
        )
    )
    s.tools = {k: v for k, v in FAILING.items() if k != "send_checked"}
    step, _ = s.command(protocol.Resume("p2"))
    unknown = only(step.records, ToolOutcomeUnknown)
    assert [u.reason for u in unknown] == ["not re-run: its tool is no longer registered"]


def test_a_failed_attempt_cancelled_by_a_revision_says_it_failed() -> None:
    s = started("fetch", {"url": "u"})
    s.finish_tool("c1", output="503", outcome="retryable", jitter=1.0)
    step, _ = s.command(protocol.Revise("v1", "never mind"))
    cancelled = only(step.records, ToolCancelled)
    assert [c.call_id for c in cancelled] == ["c1"]
    assert cancelled[0].output == (
        "perdure: this call failed (attempt 1: 503) and was not tried again: "
        "the request was revised before it ran."
    )
    assert protocol.StopBackOff("c1") in step.effects, "its back-off timer is stopped"


def test_a_restart_exactly_at_the_end_of_the_back_off_retries_at_once() -> None:
    s = started("fetch", {"url": "u"})
    s.finish_tool("c1", output="503", outcome="retryable", jitter=1.0)
    s.now = s.state.tasks["c1"].not_before  # type: ignore[assignment]
    step = s.restart()
    assert decision_for(step, "c1").action == "run attempt 2 now (its back-off is over)"
    assert runs(step) == [("c1", 2)]


def test_a_later_attempt_not_retried_reports_its_own_number() -> None:
    s = started("fetch", {"url": "u"})
    s.finish_tool("c1", output="e1", outcome="retryable")
    s.now += 100
    s.back_off_over("c1")
    s.finish_tool("c1", output="e2", outcome="retryable")
    s.now += 100
    s.tools = {k: v for k, v in FAILING.items() if k != "fetch"}
    done = only(s.back_off_over("c1").records, ToolCompleted)[0]
    assert done.attempt == 2
    assert done.output == (
        "e2\n(perdure: attempt 2 failed and was not retried: its tool is no longer registered.)"
    )


def test_a_pending_retry_whose_arguments_no_longer_fit_says_why_in_one_sentence() -> None:
    async def fetch_v3(address: str) -> str:
        """Fetch by address."""
        return address

    s = pending_retry()
    v3 = perdure.tool(name="fetch", replay=perdure.ReplayPolicy.SAFE, retry=POLICY)(fetch_v3)
    s.tools = {**FAILING, "fetch": v3}
    done = only(s.back_off_over("c1").records, ToolCompleted)[0]
    assert done.output.startswith(
        "503\n(perdure: attempt 1 failed and was not retried: the tool's definition changed "
        f"since the call was dispatched ({fetch.definition_hash} -> {v3.definition_hash}) and "
        "the recorded arguments no longer fit it: "
    )


def test_a_person_resolving_a_later_attempt_names_that_attempt() -> None:
    s = started("fetch", {"url": "u"})
    s.finish_tool("c1", output="e1", outcome="retryable")
    s.now += 100
    s.back_off_over("c1")
    s.finish_tool("c1", output="ask", outcome="needs_human")
    step, answer = s.command(protocol.Resolve("c1", "skip", "h1", result="ok"))
    assert answer == protocol.Done("c1")
    assert only(step.records, ToolCompleted)[0].attempt == 2


def test_an_executing_call_nobody_runs_whose_tool_cannot_reconcile_any_more_is_unknown() -> None:
    s = Shell()
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "send_checked", {"text": "hi"}))
    s.restart()
    s.command(protocol.Pause("p1"))
    s.view = View(models=s.view.models, tools=s.view.tools - {"c1"})
    report = protocol.ReconcileFinished(call_id="c1", status="not_applied")
    s._commit(decide.on_result(s.state, s.env(), report))
    plain = perdure.tool(name="send_checked", replay=perdure.ReplayPolicy.NEVER)(
        TOOLS["send_checked"].fn
    )
    s.tools = {**FAILING, "send_checked": plain}
    step, _ = s.command(protocol.Resume("p2"))
    unknown = only(step.records, ToolOutcomeUnknown)
    assert [u.reason for u in unknown] == ["not re-run: it cannot reconcile"]


def test_the_reconcile_asked_again_after_a_resume_is_the_tools_own() -> None:
    s = Shell()
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "send_checked", {"text": "hi"}))
    s.restart()
    s.command(protocol.Pause("p1"))
    s.view = View(models=s.view.models, tools=s.view.tools - {"c1"})
    report = protocol.ReconcileFinished(call_id="c1", status="not_applied")
    s._commit(decide.on_result(s.state, s.env(), report))
    step, _ = s.command(protocol.Resume("p2"))
    asked = [e for e in step.effects if isinstance(e, protocol.Reconcile)]
    assert [(e.tool, e.executing) for e in asked] == [
        (TOOLS["send_checked"], s.state.tasks["c1"].executing)
    ]


def test_a_restart_keeps_a_compensation_waiting_for_a_person() -> None:
    from tests.core.sim import COURSE_TOOLS

    s = Shell(tools={**COURSE_TOOLS, **FAILING})
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "hold_seat", {"seat": "1A"}))
    s.finish_tool("c1", output="held")
    s.command(protocol.Revise("v1", "another flight"))  # releases the seat automatically
    assert s.state.tasks["comp-c1"].phase == "executing"
    s.finish_tool("comp-c1", output="the airline wants a call", outcome="needs_human")
    assert s.state.tasks["comp-c1"].phase == "awaiting_human"
    step = s.restart()
    decision = decision_for(step, "comp-c1")
    assert (decision.found, decision.action, decision.reason) == (
        "awaiting a person (NeedsHuman)",
        "keep waiting for rt.resolve: retry, skip or fail",
        "the airline wants a call",
    )
    assert not runs(step)


def test_a_retry_after_of_the_tool_is_honoured_by_its_back_off() -> None:
    s = started("fetch", {"url": "u"})
    step = s.finish_tool("c1", output="429", outcome="retryable", jitter=1.0, retry_after=30.0)
    assert only(step.records, ToolRetryPending)[0].not_before == s.now + 30.0


def test_a_failure_of_a_call_whose_tool_went_away_is_an_error_not_a_retry() -> None:
    s = started("fetch", {"url": "u"})
    s.tools = {k: v for k, v in FAILING.items() if k != "fetch"}
    step = s.finish_tool("c1", output="503", outcome="retryable")
    done = only(step.records, ToolCompleted)[0]
    assert (done.kind, done.output) == ("error", "503")


@pytest.mark.parametrize(
    ("attempt", "jitter", "retry_after", "expected"),
    [
        (1, 0.0, None, 1.0),  # half of the base
        (1, 1.0, None, 2.0),  # all of it
        (3, 1.0, None, 8.0),  # doubling per attempt
        (3, 0.5, None, 6.0),  # three quarters
        (9, 1.0, None, 50.0),  # capped
        (1, 1.0, 30.0, 30.0),  # the server's retry-after, if longer
        (1, 1.0, 10_000.0, 500.0),  # but never more than ten caps
    ],
)
def test_the_model_back_off_doubles_is_jittered_capped_and_honours_retry_after(
    attempt: int, jitter: float, retry_after: float | None, expected: float
) -> None:
    env = protocol.Env(tools={}, now=0.0, limits=Limits(retry_base=2.0, retry_cap=50.0))
    assert decide.retry_delay(env, attempt, retry_after, jitter) == expected


@perdure.tool(replay=perdure.ReplayPolicy.NEVER, reconcile=_reconcile_cancel)
async def cancel_booking(ctx: perdure.ToolContext, result: str, city: str) -> str:
    """Cancel a booking (NEVER; its reconcile can tell)."""
    return "cancelled"


@perdure.tool(replay=perdure.ReplayPolicy.KEYED, compensate=cancel_booking)
async def book(city: str) -> str:
    """Book a room."""
    return "B-1"


def test_a_reconcile_outside_any_run_decides_for_no_run() -> None:
    s = Shell(tools={**FAILING, "book": book})
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "book", {"city": "Oslo"}))
    s.finish_tool("c1", output="B-1")
    s.reply("booked")
    assert s.state.run is None
    s.command(protocol.Compensate("c1", "k1"))
    step = s.restart()  # the compensation was executing: NEVER, so its reconcile is asked
    assert [e.call_id for e in step.effects if isinstance(e, protocol.Reconcile)] == ["comp-c1"]
    s.view = View(models=s.view.models, tools=s.view.tools - {"comp-c1"})
    report = protocol.ReconcileFinished(call_id="comp-c1", status="applied", output="gone")
    step = s._commit(decide.on_result(s.state, s.env(), report))
    decision = decision_for(step, "comp-c1")
    assert (decision.run_id, decision.found) == ("", "reconcile answered applied")


def test_a_reconcile_during_a_run_decides_for_that_run_and_a_late_one_changes_nothing() -> None:
    s = Shell()
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "send_checked", {"text": "hi"}))
    s.restart()
    s.view = View(models=s.view.models, tools=s.view.tools - {"c1"})
    report = protocol.ReconcileFinished(call_id="c1", status="applied", output="sent")
    step = s._commit(decide.on_result(s.state, s.env(), report))
    assert decision_for(step, "c1").run_id == "in1.r1"
    assert not decide.on_result(s.state, s.env(), report), "the call is settled already"
    stray = protocol.ReconcileFinished(call_id="c9", status="applied")
    assert not decide.on_result(s.state, s.env(), stray)


@pytest.mark.parametrize(
    ("tool", "args", "course", "why", "partly"),
    [
        ("lookup", {"query": "q"}, "revise", "the request was revised", ""),
        (
            "send",
            {"text": "t"},
            "revise",
            "the request was revised",
            " Its effect may have partly happened.",
        ),
        ("lookup", {"query": "q"}, "cancel", "the run was cancelled", ""),
        ("lookup", {"query": "q"}, "", "the runtime stopped it", ""),
    ],
)
def test_a_call_stopped_while_running_says_why_and_if_its_effect_may_have_happened(
    tool: str, args: dict[str, Any], course: str, why: str, partly: str
) -> None:
    s = started(tool, args)
    if course == "revise":
        s.command(protocol.Revise("v1", "other"))
    elif course == "cancel":
        s.command(protocol.Cancel("x1"))
    step = s.finish_tool("c1", output="", outcome="cancelled")
    cancelled = only(step.records, ToolCancelled)
    assert [(c.call_id, c.reason, c.while_executing) for c in cancelled] == [
        ("c1", f"stopped while executing: {why}", True)
    ]
    assert (
        cancelled[0].output
        == f"perdure: this call was stopped while it was running: {why}.{partly}"
    )


# -- a cancellation winding down ----------------------------------------------------------------


def test_a_cancel_stops_a_running_cancellable_tool_once_and_finishes_when_it_reports() -> None:
    s = started("lookup", {"query": "q"})
    step, _ = s.command(protocol.Cancel("x1"))
    assert kinds(step) == ["CancelRequested"]
    assert step.effects == (protocol.CancelTool("c1"),), "told to stop exactly once"
    step = s.finish_tool("c1", output="", outcome="cancelled")
    finished = [r for r in step.records if type(r).__name__ == "RunFinished"]
    assert [(f.status, f.reason) for f in finished] == [("cancelled", "cancelled by request")]  # type: ignore[attr-defined]


def test_a_cancel_during_a_back_off_stops_its_timer_and_cancels_the_call() -> None:
    s = started("fetch", {"url": "u"})
    s.finish_tool("c1", output="503", outcome="retryable", jitter=1.0)
    assert s.waiting == {"c1"}
    step, _ = s.command(protocol.Cancel("x1"))
    assert protocol.StopBackOff("c1") in step.effects
    cancelled = only(step.records, ToolCancelled)
    assert [(c.call_id, c.reason) for c in cancelled] == [("c1", "the run was cancelled")]
    assert "RunFinished" in kinds(step)


def test_a_cancel_while_the_model_is_asked_stops_that_call() -> None:
    s = Shell()
    s.command(protocol.Submit("r1", "go"))
    step, _ = s.command(protocol.Cancel("x1"))
    assert protocol.CancelModel("in1.g1") in step.effects
    assert kinds(step) == ["CancelRequested", "RunFinished"]


def test_a_cancel_after_the_reply_asks_no_model_call_to_stop() -> None:
    s = started("send", {"text": "t"})  # NEVER: left to finish
    step, _ = s.command(protocol.Cancel("x1"))
    assert kinds(step) == ["CancelRequested"] and not step.effects
    step = s.finish_tool("c1", output="sent")
    assert kinds(step) == ["ToolCompleted", "RunFinished"]


# -- a model call that fails -------------------------------------------------------------------


def test_a_fallback_to_another_provider_retries_at_once_and_keeps_who_failed() -> None:
    s = Shell(max_model_attempts=3)
    s.command(protocol.Submit("r1", "go"))
    step = s.result(
        protocol.ModelFailed(
            generation_id="in1.g1",
            attempt=1,
            error="503",
            retryable=True,
            retry_after=30.0,
            provider="first",
            model="m1",
            fallback=True,
        )
    )
    pending = [r for r in step.records if type(r).__name__ == "RetryPending"]
    assert [(p.not_before, p.provider, p.fallback, p.model) for p in pending] == [  # type: ignore[attr-defined]
        (s.now, "first", True, "m1")
    ]


@pytest.mark.parametrize(
    ("retryable", "why"),
    [(False, "a non-retryable error"), (True, "2 attempts")],
)
def test_a_model_call_that_fails_for_good_says_why(retryable: bool, why: str) -> None:
    s = Shell(max_model_attempts=2)
    s.command(protocol.Submit("r1", "go"))
    if retryable:
        s.result(protocol.ModelFailed(generation_id="in1.g1", attempt=1, error="e", retryable=True))
    step = s.result(
        protocol.ModelFailed(
            generation_id="in1.g1", attempt=1 + retryable, error="boom", retryable=retryable
        )
    )
    finished = [r for r in step.records if type(r).__name__ == "RunFinished"]
    assert [(f.status, f.reason) for f in finished] == [  # type: ignore[attr-defined]
        ("failed", f"the model call failed after {why}: boom")
    ]


@perdure.tool(name="release_desk", replay=perdure.ReplayPolicy.KEYED, retry=POLICY)
async def release_desk(ctx: perdure.ToolContext, result: str, desk: str) -> str:
    """Release a desk (transient failures retried)."""
    return "released"


@perdure.tool(replay=perdure.ReplayPolicy.KEYED, compensate=release_desk)
async def hold_desk(ctx: perdure.ToolContext, desk: str) -> str:
    """Hold a desk."""
    return f"held {desk}"


def test_a_restart_during_a_compensations_back_off_resumes_the_wait() -> None:
    s = Shell(tools={**FAILING, "hold_desk": hold_desk})
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "hold_desk", {"desk": "7"}))
    s.finish_tool("c1", output="held 7")
    s.reply("held")
    s.command(protocol.Compensate("c1", "k1"))
    s.finish_tool("comp-c1", output="busy", outcome="retryable", jitter=1.0)
    assert s.state.tasks["comp-c1"].phase == "retry_pending"
    step = s.restart()
    decision = decision_for(step, "comp-c1")
    assert (decision.run_id, decision.found, decision.action) == (
        "",
        "retry back-off after attempt 1",
        "wait out the back-off (2.0s left), then run attempt 2",
    )
    assert backoffs(step) == [protocol.BackOff("comp-c1", 1, s.now + 2.0)]


# -- the words of a call's end, as the model reads them -------------------------------------------


def test_the_model_reads_why_a_call_was_not_run() -> None:
    s = Shell()
    s.command(protocol.Submit("r1", "go"))
    step = s.reply("x", ("c1", "nope", {}), ("c2", "deploy", {"target": "t"}))
    (unknown_tool,) = only(step.records, ToolCompleted)
    known = ", ".join(sorted(FAILING))
    assert unknown_tool.output == (
        f"perdure: there is no tool named 'nope' (available: {known}). Nothing was run."
    )
    step, _ = s.command(protocol.Approve("c2", False, "a1"))
    (denied,) = only(step.records, ToolCompleted)
    assert denied.output == "perdure: the user denied this call; it was not run."
    s = Shell(tools={})
    s.command(protocol.Submit("r1", "go"))
    (alone,) = only(s.reply("x", ("c1", "nope", {})).records, ToolCompleted)
    assert "(available: none)" in alone.output


@pytest.mark.parametrize(
    ("outcome", "why", "reason"),
    [
        ("unknown", "could not tell (lost the socket)", "the tool could not tell: lost the socket"),
        ("timeout", "timed out (lost the socket)", "timeout"),
    ],
)
def test_an_unknown_outcome_names_the_tool_and_what_happened(
    outcome: str, why: str, reason: str
) -> None:
    s = started("launch", {"target": "t"})
    step = s.finish_tool("c1", output="lost the socket", outcome=outcome)
    (unknown,) = only(step.records, ToolOutcomeUnknown)
    assert unknown.reason == reason
    assert unknown.output == decide.unknown_outcome_text("launch", why)
    assert unknown.output.startswith(f"perdure: the call to 'launch' {why}. Its external effect")


def test_a_result_keeps_its_attempt_its_duration_and_its_error_flag() -> None:
    s = started("fetch", {"url": "u"})
    s.finish_tool("c1", output="503", outcome="retryable")
    s.now += 100
    s.back_off_over("c1")
    step = s.finish_tool("c1", output="page", duration=1.5)
    (done,) = only(step.records, ToolCompleted)
    assert (done.attempt, done.duration, done.is_error, done.kind) == (2, 1.5, False, "ok")


def test_a_policy_change_that_forbids_a_retry_says_so() -> None:
    s = pending_retry()
    never = perdure.tool(name="fetch", replay=perdure.ReplayPolicy.NEVER)(fetch.fn)
    s.tools = {**FAILING, "fetch": never}
    (done,) = only(s.back_off_over("c1").records, ToolCompleted)
    assert done.output == (
        "503\n(perdure: attempt 1 failed and was not retried: recorded policy safe, registered "
        "policy never: never retried automatically.)"
    )


def test_a_person_asked_without_a_reason_is_still_waited_for_after_a_restart() -> None:
    s = Shell()
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "lookup", {"query": "q"}), ("c2", "lookup", {"query": "r"}))
    s.finish_tool("c2", output="", outcome="needs_human")
    decision = decision_for(s.restart(), "c2")
    assert (decision.action, decision.reason) == (
        "keep waiting for rt.resolve: retry, skip or fail",
        "no resolution yet",
    )


def test_forget_is_asked_of_the_calls_own_tool_and_only_for_a_call_that_ran() -> None:
    from tests.core.test_decide import forgets, note

    s = Shell(tools={**FAILING, "note": note}, forget_settled=True)
    s.command(protocol.Submit("r1", "go"))
    step = s.reply("x", ("c1", "note", {"text": 5}), ("c2", "lookup", {"query": "q"}))
    assert forgets(step) == [], "invalid arguments: nothing ran, nothing to forget"
    s.finish_tool("c2")
    s.reply("y", ("c3", "lookup", {"query": "q"}), ("c4", "note", {"text": "a"}))
    s.view = View(models=s.view.models, tools=s.view.tools - {"c3", "c4"})  # both reported
    step = s._commit(
        decide.on_result(
            s.state,
            s.env(),
            protocol.ToolFinished(call_id="c3", attempt=1, outcome="ok", output="a"),
        )
        + decide.on_result(
            s.state,
            s.env(),
            protocol.ToolFinished(call_id="c4", attempt=1, outcome="ok", output="b"),
        )
    )
    asked = [e for e in step.effects if isinstance(e, protocol.Forget)]
    assert [(e.executing.call_id, e.tool) for e in asked] == [("c4", note)]


def test_an_unknown_record_is_refused_by_the_fold_by_name() -> None:
    from perdure.actors.state import SessionState

    with pytest.raises(TypeError, match="session s1: no fold for object"):
        SessionState("s1").apply(object())  # type: ignore[arg-type]


def test_invalid_arguments_are_listed_for_the_model_with_the_way_out() -> None:
    s = Shell()
    s.command(protocol.Submit("r1", "go"))
    args = {"query": 5, "extra": 1}
    (done,) = only(s.reply("x", ("c1", "lookup", args)).records, ToolCompleted)
    problems = TOOLS["lookup"].validate(args)
    assert len(problems) == 2
    assert done.output == (
        f"perdure: invalid arguments for 'lookup': {'; '.join(problems)}. Nothing was run; "
        "fix the arguments and call it again."
    )


def test_a_changed_tool_lists_every_way_the_recorded_arguments_no_longer_fit() -> None:
    async def fetch_v4(address: str, mode: str) -> str:
        """Fetch by address and mode."""
        return address

    s = pending_retry()
    v4 = perdure.tool(name="fetch", replay=perdure.ReplayPolicy.SAFE, retry=POLICY)(fetch_v4)
    s.tools = {**FAILING, "fetch": v4}
    problems = v4.validate({"url": "u"})
    assert len(problems) >= 2
    (done,) = only(s.back_off_over("c1").records, ToolCompleted)
    assert done.output.endswith(f"no longer fit it: {'; '.join(problems)}.)")
