"""The bash tool in process: results, timeouts and cancellation kill the whole group.

Crash recovery (orphans, records found after a restart) is in ``test_crash.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from perdure import ToolResult
from perdure.tools import _bash
from perdure.tools._bash import attempt_dir, process_alive
from perdure.tools._fs import read_json, write_json_durably
from perdure.tools.workspace import WorkspaceError
from tests.tools.test_workspace import ALL, ctx

BASH = ALL["bash"]


@pytest.fixture
def root(workspace: Path) -> Path:
    return workspace.resolve()


async def run(ws: Path, key: str = "pdk_bash", **args: object) -> ToolResult:
    assert BASH.validate(args) == []
    result = await BASH.invoke(ctx(ws, key), BASH.effective_args(args))
    assert isinstance(result, ToolResult)
    return result


def _pid_alive(pid: int) -> bool:
    return process_alive({"pid": pid, "pgid": pid})


async def _until(predicate: object, limit: float = 5.0) -> None:
    assert callable(predicate)
    with trio.fail_after(limit):
        while not predicate():  # noqa: ASYNC110 (watching files and /proc)
            await trio.sleep(0.01)


async def test_exit_status_and_output(workspace: Path, root: Path) -> None:
    ok = await run(workspace, command="echo out; echo err >&2", key="k1")
    assert ok == ToolResult("exit status: 0\n--- stdout ---\nout\n--- stderr ---\nerr")
    failed = await run(workspace, command="exit 3", key="k2")
    assert failed == ToolResult("exit status: 3\n(no output)", is_error=True)
    (workspace / "sub").mkdir()
    where = await run(workspace, command="pwd", cwd="sub", key="k3")
    assert where.content.endswith(str(root / "sub"))


async def test_the_command_does_not_inherit_the_fault_switch(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PERDURE_FAULT", "commit@1000")
    result = await run(workspace, command="echo ${PERDURE_FAULT:-unset}")
    assert result.content == "exit status: 0\n--- stdout ---\nunset"


async def test_arguments_are_checked(workspace: Path) -> None:
    with pytest.raises(WorkspaceError, match="the command is empty"):
        await run(workspace, command="  ")
    with pytest.raises(WorkspaceError, match="at most 600"):
        await run(workspace, command="true", timeout=601)
    with pytest.raises(WorkspaceError, match="not a directory"):
        await run(workspace, command="true", cwd="missing")


async def test_timeout_kills_the_whole_process_group(workspace: Path) -> None:
    command = "echo $$ > shell.pid; sleep 30 & echo $! > bg.pid; echo waiting; wait"
    with trio.fail_after(10):
        result = await run(workspace, command=command, timeout=0.5)
    assert result.is_error
    assert result.content == (
        "the command timed out after 0.5s and was killed (with its process group); "
        "it may have partly run.\n--- stdout ---\nwaiting"
    )
    for name in ("shell.pid", "bg.pid"):
        pid = int((workspace / name).read_text())
        await _until(lambda pid=pid: not _pid_alive(pid))


def _written(path: Path) -> bool:
    return path.exists() and path.read_text().endswith("\n")


async def test_cancellation_kills_the_whole_process_group(workspace: Path, root: Path) -> None:
    adir = attempt_dir(root, "pdk_cancel", 1)
    with trio.move_on_after(10) as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                lambda: run(
                    workspace, key="pdk_cancel", command="sleep 30 & echo $! > bg.pid; wait"
                )
            )
            # The redirection creates bg.pid before echo writes the pid into it.
            await _until(lambda: (adir / "pid.json").exists() and _written(workspace / "bg.pid"))
            nursery.cancel_scope.cancel()
    assert not scope.cancelled_caught
    record = read_json(adir / "pid.json")
    assert record is not None
    await _until(lambda: not process_alive(record))
    bg = int((workspace / "bg.pid").read_text())
    await _until(lambda: not _pid_alive(bg))
    assert not (adir / "exit.json").exists()


async def test_reconcile_claims_a_call_whose_runner_never_started(
    workspace: Path, root: Path
) -> None:
    """Intent recorded, then the runtime died before the runner claimed the call."""
    adir = attempt_dir(root, "pdk_late", 1)
    command = "echo ran > ran.txt"
    spec = {
        "command": command,
        "cwd": str(root),
        "shell": "/bin/sh",
        "timeout": 10,
        "started_at": 0,
        "key": "pdk_late",
        "attempt": 1,
    }
    write_json_durably(adir / "command.json", spec)
    found = await BASH.run_reconcile(ctx(workspace, "pdk_late"), {"command": command})
    assert found.status == "not_applied"
    tombstone = read_json(adir / "pid.json")
    assert tombstone is not None
    assert tombstone["tombstone"] is True
    # A runner that starts late finds the call claimed and never runs the command.
    late = await trio.run_process(
        [sys.executable, "-I", "-S", str(_bash._RUNNER), str(adir)], check=False
    )
    assert late.returncode == 125
    assert not (root / "ran.txt").exists()
    # Asked again (say the runtime died before recording the answer): the same answer.
    again = await BASH.run_reconcile(ctx(workspace, "pdk_late"), {"command": command})
    assert again.status == "not_applied"


async def test_the_same_attempt_is_never_started_twice(workspace: Path) -> None:
    await run(workspace, key="pdk_once", command="true")
    with pytest.raises(WorkspaceError, match="already started"):
        await run(workspace, key="pdk_once", command="true")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux's /proc")
def test_process_identity_guards_against_a_reused_pid() -> None:
    me = os.getpid()
    with open(f"/proc/{me}/stat") as f:
        start = f.read().rsplit(")", 1)[1].split()[19]
    assert process_alive({"pid": me, "pgid": os.getpgrp(), "start": start})
    assert not process_alive({"pid": me, "pgid": os.getpgrp(), "start": str(int(start) + 1)})
    assert not process_alive({"pid": me, "pgid": os.getpgrp(), "boot": "another-boot"})
    done = subprocess.Popen(["true"])
    done.wait()
    assert not _pid_alive(done.pid)


def test_the_runner_records_pid_output_and_exit_status(tmp_path: Path) -> None:
    adir = tmp_path / "attempt-1"
    spec = {"command": "echo hi; exit 4", "cwd": str(tmp_path), "shell": "/bin/sh"}
    write_json_durably(adir / "command.json", spec)
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(_bash._RUNNER), str(adir)],
        check=False,
        timeout=10,
        start_new_session=True,
    )
    assert done.returncode == 0
    pid = json.loads((adir / "pid.json").read_text())
    assert pid["pid"] == pid["pgid"]  # it leads its own process group
    assert pid["runner"] is True
    assert (adir / "stdout").read_text() == "hi\n"
    assert json.loads((adir / "exit.json").read_text())["returncode"] == 4
