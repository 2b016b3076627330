"""Workspace history across real crashes: a child runtime killed with SIGKILL.

``PERDURE_FAULT`` kills the child (``tests/tools/child.py``) in the windows of a
workspace call — after its ``executing`` commit, after its before-snapshot, after
its tool returned — and of a rewind — after ``WorkspaceRestoreStarted``, after the
files were put back. The next child recovers on the same log and workspace. Each
test loops over its windows in few child processes (CI time is tight): the first
takes four windows; ``PERDURE_SWEEP=full python -m pytest
tests/tools/test_rewind_crash.py`` takes every commit of the run and every fault
point of each of the three calls.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from tests.tools._harness import FIRST, Workdir, use
from tests.tools.test_history import files_of

FULL = os.environ.get("PERDURE_SWEEP") == "full"

SECOND = "toolu_002_1"  # one call per turn: the scripted ids of turns 2 and 3
THIRD = "toolu_003_1"


def seeded(path: Path, uses: list[dict[str, Any]], *, sequential: bool = False) -> Workdir:
    wd = Workdir(path, uses)
    if sequential:
        plan = (path / "plan.json").read_text().replace('"uses"', '"sequential": true, "uses"', 1)
        (path / "plan.json").write_text(plan)
    (wd.ws / "a.txt").write_text("alpha\n")
    (wd.ws / "b.txt").write_text("beta\nbeta two\n")
    (wd.ws / "sub").mkdir()
    (wd.ws / "sub" / "c.bin").write_bytes(bytes(range(256)))
    (wd.ws / "gone.txt").write_text("to be deleted\n")
    os.symlink("sub/c.bin", wd.ws / "link")
    return wd


PLAN = [
    use("write_file", path="a.txt", content="ALPHA\n"),
    use("edit_file", path="b.txt", old_text="beta two", new_text="BETA TWO"),
    use("bash", command="echo gamma >> sub/c.bin; rm gone.txt; echo new > new.txt", timeout=10),
]


def test_after_a_crash_in_any_window_a_rewind_restores_the_tree_byte_for_byte(
    tmp_path: Path,
) -> None:
    windows = [
        "workspace.before:write_file",  # snapshot durable, nothing written yet
        "tool.after:edit_file",  # the edit made, its result not committed
        "workspace.after:bash",  # bash ran and was snapshotted, its result not committed
        "commit@6",  # a commit in the middle of the run
    ]
    if FULL:
        points = ("tool.before", "workspace.before", "workspace.after", "tool.after")
        tools = ("write_file", "edit_file", "bash")
        windows = [f"{p}:{t}" for t in tools for p in points] + [
            f"commit@{n}" for n in range(1, 40)
        ]
    for n, fault in enumerate(windows):
        wd = seeded(tmp_path / f"w{n}", PLAN, sequential=True)
        initial = files_of(wd.ws)
        first = wd.run(fault=fault)
        if FULL and fault.startswith("commit@") and not first.killed:
            break  # past the run's last commit
        assert first.killed, (fault, first.stderr)
        again = wd.run("--rewind-to", FIRST)
        assert again.returncode == 0, (fault, again.stderr)
        assert files_of(wd.ws) == initial, fault  # back to before the write, every byte
        # every call is checkpointed (an interrupted one also by its reconcile)
        marks = again.summary["checkpoints"]  # type: ignore[index]
        assert list(dict.fromkeys(m["call_id"] for m in marks)) == [FIRST, SECOND, THIRD]
        rewound = again.summary["rewound"]  # type: ignore[index]
        assert rewound["before"] == marks[-1]["after"], fault  # the rewind can be undone
        shutil.rmtree(wd.path)


def test_a_crash_halfway_through_a_rewind_finishes_it_after_the_restart(tmp_path: Path) -> None:
    wd = seeded(tmp_path, PLAN, sequential=True)
    initial = files_of(wd.ws)
    done = wd.run()
    assert done.returncode == 0, done.stderr
    after_all = files_of(wd.ws)
    # killed once the rewind is durable, before any file is touched
    assert wd.run("--rewind-to", FIRST, fault="workspace.restore").killed
    assert files_of(wd.ws) == after_all
    assert wd.run().returncode == 0  # recovery restores, and the session goes idle
    assert files_of(wd.ws) == initial
    # killed after the files are back, before that is recorded: restored again, same tree
    second_before = [m for m in done.summary["checkpoints"] if m["call_id"] == THIRD]  # type: ignore[index]
    assert wd.run("--rewind-to", THIRD, fault="workspace.restored").killed
    again = wd.run("--rewind-to", THIRD)
    assert again.returncode == 0, again.stderr
    assert again.summary["rewound"]["tree"] == second_before[0]["before"]  # type: ignore[index]
    assert files_of(wd.ws)["a.txt"] == b"ALPHA\n" and "new.txt" not in files_of(wd.ws)
    assert files_of(wd.ws)["b.txt"] == b"beta\nBETA TWO\n"


def test_an_interrupted_workspace_call_is_told_which_files_it_changed(tmp_path: Path) -> None:
    # bash: its own record shows it finished; the result names the files it changed
    wd = seeded(tmp_path / "bash", [use("bash", command="echo 1 > one.txt; echo 2 > two.txt")])
    assert wd.run(fault="tool.after:bash").killed
    again = wd.run()
    content = again.result()["content"]
    assert content.endswith("[perdure: in the workspace 2 files changed: one.txt, two.txt]")
    # a declared workspace tool with no reconcile: unknown, but the files are named
    wd = seeded(tmp_path / "declared", [use("render_and_post", name="page")])
    assert wd.run(fault="tool.after:render_and_post").killed
    again = wd.run()
    task = again.task()
    assert task["record"] == "ToolOutcomeUnknown"
    content = again.result()["content"]
    assert "UNKNOWN" in content
    assert "2 files changed: page.html, page.txt" in content
    assert "any effect outside the workspace files stays unknown" in content
    assert again.decisions() == [
        "diff the workspace from its before-snapshot",
        "report outcome unknown",
    ]


def test_an_interrupted_append_runs_once_more_only_if_it_changed_nothing(tmp_path: Path) -> None:
    line = use("append_file", path="log.txt", content="one line\n")
    # killed after its before-snapshot, before it wrote: nothing changed, so it runs again
    wd = seeded(tmp_path / "before", [line])
    assert wd.run(fault="workspace.before:append_file").killed
    again = wd.run()
    assert (wd.ws / "log.txt").read_text() == "one line\n"
    assert again.task()["attempt"] == 2
    assert again.decisions() == [
        "ask the tool's reconcile() and diff the workspace from its before-snapshot",
        "run it once, with the same key",
    ]
    # killed after it wrote: applied, reported, never appended twice
    wd = seeded(tmp_path / "after", [line])
    assert wd.run(fault="tool.after:append_file").killed
    again = wd.run()
    assert (wd.ws / "log.txt").read_text() == "one line\n"
    task = again.task()
    assert (task["kind"], task["attempt"]) == ("reconciled", 1)
    assert "1 file changed: log.txt" in again.result()["content"]
