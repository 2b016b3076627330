"""The recovery table as a restart writes it: every decision, word for word.

``recover`` records one ``RecoveryDecision`` per thing it finds (what, what it does,
why); ``perdure show`` and the page print them, and docs/DESIGN.md's recovery table
is their specification. Each scenario below is a crash at one place in a session's
life, and the test lists the decisions the restart must record, in order. Mutation
testing (docs/RELIABILITY.md) found the words and several rows unguarded.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

import perdure
from perdure.actors import decide, protocol
from perdure.actors.protocol import Step
from perdure.storage.records import RecoveryDecision, ToolCancelled, ToolOutcomeUnknown
from tests.core.sim import TOOLS, Session, send

Decision = tuple[str, str, str, str, str]  # run id, subject, found, action, reason
RESUMED = ("in1.r0", "in1.r0", "run in progress", "resume as in1.r1")
FIRST = "resume 1 of at most 3 in a row without progress"
PROGRESSED = FIRST + "; the interrupted run had made progress"


def decisions(step: Step) -> list[Decision]:
    return [
        (d.run_id, d.subject, d.found, d.action, d.reason)
        for d in step.records
        if isinstance(d, RecoveryDecision)
    ]


def queued_input() -> Step:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.log = s.log[:2]  # SessionCreated, InputAccepted: the crash came before the run started
    return s.restart()


def paused_with_nothing_in_flight() -> Step:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "lookup", {"query": "q"}))
    s.command(protocol.Pause("p1"))
    s.finish_tool("c1")  # no next turn while paused
    return s.restart()


def waiting_for_approval() -> Step:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "deploy", {"target": "t"}))
    return s.restart()


def model_call_in_flight() -> Step:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    return s.restart()


def model_back_off() -> Step:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.result(protocol.ModelFailed(generation_id="in1.g1", attempt=1, error="busy", retryable=True))
    return s.restart()


def decided_while_paused() -> Step:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "deploy", {"target": "t"}), ("c2", "deploy", {"target": "u"}))
    s.command(protocol.Pause("p1"))
    s.command(protocol.Approve("c1", True, "a1"))
    s.command(protocol.Approve("c2", False, "a2"))
    return s.restart()


def safe_call_after_a_revision() -> Step:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "lookup", {"query": "q"}))
    s.command(protocol.Revise("v1", "something else"))
    return s.restart()


def call_whose_tool_is_gone() -> Step:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "lookup", {"query": "q"}))
    s.tools = {k: v for k, v in TOOLS.items() if k != "lookup"}
    return s.restart()


def never_call_without_reconcile() -> Step:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "send", {"text": "hi"}))
    return s.restart()


SEND_SAFE = perdure.tool(name="send", replay=perdure.ReplayPolicy.SAFE)(send.fn)


def never_call_whose_tool_is_safe_now() -> Step:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "send", {"text": "hi"}))
    s.tools = {
        **TOOLS,
        "send": perdure.tool(name="send", replay=perdure.ReplayPolicy.SAFE)(send.fn),
    }
    return s.restart()


TABLE: list[tuple[Callable[[], Step], list[Decision]]] = [
    (queued_input, [("", "in1", "input accepted, no run", "start its run", "nothing ran yet")]),
    (
        paused_with_nothing_in_flight,
        [("in1.r0", "in1.r0", "session paused", "stay paused", "nothing was in flight")],
    ),
    (
        waiting_for_approval,
        [("in1.r0", "in1.r0", "awaiting approval of c1", "keep waiting", "nothing was in flight")],
    ),
    (
        model_call_in_flight,
        [
            (*RESUMED, FIRST),
            (
                "in1.r0",
                "in1.g1",
                "model request in flight",
                "call the model again",
                "a model call has no effects",
            ),
        ],
    ),
    (
        model_back_off,
        [
            (*RESUMED, FIRST),
            (
                "in1.r0",
                "in1.g1",
                "retry back-off",
                "wait out the back-off, then call the model",
                "a model call has no effects",
            ),
        ],
    ),
    (
        decided_while_paused,
        [
            (*RESUMED, PROGRESSED),
            ("in1.r0", "c1", "approved", "run it", "it had not started: nothing happened"),
            (
                "in1.r0",
                "c2",
                "denied",
                "report the denial to the model",
                "it had not started: nothing happened",
            ),
        ],
    ),
    (
        safe_call_after_a_revision,
        [
            (*RESUMED, PROGRESSED),
            (
                "in1.r0",
                "c1",
                "executing",
                "do not re-run",
                "the request was revised (revision 1) since it was dispatched",
            ),
        ],
    ),
    (
        call_whose_tool_is_gone,
        [
            (*RESUMED, PROGRESSED),
            (
                "in1.r0",
                "c1",
                "executing",
                "report outcome unknown",
                "its tool is no longer registered",
            ),
        ],
    ),
    (
        never_call_without_reconcile,
        [
            (*RESUMED, PROGRESSED),
            (
                "in1.r0",
                "c1",
                "executing",
                "report outcome unknown",
                "recorded policy never, registered policy never: no blind re-run; no reconcile",
            ),
        ],
    ),
    (
        never_call_whose_tool_is_safe_now,
        [
            (*RESUMED, PROGRESSED),
            (
                "in1.r0",
                "c1",
                "executing",
                "report outcome unknown",
                "recorded policy never, registered policy safe: no blind re-run; the tool's "
                "definition changed since the call was dispatched "
                f"({send.definition_hash} -> {SEND_SAFE.definition_hash}); the recorded "
                "arguments still fit it; no reconcile",
            ),
        ],
    ),
]


@pytest.mark.parametrize(("crash", "expected"), TABLE, ids=[f.__name__ for f, _ in TABLE])
def test_a_restart_records_the_decisions_of_the_recovery_table(
    crash: Callable[[], Step], expected: list[Decision]
) -> None:
    assert decisions(crash()) == expected


def test_a_safe_call_superseded_by_a_revision_is_cancelled_as_interrupted() -> None:
    step = safe_call_after_a_revision()
    cancelled = [r for r in step.records if isinstance(r, ToolCancelled)]
    assert [(c.call_id, c.reason, c.while_executing) for c in cancelled] == [
        ("c1", "interrupted; superseded by a revision", True)
    ]
    assert cancelled[0].output == (
        "perdure: this call was interrupted and not re-run: the request was revised "
        "(revision 1) since it was dispatched."
    )


def test_a_call_whose_tool_is_gone_is_unknown_and_the_model_is_told_so() -> None:
    step = call_whose_tool_is_gone()
    unknown = [r for r in step.records if isinstance(r, ToolOutcomeUnknown)]
    assert [(u.call_id, u.reason) for u in unknown] == [
        ("c1", "interrupted; its tool is no longer registered")
    ]
    assert unknown[0].output == decide.interrupted_text("lookup")


def test_the_model_reads_that_an_interrupted_effect_is_unknown_in_these_words() -> None:
    assert decide.interrupted_text("send") == (
        "perdure: the call to 'send' was interrupted (the process stopped) before its result "
        "was saved. Its external effect is UNKNOWN: it may or may not have happened. It was "
        "not re-run automatically. Check the current state before deciding whether to call "
        "it again."
    )


def test_a_never_call_without_reconcile_is_unknown_as_interrupted() -> None:
    unknown = [
        r for r in never_call_without_reconcile().records if isinstance(r, ToolOutcomeUnknown)
    ]
    assert [(u.call_id, u.reason) for u in unknown] == [
        ("c1", "interrupted before its result was saved; not re-run")
    ]


def test_the_interrupted_run_names_the_run_that_continues_it() -> None:
    from perdure.storage.records import RunFinished

    (finished,) = [r for r in model_call_in_flight().records if isinstance(r, RunFinished)]
    assert (finished.run_id, finished.status, finished.reason) == (
        "in1.r0",
        "interrupted",
        "the process stopped; continued by in1.r1",
    )


def test_a_restart_lists_every_call_waiting_for_an_answer() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.reply(
        "x",
        ("c1", "deploy", {"target": "a"}),
        ("c2", "deploy", {"target": "b"}),
        ("c3", "lookup", {"query": "q"}),
        ("c4", "lookup", {"query": "r"}),
    )
    s.finish_tool("c3", output="ask them", outcome="needs_human")
    s.finish_tool("c4", output="ask them too", outcome="needs_human")
    assert decisions(s.restart()) == [
        (
            "in1.r0",
            "in1.r0",
            "awaiting approval of c1, c2; awaiting a person to resolve c3, c4",
            "keep waiting",
            "nothing was in flight",
        )
    ]


def test_a_restart_with_a_call_in_flight_decides_for_each_call_that_waits() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.reply(
        "x",
        ("c1", "lookup", {"query": "q"}),
        ("c2", "lookup", {"query": "r"}),
        ("c3", "deploy", {"target": "a"}),
    )
    s.finish_tool("c2", output="ask them", outcome="needs_human")
    assert decisions(s.restart())[1:] == [
        (
            "in1.r0",
            "c1",
            "executing",
            "re-run with the same idempotency key (policy safe)",
            "recorded policy safe, registered policy safe",
        ),
        (
            "in1.r0",
            "c2",
            "awaiting a person (NeedsHuman)",
            "keep waiting for rt.resolve: retry, skip or fail",
            "ask them",
        ),
        ("in1.r0", "c3", "awaiting_approval", "keep waiting", "no decision yet"),
    ]


def test_a_restart_after_the_last_result_of_a_draining_process_starts_the_next_turn() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "lookup", {"query": "q"}))
    first = decide.on_result(
        s.state, s.env(), protocol.ToolFinished(call_id="c1", attempt=1, outcome="ok", output="a")
    )
    step = decide.settle(s.state, s.env(), protocol.View(draining=True), first)
    assert [type(r).__name__ for r in step.records] == ["ToolCompleted"], "draining: no new turn"
    s.log += step.records
    step = s.restart()
    assert decisions(step) == [
        (
            "in1.r0",
            "in1.r0",
            "all tool results saved, next turn not started",
            "start the next turn",
            "nothing was in flight",
        )
    ]
    assert protocol.CallModel("in1.g2", 1) in step.effects
