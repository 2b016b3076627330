"""The command line's file problems, said in one line instead of a traceback.

Every command ends an expected problem with the log or the workspace the same way:
one line on standard error, ``perdure: <what went wrong> (<path>): <how to fix it>``,
and one of the documented exit statuses below. ``explain`` turns the exceptions such a
problem raises (the operating system's, LMDB's, the storage layer's) into a
``Problem``; anything else is a bug and keeps its traceback.

Exit statuses (also in ``perdure --help``):

* 0: done.
* 1: the command ran and reports a failure (a run that did not complete, a log that
  fails ``check``, a tool that fails ``conformance``, a command for a person that the
  session refuses or that has nobody to deliver it to), or the log is owned by a live
  process.
* 2: the command line or the setup is wrong (an unknown option, no log where one is
  needed, a missing workspace, ``--log`` naming a file).
* 3: the log or the workspace cannot be used as it is (no permission, a read-only
  log for a command that writes, a log written by a newer perdure).
* 4: no space: the disk, a file size limit or the log's size limit is reached.

A command that fails this way leaves the log's records as they were (a full disk
may leave what still fitted before the write that failed: the mark that the log was
opened and, for ``run``, its empty session).
"""

from __future__ import annotations

import errno
from pathlib import Path

from attrs import frozen

USAGE = 2
UNUSABLE = 3
NO_SPACE = 4

EXIT_STATUSES = (
    "Exit status: 0 done; 1 the run, check or conformance reports a failure, a command "
    "for a person is refused or has nobody to deliver it to, or a live process owns "
    "the log; 2 a wrong command line or setup (e.g. no log there, a "
    "missing workspace, --log naming a file); 3 the log or workspace cannot be used "
    "as it is (permissions, read-only, written by a newer perdure); 4 no space left."
)

_PERMISSION = (errno.EACCES, errno.EPERM)
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


@frozen
class Problem:
    """One expected problem: what went wrong, where, how to fix it, the exit status."""

    what: str
    path: str
    fix: str
    status: int

    def line(self) -> str:
        return f"{self.what} ({self.path}): {self.fix}"


def _lmdb_code(exc: BaseException) -> int | None:
    """The errno inside an LMDB error, read from its message ("path: Permission denied")."""
    import os

    text = str(exc)
    for code in (*_PERMISSION, errno.EROFS, *_NO_SPACE, errno.ENOTDIR, errno.EEXIST):
        if text.endswith(os.strerror(code)):
            return code
    return None


def _code(exc: BaseException) -> int | None:
    """The errno behind an exception, following its causes."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno is not None:
            return seen.errno
        if type(seen).__module__ == "lmdb":
            found = _lmdb_code(seen)
            if found is not None:
                return found
        seen = seen.__cause__ or seen.__context__
    return None


def _short_write_cause(log: str | None) -> int | None:
    """LMDB reports a write cut short as EIO: a write that starts below the file size
    limit, or below the disk's last free block, and runs past it. Told apart by what
    the log's data file meets now: the size limit (EFBIG) or a full disk (ENOSPC)."""
    import os
    import resource

    if log is None:
        return None
    data = Path(log) / "data.mdb"
    try:
        size = data.stat().st_size
        soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
        if soft != resource.RLIM_INFINITY and size >= soft:
            return errno.EFBIG
        disk = os.statvfs(data)
    except OSError:
        return None
    return errno.ENOSPC if disk.f_bavail == 0 else None


def _path(exc: BaseException, log: str | None) -> str:
    filename = getattr(exc, "filename", None)
    if filename:
        return str(filename)
    return log or "the log"


def explain(exc: BaseException, log: str | None) -> Problem | None:
    """The one-line problem behind ``exc`` (or inside its exception groups), or None
    when it is not a file problem."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = explain(inner, log)
            if found is not None:
                return found
        return None
    return _explain_one(exc, log)


def _explain_one(exc: BaseException, log: str | None) -> Problem | None:
    from perdure.storage.errors import LogFormatError, StorageFull

    if isinstance(exc, LogFormatError):
        return Problem(
            str(exc), log or exc.path, "upgrade perdure to read it (pip install -U perdure)", 3
        )
    if isinstance(exc, StorageFull):
        return Problem(
            "no space left to write the log",
            log or "the log",
            "free disk space (or raise the file size limit) and run the command again "
            "(what did not fit was not written)",
            NO_SPACE,
        )
    code = _code(exc)
    if code is None and str(exc).endswith("Input/output error"):
        code = _short_write_cause(log)
    path = _path(exc, log)
    if code in _PERMISSION or code == errno.EROFS:
        readonly = code == errno.EROFS
        return Problem(
            "the file system is read-only" if readonly else "permission denied",
            path,
            "this command writes to the log: give it a log it may write "
            "(chmod u+w, or another --log), or use a read-only command "
            "(check, show, sessions, export)",
            UNUSABLE,
        )
    if code in _NO_SPACE:
        return Problem(
            "no space left" if code != errno.EFBIG else "the file size limit is reached",
            path,
            "free disk space (or raise the limit) and run the command again (what did "
            "not fit was not written)",
            NO_SPACE,
        )
    if code in (errno.ENOTDIR, errno.EEXIST) and log is not None and Path(log).is_file():
        return Problem(
            "--log names a file, not a log folder",
            log,
            "give --log a folder (a new one is created) or a postgresql:// URL",
            USAGE,
        )
    return None
