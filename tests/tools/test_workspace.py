"""The built-in workspace tools: what they do, what they refuse, how they reconcile."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest
import trio

import perdure
from perdure import Reconciled, ReplayPolicy, ToolContext
from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse
from perdure.tools import _fs
from perdure.tools.workspace import STATE_DIR, TOOLS, WorkspaceError, workspace_tools
from tests.tools._inproc import call_id, one_turn

ALL = {t.name: t for t in workspace_tools(include_bash=True)}


def ctx(ws: Path | None, key: str = "pdk_test", attempt: int = 1) -> ToolContext:
    return ToolContext(
        idempotency_key=key, call_id="c1", session_id="s", attempt=attempt, workspace=ws
    )


async def call(ws: Path | None, name: str, key: str = "pdk_test", **args: Any) -> Any:
    t = ALL[name]
    assert t.validate(args) == [], t.validate(args)
    return await t.invoke(ctx(ws, key), t.effective_args(args))


async def reconcile(ws: Path, name: str, key: str = "pdk_test", **args: Any) -> Reconciled:
    t = ALL[name]
    return await t.run_reconcile(ctx(ws, key), t.effective_args(args))


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """A workspace with files, and links that lead inside and outside it."""
    root = tmp_path / "ws"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "readme.md").write_text("# Title\nhello world\nbye\n")
    (root / "src").mkdir()
    (root / "src" / "app.py").write_text("def main():\n    print('hello')\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("hello secret\n")
    (root / "out").symlink_to(outside)  # an intermediate directory link, outside
    (root / "secret_link").symlink_to(outside / "secret.txt")  # a final link, outside
    (root / "dangling").symlink_to(outside / "nothing.txt")  # a link to a file to be
    (root / "inner_link").symlink_to(root / "docs" / "readme.md")  # inside: fine
    return root


def _tree_digest(path: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        h.update(str(p).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def test_the_default_set_and_the_policies() -> None:
    assert [t.name for t in TOOLS] == [
        "read_file",
        "list_dir",
        "grep",
        "write_file",
        "edit_file",
        "append_file",
    ]
    policies = {t.name: t.replay for t in ALL.values()}
    assert {n for n, p in policies.items() if p is ReplayPolicy.SAFE} == {
        "read_file",
        "list_dir",
        "grep",
    }
    for name in ("write_file", "edit_file", "append_file", "bash"):
        assert policies[name] is ReplayPolicy.NEVER
        assert ALL[name].reconcile is not None
    assert ALL["bash"].cancellable
    gated = workspace_tools(
        writes_require_approval=True, bash_requires_approval=True, include_bash=True
    )
    assert [t.name for t in gated if t.requires_approval is True] == [
        "write_file",
        "edit_file",
        "append_file",
        "bash",
    ]
    for t in ALL.values():
        assert t.description != t.name  # a real description from the docstring


# -- what they do ------------------------------------------------------------------------------


async def test_read_file_whole_and_in_part(ws: Path) -> None:
    assert await call(ws, "read_file", path="docs/readme.md") == "# Title\nhello world\nbye\n"
    assert await call(ws, "read_file", path="inner_link") == "# Title\nhello world\nbye\n"
    part = await call(ws, "read_file", path="docs/readme.md", start_line=2, max_lines=1)
    assert part == (
        "hello world\n\n[perdure: lines 2-2 of 3 of 'docs/readme.md'; "
        "call read_file with start_line=3 for more]"
    )
    with pytest.raises(WorkspaceError, match=r"there is no file 'docs/nope\.md'"):
        await call(ws, "read_file", path="docs/nope.md")
    with pytest.raises(WorkspaceError, match="'docs' is a directory; use list_dir"):
        await call(ws, "read_file", path="docs")
    with pytest.raises(WorkspaceError, match="has 3 lines; start_line is 9"):
        await call(ws, "read_file", path="docs/readme.md", start_line=9)
    with pytest.raises(WorkspaceError, match="'docs' is a directory, not a file"):
        await call(ws, "edit_file", path="docs", old_text="a", new_text="b")
    with pytest.raises(WorkspaceError, match="'docs' is a directory, not a file"):
        await call(ws, "write_file", path="docs", content="b")
    (ws / "blob.bin").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(WorkspaceError, match="not UTF-8 text"):
        await call(ws, "read_file", path="blob.bin")


async def test_list_dir_marks_dirs_and_links_and_hides_the_state_dir(ws: Path) -> None:
    await call(ws, "append_file", path="log.txt", content="x\n")  # creates .perdure-tools
    assert (ws / STATE_DIR).is_dir()
    listing = (await call(ws, "list_dir")).splitlines()
    assert listing == [
        "dangling -> (outside the workspace; refused)",
        "docs/",
        f"inner_link -> {ws / 'docs' / 'readme.md'}",
        "log.txt (2 bytes)",
        "out -> (outside the workspace; refused)",
        "secret_link -> (outside the workspace; refused)",
        "src/",
    ]
    assert await call(ws, "list_dir", path="docs") == "readme.md (24 bytes)"


async def test_grep_finds_lines_and_never_follows_links_out(ws: Path) -> None:
    found = await call(ws, "grep", pattern="hello")
    assert found.splitlines() == [
        "inner_link:2: hello world",
        "docs/readme.md:2: hello world",
        "src/app.py:2:     print('hello')",
    ]
    assert "secret" not in found
    assert await call(ws, "grep", pattern="HELLO", glob="*.py", ignore_case=True) == (
        "src/app.py:2:     print('hello')"
    )
    assert await call(ws, "grep", pattern="nothing-like-this") == "no matches"
    assert "stopped after 1 matches" in await call(ws, "grep", pattern="e", max_matches=1)
    with pytest.raises(WorkspaceError, match="not a valid regex"):
        await call(ws, "grep", pattern="(")


async def test_write_edit_append(ws: Path) -> None:
    assert await call(ws, "write_file", path="new/dir/f.txt", content="a\nb\n") == (
        "created 'new/dir/f.txt' (4 bytes)"
    )
    assert await call(ws, "write_file", path="new/dir/f.txt", content="one\ntwo\n") == (
        "overwrote 'new/dir/f.txt' (8 bytes)"
    )
    assert await call(ws, "edit_file", path="new/dir/f.txt", old_text="two", new_text="2") == (
        "edited 'new/dir/f.txt': replaced 1 occurrence"
    )
    assert await call(ws, "append_file", path="new/dir/f.txt", content="three\n") == (
        "appended 6 bytes to 'new/dir/f.txt' (now 12 bytes)"
    )
    assert (ws / "new/dir/f.txt").read_text() == "one\n2\nthree\n"
    # writing through an inside link changes its target, not the link
    await call(ws, "write_file", path="inner_link", content="replaced\n")
    assert (ws / "inner_link").is_symlink()
    assert (ws / "docs" / "readme.md").read_text() == "replaced\n"


async def test_write_keeps_the_file_mode(ws: Path) -> None:
    script = ws / "run.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o751)
    await call(ws, "write_file", path="run.sh", content="#!/bin/sh\necho hi\n")
    assert script.stat().st_mode & 0o777 == 0o751


async def test_edit_file_must_match_exactly_once(ws: Path) -> None:
    (ws / "f.txt").write_text("x = 1\nx = 1\ny = 2\n")
    with pytest.raises(WorkspaceError, match="occurs 2 times"):
        await call(ws, "edit_file", path="f.txt", old_text="x = 1", new_text="x = 3")
    with pytest.raises(WorkspaceError, match="was not found"):
        await call(ws, "edit_file", path="f.txt", old_text="z = 1", new_text="z = 3")
    with pytest.raises(WorkspaceError, match="identical"):
        await call(ws, "edit_file", path="f.txt", old_text="y = 2", new_text="y = 2")
    with pytest.raises(WorkspaceError, match="old_text is empty"):
        await call(ws, "edit_file", path="f.txt", old_text="", new_text="y")
    assert (ws / "f.txt").read_text() == "x = 1\nx = 1\ny = 2\n"
    assert not (ws / STATE_DIR / "edit_file").exists()  # refused before any journal


async def test_no_workspace_is_a_clear_error() -> None:
    with pytest.raises(WorkspaceError, match="no workspace is configured"):
        await call(None, "read_file", path="a.txt")


# -- what they refuse ----------------------------------------------------------------------------

ESCAPES: list[tuple[str, dict[str, Any], str]] = [
    ("read_file", {"path": "../outside/secret.txt"}, "leads outside the workspace"),
    ("read_file", {"path": "{outside}/secret.txt"}, "absolute path"),
    ("read_file", {"path": "out/secret.txt"}, "symbolic link"),
    ("read_file", {"path": "secret_link"}, "symbolic link"),
    ("read_file", {"path": "docs/../../outside/secret.txt"}, "leads outside"),
    ("list_dir", {"path": ".."}, "leads outside"),
    ("list_dir", {"path": "out"}, "symbolic link"),
    ("grep", {"pattern": "secret", "path": "out"}, "symbolic link"),
    ("grep", {"pattern": "secret", "path": "../outside"}, "leads outside"),
    ("write_file", {"path": "../outside/new.txt", "content": "x"}, "leads outside"),
    ("write_file", {"path": "out/new.txt", "content": "x"}, "symbolic link"),
    ("write_file", {"path": "secret_link", "content": "x"}, "symbolic link"),
    ("write_file", {"path": "dangling", "content": "x"}, "symbolic link"),
    ("write_file", {"path": "{outside}/new.txt", "content": "x"}, "absolute path"),
    ("edit_file", {"path": "secret_link", "old_text": "hello", "new_text": "bye"}, "symbolic"),
    ("edit_file", {"path": "out/secret.txt", "old_text": "hello", "new_text": "bye"}, "link"),
    ("append_file", {"path": "out/secret.txt", "content": "x"}, "symbolic link"),
    ("append_file", {"path": "../outside/secret.txt", "content": "x"}, "leads outside"),
    ("append_file", {"path": "dangling", "content": "x"}, "symbolic link"),
    ("bash", {"command": "touch pwned", "cwd": "out"}, "symbolic link"),
    ("bash", {"command": "touch pwned", "cwd": ".."}, "leads outside"),
    ("bash", {"command": "touch pwned", "cwd": "{outside}"}, "absolute path"),
    ("write_file", {"path": f"{STATE_DIR}/bash/x", "content": "x"}, "reserves"),
    ("read_file", {"path": f"{STATE_DIR}/.gitignore"}, "reserves"),
]


def _fill(args: dict[str, Any], outside: Path) -> dict[str, Any]:
    return {k: v.format(outside=outside) if isinstance(v, str) else v for k, v in args.items()}


@pytest.mark.parametrize(("name", "args", "why"), ESCAPES)
async def test_every_tool_refuses_escapes(
    ws: Path, name: str, args: dict[str, Any], why: str
) -> None:
    outside = ws.parent / "outside"
    before = _tree_digest(outside)
    with pytest.raises(WorkspaceError, match=why):
        await call(ws, name, **_fill(args, outside))
    assert _tree_digest(outside) == before


async def test_escapes_through_the_runtime_are_is_error_results(ws: Path) -> None:
    outside = ws.parent / "outside"
    before = _tree_digest(outside)
    (ws / STATE_DIR).mkdir()
    uses = [ToolUse(name, _fill(args, outside)) for name, args, _ in ESCAPES]
    turn = await one_turn(ws.parent / "log", ALL.values(), uses, workspace=ws)
    assert turn.outcome is not None
    assert turn.outcome.status == "completed"
    for n, (_, _, why) in enumerate(ESCAPES, 1):
        content, is_error = turn.results[call_id(n)]
        assert is_error, content
        assert content.startswith("The tool raised WorkspaceError: "), content
        assert why in content
        assert turn.kind(n) == "error"
    assert _tree_digest(outside) == before
    assert not (ws / "pwned").exists()


# -- how they reconcile ---------------------------------------------------------------------------


async def test_no_journal_means_not_applied(ws: Path) -> None:
    for name, args in [
        ("write_file", {"path": "a.txt", "content": "x"}),
        ("edit_file", {"path": "docs/readme.md", "old_text": "bye", "new_text": "ciao"}),
        ("append_file", {"path": "a.txt", "content": "x"}),
        ("bash", {"command": "true"}),
    ]:
        assert await reconcile(ws, name, key="pdk_never_ran", **args) == Reconciled.not_applied()


async def test_write_reconcile_decides_by_the_journaled_hashes(ws: Path) -> None:
    args = {"path": "docs/readme.md", "content": "new\n"}
    await call(ws, "write_file", **args)
    applied = await reconcile(ws, "write_file", **args)
    assert applied.status == "applied"
    assert (
        applied.result == "wrote 'docs/readme.md' (4 bytes) (confirmed by perdure after a restart)"
    )
    (ws / "docs" / "readme.md").write_text("# Title\nhello world\nbye\n")  # as before
    assert (await reconcile(ws, "write_file", **args)).status == "not_applied"
    (ws / "docs" / "readme.md").write_text("someone else\n")
    unknown = await reconcile(ws, "write_file", **args)
    assert unknown.status == "unknown"
    assert "changed by something else" in unknown.reason


@pytest.mark.parametrize(
    ("now", "status"),
    [
        ("a\nNEW\nb\n", "applied"),  # exactly the intended result
        ("a\nOLD\nb\n", "not_applied"),  # exactly as before
        ("z\na\nNEW\nb\n", "applied"),  # changed since, but new present and old absent
        ("z\na\nOLD\nb\n", "not_applied"),  # changed since, old present once, new absent
        ("OLD NEW\n", "unknown"),  # both: cannot tell
        ("nothing\n", "unknown"),  # neither: cannot tell
    ],
)
async def test_edit_reconcile(ws: Path, now: str, status: str) -> None:
    (ws / "f.txt").write_text("a\nOLD\nb\n")
    args = {"path": "f.txt", "old_text": "OLD", "new_text": "NEW"}
    await call(ws, "edit_file", **args)
    (ws / "f.txt").write_text(now)
    assert (await reconcile(ws, "edit_file", **args)).status == status


def _journal_then_crash(ws: Path, path: str, content: str) -> None:
    """Write append_file's journal as the tool would, then 'crash' before the effect."""
    real = ws / path
    before = real.read_bytes() if real.exists() else None
    _fs.write_journal(
        ws,
        "append_file",
        "pdk_test",
        1,
        {
            "path": path,
            "existed": before is not None,
            "size_before": len(before or b""),
            "prefix": _fs.sha256_bytes(before or b""),
            "appended": _fs.sha256_bytes(content.encode()),
            "length": len(content.encode()),
        },
    )


@pytest.mark.parametrize(
    ("then", "status"),
    [
        (b"", "not_applied"),  # nothing appended, even though the file ends with the line
        (b"- done\n", "applied"),
        (b"- done\n+ later line\n", "applied"),  # others appended after us
        (b"- do", "unknown"),  # a torn write
        (b"- other\n", "unknown"),  # someone else's bytes where ours should be
    ],
)
async def test_append_reconcile_decides_by_position_not_by_how_the_file_ends(
    ws: Path, then: bytes, status: str
) -> None:
    (ws / "notes.md").write_text("# notes\n- done\n")
    _journal_then_crash(ws, "notes.md", "- done\n")
    (ws / "notes.md").write_bytes((ws / "notes.md").read_bytes() + then)
    found = await reconcile(ws, "append_file", path="notes.md", content="- done\n")
    assert found.status == status


async def test_append_reconcile_when_the_file_was_changed_or_removed(ws: Path) -> None:
    (ws / "notes.md").write_text("# notes\n")
    _journal_then_crash(ws, "notes.md", "- done\n")
    (ws / "notes.md").write_text("# NOTES\n- done\n")
    found = await reconcile(ws, "append_file", path="notes.md", content="- done\n")
    assert found.status == "unknown"
    assert "changed before the point" in found.reason
    os.unlink(ws / "notes.md")
    found = await reconcile(ws, "append_file", path="notes.md", content="- done\n")
    assert (found.status, found.reason) == ("unknown", "'notes.md' no longer exists")
    _journal_then_crash(ws, "fresh.md", "x\n")  # the file did not exist before
    assert (await reconcile(ws, "append_file", path="fresh.md", content="x\n")).status == (
        "not_applied"
    )


async def test_journals_are_keyed_by_idempotency_key_and_attempt(ws: Path) -> None:
    await call(ws, "append_file", key="pdk_a", path="n.txt", content="1\n")
    await call(ws, "append_file", key="pdk_b", path="n.txt", content="2\n")
    journals = sorted(p.relative_to(ws).as_posix() for p in (ws / STATE_DIR).rglob("*.json"))
    assert journals == [
        f"{STATE_DIR}/append_file/pdk_a/attempt-1.json",
        f"{STATE_DIR}/append_file/pdk_b/attempt-1.json",
    ]
    assert (ws / STATE_DIR / ".gitignore").read_text().endswith("*\n")
    # an odd key is hashed into a safe directory name
    await call(ws, "append_file", key="../../etc", path="n.txt", content="3\n")
    assert not (ws.parent / "etc").exists()
    assert len(list((ws / STATE_DIR / "append_file").iterdir())) == 3


async def test_a_settled_call_leaves_no_tool_state_behind(ws: Path) -> None:
    """The journals and bash records exist for reconcile; once a call is settled they go."""
    (ws / "a.txt").write_text("old line\n")
    uses = [
        ToolUse("write_file", {"path": "w.txt", "content": "w\n"}),
        ToolUse("edit_file", {"path": "a.txt", "old_text": "old line", "new_text": "new line"}),
        ToolUse("append_file", {"path": "log.txt", "content": "x\n"}),
        ToolUse("bash", {"command": "echo hi", "timeout": 10}),
    ]
    turn = await one_turn(ws.parent / "log", ALL.values(), uses, workspace=ws)
    assert [turn.kind(n) for n in range(1, 5)] == ["ok"] * 4
    assert (ws / "a.txt").read_text() == "new line\n"
    with trio.fail_after(10):
        # The checkpoint store (history.git) stays: it is the workspace's history.
        while leftovers := [  # noqa: ASYNC110
            p for p in (ws / STATE_DIR).glob("*/*") if p.parent.name != "history.git"
        ]:
            await trio.sleep(0.02)
    assert leftovers == []
    assert sorted(p.name for p in (ws / STATE_DIR).iterdir()) == [
        ".gitignore",
        "append_file",
        "bash",
        "edit_file",
        "history.git",
        "write_file",
    ]


async def test_with_fast_durability_the_state_is_kept(ws: Path) -> None:
    """A terminal record a power loss could undo must not outlive its reconcile's evidence."""
    script = ScriptedProvider(
        [
            Reply(tool_uses=[ToolUse("append_file", {"path": "log.txt", "content": "x\n"})]),
            Reply(text="done"),
        ]
    )
    async with perdure.open_runtime(
        ws.parent / "log", provider=script, tools=ALL.values(), workspace=ws, durability="fast"
    ) as rt:
        await rt.create_session("s")
        await rt.submit("s", "go", request_id="r1")
        with trio.fail_after(10):
            await rt.wait_idle("s")
        await trio.sleep(0.2)
    assert len(list((ws / STATE_DIR / "append_file").iterdir())) == 1
