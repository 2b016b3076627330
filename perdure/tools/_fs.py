"""Filesystem helpers of the built-in workspace tools: confinement, journals, atomic writes.

Everything here is synchronous and meant to run in a worker thread
(``trio.to_thread.run_sync``); nothing touches trio.

Confinement: every path a model gives is resolved against the workspace root and
must stay inside it *after* following symbolic links (``os.path.realpath``), so
``..`` escapes, absolute paths elsewhere, and symlinks (final or intermediate)
that lead outside are refused with a sentence the model can act on. The
tool-state directory (``STATE_DIR``) is reserved and refused as well. This guards
against a model's path mistakes and tricks; it is not a sandbox against a
concurrent local process swapping directories between the check and the use.

Journals: a mutating tool writes a small JSON file under
``<workspace>/.perdure-tools/<tool>/<key>/attempt-<n>.json`` (fsynced, renamed into
place) BEFORE its effect, so that after a crash its ``reconcile`` can decide
whether the effect happened. No journal means the effect never started.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import threading
import uuid
from pathlib import Path
from typing import Any

STATE_DIR = ".perdure-tools"

# Mutating tools of one process take this lock around "journal, then effect", so two
# concurrent calls on the same file cannot interleave between a journal and its effect.
MUTATION_LOCK = threading.Lock()

_SAFE_KEY = re.compile(r"[A-Za-z0-9_.-]{1,100}")


class WorkspaceError(Exception):
    """A refusal or a failure a model can read and act on (the runtime reports it as is_error)."""


def workspace_root(workspace: Path | None) -> Path:
    if workspace is None:
        raise WorkspaceError(
            "no workspace is configured for this runtime (open_runtime(..., workspace=...)); "
            "the workspace tools cannot be used"
        )
    return Path(os.path.realpath(workspace))


def confine(root: Path, path: str) -> Path:
    """The real path of ``path`` (relative to ``root``) if it stays inside ``root``."""
    if not isinstance(path, str) or not path.strip():
        raise WorkspaceError("the path is empty; give a path relative to the workspace root")
    if "\x00" in path:
        raise WorkspaceError(f"the path {path!r} contains a NUL character")
    given = Path(path)
    candidate = given if given.is_absolute() else root / given
    if not given.is_absolute() and not _inside(Path(os.path.normpath(candidate)), root):
        raise WorkspaceError(
            f"the path {path!r} leads outside the workspace (through '..'); "
            "use a path inside the workspace"
        )
    real = Path(os.path.realpath(candidate))
    if given.is_absolute() and not _inside(real, root):
        raise WorkspaceError(
            f"the absolute path {path!r} is outside the workspace; "
            "use a path relative to the workspace root"
        )
    if not _inside(real, root):
        raise WorkspaceError(
            f"the path {path!r} resolves through a symbolic link to a location outside the "
            "workspace; it was refused"
        )
    if _inside(real, root / STATE_DIR):
        raise WorkspaceError(
            f"the path {path!r} is inside {STATE_DIR}/, which perdure reserves for the "
            "tools' own records; it cannot be read or changed by tools"
        )
    return real


def _inside(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


def relative(root: Path, real: Path) -> str:
    """How a confined path is shown to the model."""
    rel = real.relative_to(root).as_posix()
    return rel if rel else "."


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_digest(path: Path) -> str | None:
    """sha256 of a regular file's content; None if it does not exist."""
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise WorkspaceError(f"'{path.name}' is a directory, not a file") from None


def read_bytes(path: Path) -> bytes | None:
    """A file's content; None if it does not exist."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise WorkspaceError(f"'{path.name}' is a directory, not a file") from None


def atomic_write(target: Path, data: bytes) -> None:
    """Replace ``target`` with ``data`` in one rename, keeping its permissions."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode: int | None = os.stat(target).st_mode & 0o7777
    except FileNotFoundError:
        mode = None
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:12]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def key_dir(root: Path, tool_name: str, key: str) -> Path:
    """The tool-state directory of one call (one idempotency key) of one tool."""
    safe = key if _SAFE_KEY.fullmatch(key) else "h_" + sha256_bytes(key.encode())[:40]
    return root / STATE_DIR / tool_name / safe


def forget_call(root: Path, tool_name: str, key: str) -> None:
    """Remove one settled call's tool-state directory (nothing asks about it again)."""
    shutil.rmtree(key_dir(root, tool_name, key), ignore_errors=True)


def ensure_state_dir(root: Path) -> None:
    state = root / STATE_DIR
    if not state.is_dir():
        state.mkdir(parents=True, exist_ok=True)
        ignore = state / ".gitignore"
        if not ignore.exists():
            ignore.write_text("# perdure's tool-state records; not part of your project\n*\n")


def journal_path(root: Path, tool_name: str, key: str, attempt: int) -> Path:
    return key_dir(root, tool_name, key) / f"attempt-{attempt}.json"


def write_json_durably(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` so that after any crash the file is either absent or complete."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object")
    return data


def write_journal(root: Path, tool_name: str, key: str, attempt: int, data: dict[str, Any]) -> None:
    ensure_state_dir(root)
    body = {"v": 1, "tool": tool_name, "key": key, "attempt": attempt, **data}
    write_json_durably(journal_path(root, tool_name, key, attempt), body)


def read_journal(root: Path, tool_name: str, key: str, attempt: int) -> dict[str, Any] | None:
    return read_json(journal_path(root, tool_name, key, attempt))


def decode_text(data: bytes, shown: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise WorkspaceError(
            f"'{shown}' is not UTF-8 text (a binary file?); the workspace tools handle text only"
        ) from None
