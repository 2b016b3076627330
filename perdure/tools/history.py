"""Workspace history: content-addressed snapshots of a workspace, their diffs, restores.

The store is a shadow git repository beside the workspace's own files, in
``<workspace>/.perdure-tools/history.git`` (never the user's ``.git``), driven
through the ``git`` binary with a private index. A snapshot is a git *tree*:
``git add`` of what changed since the last snapshot (the index keeps each file's
stat data, so an unchanged file is not read again), then ``git write-tree``. Equal
content is stored once, so a checkpoint costs the blobs of the files that changed
plus the trees above them (bench/workspace_history.py measures it).

What a snapshot holds: every file git would track (``.gitignore`` files, the
store's ``info/exclude`` and perdure's own ``.perdure-tools/`` are honoured;
``.git`` directories never enter), symbolic links as links (their target text,
never followed), executable bits. A file over ``max_file_bytes`` is skipped and
named in ``Snapshot.skipped``, so whoever shows the checkpoint can say it is not
in it; a restore leaves such a file alone.

A restore (``restore``) first snapshots the workspace as it is (so a restore can
itself be undone), checks the target tree is whole (``git fsck`` of the objects it
reaches: a damaged store is refused, never half-used), then has git make the
working files match the tree: files of the tree are written, files the previous
snapshot had and the tree has not are removed, ignored and skipped files are left.
Git writes only below the work tree and refuses to write through a symbolic link.

Everything here blocks: run it in a worker thread. One process serialises its own
calls on a store with a lock, and processes with an ``flock`` on the store, so two
runtimes (or two sessions) snapshotting one workspace never corrupt its index.
Object files and refs are fsynced (``core.fsync``) before a call returns, so a
snapshot recorded before an effect survives a crash that follows.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import subprocess
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal

from attrs import frozen

__all__ = [
    "DEFAULT_MAX_FILE_BYTES",
    "STORE_DIR",
    "FileChange",
    "HistoryError",
    "Snapshot",
    "WorkspaceHistory",
]

STORE_DIR = ".perdure-tools/history.git"
DEFAULT_MAX_FILE_BYTES = 10 * 1024 * 1024
EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"

ChangeKind = Literal["added", "modified", "deleted", "type_changed"]
_KINDS: dict[str, ChangeKind] = {"A": "added", "M": "modified", "D": "deleted", "T": "type_changed"}

# One lock per store path in this process; the flock covers other processes.
_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


class HistoryError(Exception):
    """The workspace history store failed or is damaged; the message says which and how."""


@frozen
class Snapshot:
    """One checkpoint of the workspace: a git tree id and the files left out of it."""

    tree: str
    skipped: tuple[str, ...] = ()  # files over the size limit, not in the snapshot


@frozen
class FileChange:
    path: str
    kind: ChangeKind


def ref_name(session_id: str, label: str) -> str:
    """A ref under which a session keeps a tree alive (``label`` names the checkpoint)."""
    return f"refs/perdure/{session_hash(session_id)}/{_safe(label)}"


def session_hash(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()[:24]


def _safe(label: str) -> str:
    return hashlib.sha256(label.encode()).hexdigest()[:32]


class WorkspaceHistory:
    """The checkpoint store of one workspace (created on first use)."""

    def __init__(self, workspace: Path, *, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> None:
        self.root = Path(os.path.realpath(workspace))
        self.store = self.root / STORE_DIR
        self.max_file_bytes = max_file_bytes

    # -- git -----------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
        env.update(
            GIT_DIR=str(self.store),
            GIT_WORK_TREE=str(self.root),
            GIT_INDEX_FILE=str(self.store / "perdure-index"),
            # The user's own git settings (autocrlf, hooks, excludes) must not change
            # what a snapshot holds.
            GIT_CONFIG_NOSYSTEM="1",
            GIT_CONFIG_GLOBAL=os.devnull,
            GIT_TERMINAL_PROMPT="0",
            # Paths are names, never patterns: a file called '*.py' is that file.
            GIT_LITERAL_PATHSPECS="1",
            LC_ALL="C",
        )
        return env

    def _git(
        self, *args: str, data: bytes | None = None, check: bool = True, bare: bool = False
    ) -> bytes:
        env = self._env()
        if bare:  # git init takes the directory as its argument, and no work tree
            for name in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
                env.pop(name)
        try:
            done = subprocess.run(
                ["git", *args],
                input=data,
                capture_output=True,
                env=env,
                cwd=self.root,
                check=False,
            )
        except FileNotFoundError:
            raise HistoryError(
                "workspace history needs the git program, which is not installed (or not on PATH)"
            ) from None
        if check and done.returncode != 0:
            said = done.stderr.decode(errors="replace").strip()
            raise HistoryError(f"git {args[0]} failed in {self.store}: {said}")
        return done.stdout

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with _LOCKS_GUARD:
            lock = _LOCKS.setdefault(str(self.store), threading.Lock())
        with lock:
            self._ensure()
            fd = os.open(self.store / "perdure.lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)

    def _ensure(self) -> None:
        if (self.store / "HEAD").is_file():
            return
        self.store.parent.mkdir(parents=True, exist_ok=True)
        ignore = self.store.parent / ".gitignore"
        if not ignore.exists():
            ignore.write_text("# perdure's tool-state records; not part of your project\n*\n")
        self._git("init", "--quiet", "--bare", str(self.store), bare=True)
        settings = {
            "core.bare": "false",
            "core.symlinks": "true",
            "core.filemode": "true",
            "core.autocrlf": "false",
            "core.fsync": "objects,reference,index",
            # One flush for a whole ``git add`` of many objects, not one per object.
            "core.fsyncMethod": "batch",
            "core.hooksPath": os.devnull,
            "gc.auto": "0",  # pruned when retention says so, never behind a call's back
        }
        for key, value in settings.items():
            self._git("config", key, value)
        (self.store / "info").mkdir(exist_ok=True)
        (self.store / "info" / "exclude").write_text(
            "# never part of a workspace snapshot\n/.perdure-tools/\n"
        )

    def exists(self) -> bool:
        return (self.store / "HEAD").is_file()

    # -- snapshots -----------------------------------------------------------------

    def snapshot(self, keep_as: str | None = None) -> Snapshot:
        """Record the workspace as it is now; ``keep_as`` (a ref) keeps its tree."""
        with self._locked():
            return self._snapshot(keep_as)

    def _snapshot(self, keep_as: str | None) -> Snapshot:
        listed = self._git(
            "ls-files", "-z", "--others", "--modified", "--deleted", "--exclude-standard"
        )
        candidates = sorted({p for p in listed.decode("utf-8", "surrogateescape").split("\0") if p})
        take: list[str] = []
        drop: list[str] = []
        for rel in candidates:
            try:
                info = os.lstat(self.root / rel)
            except FileNotFoundError:
                take.append(rel)  # deleted: staged as a removal
                continue
            if info.st_size > self.max_file_bytes and not _is_link(info.st_mode):
                drop.append(rel)
            else:
                take.append(rel)
        if take:
            self._git(
                "add",
                "--all",
                "--force",  # the listing already applied the ignore rules
                "--pathspec-from-file=-",
                "--pathspec-file-nul",
                data=_nul(take),
            )
        if drop:
            self._git(
                "rm",
                "--cached",
                "--quiet",
                "--ignore-unmatch",
                "--pathspec-from-file=-",
                "--pathspec-file-nul",
                data=_nul(drop),
            )
        tree = self._git("write-tree").decode().strip()
        skipped = tuple(sorted(set(drop) | self._still_skipped(drop)))
        self._remember_skipped(skipped)
        if keep_as is not None:
            self._git("update-ref", keep_as, tree)
        return Snapshot(tree=tree, skipped=skipped)

    def _still_skipped(self, now: Sequence[str]) -> set[str]:
        """Large files skipped earlier and still too large (``ls-files`` lists an
        untracked file only while it is not in the index, which it never is)."""
        known = self.store / "perdure-skipped"
        try:
            earlier = [p for p in known.read_text("utf-8", "surrogateescape").split("\0") if p]
        except FileNotFoundError:
            return set()
        still: set[str] = set()
        for rel in earlier:
            with contextlib.suppress(FileNotFoundError):
                if os.lstat(self.root / rel).st_size > self.max_file_bytes:
                    still.add(rel)
        return still

    def _remember_skipped(self, skipped: Sequence[str]) -> None:
        (self.store / "perdure-skipped").write_bytes(_nul(skipped))

    def keep(self, ref: str, tree: str) -> None:
        with self._locked():
            self._git("update-ref", ref, tree)

    def keep_for(self, session_id: str, trees: Sequence[str]) -> None:
        """Keep ``trees`` alive for ``session_id`` too (a fork holds its source's
        checkpoints: deleting the source must not prune them)."""
        if not trees or not self.exists():
            return
        lines = "".join(
            f"update {ref_name(session_id, 'kept/' + tree)} {tree}\n" for tree in set(trees)
        )
        with self._locked():
            self._git("update-ref", "--stdin", data=lines.encode())

    def lookup(self, ref: str) -> str | None:
        """The tree a ref keeps, or None if there is no such ref (or no store)."""
        if not self.exists():
            return None
        with self._locked():
            out = self._git("rev-parse", "--verify", "--quiet", ref, check=False)
        return out.decode().strip() or None

    # -- diffs ---------------------------------------------------------------------

    def changes(self, before: str, after: str) -> tuple[FileChange, ...]:
        """Which files differ between two trees, by path."""
        if before == after:
            return ()
        with self._locked():
            out = self._git("diff-tree", "-r", "-z", "--no-renames", "--name-status", before, after)
        parts = [p for p in out.decode("utf-8", "surrogateescape").split("\0") if p]
        return tuple(
            FileChange(path=path, kind=_KINDS.get(status[:1], "modified"))
            for status, path in zip(parts[::2], parts[1::2], strict=True)
        )

    def patch(self, before: str, after: str, paths: Sequence[str] = ()) -> str:
        """A unified diff between two trees (binary files are named, not shown)."""
        if before == after:
            return ""
        with self._locked():
            out = self._git("diff-tree", "-r", "-p", "--no-renames", before, after, "--", *paths)
        return out.decode("utf-8", "replace")

    # -- restore -------------------------------------------------------------------

    def restore(self, tree: str, keep_current_as: str | None = None) -> Snapshot:
        """Make the workspace's tracked files match ``tree``; returns the state before.

        Refused (``HistoryError``) if the store cannot prove ``tree`` whole: nothing
        is written then. Idempotent: a restore repeated after a crash halfway
        through ends in the same files.
        """
        with self._locked():
            self.verify(tree, locked=True)
            # A restore repeated after a crash keeps what the first attempt saw as "before".
            kept = None
            if keep_current_as is not None:
                out = self._git("rev-parse", "--verify", "--quiet", keep_current_as, check=False)
                kept = out.decode().strip() or None
            current = self._snapshot(None if kept else keep_current_as)
            # --reset: the index is the workspace (just snapshotted), so git removes
            # what the target lacks and writes what differs; -u updates the files.
            self._git("read-tree", "--reset", "-u", tree)
            return Snapshot(kept, current.skipped) if kept else current

    def verify(self, tree: str, *, locked: bool = False) -> None:
        """Raise ``HistoryError`` unless ``tree`` and every object below it are whole."""
        if not self.exists():
            raise HistoryError(
                f"the workspace history store {self.store} is missing: the checkpoint "
                f"{tree[:12]} cannot be restored"
            )
        guard = contextlib.nullcontext() if locked else self._locked()
        with guard:
            kind = self._git("cat-file", "-t", tree, check=False).decode().strip()
            if kind != "tree":
                raise HistoryError(
                    f"the checkpoint {tree[:12]} is not in the workspace history store "
                    f"{self.store} (missing or damaged); nothing was restored"
                )
            done = subprocess.run(
                ["git", "fsck", "--no-dangling", "--no-progress", "--strict", tree],
                capture_output=True,
                env=self._env(),
                cwd=self.root,
                check=False,
            )
            if done.returncode != 0:
                said = (done.stderr + done.stdout).decode(errors="replace").strip()
                raise HistoryError(
                    f"the workspace history store {self.store} is damaged below checkpoint "
                    f"{tree[:12]}; nothing was restored: {said[:500]}"
                )

    def check(self) -> list[str]:
        """Problems of the whole store (``git fsck``), as sentences; [] if sound."""
        if not self.exists():
            return []
        with self._locked():
            done = subprocess.run(
                ["git", "fsck", "--no-dangling", "--no-progress", "--full"],
                capture_output=True,
                env=self._env(),
                cwd=self.root,
                check=False,
            )
        if done.returncode == 0:
            return []
        said = (done.stderr + done.stdout).decode(errors="replace").strip().splitlines()
        return [f"workspace history {self.store}: {line}" for line in said[:20]]

    def has_tree(self, tree: str) -> bool:
        if not self.exists():
            return False
        with self._locked():
            kind = self._git("cat-file", "-t", tree, check=False).decode().strip()
        return kind == "tree"

    # -- retention -----------------------------------------------------------------

    def drop_session(self, session_id: str) -> int:
        """Forget a session's checkpoints (its refs); unreferenced objects are pruned."""
        if not self.exists():
            return 0
        prefix = f"refs/perdure/{session_hash(session_id)}/"
        with self._locked():
            refs = self._git("for-each-ref", "--format=%(refname)", prefix).decode().split()
            if refs:
                self._git(
                    "update-ref", "--stdin", data="".join(f"delete {r}\n" for r in refs).encode()
                )
                self._git("prune", "--expire=now")
        return len(refs)


def _is_link(mode: int) -> bool:
    import stat

    return stat.S_ISLNK(mode)


def _nul(paths: Sequence[str]) -> bytes:
    return b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in paths)
