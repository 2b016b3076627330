"""Tool failures by policy, in the pure core: each transition as data in, data out.

Retries (``ToolRetryPending`` -> back-off -> ``ToolExecuting`` attempt + 1), heartbeats
(``ToolHeartbeat``, handed to the next attempt), calls that wait for a person
(``ToolAwaitingHuman`` -> ``ResolutionDecided``), and their rows of the recovery table.
No trio, no disk: ``tests.failures._sim`` plays the shell.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest

import perdure
from perdure import ReplayPolicy, RetryPolicy, errors
from perdure.actors import decide, protocol
from perdure.actors.lifecycle import (
    BACKING_OFF_PHASES,
    DISPATCHABLE_PHASES,
    HUMAN_WAIT_PHASES,
    IN_FLIGHT_PHASES,
    TERMINAL_PHASES,
)
from perdure.actors.state import SessionState
from perdure.storage.records import (
    GenerationStarted,
    RecoveryDecision,
    ResolutionDecided,
    RunFinished,
    RunStarted,
    ToolAwaitingHuman,
    ToolCancelled,
    ToolCompleted,
    ToolExecuting,
    ToolHeartbeat,
    ToolOutcomeUnknown,
    ToolRetryPending,
)
from tests.core.sim import decide_committed, kinds, only, runs
from tests.failures._sim import FETCH_POLICY, TOOLS, Session, back_offs, fetch, run_tools


def calling(tool: str, args: dict[str, Any], **env: Any) -> Session:
    s = Session(**env)
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", tool, args))
    return s


# -- the retry policy ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attempt", "jitter", "retry_after", "expected"),
    [
        (1, 0.0, None, 1.0),  # half of initial=2 with the least jitter
        (1, 1.0, None, 2.0),  # all of it with the most
        (2, 1.0, None, 4.0),  # initial * multiplier
        (9, 1.0, None, 60.0),  # capped at max_interval
        (1, 0.0, 30.0, 30.0),  # never sooner than the tool's retry_after
        (3, 1.0, 0.5, 8.0),  # a shorter retry_after does not shorten the back-off
    ],
)
def test_the_back_off_grows_is_capped_jittered_and_honours_retry_after(
    attempt: int, jitter: float, retry_after: float | None, expected: float
) -> None:
    assert FETCH_POLICY.delay(attempt, jitter, retry_after) == pytest.approx(expected)


def test_a_never_tool_with_retry_is_refused_at_definition_time_and_says_what_to_do() -> None:
    with pytest.raises(ValueError, match="retry= needs replay=SAFE or KEYED") as info:

        @perdure.tool(retry=RetryPolicy())
        async def send_mail(to: str) -> str:
            """Send a mail."""
            return to

    assert "replay=KEYED" in str(info.value) and "NeedsHuman" in str(info.value)
    with pytest.raises(ValueError, match="retry= needs replay=SAFE or KEYED"):
        attrs.evolve(TOOLS["send"], retry=RetryPolicy())  # no way around it


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_attempts": 0}, "max_attempts must be an integer >= 1"),
        ({"max_attempts": 2.5}, "max_attempts must be an integer >= 1"),
        ({"initial": 0}, "initial must be a number > 0"),
        ({"multiplier": 0.5}, "multiplier must be a number >= 1"),
        ({"max_interval": float("inf")}, "max_interval must be finite"),
        ({"retry_on": (ValueError, 3)}, "retry_on must be a tuple of exception classes"),
    ],
)
def test_a_bad_retry_policy_is_refused_naming_the_field(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        RetryPolicy(**options)


def test_a_bad_heartbeat_timeout_or_retry_after_is_refused() -> None:
    with pytest.raises(ValueError, match="heartbeat_timeout must be a number of seconds > 0"):
        perdure.tool(replay=ReplayPolicy.SAFE, heartbeat_timeout=0)(fetch.fn)
    with pytest.raises(ValueError, match="retry_after must be a number of seconds >= 0"):
        perdure.RetryableError("x", retry_after=-1)


# -- a transient failure is retried, durably, with the same key ---------------------------------


def test_a_transient_failure_commits_the_retry_before_the_back_off_and_runs_nothing() -> None:
    s = calling("fetch", {"url": "u"})
    key = s.state.tasks["c1"].executing.idempotency_key  # type: ignore[union-attr]
    step = s.fail_tool("c1", jitter=1.0)
    assert kinds(step) == ["ToolRetryPending"], "no result, no next turn, no new attempt yet"
    pending = only(step.records, ToolRetryPending)[0]
    assert (pending.attempt, pending.not_before) == (1, s.now + 2.0)
    assert "503 from upstream" in pending.error
    assert back_offs(step) == [protocol.BackOff("c1", 1, pending.not_before)]
    assert not run_tools(step)
    task = s.state.tasks["c1"]
    assert task.phase == "retry_pending" and task.phase in BACKING_OFF_PHASES
    assert task.phase in IN_FLIGHT_PHASES and task.phase not in TERMINAL_PHASES
    assert task.phase not in DISPATCHABLE_PHASES
    step = s.back_off_over("c1")
    assert kinds(step) == ["ToolExecuting"]
    again = only(step.records, ToolExecuting)[0]
    assert (again.attempt, again.idempotency_key, again.args) == (2, key, {"url": "u"})
    assert again.at >= pending.not_before
    assert runs(step) == [("c1", 2)]


def test_a_back_off_reported_early_waits_again_for_the_same_time() -> None:
    s = calling("fetch", {"url": "u"})
    pending = only(s.fail_tool("c1", jitter=0.5).records, ToolRetryPending)[0]
    step = s.back_off_over("c1", at=pending.not_before - 0.01)  # the wall clock stepped back
    assert not step.records
    assert back_offs(step) == [protocol.BackOff("c1", 1, pending.not_before)]


def test_the_retry_after_of_the_tool_is_honoured() -> None:
    s = calling("fetch", {"url": "u"})
    step = s.fail_tool("c1", retry_after=45.0, jitter=0.0)
    assert only(step.records, ToolRetryPending)[0].not_before == s.now + 45.0


def test_a_retry_that_succeeds_completes_the_call_and_wakes_the_model() -> None:
    s = calling("charge", {"cents": 500})
    s.fail_tool("c1")
    s.back_off_over("c1")
    step = s.finish_tool("c1", output="charged")
    assert kinds(step) == ["ToolCompleted", "GenerationStarted"]
    done = only(step.records, ToolCompleted)[0]
    assert (done.attempt, done.output, done.is_error) == (2, "charged", False)


def test_when_attempts_run_out_the_model_gets_the_last_error_and_the_count() -> None:
    s = calling("fetch", {"url": "u"})
    for n in (1, 2):
        s.fail_tool("c1", error=f"boom {n}")
        s.back_off_over("c1")
    step = s.fail_tool("c1", error="boom 3")
    assert kinds(step) == ["ToolCompleted", "GenerationStarted"]
    done = only(step.records, ToolCompleted)[0]
    assert done.is_error and done.attempt == 3
    assert "failed 3 times" in done.output and "allows 3 attempts" in done.output
    assert done.output.endswith("The tool raised RetryableError: boom 3")
    assert len(only(s.log, ToolRetryPending)) == 2
    assert [e.attempt for e in only(s.log, ToolExecuting)] == [1, 2, 3]


def test_a_timeout_is_retried_when_the_policy_says_so_and_reported_otherwise() -> None:
    s = calling("fetch", {"url": "u"})
    step = s.finish_tool("c1", output="sent no heartbeat for 5s", outcome="timeout")
    assert kinds(step) == ["ToolRetryPending"]
    s = calling("upload", {"name": "f"})
    step = s.finish_tool("c1", output="timed out after 5s", outcome="timeout")
    done = only(step.records, ToolCompleted)[0]
    assert (done.kind, done.is_error) == ("timeout", True)


def test_a_retryable_error_without_a_policy_is_an_error_for_the_model() -> None:
    s = calling("plain_keyed", {"item": "a"})
    step = s.fail_tool("c1")
    assert kinds(step) == ["ToolCompleted", "GenerationStarted"]
    done = only(step.records, ToolCompleted)[0]
    assert (done.kind, done.is_error) == ("error", True)
    assert "RetryableError: 503" in done.output


# -- a NEVER call is never retried by policy ------------------------------------------------------


def test_a_never_call_that_fails_transiently_is_not_retried() -> None:
    s = calling("send", {"text": "hi"})
    step = s.fail_tool("c1")
    assert not only(step.records, ToolRetryPending) and not back_offs(step)
    assert only(step.records, ToolCompleted)[0].is_error


def test_a_call_recorded_never_is_not_retried_even_if_its_tool_now_has_a_policy() -> None:
    s = calling("send", {"text": "hi"})
    now_safe = perdure.tool(name="send", replay=ReplayPolicy.SAFE, retry=FETCH_POLICY)(
        TOOLS["send"].fn
    )
    s.tools = {**TOOLS, "send": now_safe}
    step = s.fail_tool("c1")
    assert not only(step.records, ToolRetryPending)
    assert only(step.records, ToolCompleted)[0].is_error


def test_a_hung_never_call_is_an_unknown_outcome_not_a_retry() -> None:
    s = calling("send", {"text": "hi"})
    step = s.finish_tool("c1", output="sent no heartbeat for 5s", outcome="timeout")
    assert kinds(step)[0] == "ToolOutcomeUnknown"
    assert "UNKNOWN" in only(step.records, ToolOutcomeUnknown)[0].output
    assert not only(step.records, ToolRetryPending)


def test_a_pending_retry_of_a_tool_registered_never_after_a_restart_is_not_run() -> None:
    s = calling("fetch", {"url": "u"})
    s.fail_tool("c1")
    now_never = perdure.tool(name="fetch", replay=ReplayPolicy.NEVER)(fetch.fn)
    s.tools = {**TOOLS, "fetch": now_never}
    s.now += 100  # the back-off is over by the time the new process starts
    step = s.restart()
    decision = next(d for d in only(step.records, RecoveryDecision) if d.subject == "c1")
    assert decision.action == "record the last error; do not retry"
    assert "registered policy never" in decision.reason
    assert not only(step.records, ToolExecuting) and not runs(step)
    done = only(step.records, ToolCompleted)[0]
    assert done.is_error and "not retried" in done.output and "503" in done.output


# -- a back-off under changes of course --------------------------------------------------------


def test_cancel_during_a_back_off_stops_the_wait_and_says_what_happened() -> None:
    s = calling("fetch", {"url": "u"})
    s.fail_tool("c1")
    step, _ = s.command(protocol.Cancel("k"))
    assert kinds(step) == ["CancelRequested", "ToolCancelled", "RunFinished"]
    assert step.effects == (protocol.StopBackOff("c1"),)
    cancelled = only(step.records, ToolCancelled)[0]
    assert "failed (attempt 1" in cancelled.output and "not tried again" in cancelled.output
    assert not s.back_off_over("c1").records, "a late timer changes nothing"


def test_a_revision_during_a_back_off_cancels_the_retry() -> None:
    s = calling("fetch", {"url": "u"})
    s.fail_tool("c1")
    step, _ = s.command(protocol.Revise("v", "something else"))
    assert kinds(step)[:2] == ["GoalRevised", "ToolCancelled"]
    assert protocol.StopBackOff("c1") in step.effects
    assert only(step.records, GenerationStarted), "the model reads the revision"


def test_a_failure_after_the_run_was_cancelled_is_not_retried() -> None:
    s = calling("charge", {"cents": 1})  # KEYED, not cancellable: left to finish
    s.command(protocol.Cancel("k"))
    step = s.fail_tool("c1")
    assert kinds(step) == ["ToolCompleted", "RunFinished"]
    assert only(step.records, RunFinished)[0].status == "cancelled"


def test_a_back_off_over_while_paused_waits_for_resume() -> None:
    s = calling("fetch", {"url": "u"})
    s.fail_tool("c1")
    s.command(protocol.Pause("p"))
    assert not s.back_off_over("c1"), "paused: nothing is dispatched"
    step, _ = s.command(protocol.Resume("u"))
    assert kinds(step) == ["SessionResumed", "ToolExecuting"]
    assert runs(step) == [("c1", 2)]


# -- recovery: the back-off resumes where it was -----------------------------------------------


def test_a_restart_during_the_back_off_resumes_the_wait_for_the_recorded_time() -> None:
    s = calling("fetch", {"url": "u"})
    pending = only(s.fail_tool("c1", jitter=1.0).records, ToolRetryPending)[0]
    s.now += 0.5  # the process died; the next one starts half a second later
    step = s.restart()
    assert kinds(step)[:3] == ["RecoveryDecision", "RunFinished", "RunStarted"]
    decision = next(d for d in only(step.records, RecoveryDecision) if d.subject == "c1")
    assert decision.found == "retry back-off after attempt 1"
    assert decision.action == "wait out the back-off (1.5s left), then run attempt 2"
    assert not only(step.records, ToolExecuting), "nothing runs before not_before"
    assert back_offs(step) == [protocol.BackOff("c1", 1, pending.not_before)]
    step = s.back_off_over("c1")
    again = only(step.records, ToolExecuting)[0]
    assert (again.attempt, again.run_id) == (2, "in1.r1")
    assert again.idempotency_key == only(s.log, ToolExecuting)[0].idempotency_key


def test_a_restart_after_the_back_off_ended_runs_the_retry_at_once() -> None:
    s = calling("fetch", {"url": "u"})
    s.fail_tool("c1")
    s.now += 100
    step = s.restart()
    decision = next(d for d in only(step.records, RecoveryDecision) if d.subject == "c1")
    assert decision.action == "run attempt 2 now (its back-off is over)"
    assert runs(step) == [("c1", 2)]


def test_recovery_of_a_back_off_is_deterministic() -> None:
    s = calling("fetch", {"url": "u"})
    s.fail_tool("c1")
    base = list(s.log)
    first = s.restart()
    s.log = list(base)
    assert s.restart().records == first.records


# -- heartbeats --------------------------------------------------------------------------------


def test_a_heartbeat_of_the_running_attempt_is_recorded_and_a_late_one_is_not() -> None:
    s = calling("fetch", {"url": "u"})
    step = s.beat("c1", {"done": 10})
    assert kinds(step) == ["ToolHeartbeat"]
    beat = only(step.records, ToolHeartbeat)[0]
    assert (beat.attempt, beat.details) == (1, {"done": 10})
    assert s.state.tasks["c1"].last_heartbeat == beat
    stale = protocol.HeartbeatReported(call_id="c1", attempt=7, details={"done": 99})
    assert not decide.on_result(s.state, s.env(), stale), "not the running attempt"
    s.finish_tool("c1")
    assert not s.beat("c1", {"done": 11}), "the call is over"


def test_a_retry_receives_the_last_committed_heartbeat() -> None:
    s = calling("fetch", {"url": "u"})
    s.beat("c1", {"done": 10})
    s.beat("c1", {"done": 20})
    s.fail_tool("c1")
    (run,) = run_tools(s.back_off_over("c1"))
    assert run.last_heartbeat == {"done": 20}


def test_a_re_run_after_a_crash_receives_the_last_committed_heartbeat() -> None:
    s = calling("fetch", {"url": "u"})
    s.beat("c1", [1, 2, 3])
    (run,) = run_tools(s.restart())
    assert (run.executing.attempt, run.last_heartbeat) == (2, [1, 2, 3])


def test_a_first_attempt_has_no_last_heartbeat() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    (run,) = run_tools(s.reply("x", ("c1", "fetch", {"url": "u"})))
    assert run.last_heartbeat is None


# -- a failure that needs a person -------------------------------------------------------------


def needing_a_person(tool: str = "send", args: dict[str, Any] | None = None) -> Session:
    s = calling(tool, args or {"text": "hi"})
    step = s.finish_tool("c1", output="card declined: ask the customer", outcome="needs_human")
    assert kinds(step) == ["ToolAwaitingHuman"]
    assert only(step.records, ToolAwaitingHuman)[0].reason == "card declined: ask the customer"
    task = s.state.tasks["c1"]
    assert task.phase == "awaiting_human" and task.phase in HUMAN_WAIT_PHASES
    assert task.phase not in IN_FLIGHT_PHASES | TERMINAL_PHASES
    return s


def test_a_call_waiting_for_a_person_survives_a_restart_without_a_new_run() -> None:
    s = needing_a_person()
    step = s.restart()
    assert kinds(step) == ["RecoveryDecision"], "keep waiting: no run resumed, no budget spent"
    decision = only(step.records, RecoveryDecision)[0]
    assert decision.found == "awaiting a person to resolve c1"
    assert decision.action == "keep waiting"
    assert s.state.tasks["c1"].phase == "awaiting_human"


def test_resolve_retry_runs_a_never_call_again_with_the_same_key() -> None:
    s = needing_a_person()
    key = s.state.tasks["c1"].executing.idempotency_key  # type: ignore[union-attr]
    step, answer = s.command(protocol.Resolve("c1", "retry", "h1"))
    assert kinds(step) == ["ResolutionDecided", "ToolExecuting"]
    again = only(step.records, ToolExecuting)[0]
    assert (again.attempt, again.idempotency_key, again.replay) == (2, key, "never")
    assert runs(step) == [("c1", 2)]
    assert answer == protocol.Done("c1")


def test_resolve_skip_records_the_given_result_and_the_run_goes_on() -> None:
    s = needing_a_person()
    step, _ = s.command(protocol.Resolve("c1", "skip", "h1", {"charged": False}))
    assert kinds(step) == ["ResolutionDecided", "ToolCompleted", "GenerationStarted"]
    done = only(step.records, ToolCompleted)[0]
    assert (done.kind, done.output, done.is_error) == ("resolved", '{"charged": false}', False)
    assert not only(step.records, ToolExecuting)


def test_resolve_fail_hands_the_error_to_the_model() -> None:
    s = needing_a_person()
    step, _ = s.command(protocol.Resolve("c1", "fail", "h1", "the customer cancelled"))
    done = only(step.records, ToolCompleted)[0]
    assert (done.kind, done.is_error) == ("resolved", True)
    assert "card declined: ask the customer" in done.output
    assert "they chose to fail it" in done.output and "the customer cancelled" in done.output
    assert only(step.records, GenerationStarted)


def test_resolve_is_deduplicated_by_request_id_and_refused_when_nothing_waits() -> None:
    s = needing_a_person()
    s.command(protocol.Resolve("c1", "skip", "h1", "ok"))
    s.state.requests["h1"].seq = 9
    step, answer = s.command(protocol.Resolve("c1", "skip", "h1", "ok"))
    assert not step and answer == protocol.Done("c1", 9, duplicate=True)
    with pytest.raises(errors.Refused) as info:
        s.command(protocol.Resolve("c1", "skip", "h1", "another result"))
    assert info.value.code == "conflict"
    with pytest.raises(errors.Refused) as info:
        s.command(protocol.Resolve("c1", "retry", "h2"))
    assert info.value.code == "invalid_state" and "not waiting for a person" in str(info.value)
    with pytest.raises(errors.Refused) as info:
        s.command(protocol.Resolve("nope", "retry", "h3"))
    assert info.value.code == "not_found"


def test_resolve_retry_while_paused_runs_once_resumed() -> None:
    s = needing_a_person()
    s.command(protocol.Pause("p"))
    step, _ = s.command(protocol.Resolve("c1", "retry", "h1"))
    assert kinds(step) == ["ResolutionDecided"]
    assert s.state.tasks["c1"].phase == "retry_pending"
    step, _ = s.command(protocol.Resume("u"))
    assert kinds(step) == ["SessionResumed", "ToolExecuting"]


def test_a_retry_a_person_chose_survives_a_restart_and_holds_for_a_never_call() -> None:
    s = needing_a_person()
    s.command(protocol.Pause("p"))
    s.command(protocol.Resolve("c1", "retry", "h1"))  # paused: it waits to run
    step = s.restart()
    decision = next(d for d in only(step.records, RecoveryDecision) if d.subject == "c1")
    assert decision.found == "a person chose to retry (attempt 1 asked for one)"
    assert decision.action == "run attempt 2 now (its back-off is over)"
    assert not only(step.records, ToolExecuting), "still paused"
    step, _ = s.command(protocol.Resume("u"))
    again = only(step.records, ToolExecuting)[0]
    assert (again.attempt, again.replay) == (2, "never")


def test_cancelling_a_call_that_waits_for_a_person_says_it_failed() -> None:
    s = needing_a_person()
    step, _ = s.command(protocol.Cancel("k"))
    assert kinds(step) == ["CancelRequested", "ToolCancelled", "RunFinished"]
    assert "card declined" in only(step.records, ToolCancelled)[0].output


def test_a_policy_maps_an_exception_to_a_person_even_for_a_keyed_tool_with_retries() -> None:
    s = calling("charge", {"cents": 5})
    step = s.finish_tool("c1", output="PermissionError: 3-D Secure", outcome="needs_human")
    assert kinds(step) == ["ToolAwaitingHuman"], "a person decides, not the retry policy"


# -- the fold ----------------------------------------------------------------------------------


def test_the_new_records_fold_to_the_same_state_as_a_replay() -> None:
    s = calling("fetch", {"url": "u"})
    s.beat("c1", {"i": 1})
    s.fail_tool("c1")
    s.back_off_over("c1")
    s.finish_tool("c1", output="who knows", outcome="needs_human")
    s.command(protocol.Resolve("c1", "skip", "h", "fine"))
    replayed = SessionState.fold("s1", [decide_committed(i, r) for i, r in enumerate(s.log, 1)])
    live, again = s.state.tasks["c1"], replayed.tasks["c1"]
    assert (again.phase, again.attempt, again.last_error, again.last_heartbeat) == (
        live.phase,
        live.attempt,
        live.last_error,
        live.last_heartbeat,
    )
    assert replayed.requests["h"].kind == "resolve"
    assert only(s.log, ResolutionDecided)[0].result == "fine"
    started = only(s.log, RunStarted)
    assert len(started) == 1, "a retry is not a new run"


def test_the_resolve_body_hash_names_the_call_the_action_and_the_result() -> None:
    base = protocol.Resolve.hash_of("c1", "skip", {"a": 1})
    assert base == protocol.Resolve("c1", "skip", "x", {"a": 1}).body_hash
    assert base != protocol.Resolve.hash_of("c1", "fail", {"a": 1})
    assert base != protocol.Resolve.hash_of("c1", "skip", {"a": 2})
    assert base != protocol.Resolve.hash_of("c2", "skip", {"a": 1})
