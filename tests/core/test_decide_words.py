"""What the core tells people and the model, word for word, where a weaker test let a
change of it pass unnoticed.

The refusals of a rewind and of a compaction carry their code and every reason that
holds; a workspace call's reconciliation names the files that changed (at most fifty,
then how many more), tells a known effect as the tool's own answer, and says why a
call runs again; a rewind's restore is recorded once, for its own request, with what
the store reported; the recovery decisions of a rewind and of a reconciled workspace
call say what they do; a call off of a call waiting for a person names its tool; a
compensation whose outcome is unknown waits for a person even after the request
changed.
"""

from __future__ import annotations

from typing import Any

import pytest

import perdure
from perdure import errors
from perdure.actors import decide, protocol
from perdure.actors.decide.results import describe_changes
from perdure.actors.protocol import Step, View, WorkspaceSeen
from perdure.storage.records import (
    CompactionPolicy,
    RecoveryDecision,
    ToolAwaitingHuman,
    ToolCompleted,
    ToolOutcomeUnknown,
    WorkspaceCheckpointed,
    WorkspaceRestored,
)
from tests.core.sim import COURSE_TOOLS, TOOLS, Session, only, runs


async def _ask_the_site(ctx: perdure.ToolContext, target: str) -> perdure.Reconciled:
    return perdure.Reconciled.unknown()


@perdure.tool(
    name="publish",
    replay=perdure.ReplayPolicy.NEVER,
    changes_workspace=True,
    reconcile=_ask_the_site,
)
async def publish(target: str) -> str:
    """Build the site in the workspace and publish it."""
    return "published"


@perdure.tool(name="write_note", replay=perdure.ReplayPolicy.NEVER, workspace_only=True)
async def write_note(text: str) -> str:
    """Write a note file."""
    return "written"


@perdure.tool(name="shell", replay=perdure.ReplayPolicy.NEVER, changes_workspace=True)
async def shell(command: str) -> str:
    """Run a command in the workspace."""
    return "ran"


@perdure.tool(replay=perdure.ReplayPolicy.NEVER, unknown_outcome="ask_person")
async def refund(ctx: perdure.ToolContext, result: str, amount: int) -> str:
    """Refund a charge (a person says what happened when perdure cannot know)."""
    return "refunded"


@perdure.tool(replay=perdure.ReplayPolicy.KEYED, compensate=refund)
async def charge(ctx: perdure.ToolContext, amount: int) -> str:
    """Charge a card."""
    return "charged"


@perdure.tool(replay=perdure.ReplayPolicy.NEVER, unknown_outcome="ask_person")
async def wire(amount: int) -> str:
    """Wire money."""
    return str(amount)


WORDS_TOOLS = {
    **COURSE_TOOLS,
    **{t.name: t for t in (publish, write_note, shell, refund, charge, wire)},
}


def refusal(s: Session, cmd: protocol.Command) -> tuple[str, str]:
    """The code and message of the refusal of ``cmd``; nothing may be recorded."""
    before = list(s.log)
    with pytest.raises(errors.Refused) as info:
        s.command(cmd)
    assert s.log == before
    return info.value.code, info.value.message


# -- refusals ---------------------------------------------------------------------------


def test_a_rewind_refused_names_every_reason_the_session_is_busy_and_what_to_do() -> None:
    s = Session(tools=WORDS_TOOLS)
    s.command(protocol.Submit("r1", "go"))
    s.command(protocol.Submit("r2", "then this"))
    assert refusal(s, protocol.Rewind("rw1", 3, "t1")) == (
        "invalid_state",
        "session s1 cannot rewind its workspace now: run in1.r0 is in progress; "
        "1 input(s) wait their turn. "
        "Cancel the run (or wait until the session is idle), then rewind.",
    )


def test_a_rewind_is_refused_while_a_compensation_or_another_rewind_is_unfinished() -> None:
    s = Session(tools=WORDS_TOOLS)
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "create_ticket", {"title": "t"}))
    s.finish_tool("c1", output="T-1")
    s.reply("done")
    s.command(protocol.Compensate("c1", "k1"))  # its undo waits for an approval
    code, message = refusal(s, protocol.Rewind("rw1", 3, "t1"))
    assert code == "invalid_state"
    assert "cannot rewind its workspace now: 1 compensation(s) are unfinished. " in message
    s.command(protocol.Approve("comp-c1", False, "a1"))
    assert s.state.idle
    _, answer = s.command(protocol.Rewind("rw1", 3, "t1"))
    assert answer == protocol.Done("t1", answer.seq), "a rewind answers with its tree"
    code, message = refusal(s, protocol.Rewind("rw2", 1, "t0"))
    assert (code, message.split(": ", 1)[1]) == (
        "invalid_state",
        "the rewind 'rw1' is still restoring the files. "
        "Cancel the run (or wait until the session is idle), then rewind.",
    )


def test_a_compaction_with_nothing_to_summarise_is_refused_with_the_numbers() -> None:
    policy = CompactionPolicy(window=1000, keep_recent=3, threshold=0.8)
    s = Session(tools=TOOLS, compaction=policy)
    assert refusal(s, protocol.CompactContext("k1")) == (
        "invalid_state",
        "nothing to compact in session s1: the conversation has 0 items, 0 already "
        "summarised, the last 3 kept verbatim (and any unsettled turn with them)",
    )


# -- the files a call changed ---------------------------------------------------------


def test_the_files_a_call_changed_are_named_up_to_fifty_then_counted() -> None:
    assert describe_changes(()) == "no file changed"
    assert describe_changes(["a.txt"]) == "1 file changed: a.txt"
    fifty = [f"f{i}" for i in range(50)]
    assert describe_changes(fifty) == "50 files changed: " + ", ".join(fifty)
    assert describe_changes([*fifty, "g", "h"]) == (
        "52 files changed: " + ", ".join(fifty) + " and 2 more"
    )


# -- a workspace call reconciled --------------------------------------------------------


def interrupted(tool_name: str, args: dict[str, Any]) -> tuple[Session, Step]:
    """A workspace call executing when the process died, and the restart's step."""
    s = Session(tools=WORDS_TOOLS)
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", tool_name, args))
    return s, s.restart()


def reconciled(s: Session, seen: WorkspaceSeen, status: str = "unknown", **kw: Any) -> Step:
    s.view = View(models=s.view.models, tools=s.view.tools - {"c1"})
    msg = protocol.ReconcileFinished(call_id="c1", status=status, workspace=seen, **kw)  # type: ignore[arg-type]
    return s._commit(decide.on_result(s.state, s.env(), msg))


def decision(step: Step) -> RecoveryDecision:
    (d,) = [r for r in step.records if isinstance(r, RecoveryDecision) and r.subject == "c1"]
    return d


def test_a_call_with_a_reconcile_and_a_workspace_is_asked_and_diffed() -> None:
    _, step = interrupted("publish", {"target": "prod"})
    assert decision(step).action == (
        "ask the tool's reconcile() and diff the workspace from its before-snapshot"
    )


def test_a_call_run_again_says_how_it_is_known_that_it_had_no_effect() -> None:
    s, _ = interrupted("shell", {"command": "make"})
    step = reconciled(s, WorkspaceSeen(before="", after=""))
    assert runs(step) == [("c1", 2)]
    assert decision(step).reason == (
        "the effect had not happened: the call was interrupted before its tool started "
        "(no checkpoint of it)"
    )
    s, _ = interrupted("write_note", {"text": "hi"})
    step = reconciled(s, WorkspaceSeen(before="t1", after="t1"))
    assert runs(step) == [("c1", 2)]
    assert decision(step).reason == (
        "the effect had not happened: no file of the workspace changed since the call started"
    )


def test_a_file_tool_that_answered_applied_without_a_change_is_done() -> None:
    """A write of the content already there changes nothing, and is done."""
    s, _ = interrupted("write_note", {"text": "hi"})
    step = reconciled(s, WorkspaceSeen(before="t1", after="t1"), "applied", output="written")
    assert runs(step) == []
    (done,) = only(step.records, ToolCompleted)
    assert (done.output, done.kind) == ("written", "reconciled")


def test_an_applied_result_names_the_files_it_changed_and_only_then() -> None:
    s, _ = interrupted("publish", {"target": "prod"})
    seen = WorkspaceSeen(before="t1", after="t2", changed=("site/index.html",))
    (done,) = only(reconciled(s, seen, "applied", output="live").records, ToolCompleted)
    assert done.output == "live\n[perdure: in the workspace 1 file changed: site/index.html]"
    s, _ = interrupted("publish", {"target": "prod"})
    (done,) = only(
        reconciled(s, WorkspaceSeen(before="t1", after="t1"), "applied", output="live").records,
        ToolCompleted,
    )
    assert done.output == "live"


def test_an_unknown_outcome_says_what_the_check_and_the_diff_found() -> None:
    found = "The tool's own check found: "
    s, _ = interrupted("publish", {"target": "prod"})
    seen = WorkspaceSeen(before="t1", after="t2", changed=("a.c", "b.o"))
    (unknown,) = only(reconciled(s, seen).records, ToolOutcomeUnknown)
    assert unknown.output.endswith(
        found + "in the workspace 2 files changed: a.c, b.o; "
        "any effect outside the workspace files stays unknown"
    )
    s, _ = interrupted("publish", {"target": "prod"})
    (unknown,) = only(
        reconciled(s, seen, reason="the site answers 502").records, ToolOutcomeUnknown
    )
    assert unknown.output.endswith(
        found + "the site answers 502; in the workspace 2 files changed: a.c, b.o; "
        "any effect outside the workspace files stays unknown"
    )
    s, _ = interrupted("write_note", {"text": "hi"})
    seen = WorkspaceSeen(before="t1", after="t2", changed=("note.txt",))
    (unknown,) = only(reconciled(s, seen).records, ToolOutcomeUnknown)
    assert unknown.output.endswith(found + "in the workspace 1 file changed: note.txt")


def test_a_checkpoint_records_the_files_changed_from_outside() -> None:
    s = Session(tools=WORDS_TOOLS)
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "write_note", {"text": "hi"}))
    seen = WorkspaceSeen(before="t1", after="t2", changed=("note.txt",), outside=("todo.md",))
    (mark,) = only(s.finish_tool("c1", "written", workspace=seen).records, WorkspaceCheckpointed)
    assert (mark.changed, mark.outside) == (["note.txt"], ["todo.md"])


# -- a rewind's restore -------------------------------------------------------------------


def test_a_restore_is_recorded_once_for_its_own_request_with_what_the_store_said() -> None:
    s = Session(tools=WORDS_TOOLS)
    assert s.result(protocol.RestoreFinished(request_id="rw0", tree="t0")) == Step(())
    s.command(protocol.Rewind("rw1", 3, "t1"))
    again = s.restart()
    (d,) = only(again.records, RecoveryDecision)
    assert (d.subject, d.found, d.action, d.reason) == (
        "rw1",
        "the rewind 'rw1' to position 3 unfinished",
        "restore the files again",
        "a restore makes the files match its tree, however far it got",
    )
    assert s.result(protocol.RestoreFinished(request_id="rw9", tree="t1")) == Step(())
    assert s.state.restoring is not None
    step = s.result(
        protocol.RestoreFinished(request_id="rw1", tree="t1", before="t8", error="store is gone")
    )
    (done,) = only(step.records, WorkspaceRestored)
    assert (done.request_id, done.tree, done.before, done.error) == (
        "rw1",
        "t1",
        "t8",
        "store is gone",
    )


# -- waiting for a person -----------------------------------------------------------------


def test_a_call_off_of_a_wait_for_a_person_names_the_tool_to_the_model() -> None:
    s = Session(tools=WORDS_TOOLS)
    s.command(protocol.Submit("r1", "pay"))
    s.reply("paying", ("c1", "wire", {"amount": 5}))
    s.restart()
    assert s.state.tasks["c1"].phase == "awaiting_human"
    step, _ = s.command(protocol.Cancel("x1"))
    (unknown,) = only(step.records, ToolOutcomeUnknown)
    assert unknown.output.startswith("perdure: the call to 'wire' was waiting for a person")


def test_an_unknown_compensation_waits_for_a_person_though_the_request_changed() -> None:
    """A compensation lives beside runs: a revision of a later request does not end it."""
    s = Session(tools=WORDS_TOOLS)
    s.command(protocol.Submit("r1", "buy"))
    s.reply("x", ("c1", "charge", {"amount": 5}))
    s.finish_tool("c1", output="charged")
    s.reply("done")
    s.command(protocol.Compensate("c1", "k1"))
    assert s.state.tasks["comp-c1"].phase == "executing"
    s.command(protocol.Submit("r2", "and then"))
    s.command(protocol.Revise("v1", "and then, differently"))
    assert s.state.tasks["comp-c1"].goal_rev < s.state.goal_rev
    step = s.finish_tool("comp-c1", output="no answer", outcome="timeout")
    assert not only(step.records, ToolOutcomeUnknown)
    assert [w.call_id for w in only(step.records, ToolAwaitingHuman)] == ["comp-c1"]


def test_a_restart_names_every_call_waiting_for_a_person_to_say_what_happened() -> None:
    s = Session(tools=WORDS_TOOLS)
    s.command(protocol.Submit("r1", "pay"))
    s.reply("paying", ("c1", "wire", {"amount": 5}), ("c2", "wire", {"amount": 7}))
    s.finish_tool("c1", output="no answer", outcome="timeout")
    s.finish_tool("c2", output="no answer", outcome="timeout")
    (d,) = only(s.restart().records, RecoveryDecision)
    assert d.found == "awaiting a person to say whether c1, c2 took effect"
