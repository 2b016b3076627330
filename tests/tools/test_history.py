"""The workspace history store: snapshots, diffs, restores, damage, retention.

Real files and the real git binary, in a temporary workspace.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from perdure.tools.history import STORE_DIR, HistoryError, WorkspaceHistory, ref_name


def files_of(root: Path) -> dict[str, bytes | str]:
    """Every file under ``root`` except perdure's own, links as their target text."""
    found: dict[str, bytes | str] = {}
    for dirpath, dirnames, names in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".perdure-tools"]
        for name in names:
            path = Path(dirpath, name)
            rel = path.relative_to(root).as_posix()
            found[rel] = ("-> " + os.readlink(path)) if path.is_symlink() else path.read_bytes()
    return found


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "src" / "a.py").write_text("print('a')\n")
    (root / "notes.txt").write_bytes(b"\x00binary\xff")
    (root / ".gitignore").write_text("build/\n*.log\n")
    (root / "build").mkdir()
    (root / "build" / "out.o").write_bytes(b"object")
    (root / "run.log").write_text("ignored")
    (root / "weird [1] *.py").write_text("a pattern-like name")
    os.symlink("src/a.py", root / "inside-link")
    os.symlink("/etc/hostname", root / "outside-link")
    return root


def test_a_rewind_restores_the_tracked_files_byte_for_byte(ws: Path) -> None:
    history = WorkspaceHistory(ws)
    first = history.snapshot(ref_name("s", "first"))
    original = files_of(ws)
    (ws / "src" / "a.py").write_text("print('changed')\n")
    (ws / "src" / "new.py").write_text("new\n")
    (ws / "weird [1] *.py").unlink()
    (ws / "inside-link").unlink()
    os.symlink("notes.txt", ws / "inside-link")
    (ws / "run.log").write_text("still ignored, and left alone")
    second = history.snapshot(ref_name("s", "second"))
    changes = {c.path: c.kind for c in history.changes(first.tree, second.tree)}
    assert changes == {
        "src/a.py": "modified",
        "src/new.py": "added",
        "weird [1] *.py": "deleted",
        "inside-link": "modified",
    }
    assert "-print('a')" in history.patch(first.tree, second.tree)

    before_rewind = history.restore(first.tree)

    now = files_of(ws)
    assert now.pop("run.log") == b"still ignored, and left alone"  # ignored: untouched
    original.pop("run.log")
    assert now == original
    assert os.readlink(ws / "outside-link") == "/etc/hostname"  # a link, never followed
    assert before_rewind.tree == second.tree  # the rewind itself can be undone
    history.restore(before_rewind.tree)
    assert (ws / "src" / "new.py").read_text() == "new\n"


def test_ignored_files_and_large_files_are_not_in_a_snapshot(ws: Path) -> None:
    history = WorkspaceHistory(ws, max_file_bytes=100)
    (ws / "big.bin").write_bytes(b"x" * 101)
    first = history.snapshot()
    assert first.skipped == ("big.bin",)
    (ws / "src" / "a.py").write_text("edit\n")
    second = history.snapshot()
    assert second.skipped == ("big.bin",)  # still named while it is still too large
    paths = {c.path for c in history.changes(first.tree, second.tree)}
    assert paths == {"src/a.py"}
    tree = history._git("ls-tree", "-r", "--name-only", first.tree).decode().split("\n")
    assert "big.bin" not in tree and "run.log" not in tree and "build/out.o" not in tree
    assert not any(p.startswith(".perdure-tools") for p in tree)
    (ws / "big.bin").write_bytes(b"small now")
    assert history.snapshot().skipped == ()


def test_a_missing_or_damaged_store_refuses_and_writes_nothing(ws: Path) -> None:
    history = WorkspaceHistory(ws)
    first = history.snapshot(ref_name("s", "first"))
    (ws / "src" / "a.py").write_text("after\n")
    history.snapshot(ref_name("s", "after"))
    # Damage one object of the first tree: the blob of src/a.py as it was.
    blob = history._git("rev-parse", f"{first.tree}:src/a.py").decode().strip()
    obj = ws / STORE_DIR / "objects" / blob[:2] / blob[2:]
    os.chmod(obj, 0o644)
    obj.write_bytes(b"garbage")
    with pytest.raises(HistoryError, match=r"damaged|not in the workspace history"):
        history.restore(first.tree)
    assert (ws / "src" / "a.py").read_text() == "after\n"  # nothing written
    assert history.check()  # perdure check reports it

    with pytest.raises(HistoryError, match="not in the workspace history store"):
        history.restore("0" * 40)


def test_dropping_a_session_prunes_what_only_it_kept(ws: Path) -> None:
    history = WorkspaceHistory(ws)
    (ws / "only-s1.txt").write_text("s1")
    kept = history.snapshot(ref_name("s1", "x"))
    (ws / "only-s1.txt").unlink()
    history.snapshot(ref_name("s2", "y"))
    assert history.lookup(ref_name("s1", "x")) == kept.tree
    assert history.drop_session("s1") == 1
    assert history.lookup(ref_name("s1", "x")) is None
    assert not history.has_tree(kept.tree)
    assert history.drop_session("s1") == 0
