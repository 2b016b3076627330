"""Workspace history through the runtime: checkpoints around calls, diffs, rewind, fork.

A real LMDB log, the real workspace tools and git store, a scripted model.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import trio
from click.testing import CliRunner

import perdure
from perdure.cli import main
from perdure.errors import Refused
from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse
from perdure.storage.records import WorkspaceCheckpointed, WorkspaceRestored
from perdure.tools.history import STORE_DIR, WorkspaceHistory
from perdure.tools.workspace import workspace_tools
from tests.support.fold import fold_of
from tests.tools.test_history import files_of

TOOLS = workspace_tools(include_bash=True)


def script() -> ScriptedProvider:
    return ScriptedProvider(
        [
            Reply(tool_uses=[ToolUse("write_file", {"path": "a.txt", "content": "one\n"})]),
            Reply(
                tool_uses=[
                    ToolUse("edit_file", {"path": "a.txt", "old_text": "one", "new_text": "two"}),
                    ToolUse("bash", {"command": "mkdir -p d && echo b > d/b.txt", "timeout": 10}),
                ]
            ),
            Reply(tool_uses=[ToolUse("read_file", {"path": "a.txt"})]),
            Reply(text="done"),
        ]
    )


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "keep.txt").write_text("kept\n")
    return root


async def test_calls_are_checkpointed_diffed_and_rewound(tmp_path: Path, ws: Path) -> None:
    async with perdure.open_runtime(
        tmp_path / "log", provider=script(), tools=TOOLS, workspace=ws
    ) as rt:
        await rt.create_session("s")
        await rt.submit("s", "go", request_id="r1")
        with trio.fail_after(30):
            await rt.wait_idle("s")
        state = await fold_of(rt, "s")
        marks = state.checkpoints
        by_tool = {state.tasks[m.call_id].tool_name: m for m in marks}
        # write, edit, bash: checkpointed; read_file is not a workspace-changing tool
        assert len(marks) == 3 and set(by_tool) == {"write_file", "edit_file", "bash"}
        # edit and bash ran in one turn, one after the other between their snapshots,
        # so each diff is that call's alone
        assert by_tool["write_file"].changed == ["a.txt"]
        assert by_tool["edit_file"].changed == ["a.txt"]
        assert by_tool["bash"].changed == ["d/b.txt"]
        assert marks[1].before == marks[0].after and marks[2].before == marks[1].after
        edit = by_tool["edit_file"]
        diffs = await rt.workspace_diff("s", edit.call_id)
        assert [d.tool_name for d in diffs] == ["edit_file"]
        assert "-one\n+two\n" in diffs[0].patch
        with pytest.raises(Refused, match="no checkpointed call"):
            await rt.workspace_diff("s", "nope")

        # Rewind to before the edit: a.txt is "one" again, keep.txt kept (and d/b.txt
        # only if bash ran before the edit).
        done = await rt.rewind("s", to=edit.call_id, request_id="rw1")
        assert done.tree == edit.before and done.before == marks[2].after
        expected = {"keep.txt": b"kept\n", "a.txt": b"one\n"}
        if marks[1] is by_tool["bash"]:
            expected["d/b.txt"] = b"b\n"
        assert files_of(ws) == expected
        again = await rt.rewind("s", to=edit.call_id, request_id="rw1")
        assert again.duplicate and files_of(ws) == expected

        # Rewind to the end of the run (the last settled point): the files come back.
        history = [c async for c in _records(rt, "s")]
        end = history[-1][0]
        await rt.rewind("s", to=end, request_id="rw2")
        assert files_of(ws) == {"keep.txt": b"kept\n", "a.txt": b"two\n", "d/b.txt": b"b\n"}
        with pytest.raises(Refused, match="not a settled point"):
            await rt.rewind("s", to=3, request_id="rw3")

        # A fork at the end of the first turn (the write's result, just after its
        # checkpoint), with its files: a.txt as the write left it, d/ not there yet.
        first_turn_end = next(
            seq
            for seq, r in history
            if isinstance(r, WorkspaceCheckpointed) and r.call_id == marks[0].call_id
        )
        forked = await rt.fork("s", at=first_turn_end + 1, session_id="f", files=True)
        assert forked.session_id == "f"
        assert files_of(ws) == {"keep.txt": b"kept\n", "a.txt": b"one\n"}
        restored = (await fold_of(rt, "f")).restores
        assert [r.tree for r in restored.values()] == [marks[0].after]


async def _records(rt: perdure.Runtime, sid: str):  # type: ignore[no-untyped-def]
    async for event in rt.events(sid, live=False):
        if event.record is not None and event.seq is not None:
            yield event.seq, event.record


async def test_a_rewind_is_refused_while_a_run_is_active(tmp_path: Path, ws: Path) -> None:
    slow = ScriptedProvider(
        [
            Reply(tool_uses=[ToolUse("write_file", {"path": "a.txt", "content": "one\n"})]),
            Reply(tool_uses=[ToolUse("bash", {"command": "sleep 5", "timeout": 10})]),
            Reply(text="done"),
        ]
    )
    async with perdure.open_runtime(
        tmp_path / "log", provider=slow, tools=TOOLS, workspace=ws
    ) as rt:
        await rt.create_session("s")
        await rt.submit("s", "go", request_id="r1")
        with trio.fail_after(20):
            while not (await fold_of(rt, "s")).checkpoints:  # noqa: ASYNC110
                await trio.sleep(0.05)
        call = (await fold_of(rt, "s")).checkpoints[0].call_id
        with pytest.raises(Refused, match=r"run .* is in progress"):
            await rt.rewind("s", to=call)
        await rt.cancel("s")
        with trio.fail_after(20):
            await rt.wait_idle("s")
        await rt.rewind("s", to=call)
        assert files_of(ws) == {"keep.txt": b"kept\n"}


async def test_a_damaged_store_refuses_the_rewind_and_writes_nothing(
    tmp_path: Path, ws: Path
) -> None:
    async with perdure.open_runtime(
        tmp_path / "log", provider=script(), tools=TOOLS, workspace=ws
    ) as rt:
        await rt.create_session("s")
        await rt.submit("s", "go", request_id="r1")
        with trio.fail_after(30):
            await rt.wait_idle("s")
        first = (await fold_of(rt, "s")).checkpoints[0]
        objects = ws / ".perdure-tools" / "history.git" / "objects"
        tree = objects / first.before[:2] / first.before[2:]
        os.chmod(tree, 0o644)
        tree.write_bytes(b"damaged")
        before = files_of(ws)
        with pytest.raises(Refused, match="not restored"):
            await rt.rewind("s", to=first.call_id, request_id="rw")
        assert files_of(ws) == before
        state = await fold_of(rt, "s")
        assert isinstance(state.restores["rw"], WorkspaceRestored)
        assert state.restores["rw"].error
        assert state.restoring is None  # the session is not stuck: it goes on


def test_retention_check_and_the_command_line(tmp_path: Path, ws: Path) -> None:
    """Deleting a session drops its checkpoints (a fork keeps those it copied);
    ``perdure check --workspace`` reports a lost store; ``perdure diff`` and
    ``perdure rewind`` work from a shell (plain functions: the CLI runs its own trio)."""
    log = tmp_path / "log"

    async def run_and_fork(sid: str, fork: bool) -> list[WorkspaceCheckpointed]:
        async with perdure.open_runtime(log, provider=script(), tools=TOOLS, workspace=ws) as rt:
            await rt.create_session(sid)
            await rt.submit(sid, "go", request_id="r1")
            with trio.fail_after(30):
                await rt.wait_idle(sid)
            if fork:
                await rt.fork(sid, session_id="f")
            return (await fold_of(rt, sid)).checkpoints

    async def delete(*sids: str) -> list[bool]:
        held = []
        async with perdure.open_runtime(log, provider=script(), tools=TOOLS, workspace=ws) as rt:
            for sid in sids:
                await rt.delete_session(sid)
                held.append(all(history.has_tree(t) for t in trees))
        return held

    marks = trio.run(run_and_fork, "s", True)
    history = WorkspaceHistory(ws)
    trees = {t for m in marks for t in (m.before, m.after)}
    assert all(history.has_tree(t) for t in trees)

    runner = CliRunner()
    where = ["--log", str(log), "--workspace", str(ws)]
    shown = runner.invoke(main, ["diff", "s", marks[0].call_id, *where])
    assert shown.exit_code == 0, shown.output
    assert "+one" in shown.output and "write_file" in shown.output
    checked = runner.invoke(main, ["check", *where])
    assert checked.exit_code == 0, checked.output
    no_model = f"scripted:{_no_model(tmp_path)}"
    rewound = runner.invoke(
        main, ["rewind", "s", "--to", marks[0].call_id, *where, "--provider", no_model]
    )
    assert rewound.exit_code == 0, rewound.output
    assert files_of(ws) == {"keep.txt": b"kept\n"}

    # the fork still holds the trees once the source is gone; then they go too
    assert trio.run(delete, "s", "f") == [True, False]
    # the trees only the deleted sessions kept are pruned (the empty workspace's
    # tree stays: the current one, which the rewind's own snapshot made)
    assert not any(history.has_tree(t) for t in trees - {marks[0].before})

    # a checkpoint the log names but whose store is gone is reported by check
    trio.run(run_and_fork, "s2", False)
    shutil.rmtree(ws / STORE_DIR)
    checked = runner.invoke(main, ["check", *where])
    assert checked.exit_code == 1
    assert "history store" in checked.output and "is missing" in checked.output


def _no_model(tmp_path: Path) -> Path:
    """A script for a provider the rewind never calls."""
    path = tmp_path / "script.json"
    path.write_text(json.dumps([{"text": "unused"}]))
    return path


async def test_two_sessions_on_one_workspace_are_detected(tmp_path: Path, ws: Path) -> None:
    """What another session changed between two calls of this one is named on the
    second call's checkpoint (``outside``)."""

    def writes(path: str) -> list[Reply]:
        return [
            Reply(tool_uses=[ToolUse("write_file", {"path": path, "content": path})]),
            Reply(text="done"),
        ]

    by_system = {"one": writes("a.txt") + writes("c.txt"), "two": writes("b.txt")}
    provider = ScriptedProvider([], by_system=by_system)
    async with perdure.open_runtime(
        tmp_path / "log", provider=provider, tools=TOOLS, workspace=ws
    ) as rt:
        await rt.create_session("s1", system="one")
        await rt.create_session("s2", system="two")
        for sid, rid in (("s1", "r1"), ("s2", "r1"), ("s1", "r2")):
            await rt.submit(sid, "go", request_id=rid)
            with trio.fail_after(30):
                await rt.wait_idle(sid)
        first, second = (await fold_of(rt, "s1")).checkpoints
        (other,) = (await fold_of(rt, "s2")).checkpoints
    assert (first.changed, first.outside) == (["a.txt"], [])
    assert (other.changed, other.outside) == (["b.txt"], [])  # s2 had no earlier call
    assert (second.changed, second.outside) == (["c.txt"], ["b.txt"])


async def test_bad_rewinds_are_refused_before_anything_is_recorded(
    tmp_path: Path, ws: Path
) -> None:
    async with perdure.open_runtime(
        tmp_path / "log", provider=script(), tools=TOOLS, workspace=ws
    ) as rt:
        await rt.create_session("s")
        with pytest.raises(Refused, match="no workspace checkpoint"):
            await rt.rewind("s", to="toolu_001_1")
        with pytest.raises(ValueError, match="to must be a call id or a sequence number"):
            await rt.rewind("s", to=True)
        with pytest.raises(perdure.UnknownSession):
            await rt.rewind("nobody", to="toolu_001_1")
        assert (await fold_of(rt, "s")).restores == {}
    async with perdure.open_runtime(tmp_path / "log2", provider=script(), tools=TOOLS) as rt:
        await rt.create_session("s")
        with pytest.raises(Refused, match="no workspace"):
            await rt.rewind("s", to="toolu_001_1")
