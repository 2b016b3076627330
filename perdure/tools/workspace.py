"""Built-in workspace tools: read, list, search, write, edit, append, and (opt-in) bash.

An opt-in set: pass ``perdure.tools.workspace.TOOLS`` (the file tools) or
``workspace_tools(include_bash=True)`` to ``open_runtime(..., workspace=...)``.

Every path is confined to the runtime's workspace: ``..`` escapes, absolute paths
elsewhere and symbolic links (final or intermediate) that resolve outside are
refused with a ``WorkspaceError`` the model reads as an ``is_error`` result. The
tool-state directory ``.perdure-tools/`` is reserved for the tools' own records.

Replay policies and crash recovery:

* ``read_file``, ``list_dir``, ``grep`` are SAFE: re-run after a crash.
* ``write_file``, ``edit_file``, ``append_file`` are NEVER, each with a
  ``reconcile``. Before its effect each writes a journal (keyed by the call's
  idempotency key and attempt) with what it needs to decide later: the file's
  hash before and the intended hash after (write, edit), or the file's size and
  hash before the append point (append). Reconcile answers ``applied`` when the
  intended effect is in place, ``not_applied`` when the file is still exactly as
  before (or no journal exists: the effect never started), and ``unknown`` when
  the file changed in a way that cannot be attributed.
* ``bash`` is NEVER with a reconcile that finds the command's record, see
  ``perdure.tools._bash``.

Workspace history: the mutating tools and ``bash`` are checkpointed (a snapshot of
the workspace before and after each attempt, ``perdure.tools.history``), which is
what ``rt.workspace_diff`` shows and ``rt.rewind`` restores. At recovery an
interrupted call is also diffed from its before-snapshot: a file tool that changed
nothing runs once more; for ``bash`` the model is told which files changed.

A call's tool-state directory is removed once the call is settled (``forget``), so
``.perdure-tools/`` holds only the calls that may still need a reconcile (and the
rare leftovers of a crash between a settling commit and its clean-up).

File I/O runs in worker threads; the trio loop is never blocked.
"""

from __future__ import annotations

import fnmatch
import os
import re
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import trio

from perdure.tools import _fs
from perdure.tools._bash import BASH_TIMEOUT_LIMIT, bash, bash_reconcile
from perdure.tools._fs import STATE_DIR, WorkspaceError
from perdure.tools.contract import Reconciled, ReplayPolicy, Tool, ToolContext, tool

__all__ = [
    "STATE_DIR",
    "TOOLS",
    "WorkspaceError",
    "workspace_tools",
]

MAX_READ_BYTES = 4 * 1024 * 1024
MAX_OUTPUT_CHARS = 60_000
FILE_TOOL_TIMEOUT = 60.0
_SKIP_DIRS = frozenset({".git", STATE_DIR})

Path_ = Annotated[str, "a path relative to the workspace root"]


R = TypeVar("R")


async def _in_thread(fn: Callable[[], R], *, abandon: bool = False) -> R:
    """Run blocking file work in a worker thread. Only read-only work may be abandoned."""
    return await trio.to_thread.run_sync(fn, abandon_on_cancel=abandon)


def _clip(text: str, limit: int = MAX_OUTPUT_CHARS) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[perdure: output truncated at {limit} characters]"


# -- SAFE: read_file, list_dir, grep ----------------------------------------------------


async def read_file(
    ctx: ToolContext,
    path: Path_,
    start_line: Annotated[int, "first line to return, counting from 1"] = 1,
    max_lines: Annotated[int, "how many lines to return at most"] = 2000,
) -> str:
    """Read a UTF-8 text file of the workspace (optionally a range of its lines)."""

    def work() -> str:
        root = _fs.workspace_root(ctx.workspace)
        real = _fs.confine(root, path)
        shown = _fs.relative(root, real)
        if start_line < 1 or max_lines < 1:
            raise WorkspaceError("start_line and max_lines must be at least 1")
        try:
            info = os.stat(real)
        except FileNotFoundError:
            raise WorkspaceError(f"there is no file '{shown}' in the workspace") from None
        if stat.S_ISDIR(info.st_mode):
            raise WorkspaceError(f"'{shown}' is a directory; use list_dir to see its entries")
        if info.st_size > MAX_READ_BYTES:
            raise WorkspaceError(
                f"'{shown}' is {info.st_size} bytes, more than the {MAX_READ_BYTES} bytes "
                "read_file handles; use grep to find what you need"
            )
        data = _fs.read_bytes(real)
        if data is None:
            raise WorkspaceError(f"there is no file '{shown}' in the workspace")
        lines = _fs.decode_text(data, shown).splitlines(keepends=True)
        if start_line > max(len(lines), 1):
            raise WorkspaceError(f"'{shown}' has {len(lines)} lines; start_line is {start_line}")
        end = min(len(lines), start_line - 1 + max_lines)
        text = "".join(lines[start_line - 1 : end])
        if start_line > 1 or end < len(lines):
            first = min(start_line, len(lines))
            text += f"\n[perdure: lines {first}-{end} of {len(lines)} of '{shown}'" + (
                f"; call read_file with start_line={end + 1} for more]" if end < len(lines) else "]"
            )
        return _clip(text)

    return await _in_thread(work, abandon=True)


async def list_dir(
    ctx: ToolContext,
    path: Annotated[str, "a directory relative to the workspace root"] = ".",
) -> str:
    """List a workspace directory: sub-directories end with '/', links show their target."""

    def work() -> str:
        root = _fs.workspace_root(ctx.workspace)
        real = _fs.confine(root, path)
        shown = _fs.relative(root, real)
        if not real.exists():
            raise WorkspaceError(f"there is no directory '{shown}' in the workspace")
        if not real.is_dir():
            raise WorkspaceError(f"'{shown}' is a file, not a directory; use read_file")
        lines: list[str] = []
        with os.scandir(real) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                if real == root and entry.name == STATE_DIR:
                    continue
                if entry.is_symlink():
                    if _fs._inside(Path(os.path.realpath(entry.path)), root):
                        lines.append(f"{entry.name} -> {os.readlink(entry.path)}")
                    else:
                        lines.append(f"{entry.name} -> (outside the workspace; refused)")
                elif entry.is_dir():
                    lines.append(entry.name + "/")
                else:
                    lines.append(f"{entry.name} ({entry.stat().st_size} bytes)")
        if not lines:
            return f"'{shown}' is empty"
        return _clip("\n".join(lines))

    return await _in_thread(work, abandon=True)


async def grep(
    ctx: ToolContext,
    pattern: Annotated[str, "a Python regular expression"],
    path: Annotated[str, "a file or directory to search, relative to the workspace"] = ".",
    glob: Annotated[str | None, "only files whose name matches, e.g. '*.py'"] = None,
    ignore_case: bool = False,
    max_matches: Annotated[int, "stop after this many matching lines"] = 200,
) -> str:
    """Search workspace text files for a regular expression; answers 'path:line: text'."""

    def work() -> str:
        root = _fs.workspace_root(ctx.workspace)
        real = _fs.confine(root, path)
        try:
            regex = re.compile(pattern, re.IGNORECASE if ignore_case else 0)
        except re.error as exc:
            raise WorkspaceError(f"the pattern {pattern!r} is not a valid regex: {exc}") from None
        if not real.exists():
            raise WorkspaceError(f"there is no '{_fs.relative(root, real)}' in the workspace")
        matches: list[str] = []
        for file in _walk_files(root, real):
            if glob is not None and not fnmatch.fnmatch(file.name, glob):
                continue
            _grep_file(root, file, regex, matches, max_matches)
            if len(matches) >= max_matches:
                matches.append(f"[perdure: stopped after {max_matches} matches]")
                break
        return _clip("\n".join(matches)) if matches else "no matches"

    return await _in_thread(work, abandon=True)


def _walk_files(root: Path, start: Path) -> list[Path]:
    """Regular files under ``start``, never following a link out of the workspace."""
    if start.is_file():
        return [start]
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(start, followlinks=False):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for name in sorted(filenames):
            file = here / name
            if file.is_symlink():
                target = Path(os.path.realpath(file))
                if not _fs._inside(target, root) or _fs._inside(target, root / STATE_DIR):
                    continue
            if file.is_file():
                found.append(file)
    return found


def _grep_file(root: Path, file: Path, regex: re.Pattern[str], out: list[str], limit: int) -> None:
    try:
        if file.stat().st_size > MAX_READ_BYTES:
            return
        data = file.read_bytes()
    except OSError:
        return
    if b"\x00" in data[:8192]:
        return  # binary
    text = data.decode("utf-8", errors="replace")
    shown = file.relative_to(root).as_posix()
    for number, line in enumerate(text.splitlines(), 1):
        if regex.search(line):
            out.append(f"{shown}:{number}: {line[:300]}")
            if len(out) >= limit:
                return


# -- NEVER: write_file ------------------------------------------------------------------


async def write_file(
    ctx: ToolContext,
    path: Path_,
    content: Annotated[str, "the complete new content of the file"],
) -> str:
    """Create or overwrite a workspace text file with the given content.

    Missing parent directories are created. The replacement is atomic.
    """

    def work() -> str:
        root = _fs.workspace_root(ctx.workspace)
        real = _fs.confine(root, path)
        shown = _fs.relative(root, real)
        data = content.encode("utf-8")
        with _fs.MUTATION_LOCK:
            before = _fs.file_digest(real)
            _fs.write_journal(
                root,
                "write_file",
                ctx.idempotency_key,
                ctx.attempt,
                {"path": shown, "before": before, "after": _fs.sha256_bytes(data)},
            )
            _fs.atomic_write(real, data)
        verb = "created" if before is None else "overwrote"
        return f"{verb} '{shown}' ({len(data)} bytes)"

    return await _in_thread(work)


async def _write_file_reconcile(ctx: ToolContext, path: str, content: str) -> Reconciled:
    def work() -> Reconciled:
        root = _fs.workspace_root(ctx.workspace)
        journal = _fs.read_journal(root, "write_file", ctx.idempotency_key, ctx.attempt)
        if journal is None:
            return Reconciled.not_applied()  # the journal precedes the effect
        shown = journal["path"]
        now = _fs.file_digest(root / shown)
        size = len(content.encode("utf-8"))
        if now == journal["after"]:
            return Reconciled.applied(
                f"wrote '{shown}' ({size} bytes) (confirmed by perdure after a restart)"
            )
        if now == journal["before"]:
            return Reconciled.not_applied()
        return Reconciled.unknown(
            f"'{shown}' holds neither its previous content nor the intended content: "
            "it was changed by something else"
        )

    return await _in_thread(work)


# -- NEVER: edit_file -------------------------------------------------------------------


async def edit_file(
    ctx: ToolContext,
    path: Path_,
    old_text: Annotated[str, "the exact text to replace; it must occur exactly once"],
    new_text: Annotated[str, "the text to put in its place"],
) -> str:
    """Replace one exact occurrence of old_text with new_text in a workspace text file.

    old_text must match the file exactly (whitespace included) and occur exactly
    once; include surrounding lines to make it unique.
    """

    def work() -> str:
        root = _fs.workspace_root(ctx.workspace)
        real = _fs.confine(root, path)
        shown = _fs.relative(root, real)
        if not old_text:
            raise WorkspaceError("old_text is empty; give the exact text to replace")
        if old_text == new_text:
            raise WorkspaceError("old_text and new_text are identical; nothing would change")
        with _fs.MUTATION_LOCK:
            data = _fs.read_bytes(real)
            if data is None:
                raise WorkspaceError(f"there is no file '{shown}' in the workspace")
            text = _fs.decode_text(data, shown)
            count = text.count(old_text)
            if count == 0:
                raise WorkspaceError(
                    f"old_text was not found in '{shown}'; it must match exactly, "
                    "whitespace included (read the file first)"
                )
            if count > 1:
                raise WorkspaceError(
                    f"old_text occurs {count} times in '{shown}'; include more surrounding "
                    "text so that it occurs exactly once"
                )
            new_data = text.replace(old_text, new_text, 1).encode("utf-8")
            _fs.write_journal(
                root,
                "edit_file",
                ctx.idempotency_key,
                ctx.attempt,
                {
                    "path": shown,
                    "before": _fs.sha256_bytes(data),
                    "after": _fs.sha256_bytes(new_data),
                },
            )
            _fs.atomic_write(real, new_data)
        return f"edited '{shown}': replaced 1 occurrence"

    return await _in_thread(work)


async def _edit_file_reconcile(
    ctx: ToolContext, path: str, old_text: str, new_text: str
) -> Reconciled:
    def work() -> Reconciled:
        root = _fs.workspace_root(ctx.workspace)
        journal = _fs.read_journal(root, "edit_file", ctx.idempotency_key, ctx.attempt)
        if journal is None:
            return Reconciled.not_applied()
        shown = journal["path"]
        data = _fs.read_bytes(root / shown)
        if data is None:
            return Reconciled.unknown(f"'{shown}' no longer exists")
        applied = f"edited '{shown}': replaced 1 occurrence (confirmed by perdure after a restart)"
        digest = _fs.sha256_bytes(data)
        if digest == journal["after"]:
            return Reconciled.applied(applied)
        if digest == journal["before"]:
            return Reconciled.not_applied()
        # The file changed since; decide from the texts where they are telling.
        text = data.decode("utf-8", errors="replace")
        has_old, has_new = old_text in text, bool(new_text) and new_text in text
        if has_new and not has_old:
            return Reconciled.applied(applied + "; the file has changed since")
        if has_old and not has_new and text.count(old_text) == 1:
            return Reconciled.not_applied()
        return Reconciled.unknown(
            f"'{shown}' was changed by something else and its text does not tell whether "
            "the edit was made"
        )

    return await _in_thread(work)


# -- NEVER: append_file -----------------------------------------------------------------


async def append_file(
    ctx: ToolContext,
    path: Path_,
    content: Annotated[str, "the text to add at the end (include a final newline if wanted)"],
) -> str:
    """Append text to the end of a workspace file, creating it if it does not exist."""

    def work() -> str:
        root = _fs.workspace_root(ctx.workspace)
        real = _fs.confine(root, path)
        shown = _fs.relative(root, real)
        if real.is_dir():
            raise WorkspaceError(f"'{shown}' is a directory, not a file")
        data = content.encode("utf-8")
        if not data:
            raise WorkspaceError("content is empty; nothing to append")
        with _fs.MUTATION_LOCK:
            before = _fs.read_bytes(real)
            # Where our bytes will land, and what precedes them: the same line may well
            # be at the end of the file already, so "ends with content" proves nothing.
            _fs.write_journal(
                root,
                "append_file",
                ctx.idempotency_key,
                ctx.attempt,
                {
                    "path": shown,
                    "existed": before is not None,
                    "size_before": len(before or b""),
                    "prefix": _fs.sha256_bytes(before or b""),
                    "appended": _fs.sha256_bytes(data),
                    "length": len(data),
                },
            )
            real.parent.mkdir(parents=True, exist_ok=True)
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
            fd = os.open(real, flags, 0o666)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
        total = len(before or b"") + len(data)
        return f"appended {len(data)} bytes to '{shown}' (now {total} bytes)"

    return await _in_thread(work)


async def _append_file_reconcile(ctx: ToolContext, path: str, content: str) -> Reconciled:
    def work() -> Reconciled:
        root = _fs.workspace_root(ctx.workspace)
        journal = _fs.read_journal(root, "append_file", ctx.idempotency_key, ctx.attempt)
        if journal is None:
            return Reconciled.not_applied()
        return decide_append(root, journal)

    return await _in_thread(work)


def decide_append(root: Path, journal: dict[str, Any]) -> Reconciled:
    """Was the journaled append made? Decided by position, not by how the file ends."""
    shown: str = journal["path"]
    start: int = journal["size_before"]
    length: int = journal["length"]
    data = _fs.read_bytes(root / shown)
    if data is None:
        if not journal["existed"]:
            return Reconciled.not_applied()
        return Reconciled.unknown(f"'{shown}' no longer exists")
    if len(data) < start or _fs.sha256_bytes(data[:start]) != journal["prefix"]:
        return Reconciled.unknown(
            f"'{shown}' was changed before the point where the text was to be appended"
        )
    if len(data) == start:
        return Reconciled.not_applied()
    ours = data[start : start + length]
    if len(ours) == length and _fs.sha256_bytes(ours) == journal["appended"]:
        return Reconciled.applied(
            f"appended {length} bytes to '{shown}' (confirmed by perdure after a restart)"
        )
    return Reconciled.unknown(
        f"'{shown}' has other or partial data where the text was to be appended "
        f"({len(data) - start} bytes after offset {start}, {length} intended)"
    )


# -- the tool set -----------------------------------------------------------------------


def _forgetter(tool_name: str) -> Callable[[ToolContext], Awaitable[None]]:
    """The ``forget`` hook of a tool whose reconcile state lives under ``key_dir``."""

    async def forget(ctx: ToolContext) -> None:
        if ctx.workspace is not None:
            root = _fs.workspace_root(ctx.workspace)
            await trio.to_thread.run_sync(_fs.forget_call, root, tool_name, ctx.idempotency_key)

    return forget


def workspace_tools(
    *,
    include_bash: bool = False,
    writes_require_approval: bool | Callable[[dict[str, Any]], bool] = False,
    bash_requires_approval: bool | Callable[[dict[str, Any]], bool] = False,
) -> tuple[Tool, ...]:
    """The built-in workspace tools, as a fresh tuple of ``Tool`` objects.

    ``include_bash`` adds ``bash`` (not a sandbox: it runs in the workspace with the
    runtime's permissions). Approval policies may be set for the mutating tools and
    for bash; they may be functions of the call's arguments.
    """
    safe = tool(replay=ReplayPolicy.SAFE, timeout=FILE_TOOL_TIMEOUT)

    def never(name: str, reconcile: Callable[..., Any]) -> Callable[[Callable[..., Any]], Tool]:
        return tool(
            replay=ReplayPolicy.NEVER,
            timeout=FILE_TOOL_TIMEOUT,
            requires_approval=writes_require_approval,
            reconcile=reconcile,
            forget=_forgetter(name),
            workspace_only=True,  # checkpointed; a call that changed nothing runs again
        )

    tools = [
        safe(read_file),
        safe(list_dir),
        safe(grep),
        never("write_file", _write_file_reconcile)(write_file),
        never("edit_file", _edit_file_reconcile)(edit_file),
        never("append_file", _append_file_reconcile)(append_file),
    ]
    if include_bash:
        tools.append(
            tool(
                replay=ReplayPolicy.NEVER,
                reconcile=bash_reconcile,
                forget=_forgetter("bash"),
                requires_approval=bash_requires_approval,
                timeout=BASH_TIMEOUT_LIMIT + 60.0,  # a backstop; bash enforces its own
                cancellable=True,  # a cancelled run kills the command's process group
                changes_workspace=True,  # checkpointed; its other effects stay unknown
            )(bash)
        )
    return tuple(tools)


TOOLS: tuple[Tool, ...] = workspace_tools()
"""The file tools (no bash), with default settings."""
