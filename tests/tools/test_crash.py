"""Crash tests: a runtime in a child process is killed at a chosen point and restarted.

The child (``tests/tools/child.py``) is killed with SIGKILL, either by
``PERDURE_FAULT`` (``tool.before``: the executing record is durable, the tool not
yet called; ``tool.after``: the tool returned, its result not yet committed) or by
this process when it sees a marker. A second child on the same log and workspace
recovers, and the test checks what was recorded, what the model reads, and how
many times each side effect really happened.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from perdure.tools._bash import process_alive
from perdure.tools._fs import read_json
from tests.tools._harness import FIRST, Workdir, use
from tests.tools._service import dedup_service

# -- the idempotency key and the reconcile outcomes ------------------------------------------


def test_keyed_rerun_after_a_crash_keeps_the_idempotency_key(tmp_path: Path) -> None:
    wd = Workdir(tmp_path, [use("ledger", note="x")])
    assert wd.run(fault="tool.after:ledger").killed
    again = wd.run()
    assert again.returncode == 0, again.stderr
    first, second = wd.ledger()
    assert first["key"] == second["key"]
    assert (first["attempt"], second["attempt"]) == (1, 2)
    task = again.task()
    assert task["key"] == first["key"]
    assert (task["phase"], task["kind"], task["attempt"]) == ("completed", "ok", 2)
    assert any(a.startswith("re-run with the same idempotency key") for a in again.decisions())
    assert again.summary is not None
    assert again.summary["final_text"] == "all done"


def test_reconcile_applied_records_the_real_result_without_rerunning(tmp_path: Path) -> None:
    wd = Workdir(tmp_path, [use("note_checked", note="x")])
    assert wd.run(fault="tool.after:note_checked").killed
    again = wd.run()
    assert len(wd.ledger()) == 1  # not re-run
    task = again.task()
    assert (task["phase"], task["kind"], task["is_error"]) == ("completed", "reconciled", False)
    assert again.result() == {"content": "noted x (found in the ledger)", "is_error": False}
    assert again.decisions() == ["ask the tool's reconcile()", "record the real result"]


def test_reconcile_not_applied_runs_once_more_with_the_same_key(tmp_path: Path) -> None:
    wd = Workdir(tmp_path, [use("note_checked", note="x")])
    assert wd.run(fault="tool.before:note_checked").killed
    assert wd.ledger() == []
    again = wd.run()
    (entry,) = wd.ledger()
    task = again.task()
    assert entry["attempt"] == 2
    assert entry["key"] == task["key"]
    assert (task["phase"], task["kind"], task["attempt"]) == ("completed", "ok", 2)
    assert again.result() == {"content": "noted x", "is_error": False}
    assert again.decisions() == ["ask the tool's reconcile()", "run it once, with the same key"]


@pytest.mark.parametrize(
    ("tool_name", "said"),
    [
        ("note_unsure", "the ledger is offline; cannot tell"),
        ("note_broken", "reconcile raised RuntimeError: ledger index corrupt"),
        ("note_plain", "not re-run"),
    ],
)
def test_unknown_outcome_is_told_to_the_model(tmp_path: Path, tool_name: str, said: str) -> None:
    wd = Workdir(tmp_path, [use(tool_name, note="x")])
    assert wd.run(fault=f"tool.after:{tool_name}").killed
    again = wd.run()
    assert len(wd.ledger()) == 1  # never re-run
    task = again.task()
    assert (task["phase"], task["record"]) == ("outcome_unknown", "ToolOutcomeUnknown")
    assert said in task["reason"]
    result = again.result()
    assert result["is_error"] is True
    assert "UNKNOWN" in result["content"]
    assert "not re-run" in result["content"]
    if tool_name != "note_plain":
        assert said in result["content"]  # what the check found reaches the model
    assert again.summary is not None
    assert again.summary["outcome"] == "completed"


def test_not_applied_while_paused_runs_after_resume(tmp_path: Path) -> None:
    wd = Workdir(tmp_path, [use("slow_note", note="x")])
    assert wd.run("--pause-while", FIRST, kill_when=wd.marker).killed  # killed mid-sleep
    assert wd.ledger() == []
    again = wd.run("--resume")
    assert again.task()["phase"] == "completed"
    assert len(wd.ledger()) == 1


# -- approvals across restarts ---------------------------------------------------------------


def test_approval_still_awaited_after_a_restart(tmp_path: Path) -> None:
    wd = Workdir(tmp_path, [use("transfer", amount=500)])
    assert wd.run("--await-approval", FIRST, kill_when=wd.marker).killed
    assert wd.ledger() == []
    again = wd.run("--phase-of", FIRST, "--approve", FIRST)
    assert again.returncode == 0, again.stderr
    assert again.summary is not None
    assert again.summary["phase_at_start"] == "awaiting_approval"
    assert again.summary["approval_requests"] == 1  # not asked twice
    (entry,) = wd.ledger()
    assert entry["amount"] == 500
    assert again.result() == {"content": "transferred 500", "is_error": False}


def test_approval_decided_before_a_crash_executes_once_after_it(tmp_path: Path) -> None:
    # Paused, so the approval is durable but nothing was dispatched when the process died.
    wd = Workdir(tmp_path, [use("transfer", amount=500)])
    assert wd.run("--pause-and-approve", FIRST, kill_when=wd.marker).killed
    again = wd.run("--phase-of", FIRST, "--resume")
    assert again.returncode == 0, again.stderr
    assert again.summary is not None
    assert again.summary["phase_at_start"] == "approved"
    assert again.summary["approval_requests"] == 1
    assert len(wd.ledger()) == 1
    assert again.task()["kind"] == "ok"


def test_approved_call_killed_before_its_effect_runs_exactly_once(tmp_path: Path) -> None:
    wd = Workdir(tmp_path, [use("transfer", amount=500)])
    assert wd.run("--approve", FIRST, fault="tool.before:transfer").killed
    assert wd.ledger() == []
    again = wd.run()
    (entry,) = wd.ledger()
    assert entry["attempt"] == 2
    assert again.summary is not None
    assert again.summary["approval_requests"] == 1
    assert again.result() == {"content": "transferred 500", "is_error": False}


# -- a KEYED call against a deduplicating service ------------------------------------------


def test_keyed_rerun_against_a_deduplicating_service_creates_one_object(tmp_path: Path) -> None:
    with dedup_service(tmp_path / "store.json") as (port, store):
        wd = Workdir(tmp_path / "wd", [use("create_object", name="widget")], port=port)
        assert wd.run(fault="tool.after:create_object").killed
        again = wd.run()
        data = store.load()
    assert again.returncode == 0, again.stderr
    assert [o["id"] for o in data["objects"]] == ["obj-1"]
    keys = [r["key"] for r in data["requests"]]
    assert len(keys) == 2
    assert keys[0] == keys[1] == again.task()["key"]
    assert again.result() == {"content": "created obj-1", "is_error": False}
    assert [e["object_id"] for e in wd.ledger()] == ["obj-1", "obj-1"]


# -- built-in file tools ----------------------------------------------------------------------

FILE_CASES = {
    "write_file": (
        {"path": "out.txt", "content": "new\n"},
        "old\n",
        "new\n",
    ),
    "edit_file": (
        {"path": "out.txt", "old_text": "old line", "new_text": "new line"},
        "a\nold line\nb\n",
        "a\nnew line\nb\n",
    ),
    "append_file": (
        # The file already ends with the very line to append: no proof of anything.
        {"path": "out.txt", "content": "- done\n"},
        "# notes\n- done\n",
        "# notes\n- done\n- done\n",
    ),
}


@pytest.mark.parametrize("tool_name", sorted(FILE_CASES))
def test_file_tool_killed_after_its_effect_is_reconciled_as_applied(
    tmp_path: Path, tool_name: str
) -> None:
    args, before, after = FILE_CASES[tool_name]
    wd = Workdir(tmp_path, [use(tool_name, **args)])
    (wd.ws / "out.txt").write_text(before)
    assert wd.run(fault=f"tool.after:{tool_name}").killed
    assert (wd.ws / "out.txt").read_text() == after
    state = wd.ws / ".perdure-tools" / tool_name
    assert len(list(state.iterdir())) == 1  # the journal reconcile will need
    again = wd.run()
    assert (wd.ws / "out.txt").read_text() == after  # not applied twice
    assert list(state.iterdir()) == []  # settled: the journal is gone
    task = again.task()
    assert (task["kind"], task["attempt"]) == ("reconciled", 1)
    assert "confirmed by perdure after a restart" in again.result()["content"]


@pytest.mark.parametrize("tool_name", sorted(FILE_CASES))
def test_file_tool_killed_before_its_effect_runs_once_after_recovery(
    tmp_path: Path, tool_name: str
) -> None:
    args, before, after = FILE_CASES[tool_name]
    wd = Workdir(tmp_path, [use(tool_name, **args)])
    (wd.ws / "out.txt").write_text(before)
    assert wd.run(fault=f"tool.before:{tool_name}").killed
    assert (wd.ws / "out.txt").read_text() == before
    again = wd.run()
    assert (wd.ws / "out.txt").read_text() == after  # exactly once
    task = again.task()
    assert (task["kind"], task["attempt"], task["is_error"]) == ("ok", 2, False)
    assert again.decisions()[-1] == "run it once, with the same key"


# -- bash -------------------------------------------------------------------------------------


def _runs(wd: Workdir) -> list[str]:
    path = wd.ws / "runs.txt"
    return path.read_text().split() if path.exists() else []


def _pid_record(wd: Workdir) -> dict[str, object] | None:
    dirs = wd.bash_dirs()
    return read_json(dirs[0] / "pid.json") if dirs else None


def _started(wd: Workdir) -> bool:
    return _pid_record(wd) is not None and "started" in _runs(wd)


SLOW = "echo started >> runs.txt; echo begun; sleep {sleep}; echo done; echo finished >> runs.txt"


def test_bash_killed_before_start_runs_once_after_recovery(tmp_path: Path) -> None:
    wd = Workdir(tmp_path, [use("bash", command="echo ran >> runs.txt; echo hello", timeout=10)])
    assert wd.run(fault="tool.before:bash").killed
    again = wd.run()
    assert _runs(wd) == ["ran"]
    assert (again.task()["kind"], again.task()["attempt"]) == ("ok", 2)
    assert again.result()["content"] == "exit status: 0\n--- stdout ---\nhello"


def test_bash_finished_before_the_crash_is_recovered_from_its_record(tmp_path: Path) -> None:
    wd = Workdir(tmp_path, [use("bash", command="echo ran >> runs.txt; echo hello", timeout=10)])
    assert wd.run(fault="tool.after:bash").killed
    again = wd.run()
    assert _runs(wd) == ["ran"]
    assert again.task()["kind"] == "reconciled"
    content = again.result()["content"]
    assert "recovered after a restart" in content
    # the diff from the call's before-snapshot names what it changed in the workspace
    assert content.endswith(
        "exit status: 0\n--- stdout ---\nhello\n"
        "[perdure: in the workspace 1 file changed: runs.txt]"
    )


def test_bash_that_failed_before_the_crash_is_recovered_as_an_error(tmp_path: Path) -> None:
    wd = Workdir(tmp_path, [use("bash", command="echo ran >> runs.txt; exit 3", timeout=10)])
    assert wd.run(fault="tool.after:bash").killed
    again = wd.run()
    assert _runs(wd) == ["ran"]
    task = again.task()
    assert (task["kind"], task["is_error"]) == ("reconciled", True)
    result = again.result()
    assert result["is_error"] is True
    assert "exit status: 3" in result["content"]


def test_bash_orphan_still_running_is_awaited_and_its_result_recorded(tmp_path: Path) -> None:
    wd = Workdir(tmp_path, [use("bash", command=SLOW.format(sleep=1.5), timeout=30)])
    assert wd.run(kill_when=lambda: _started(wd)).killed  # the runtime dies mid-command
    record = _pid_record(wd)
    assert record is not None
    assert process_alive(record)
    again = wd.run()
    assert _runs(wd) == ["started", "finished"]  # ran once, to its end
    task = again.task()
    assert (task["kind"], task["attempt"]) == ("reconciled", 1)
    content = again.result()["content"]
    assert f"the command ran as pid {record['pid']}" in content
    assert "exit status: 0\n--- stdout ---\nbegun\ndone" in content


def test_bash_orphan_killed_while_the_runtime_was_down_is_unknown(tmp_path: Path) -> None:
    wd = Workdir(tmp_path, [use("bash", command=SLOW.format(sleep=30), timeout=60)])
    assert wd.run(kill_when=lambda: _started(wd)).killed
    record = _pid_record(wd)
    assert record is not None
    os.killpg(int(str(record["pgid"])), signal.SIGKILL)  # e.g. the machine's OOM killer
    deadline = time.monotonic() + 5
    while process_alive(record) and time.monotonic() < deadline:
        time.sleep(0.01)
    again = wd.run()
    task = again.task()
    assert task["phase"] == "outcome_unknown"
    content = again.result()["content"]
    assert again.result()["is_error"] is True
    assert f"started as pid {record['pid']}" in content
    assert "stopped without recording an exit status" in content
    assert "begun" in content  # the output it left
    assert _runs(wd) == ["started"]


def test_bash_orphan_past_its_time_limit_is_killed_and_reported(tmp_path: Path) -> None:
    wd = Workdir(tmp_path, [use("bash", command=SLOW.format(sleep=30), timeout=1)])
    assert wd.run(kill_when=lambda: _started(wd)).killed
    record = _pid_record(wd)
    assert record is not None
    assert process_alive(record)
    again = wd.run()
    assert not process_alive(record)
    assert again.task()["phase"] == "outcome_unknown"
    content = again.result()["content"]
    assert f"still running as pid {record['pid']}" in content
    assert "perdure killed its process group" in content
    assert _runs(wd) == ["started"]
