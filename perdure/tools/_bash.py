"""The built-in ``bash`` tool: a shell command in the workspace, recoverable after a crash.

Replay policy NEVER (a command may do anything), with a ``reconcile``. Each attempt
of a call has a directory ``<workspace>/.perdure-tools/bash/<key>/attempt-<n>/``:

* ``command.json`` — written durably BEFORE anything is started (the intent);
* ``pid.json`` — the runner's pid, process group, start time and boot id, linked
  into place by the runner itself BEFORE it starts the command;
* ``stdout``, ``stderr`` — the command's output, written directly to files;
* ``exit.json`` — the exit status, written (atomically) when the command ends.

The command runs under ``_bash_runner.py`` in a new session (its own process
group), so it neither shares the runtime's fate nor needs the runtime to record
its result. A timeout or a cancellation kills the whole group (SIGTERM, then
SIGKILL after a grace period).

Reconcile, after a crash of the runtime, reads that directory:

* no ``command.json`` -> nothing was started: ``not_applied`` (run it once more);
* no ``pid.json`` -> the runner had not claimed the call; reconcile claims it with a
  tombstone (the runner's claim then fails and it never runs the command), and
  answers ``not_applied``;
* ``exit.json`` -> the command finished while nobody was watching: ``applied``, with
  its exit status and output;
* the runner still alive (same pid, start time and boot) -> an orphan. Policy: it
  is the very command the call started, so reconcile waits for it until the
  call's own deadline (start + timeout) and reports its real result (``applied``);
  if it is still running past that deadline, reconcile kills its process group,
  as the original call would have, and answers ``unknown`` saying so;
* the runner dead without ``exit.json`` -> it was killed mid-run: ``unknown``, with
  the pid and the output it left.

Failures, and which are reported as retryable. ``bash`` is NEVER, so the runtime
never retries it by itself (a NEVER tool cannot have a ``RetryPolicy``): whatever
it reports, the model reads it and decides. Only one failure is reported as
retryable (``RetryableError``), because only then is it certain that the command
never ran: the operating system refused to start the runner process for a reason
that passes (``EAGAIN``, ``ENOMEM``, ``EMFILE``, ``ENFILE``: too many processes or
open files, not enough memory). Everything else is a plain error result, never
retryable, since the command may have run in part or in full: a non-zero exit
status, a timeout (the group was killed), a runner stopped before it recorded an
exit status. The model's own mistakes (an empty command, a bad ``timeout`` or
``cwd``) are errors too. A crash of the runtime is recovered by ``reconcile`` above.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Annotated, Any

import trio

from perdure.tools import _fs
from perdure.tools._fs import WorkspaceError
from perdure.tools.contract import Reconciled, RetryableError, ToolContext, ToolResult

BASH_TIMEOUT_LIMIT = 600.0
KILL_GRACE = 2.0
OUTPUT_TAIL = 20_000
POLL = 0.05
_RUNNER = Path(__file__).with_name("_bash_runner.py")
_PROCFS = os.path.exists("/proc/self/stat")
# Reasons the OS may refuse to start a process that pass by themselves (see above).
TRANSIENT_SPAWN_ERRORS = frozenset({errno.EAGAIN, errno.ENOMEM, errno.EMFILE, errno.ENFILE})


def attempt_dir(root: Path, key: str, attempt: int) -> Path:
    return _fs.key_dir(root, "bash", key) / f"attempt-{attempt}"


def _shell() -> str:
    return shutil.which("bash") or "/bin/sh"


def _command_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PERDURE_FAULT", None)  # a test switch of this process, not of the command
    return env


async def bash(
    ctx: ToolContext,
    command: Annotated[str, "the shell command to run (bash -c)"],
    timeout: Annotated[float, "seconds before the command is killed (at most 600)"] = 120.0,  # noqa: ASYNC109 (the model's argument, enforced below)
    cwd: Annotated[str, "the working directory, relative to the workspace root"] = ".",
) -> ToolResult:
    """Run a shell command in the workspace; answers its exit status, stdout and stderr.

    The command is killed (with everything it started) when it exceeds its timeout.
    It is not sandboxed: it runs with the runtime's permissions.
    """
    if not command.strip():
        raise WorkspaceError("the command is empty")
    if not 0 < timeout <= BASH_TIMEOUT_LIMIT:
        raise WorkspaceError(f"timeout must be more than 0 and at most {BASH_TIMEOUT_LIMIT:g}")
    adir = await trio.to_thread.run_sync(_prepare, ctx, command, timeout, cwd)
    log_fd = await trio.to_thread.run_sync(
        lambda: os.open(adir / "runner.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    )
    try:
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-I", "-S", str(_RUNNER), str(adir)],
            start_new_session=True,  # its own process group: killed as one, survives us
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log_fd,
            env=_command_env(),
        )
    except OSError as exc:
        if exc.errno not in TRANSIENT_SPAWN_ERRORS:
            raise
        raise RetryableError(
            f"the command was not started: the system could not start a process now "
            f"({os.strerror(exc.errno or 0)}). Nothing ran; trying again later may work."
        ) from exc
    finally:
        os.close(log_fd)
    timed_out = False
    try:
        with trio.move_on_after(timeout) as limit:
            await proc.wait()
        if limit.cancelled_caught:
            timed_out = True
            await _kill_group(proc)
    except BaseException:  # cancelled: by the runtime's backstop, a cancel, a shutdown
        with trio.CancelScope(shield=True):
            await _kill_group(proc)
        raise
    return await trio.to_thread.run_sync(_result, adir, proc.returncode, timed_out, timeout)


def _prepare(ctx: ToolContext, command: str, timeout: float, cwd: str) -> Path:
    root = _fs.workspace_root(ctx.workspace)
    where = _fs.confine(root, cwd)
    if not where.is_dir():
        raise WorkspaceError(f"cwd '{cwd}' is not a directory of the workspace")
    _fs.ensure_state_dir(root)
    adir = attempt_dir(root, ctx.idempotency_key, ctx.attempt)
    if (adir / "command.json").exists():
        raise WorkspaceError(
            f"attempt {ctx.attempt} of this call was already started; refusing to start it twice"
        )
    spec = {
        "command": command,
        "cwd": str(where),
        "shell": _shell(),
        "timeout": timeout,
        "started_at": time.time(),
        "key": ctx.idempotency_key,
        "attempt": ctx.attempt,
    }
    _fs.write_json_durably(adir / "command.json", spec)  # the intent, before any start
    return adir


async def _kill_group(proc: trio.Process) -> None:
    """SIGTERM the process group, SIGKILL what is left after a grace period, reap the leader."""
    _signal_group(proc.pid, signal.SIGTERM)
    with trio.move_on_after(KILL_GRACE):
        await proc.wait()
    _signal_group(proc.pid, signal.SIGKILL)  # stragglers of the group, even if the leader exited
    await proc.wait()


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _result(adir: Path, runner_rc: int | None, timed_out: bool, timeout: float) -> ToolResult:
    stdout, stderr = _tail(adir / "stdout"), _tail(adir / "stderr")
    if timed_out:
        text = (
            f"the command timed out after {timeout:g}s and was killed (with its process "
            "group); it may have partly run.\n" + _sections(stdout, stderr)
        )
        return ToolResult(text, is_error=True)
    done = _fs.read_json(adir / "exit.json")
    if done is None:
        log = (adir / "runner.log").read_text(errors="replace").strip()
        why = f" (runner exit {runner_rc}{': ' + log[-2000:] if log else ''})"
        raise WorkspaceError("the command was stopped before it recorded an exit status" + why)
    rc = int(done["returncode"])
    return ToolResult(format_result(rc, stdout, stderr), is_error=rc != 0)


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - OUTPUT_TAIL))
            data = f.read()
    except FileNotFoundError:
        return ""
    text = data.decode("utf-8", errors="replace")
    if size > OUTPUT_TAIL:
        text = f"[perdure: first {size - OUTPUT_TAIL} bytes omitted]\n" + text
    return text


def _sections(stdout: str, stderr: str) -> str:
    parts = []
    if stdout:
        parts.append("--- stdout ---\n" + stdout.rstrip("\n"))
    if stderr:
        parts.append("--- stderr ---\n" + stderr.rstrip("\n"))
    return "\n".join(parts) if parts else "(no output)"


def format_result(returncode: int, stdout: str, stderr: str) -> str:
    status = f"killed by signal {-returncode}" if returncode < 0 else f"exit status: {returncode}"
    return status + "\n" + _sections(stdout, stderr)


# -- reconcile ----------------------------------------------------------------------------


async def bash_reconcile(
    ctx: ToolContext,
    command: str,
    timeout: float = 120.0,  # noqa: ASYNC109 (the call's arguments; the deadline is recorded)
    cwd: str = ".",
) -> Reconciled:
    """What became of an interrupted call: see the module docstring for the table."""
    root = await trio.to_thread.run_sync(_fs.workspace_root, ctx.workspace)
    adir = attempt_dir(root, ctx.idempotency_key, ctx.attempt)
    spec = await trio.to_thread.run_sync(_fs.read_json, adir / "command.json")
    if spec is None:
        return Reconciled.not_applied()  # the intent precedes any start
    record = await trio.to_thread.run_sync(_claim_or_read_pid, adir)
    if record.get("tombstone"):
        return Reconciled.not_applied()  # the runner can never start this command now
    pid = int(record["pid"])
    found = await trio.to_thread.run_sync(_finished, adir, pid)
    if found is not None:
        return found
    deadline = float(spec["started_at"]) + float(spec["timeout"])
    while process_alive(record):
        if time.time() >= deadline:
            await _kill_orphan(record)
            found = await trio.to_thread.run_sync(_finished, adir, pid)
            if found is not None:
                return found
            output = await trio.to_thread.run_sync(_output_so_far, adir)
            return Reconciled.unknown(
                f"the command was still running as pid {pid} after the runtime restarted, "
                f"past its time limit of {float(spec['timeout']):g}s; perdure killed its "
                f"process group. It may have partly run. {output}"
            )
        await trio.sleep(POLL)
        found = await trio.to_thread.run_sync(_finished, adir, pid)
        if found is not None:
            return found
    found = await trio.to_thread.run_sync(_finished, adir, pid)
    if found is not None:
        return found
    output = await trio.to_thread.run_sync(_output_so_far, adir)
    return Reconciled.unknown(
        f"the command was started as pid {pid} but stopped without recording an exit status "
        f"(it was killed, perhaps together with the runtime); it may have partly run. {output}"
    )


def _claim_or_read_pid(adir: Path) -> dict[str, Any]:
    """The runner's pid record, or a tombstone put in its place so the runner never starts."""
    pid_file = adir / "pid.json"
    record = _fs.read_json(pid_file)
    if record is not None:
        return record
    tombstone = {"tombstone": True, "at": time.time()}
    tmp = adir / f".tombstone.{uuid.uuid4().hex[:12]}.tmp"
    _fs.write_json_durably(tmp, tombstone)
    try:
        os.link(tmp, pid_file)
    except FileExistsError:  # the runner claimed it first: it is running or has run
        claimed = _fs.read_json(pid_file)
        assert claimed is not None
        return claimed
    else:
        _fs.fsync_dir(adir)
        return tombstone
    finally:
        os.unlink(tmp)


def _finished(adir: Path, pid: int) -> Reconciled | None:
    done = _fs.read_json(adir / "exit.json")
    if done is None:
        return None
    rc = int(done["returncode"])
    text = format_result(rc, _tail(adir / "stdout"), _tail(adir / "stderr"))
    note = (
        f"[perdure: this result was recovered after a restart; the command ran as pid {pid} "
        "and finished while the runtime was down]\n"
    )
    return Reconciled.applied(ToolResult(note + text, is_error=rc != 0))


def _output_so_far(adir: Path) -> str:
    stdout, stderr = _tail(adir / "stdout")[-2000:], _tail(adir / "stderr")[-2000:]
    if not stdout and not stderr:
        return "It left no output."
    return "Output so far:\n" + _sections(stdout, stderr)


async def _kill_orphan(record: dict[str, Any]) -> None:
    """Kill an orphaned runner's group, having verified that it is still the same process."""
    if not process_alive(record):
        return
    pgid = int(record["pgid"])
    for sig in (signal.SIGTERM, signal.SIGKILL):
        _signal_group(pgid, sig)
        with trio.move_on_after(KILL_GRACE):
            # Not our child: nothing to wait on but its /proc entry.
            while process_alive(record):  # noqa: ASYNC110
                await trio.sleep(POLL)
        if not process_alive(record):
            return


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


def process_alive(record: dict[str, Any]) -> bool:
    """Is the process of a pid record still running, and still the same process?

    On Linux the start time (from /proc) and the boot id guard against a reused pid,
    and a zombie counts as dead. Elsewhere: the pid exists and leads the same group.
    """
    pid = int(record["pid"])
    boot = record.get("boot")
    if boot is not None and _boot_id() not in (None, boot):
        return False
    if _PROCFS:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            return False
        if fields[0] in ("Z", "X", "x"):
            return False
        start = record.get("start")
        return start is None or fields[19] == start
    try:
        os.kill(pid, 0)
        return os.getpgid(pid) == int(record["pgid"])
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
