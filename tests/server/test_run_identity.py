"""``perdure run`` has an identity: the same command continues the same run after a
SIGKILL in the middle of a tool call, and reports a finished run instead of running it
again; ``--new`` starts a fresh one. One real subprocess per replay policy."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from perdure.storage.lmdb_log import LmdbLog
from perdure.storage.records import InputAccepted
from tests.server.test_cli import perdure, write_script
from tests.support.ledger_tools import read_ledger

TOOLS = "tests.server.identity_tools:TOOLS"


def log_facts(log: Path) -> tuple[int, list[str]]:
    """The log's last sequence number and the sessions its inputs went to."""
    opened = LmdbLog(log, readonly=True)
    try:
        inputs = [c.record for c in opened.read_global() if isinstance(c.record, InputAccepted)]
        return opened.last_seq(), [i.session_id for i in inputs]
    finally:
        opened.close()


def effects(workspace: Path, tool: str) -> list[dict[str, Any]]:
    return [e for e in read_ledger(workspace) if e["tool"] == tool]


@pytest.mark.parametrize(
    ("tool", "replay"),
    [("count_stock", "safe"), ("place_order", "keyed"), ("send_invoice", "never")],
)
def test_the_same_command_continues_after_a_sigkill_mid_tool(
    tmp_path: Path, tool: str, replay: str
) -> None:
    script = write_script(
        tmp_path / "script.json",
        [
            {"text": "On it.", "tool_uses": [{"name": tool, "input": {"item": "A1"}}]},
            {"text": "All done with A1."},
        ],
    )
    ws, log = tmp_path / "ws", tmp_path / "log"
    ws.mkdir()
    command = ["run", "Handle 2 of A1", "--provider", f"scripted:{script}", "--tools", TOOLS]
    command += ["--log", str(log), "--workspace", str(ws)]

    # SIGKILL after the tool's effect, before its result is in the log.
    crashed = perdure(*command, env={"PERDURE_FAULT": f"tool.after:{tool}"})
    assert crashed.returncode == -9, crashed.stdout + crashed.stderr
    assert "a new run of this task" in crashed.stdout
    [first] = effects(ws, tool)
    session = first["session_id"]
    assert re.fullmatch(r"run-[0-9a-f]{16}", session)

    again = perdure(*command)
    assert again.returncode == 0, again.stdout + again.stderr
    assert (
        f"continuing the interrupted run of this task: session {session}, started " in again.stdout
    )
    assert "All done with A1." in again.stdout
    calls = effects(ws, tool)
    # One task, one session, one call: every attempt under the same idempotency key.
    assert {e["session_id"] for e in calls} == {session}
    assert {e["key"] for e in calls} == {first["key"]}
    assert {e["call_id"] for e in calls} == {first["call_id"]}
    applied = [e for e in calls if e["event"] == "effect"]
    if replay == "never":
        # Not repeated: recovery reports the outcome as unknown to the model.
        assert len(calls) == 1
        assert "OUTCOME UNKNOWN" in again.stdout
    elif replay == "keyed":
        # Repeated with the same key; the service applied it once.
        assert len(applied) == 1
        assert [e["event"] for e in calls] == ["effect", "deduplicated"]
    else:
        # A read is repeated on recovery: that is what SAFE declares; it has no effect
        # to apply twice, and it is the same call, not a second run of the task.
        assert [e["event"] for e in calls] == ["effect", "effect"]
        assert calls[1]["attempt"] == 2
    last_seq, inputs = log_facts(log)
    assert inputs == [session]  # the task was submitted once

    # Once finished, the same command prints the outcome and runs nothing.
    done = perdure(*command)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"this task already finished: session {session}, started " in done.stdout
    assert "completed" in done.stdout and "All done with A1." in done.stdout
    assert effects(ws, tool) == calls
    assert log_facts(log) == (last_seq, inputs)

    if replay != "keyed":
        return
    # --new runs it again on purpose, in a session (and under keys) of its own; the
    # plain command then follows that latest run.
    fresh = perdure(*command, "--new")
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr
    assert "a new run of this task" in fresh.stdout
    second = [e for e in effects(ws, tool) if e["session_id"] != session]
    assert [e["session_id"] for e in second] == [f"{session}.2"]
    assert second[0]["key"] != first["key"] and second[0]["event"] == "effect"
    latest = perdure(*command)
    assert f"this task already finished: session {session}.2" in latest.stdout
    assert len(effects(ws, tool)) == len(calls) + 1
    assert perdure(*command, "--new", "--session", "x").returncode == 2


def test_another_workspace_or_task_is_another_run(tmp_path: Path) -> None:
    script = write_script(tmp_path / "script.json", [{"text": "hello"}])
    base = ["--provider", f"scripted:{script}", "--tools", TOOLS, "--log", str(tmp_path / "log")]
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    one = perdure("run", "greet", *base, "--workspace", str(tmp_path / "a"))
    other_ws = perdure("run", "greet", *base, "--workspace", str(tmp_path / "b"))
    other_task = perdure("run", "greet again", *base, "--workspace", str(tmp_path / "a"))
    for proc in (one, other_ws, other_task):
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "a new run of this task" in proc.stdout
    # A relative workspace names the same folder as its absolute path.
    same = perdure("run", "greet", *base, "--workspace", "a", cwd=tmp_path)
    assert "this task already finished" in same.stdout, same.stdout + same.stderr
    _, inputs = log_facts(tmp_path / "log")
    assert len(set(inputs)) == 3
    assert os.path.exists(tmp_path / "log" / "data.mdb")
