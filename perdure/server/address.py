"""Where a running ``perdure serve`` answers, written next to the log it owns.

The daemon writes ``daemon.json`` (its URL and process id) into an LMDB log's
directory once it listens, and removes it when it stops, so that a command run
beside the log (``perdure cancel``, ``approve``, …) finds the process to talk to
without being told. A daemon killed outright leaves the file behind: readers
check that the process still lives (and then that it answers) before trusting it.
The token is not in it: it stays in ``daemon.token`` (mode 0600) or wherever the
daemon was given it.

Plain file I/O, imported without the daemon's HTTP stack: call it from a worker
thread in async code.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit, urlunsplit

from attrs import frozen

ADDRESS_FILE: Final = "daemon.json"

# A daemon bound to every interface is reached on this machine through loopback.
_UNSPECIFIED: Final = {"0.0.0.0": "127.0.0.1", "[::]": "[::1]"}


@frozen
class DaemonAddress:
    """A daemon's URL and process id, as it recorded them."""

    url: str
    pid: int

    def alive(self) -> bool:
        """Whether the process that wrote it still runs (it may not answer yet)."""
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True  # it runs, as another user
        return True


def local_url(url: str) -> str:
    """The URL a client on this machine uses for a daemon bound to ``url``."""
    parts = urlsplit(url)
    host, _, port = parts.netloc.rpartition(":")
    if host in _UNSPECIFIED:
        return urlunsplit(parts._replace(netloc=f"{_UNSPECIFIED[host]}:{port}"))
    return url


def write_address(log_dir: str | os.PathLike[str], url: str) -> Path:
    """Record this process as the daemon of the log at ``log_dir`` (atomically)."""
    path = Path(log_dir) / ADDRESS_FILE
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps({"url": local_url(url), "pid": os.getpid()}) + "\n")
    os.replace(tmp, path)
    return path


def read_address(log_dir: str | os.PathLike[str]) -> DaemonAddress | None:
    """The daemon the log's directory names, or None (no file, or not one of ours)."""
    try:
        data = json.loads((Path(log_dir) / ADDRESS_FILE).read_text())
    except (OSError, ValueError):
        return None
    url, pid = (data.get("url"), data.get("pid")) if isinstance(data, dict) else (None, None)
    if not isinstance(url, str) or not isinstance(pid, int) or isinstance(pid, bool):
        return None
    return DaemonAddress(url, pid)


def forget_address(log_dir: str | os.PathLike[str]) -> None:
    """Remove the address file if this process wrote it (a later daemon's stays)."""
    found = read_address(log_dir)
    if found is not None and found.pid == os.getpid():
        (Path(log_dir) / ADDRESS_FILE).unlink(missing_ok=True)
