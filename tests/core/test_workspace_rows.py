"""Workspace history in the pure core: checkpoints, the diff at recovery, rewinds.

The shell snapshots and diffs; these rows decide from what it reports
(``WorkspaceSeen``): what the model is told about an interrupted workspace call,
whether it runs again, and when a rewind of the files may start.
"""

from __future__ import annotations

from typing import Any

import pytest
from attrs import evolve

import perdure
from perdure.actors import decide, protocol
from perdure.actors.decide import sessions
from perdure.actors.protocol import Step, View, WorkspaceSeen
from perdure.errors import Refused
from perdure.storage.records import (
    Committed,
    RecoveryDecision,
    ToolOutcomeUnknown,
    WorkspaceCheckpointed,
    WorkspaceRestored,
    WorkspaceRestoreStarted,
)
from tests.core.sim import TOOLS, Session, decide_committed, runs


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
    assert answer.ref == "t1", "the repeat names the tree the rewind restored"  # type: ignore[union-attr]


# -- which tree a rewind (or a fork with its files) restores ------------------------------


def _two_file_calls() -> list[Committed]:
    """A run that only talks (it ends at seq 6), then a run of two checkpointed calls:
    c1 takes the workspace from t0 to t1 (its checkpoint at 13, its turn settled at 14),
    c2 from t1 to t2 (19, settled at 20); the run ends at 23."""
    s = Session(tools=WS_TOOLS)
    s.command(protocol.Submit("r0", "hello"))
    s.reply("hi")
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "write_note", {"text": "a"}))
    s.finish_tool("c1", "written", workspace=WorkspaceSeen(before="t0", after="t1"))
    s.reply("y", ("c2", "write_note", {"text": "b"}))
    s.finish_tool("c2", "written", workspace=WorkspaceSeen(before="t1", after="t2"))
    s.reply("done")
    history = [decide_committed(i, r) for i, r in enumerate(s.log, start=1)]
    assert decide.fork_points(history) == [6, 14, 20, 23]
    assert [c.seq for c in history if isinstance(c.record, WorkspaceCheckpointed)] == [13, 19]
    return history


def test_a_rewind_to_a_point_restores_the_tree_the_calls_before_it_left() -> None:
    """At a settled point: the after-snapshot of the last checkpointed call before it;
    before any such call, the before-snapshot of the first one after it."""
    history = _two_file_calls()
    assert decide.workspace_at(history, 6) == (6, "t0")
    assert decide.workspace_at(history, 14) == (14, "t1")
    assert decide.workspace_at(history, 20) == (20, "t2")
    assert decide.workspace_at(history, 23) == (23, "t2")
    with pytest.raises(Refused, match="not a settled point"):
        decide.workspace_at(history, 13)


def test_a_rewind_to_a_call_restores_the_tree_before_its_first_attempt() -> None:
    """A call id names the workspace just before the call's first checkpointed attempt;
    an unknown one is refused with the calls that do have checkpoints, each once."""
    history = _two_file_calls()
    assert decide.workspace_at(history, "c1") == (13, "t0")
    assert decide.workspace_at(history, "c2") == (19, "t1")
    again = WorkspaceCheckpointed(
        session_id="s1", call_id="c1", attempt=2, before="t5", after="t6", at=9.0
    )
    retried = [*history, decide_committed(24, again)]
    assert decide.workspace_at(retried, "c1") == (13, "t0")
    with pytest.raises(Refused) as unknown:
        decide.workspace_at(retried, "c9")
    assert unknown.value.code == "not_found"
    assert str(unknown.value) == "session s1 has no checkpointed call 'c9' (its calls: c1, c2)"


def test_a_rewind_without_a_usable_checkpoint_is_refused_and_says_why() -> None:
    """No checkpoint at all: nothing to put back. Only a checkpoint whose after-snapshot
    the store failed to take, before the point: the tree there is not known."""
    history = _two_file_calls()
    talk_only = history[:6]
    with pytest.raises(Refused) as none:
        decide.workspace_at(talk_only, 6)
    assert none.value.code == "not_found"
    assert str(none.value) == (
        "session s1 has no workspace checkpoint: none of its calls changed the "
        "workspace through a checkpointed tool"
    )
    with pytest.raises(Refused, match=r"^session s1 has no workspace checkpoint"):
        decide.workspace_at(history[:1], 1)  # a session just created
    with pytest.raises(Refused, match=r"^session \? has no workspace checkpoint"):
        decide.workspace_at([], 1)
    (mark,) = [c for c in history[:14] if isinstance(c.record, WorkspaceCheckpointed)]
    failed = evolve(mark.record, after="")
    broken = [decide_committed(c.seq, failed) if c is mark else c for c in history[:14]]
    assert decide.workspace_at(broken, 6) == (6, "t0")  # the before-snapshot is there
    with pytest.raises(Refused) as lost:
        decide.workspace_at(broken, 14)
    assert lost.value.code == "invalid_state"
    assert str(lost.value) == (
        "session s1 has no complete checkpoint at 14: the after-snapshot of call c1 is "
        "missing (the store failed then)"
    )


def test_a_fork_with_its_files_restores_the_tree_of_its_point_first() -> None:
    """``fork(files=True)`` adds, to the fork's own records, the start of a restore of
    the tree at the fork's point (not the source's latest), under a request id of its
    own, so the fork's recovery puts the files back before its first run goes on."""
    history = _two_file_calls()
    decided = sessions.fork(
        "s1", "f1", 14, "fk1", existing=None, history=history, now=9.0, files=True
    )
    *copied, restore = decided.records
    assert restore == WorkspaceRestoreStarted(
        session_id="f1", tree="t1", position=14, request_id="fk1/files", at=9.0
    )
    assert decided.forked.position == 14
    plain = sessions.fork("s1", "f1", 14, "fk1", existing=None, history=history, now=9.0)
    assert tuple(copied) == plain.records
