"""The core's tables are whole, and the fold holds every record to the lifecycle table.

``advance`` and ``recover`` choose what to do with a tool call by a row keyed by its
phase (``decide.ADVANCE``, ``decide.RECOVER``), and the lifecycles of docs/DESIGN.md
§3 are literal tables (``perdure.actors.lifecycle``) that the fold looks every phase
change up in. A phase without a row would be a ``KeyError`` in a running session; a
transition the table lacks is refused by the fold, naming what and where.
"""

from __future__ import annotations

import attrs
import pytest

from perdure.actors import decide, lifecycle, protocol
from perdure.actors.decide.verbs import every_phase_has_a_row
from perdure.actors.lifecycle import (
    GENERATION_TRANSITIONS,
    TASK_PHASES,
    TASK_TRANSITIONS,
    ImpossibleTransition,
)
from perdure.actors.requests import ANSWERS
from perdure.actors.state import SessionState
from perdure.storage.records import (
    RECORD_TYPES,
    GenerationCompleted,
    SessionCreated,
    SessionForked,
    ToolCompleted,
    ToolExecuting,
    ToolHeartbeat,
    WorkspaceRestored,
)
from tests.core.sim import Session, decide_committed


@pytest.mark.parametrize("table", ["ADVANCE", "RECOVER"])
def test_every_task_phase_has_a_row_in_every_table(table: str) -> None:
    rows = getattr(decide, table)
    assert set(rows) == set(TASK_PHASES)
    assert all(callable(row) for row in rows.values())


def test_a_table_without_a_row_for_a_phase_is_an_error_at_import() -> None:
    rows = dict(decide.ADVANCE)
    del rows["awaiting_human"]
    with pytest.raises(ImportError, match="awaiting_human") as missing:
        every_phase_has_a_row(rows, "a table")
    assert str(missing.value) == "the table a table has no row for the phase(s) ['awaiting_human']"
    every_phase_has_a_row(decide.RECOVER, "RECOVER")  # a whole table passes


def test_every_task_phase_is_entered_and_only_terminal_phases_have_no_way_out() -> None:
    entered = set(TASK_TRANSITIONS.values())
    assert entered == set(TASK_PHASES)
    left = {before for before, _ in TASK_TRANSITIONS if before is not None}
    assert set(TASK_PHASES) - left == lifecycle.TERMINAL_PHASES


def test_the_fold_refuses_a_second_result_for_a_call() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "lookup", {"query": "q"}))
    s.finish_tool("c1", output="found")
    late = ToolCompleted(session_id="s1", call_id="c1", output="again", at=1.0)
    with pytest.raises(ImpossibleTransition, match=r"ToolCompleted for tool call c1 in phase"):
        s.state.apply(late)
    assert s.state.tasks["c1"].result is not None
    assert s.state.tasks["c1"].result.output == "found"


def test_the_fold_refuses_to_run_a_call_that_waits_for_its_approval() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "deploy", {"target": "prod"}))
    assert s.state.tasks["c1"].phase == "awaiting_approval"
    other = Session()  # an executing record of a call that needed no approval
    other.command(protocol.Submit("r1", "go"))
    other.reply("x", ("c1", "lookup", {"query": "q"}))
    executing = next(r for r in other.log if isinstance(r, ToolExecuting))
    with pytest.raises(ImpossibleTransition, match="'awaiting_approval'") as refused:
        s.state.apply(executing)
    assert refused.value.event == "ToolExecuting" and refused.value.phase == "awaiting_approval"


def test_the_fold_refuses_a_heartbeat_of_a_call_that_is_not_running() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "deploy", {"target": "prod"}))
    beat = ToolHeartbeat(session_id="s1", call_id="c1", attempt=1, details={}, at=1.0)
    with pytest.raises(ImpossibleTransition):
        s.state.apply(beat)


def test_the_fold_refuses_a_second_reply_to_one_model_turn() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.reply("first")
    reply = next(r for r in s.log if isinstance(r, GenerationCompleted))
    state = SessionState.fold("s1", [decide_committed(i, r) for i, r in enumerate(s.log, 1)])
    with pytest.raises(ImpossibleTransition, match=r"model turn in1\.g1 in phase 'completed'"):
        state.apply(reply)
    assert ("completed", "GenerationCompleted") not in GENERATION_TRANSITIONS


def test_a_table_with_a_row_for_an_unknown_phase_is_an_error_at_import() -> None:
    rows: dict[str, object] = {**decide.ADVANCE, "sleeping": object()}
    with pytest.raises(ImportError, match=r"unknown phase\(s\) \['sleeping'\]") as refused:
        every_phase_has_a_row(rows, "a table")  # type: ignore[arg-type]
    assert "no row for the phase(s) []" in str(refused.value)
    del rows["executing"]
    with pytest.raises(ImportError, match=r"\['executing'\] and rows for unknown") as both:
        every_phase_has_a_row(rows, "a table")  # type: ignore[arg-type]
    assert str(both.value).startswith("the table a table has no row")


def test_a_lifecycle_table_naming_an_unknown_or_unreached_phase_is_an_error_at_import() -> None:
    check = lifecycle._check_table
    check(TASK_TRANSITIONS, TASK_PHASES)  # the real tables pass
    check(GENERATION_TRANSITIONS, lifecycle.GENERATION_PHASES)
    typo = {**TASK_TRANSITIONS, ("executing", "ToolDone"): "complete"}
    with pytest.raises(ImportError, match=r"unknown phases \['complete'\], phases no transition"):
        check(typo, TASK_PHASES)
    from_typo = {**TASK_TRANSITIONS, ("runing", "ToolCompleted"): "completed"}
    with pytest.raises(ImportError, match=r"unknown phases \['runing'\]"):
        check(from_typo, TASK_PHASES)
    unreached = {k: v for k, v in TASK_TRANSITIONS.items() if v != "denied"}
    with pytest.raises(ImportError, match=r"unknown phases \[\], .* enters \['denied'\]"):
        check(unreached, TASK_PHASES)


def test_an_impossible_transition_names_the_session_the_subject_its_phase_and_the_event() -> None:
    early = ImpossibleTransition("s1", "tool call c1", None, "ToolCompleted")
    assert (early.session_id, early.subject, early.phase, early.event) == (
        "s1",
        "tool call c1",
        None,
        "ToolCompleted",
    )
    assert str(early) == (
        "session s1: ToolCompleted for tool call c1 before it exists is not a transition "
        "of its lifecycle (docs/DESIGN.md §3)"
    )
    late = ImpossibleTransition("s1", "model turn g1", "completed", "RetryPending")
    assert "RetryPending for model turn g1 in phase 'completed' is not" in str(late)


# Records that carry a request id but answer no command of the session's own: a
# created session is made idempotent by its id (decide/sessions.py), a fork by the
# target session's log, and a finished restore closes the request its start answered.
_NOT_A_COMMANDS_ANSWER = {SessionCreated, SessionForked, WorkspaceRestored}


def test_every_record_that_carries_a_request_id_is_read_back_as_its_command() -> None:
    """A command record without its row in ``requests.ANSWERS`` would leave its request
    id unknown to the fold: a retry of that command would run it a second time."""
    carrying = {cls for cls in RECORD_TYPES if "request_id" in attrs.fields_dict(cls)}
    assert set(ANSWERS) == carrying - _NOT_A_COMMANDS_ANSWER
    assert carrying >= _NOT_A_COMMANDS_ANSWER
