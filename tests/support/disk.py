"""A small real filesystem for full-disk tests: a tmpfs mounted for one test (root only)."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

DISK_SIZE = 1 << 20


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs at ``tmp_path/disk``, unmounted (even if busy) after the test."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs (run as root to test a full disk)")
    if shutil.which("mount") is None:
        pytest.skip("no mount command on this system")
    disk = tmp_path / "disk"
    disk.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_SIZE}", "tmpfs", str(disk)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield disk
    finally:
        if subprocess.run(["umount", str(disk)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(disk)], check=True)


def fill(path: Path) -> None:
    """Write zeros to ``path`` until the filesystem refuses more."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            try:
                os.write(fd, b"\0" * 4096)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                return
    finally:
        os.close(fd)
