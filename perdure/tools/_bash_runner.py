"""The runner of one ``bash`` tool call: a tiny stdlib-only program, started by path.

``python -I -S _bash_runner.py <attempt-dir>`` reads ``command.json`` from the
attempt directory (written durably by the tool BEFORE it started this runner), then:

1. claims the call by hard-linking its pid record to ``pid.json``. The link fails if
   the file exists: a recovering runtime that found no pid record put a tombstone
   there to make sure the command can never start late. Then it exits (125)
   without running anything.
2. runs the command with stdout/stderr going to files in the attempt directory,
   in its own process group (the runner leads it: it was started in a new session),
3. records the exit status in ``exit.json`` (write then rename) and exits.

Because output and exit status go to files, not to pipes held by the runtime, the
command survives a crash of the runtime and its result can still be found.
This file imports nothing of perdure and must stay that way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path


def _proc_start() -> dict[str, str | None]:
    """This process's identity beyond its pid: its start time and the boot it belongs to."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        start: str | None = fields[19]
    except (OSError, IndexError):
        start = None
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot: str | None = f.read().strip()
    except OSError:
        boot = None
    return {"start": start, "boot": boot}


def _write_atomically(path: Path, data: dict[str, object]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main(attempt_dir: str) -> int:
    adir = Path(attempt_dir)
    spec = json.loads((adir / "command.json").read_text())
    record = {"pid": os.getpid(), "pgid": os.getpgrp(), "runner": True, **_proc_start()}
    tmp = adir / f".pid.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(record, f)
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, adir / "pid.json")
    except FileExistsError:
        return 125  # claimed by a recovery: this command must never run now
    finally:
        os.unlink(tmp)
    with open(adir / "stdout", "wb") as out, open(adir / "stderr", "wb") as err:
        proc = subprocess.Popen(
            [spec["shell"], "-c", spec["command"]],
            cwd=spec["cwd"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
        )
        returncode = proc.wait()
    _write_atomically(adir / "exit.json", {"returncode": returncode, "finished_at": time.time()})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
