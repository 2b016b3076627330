"""Workspace history in the pure core: checkpoints, the diff at recovery, rewinds.

The shell snapshots and diffs; these rows decide from what it reports
(``WorkspaceSeen``): what the model is told about an interrupted workspace call,
whether it runs again, and when a rewind of the files may start.
"""

from __future__ import annotations

from typing import Any

import pytest

import perdure
from perdure.actors import decide, protocol
from perdure.actors.protocol import Step, View, WorkspaceSeen
from perdure.errors import Refused
from perdure.storage.records import (
    RecoveryDecision,
    ToolOutcomeUnknown,
    WorkspaceCheckpointed,
    WorkspaceRestored,
    WorkspaceRestoreStarted,
)
from tests.core.sim import TOOLS, Session, runs


@perdure.tool(name="write_note", replay=perdure.ReplayPolicy.NEVER, workspace_only=True)
async def write_note(text: str) -> str:
    return "written"


@perdure.tool(name="shell", replay=perdure.ReplayPolicy.NEVER, changes_workspace=True)
async def shell(command: str) -> str:
    return "ran"


WS_TOOLS = {**TOOLS, "write_note": write_note, "shell": shell}


def interrupted(tool_name: str, args: dict[str, Any]) -> Session:
    """A workspace call executing when the process died: recovery asks for its diff
    even though the tool has no reconcile of its own."""
    s = Session(tools=WS_TOOLS)
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", tool_name, args))
    step = s.restart()
    asked = [e for e in step.effects if isinstance(e, protocol.Reconcile)]
    assert [e.call_id for e in asked] == ["c1"]
    (d,) = [r for r in step.records if isinstance(r, RecoveryDecision) and r.subject == "c1"]
    assert d.action == "diff the workspace from its before-snapshot"
    return s


def found(s: Session, seen: WorkspaceSeen) -> Step:
    s.view = View(models=s.view.models, tools=s.view.tools - {"c1"})
    msg = protocol.ReconcileFinished(call_id="c1", status="unknown", workspace=seen)
    return s._commit(decide.on_result(s.state, s.env(), msg))


def test_a_file_tool_that_changed_nothing_runs_once_more() -> None:
    s = interrupted("write_note", {"text": "hi"})
    step = found(s, WorkspaceSeen(before="t1", after="t1"))
    assert runs(step) == [("c1", 2)]
    (mark,) = [r for r in step.records if isinstance(r, WorkspaceCheckpointed)]
    assert (mark.before, mark.after, mark.changed) == ("t1", "t1", [])


def test_no_before_snapshot_means_the_tool_never_started() -> None:
    s = interrupted("shell", {"command": "rm -rf build"})
    step = found(s, WorkspaceSeen(before="", after=""))
    assert runs(step) == [("c1", 2)]
    assert not [r for r in step.records if isinstance(r, WorkspaceCheckpointed)]


def test_bash_like_tools_are_told_which_files_changed_and_that_the_rest_is_unknown() -> None:
    s = interrupted("shell", {"command": "make"})
    step = found(s, WorkspaceSeen(before="t1", after="t2", changed=("a.c", "b.o")))
    assert runs(step) == []
    (unknown,) = [r for r in step.records if isinstance(r, ToolOutcomeUnknown)]
    assert "2 files changed: a.c, b.o" in unknown.output
    assert "any effect outside the workspace files stays unknown" in unknown.output
    assert "UNKNOWN" in unknown.output


def test_bash_like_tools_that_changed_nothing_are_still_unknown_and_say_so() -> None:
    s = interrupted("shell", {"command": "curl -X POST ..."})
    step = found(s, WorkspaceSeen(before="t1", after="t1"))
    assert runs(step) == []
    (unknown,) = [r for r in step.records if isinstance(r, ToolOutcomeUnknown)]
    assert "no file changed" in unknown.output


def test_a_file_tool_that_changed_files_without_its_own_answer_is_unknown() -> None:
    s = interrupted("write_note", {"text": "hi"})
    step = found(s, WorkspaceSeen(before="t1", after="t2", changed=("note.txt",)))
    (unknown,) = [r for r in step.records if isinstance(r, ToolOutcomeUnknown)]
    assert "1 file changed: note.txt" in unknown.output
    assert "outside the workspace" not in unknown.output


def test_a_finished_call_records_its_checkpoints_with_its_result() -> None:
    s = Session(tools=WS_TOOLS)
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "write_note", {"text": "hi"}))
    seen = WorkspaceSeen(before="t1", after="t2", changed=("note.txt",), skipped=("big",))
    step = s.finish_tool("c1", "written", workspace=seen)
    (mark,) = [r for r in step.records if isinstance(r, WorkspaceCheckpointed)]
    assert (mark.call_id, mark.changed, mark.skipped) == ("c1", ["note.txt"], ["big"])
    assert s.state.checkpoints == [mark]


def test_a_rewind_is_refused_while_a_run_is_active_and_recorded_when_idle() -> None:
    s = Session(tools=WS_TOOLS)
    s.command(protocol.Submit("r1", "go"))
    busy = r"cannot rewind its workspace now: run in1\.r0 is in progress"
    with pytest.raises(Refused, match=busy):
        s.command(protocol.Rewind("rw1", 5, "t1"))
    s.reply("done")
    assert s.state.idle
    step, answer = s.command(protocol.Rewind("rw1", 5, "t1"))
    assert [type(r) for r in step.records] == [WorkspaceRestoreStarted]
    assert step.effects == (protocol.RestoreWorkspace("rw1", "t1"),)
    assert not s.state.idle  # the restore is unfinished work
    # no run starts while the files are being put back
    step, _ = s.command(protocol.Submit("r2", "next"))
    assert not [e for e in step.effects if isinstance(e, protocol.CallModel)]
    # a crash now: recovery restores again
    again = s.restart()
    assert protocol.RestoreWorkspace("rw1", "t1") in again.effects
    done = s.result(protocol.RestoreFinished(request_id="rw1", tree="t1", before="t9"))
    assert isinstance(done.records[0], WorkspaceRestored)
    assert s.state.restoring is None
    assert [e for e in done.effects if isinstance(e, protocol.CallModel)]  # r2 runs now
    # the same request again answers as before, recording nothing
    step, answer = s.command(protocol.Rewind("rw1", 5, "t1"))
    assert not step.records and answer.duplicate
