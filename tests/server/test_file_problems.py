"""Every command against every file problem that applies to it: one line on stderr
(``perdure: <what> (<path>): <fix>``), the documented exit status, no traceback, and
the log as it was.

The tests run as root here, and root ignores file permissions, so each child runs
without capabilities (``setpriv --bounding-set=-all``: a root process that execs with an
empty bounding set has no CAP_DAC_OVERRIDE), where ``chmod -w`` binds it as it binds
any user. A full disk is a file size limit (``RLIMIT_FSIZE`` at the log's current
size, with SIGXFSZ ignored so that a write past it fails with EFBIG instead of killing
the process): the same failed write a full disk gives, without a privileged tmpfs.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import signal
import socket
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lmdb
import pytest

from perdure.storage import LogFormatError
from perdure.storage.lmdb_log import LmdbLog
from perdure.storage.records import LogOpened, SessionCreated
from tests.server.test_cli import write_script
from tests.support.daemon import ROOT

TOOLS = "tests.server.identity_tools:TOOLS"
BIG = "Handle A1 " + "x" * 100_000  # a task whose input needs new pages in the log
READ_ONLY = ["show", "check", "sessions", "export"]
WRITERS = ["run", "serve", "prune", "compact", "fork", "import"]
LINE = re.compile(r"perdure: .+ \(.+\): .+")
NO_CAPS = ["setpriv", "--bounding-set=-all", "--"] if os.geteuid() == 0 else []


def child(
    args: list[str], cwd: Path, preexec: Callable[[], None] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PERDURE_", "ANTHROPIC_"))}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [*NO_CAPS, sys.executable, "-m", "perdure.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=preexec,
    )


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A log with one finished session of a big task, and an export of another log's."""
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: file permissions cannot be tested")
    root = tmp_path_factory.mktemp("problems")
    script = write_script(root / "script.json", [{"text": "done"}])
    (root / "ws").mkdir()
    base = ["--provider", f"scripted:{script}", "--tools", TOOLS, "--workspace", str(root / "ws")]
    for log, task in (("log", BIG), ("other", BIG + " again")):
        made = child(["run", task, *base, "--log", str(root / log)], root)
        assert made.returncode == 0, made.stdout + made.stderr
    [session] = [i.session_id for i in _infos(root / "log")]
    [other] = [i.session_id for i in _infos(root / "other")]
    exported = child(["export", other, "--log", str(root / "other")], root)
    (root / "other.jsonl").write_text(exported.stdout)
    return {"root": root, "script": script, "session": session}


def _infos(log: Path) -> list[Any]:
    opened = LmdbLog(log, readonly=True)
    try:
        return list(opened.sessions())
    finally:
        opened.close()


def command(name: str, world: dict[str, Any], log: Path, ws: Path) -> list[str]:
    scripted = ["--provider", f"scripted:{world['script']}", "--tools", TOOLS]
    sid = world["session"]
    return {
        "run": ["run", BIG + " more", *scripted, "--log", str(log), "--workspace", str(ws)],
        "serve": ["serve", "--port", "0", *scripted, "--log", str(log), "--workspace", str(ws)],
        "show": ["show", sid, "--log", str(log)],
        "check": ["check", "--log", str(log)],
        "sessions": ["sessions", "--log", str(log)],
        "export": ["export", sid, "--log", str(log)],
        "prune": ["prune", "--finished-before", "2100-01-01", "--log", str(log)],
        "compact": ["compact", "--log", str(log)],
        "fork": ["fork", sid, *scripted, "--log", str(log)],
        "import": ["import", str(world["root"] / "other.jsonl"), "--log", str(log)],
        "conformance": ["conformance", "--tools", TOOLS, "--workspace-template", str(ws)],
        "pause": ["pause", sid, "--log", str(log)],
    }[name]


def snapshot(log: Path) -> tuple[bytes, list[Any]] | None:
    """The log's data file and its records (what "unchanged" compares; the bytes alone
    for a log this build does not read)."""
    data = log / "data.mdb"
    if not data.is_file():
        return None
    try:
        opened = LmdbLog(log, readonly=True)
    except LogFormatError:
        return data.read_bytes(), []
    try:
        records = [(c.seq, c.record) for c in opened.read_global()]
    finally:
        opened.close()
    return data.read_bytes(), records


def copy_log(world: dict[str, Any], where: Path) -> Path:
    shutil.copytree(world["root"] / "log", where)
    (where / "owner.lock").unlink(missing_ok=True)
    return where


def read_only(path: Path) -> None:
    for entry in [path, *path.iterdir()]:
        entry.chmod(entry.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def newer_format(path: Path) -> None:
    env = lmdb.open(str(path), max_dbs=8)
    try:
        meta = env.open_db(b"meta")
        with env.begin(write=True) as txn:
            txn.put(b"format", b"2", db=meta)
    finally:
        env.close()


# (command, problem) -> the exit status it must end with (0: it works).
CASES: dict[tuple[str, str], int] = {
    **{(c, "folder unwritable"): 2 for c in READ_ONLY},
    **{(c, "folder unwritable"): 3 for c in WRITERS if c != "compact"},
    ("compact", "folder unwritable"): 2,  # there is no log to compact
    **{(c, "log read-only"): 0 for c in READ_ONLY},
    **{(c, "log read-only"): 3 for c in WRITERS},
    **{(c, "log is a file"): 2 for c in READ_ONLY + WRITERS},
    **{(c, "newer format"): 3 for c in READ_ONLY + WRITERS},
    **{(c, "workspace missing"): 2 for c in ("run", "serve", "conformance")},
    **{(c, "disk full"): 4 for c in ("run", "import", "fork", "compact", "prune")},
    # A command for a person, on a log no process owns (it writes one record there).
    ("pause", "folder unwritable"): 2,  # there is no log to pause a session in
    ("pause", "log read-only"): 3,
    ("pause", "log is a file"): 2,
    ("pause", "newer format"): 3,
}


@pytest.mark.parametrize(("name", "problem"), list(CASES), ids=[f"{c}-{p}" for c, p in CASES])
def test_a_file_problem_is_one_line_and_leaves_the_log_as_it_was(
    world: dict[str, Any], tmp_path: Path, name: str, problem: str
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    log = tmp_path / "log"
    preexec: Callable[[], None] | None = None
    if problem == "folder unwritable":
        folder = tmp_path / "locked"
        folder.mkdir()
        folder.chmod(0o555)
        log = folder / "log"
    elif problem == "log read-only":
        read_only(copy_log(world, log))
    elif problem == "log is a file":
        log.write_text("not a log\n")
    elif problem == "newer format":
        newer_format(copy_log(world, log))
    elif problem == "workspace missing":
        ws = tmp_path / "missing"
        copy_log(world, log)
    elif problem == "disk full":
        copy_log(world, log)
        # At the log's size for the commands that add to it (the big input does not
        # fit); below it for those that write little (prune) or less
        # than the log holds (compact's copy): a write past the limit fails even inside
        # the file, so they fail at the first write beyond it.
        size = (log / "data.mdb").stat().st_size
        limit = size if name in ("run", "import", "fork") else size // 2

        def preexec() -> None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    before = snapshot(log)
    proc = child(command(name, world, log, ws), tmp_path, preexec)
    expected = CASES[(name, problem)]
    assert proc.returncode == expected, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    if expected == 0:
        assert proc.stdout.strip()  # the read-only command did its work
    else:
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and LINE.fullmatch(lines[0]), proc.stderr
    after = snapshot(log)
    if problem == "disk full":
        # A failed commit may leave pages it wrote beyond the last committed ones; the
        # records are what must not change. What still fits is said here: the mark
        # that the log was opened and, for run, the empty session whose input did not.
        assert before is not None and after is not None
        assert after[1][: len(before[1])] == before[1]
        added = {type(record) for _, record in after[1][len(before[1]) :]}
        assert added <= ({LogOpened, SessionCreated} if name == "run" else {LogOpened})
    else:
        assert after == before
    if problem == "folder unwritable":
        assert not log.exists()
    if name == "serve":
        assert not (log / "daemon.token").exists() or before is not None
    if problem == "workspace missing":
        assert not ws.exists()
    if name == "compact":
        assert not (log / "compact.tmp").exists()
    print(proc.stderr)  # the line, for a reader of -s output


def test_a_failed_serve_start_leaves_no_token_files(tmp_path: Path) -> None:
    script = write_script(tmp_path / "script.json", [{"text": "hi"}])
    log = tmp_path / "log"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        proc = child(
            ["serve", "--port", port, "--provider", f"scripted:{script}", "--log", str(log)],
            tmp_path,
        )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert port in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not log.exists()
    # A start that fails after the token files were made (a log this build cannot
    # read) removes them, and only them.
    newer = copy_log_from(tmp_path, script)
    newer_format(newer)
    before = sorted(p.name for p in newer.iterdir())
    failed = child(
        ["serve", "--port", "0", "--provider", f"scripted:{script}", "--log", str(newer)], tmp_path
    )
    assert failed.returncode == 3, failed.stdout + failed.stderr
    assert "newer perdure" in failed.stderr
    assert sorted(p.name for p in newer.iterdir()) == before


def copy_log_from(tmp_path: Path, script: Path) -> Path:
    """A small log of one finished run."""
    (tmp_path / "ws").mkdir(exist_ok=True)
    log = tmp_path / "small"
    made = child(["run", "hi", "--provider", f"scripted:{script}", "--log", str(log)], tmp_path)
    assert made.returncode == 0, made.stdout + made.stderr
    return log


def test_tools_are_imported_from_the_current_folder(tmp_path: Path) -> None:
    """The installed ``perdure`` script (whose own folder is first on its path) imports
    ``--tools MODULE:ATTR`` from the folder it runs in, as uvicorn does."""
    script = Path(sys.executable).parent / "perdure"
    if not script.exists():
        pytest.skip("perdure is not installed as a script in this environment")
    (tmp_path / "mytools.py").write_text(
        "import perdure\n\n"
        "@perdure.tool(replay=perdure.ReplayPolicy.SAFE)\n"
        "async def shout(ctx: perdure.ToolContext, text: str) -> str:\n"
        '    """Say it louder."""\n'
        "    return text.upper()\n\n"
        "TOOLS = [shout]\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [str(script), "tools", "--tools", "mytools:TOOLS"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.split()[:3] == ["shout", "1", "safe"]  # name, version, policy


def test_the_benchmark_runner_refuses_a_missing_workdir(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "run.py"),
            "--quick",
            "--workdir",
            str(tmp_path / "nope"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert "does not exist" in line and str(tmp_path / "nope") in line
    assert not (tmp_path / "nope").exists()
