"""Processes that own a perdure log and get killed for real, for the storage tests.

Run from the repository root as ``python tests/storage/_child.py MODE ...`` (the
tests set ``cwd`` and ``PYTHONPATH``). Modes:

``owner PATH [--takeover] [--map-size N]``
    Open the log and a Journal, append one record, print one JSON line
    ``{"pid", "epoch", "seq"}``, then obey commands read from stdin, one a line:
    ``append [SIZE]`` appends one record (with an output of SIZE bytes) and prints
    ``{"seq": n}``; ``exit`` closes and exits 0. If the log says this process was
    fenced (taken over), it prints ``{"fenced": message}`` and exits with
    ``FENCED_EXIT``.

``fault-script PATH``
    Appends under ``PERDURE_FAULT`` (see ``_fault_script``).

``zygote``
    A fork server for the crash sweep: it imports perdure once, then for every
    ``fork {json}`` line on stdin forks a child that runs ``appender`` and answers
    ``{"pid": n}``; ``reap PID`` waits for that child and answers
    ``{"pid", "signal", "code"}``. Forking from a warm process keeps each crash
    iteration in milliseconds instead of a fresh interpreter start.

The appender opens the log and a Journal, writes ``ready`` to its progress file,
then appends batches from several concurrent trio tasks until it is killed. Each
record names its batch and its place in it (``batch_mark``), and after each
append returns the child writes ``ok BATCH FIRST LAST`` to the progress file, so
the parent can check both atomicity and durability of what was acknowledged.
"""

from __future__ import annotations

import json
import os
import random
import sys
import traceback
from typing import Any, Final

import trio

from perdure.storage import Guard, LogFenced, StaleGoal
from perdure.storage.journal import open_journal
from perdure.storage.lmdb_log import DEFAULT_MAP_SIZE, LmdbLog
from perdure.storage.records import (
    GoalRevised,
    InputAccepted,
    Record,
    RunFinished,
    SessionCreated,
    ToolCompleted,
)

FENCED_EXIT: Final = 17
SHARED_SESSION: Final = "shared"


# -- the appender's batches ----------------------------------------------------------


def batch_session(task: int, k: int) -> str:
    """Every third batch of a task goes to a session all tasks share."""
    return SHARED_SESSION if k % 3 == 2 else f"s{task}"


def make_batch(bid: str, sid: str, k: int, n: int, rng: random.Random) -> list[Record]:
    """``n`` records for batch ``bid``: input first, tool results, then a finish or a revision.

    Odd batches close their own submission (net ``active`` change 0), even batches
    leave it open (+1) and revise the goal, so the sweep exercises every index.
    """
    marks = [f"{bid}#{i}/{n}" for i in range(n)]
    records: list[Record] = [
        InputAccepted(
            session_id=sid,
            submission_id=bid,
            request_id=marks[0],
            text=f"batch {bid}",
            body_hash="",
            at=1.0,
        )
    ]
    for i in range(1, n - 1):
        records.append(
            ToolCompleted(
                session_id=sid, call_id=marks[i], output="x" * rng.randrange(1500), at=2.0
            )
        )
    if k % 2:
        records.append(
            RunFinished(
                session_id=sid, run_id=marks[-1], submission_id=bid, status="completed", at=3.0
            )
        )
    else:
        records.append(
            GoalRevised(session_id=sid, goal_rev=k, text="", request_id=marks[-1], at=3.0)
        )
    return records


def batch_mark(record: Record) -> str | None:
    """The ``BATCH#INDEX/COUNT`` mark an appender record carries, or None for others."""
    if isinstance(record, InputAccepted | GoalRevised):
        return record.request_id
    if isinstance(record, ToolCompleted):
        return record.call_id
    if isinstance(record, RunFinished):
        return record.run_id
    return None


async def _append_forever(path: str, tag: str, tasks: int, n: int, progress: str) -> None:
    log = LmdbLog(path)
    rng = random.Random(os.getpid())
    async with await trio.open_file(progress, "a", buffering=1) as out:
        await out.write(f"ready {log.epoch}\n")

        async def appender(task: int, journal: Any) -> None:
            k = 0
            while True:
                bid = f"{tag}.{task}.{k}"
                batch = make_batch(bid, batch_session(task, k), k, n, rng)
                done = await journal.append(batch)
                await out.write(f"ok {bid} {done[0].seq} {done[-1].seq}\n")
                k += 1

        async with open_journal(log) as journal, trio.open_nursery() as nursery:
            for task in range(tasks):
                nursery.start_soon(appender, task, journal)


def _zygote() -> None:
    for line in sys.stdin:
        command, _, arg = line.strip().partition(" ")
        if command == "fork":
            spec = json.loads(arg)
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                devnull = os.open(os.devnull, os.O_RDWR)
                os.dup2(devnull, 0)
                os.dup2(devnull, 1)
                try:
                    trio.run(
                        _append_forever,
                        spec["path"],
                        spec["tag"],
                        spec["tasks"],
                        spec["n"],
                        spec["progress"],
                    )
                except BaseException:
                    traceback.print_exc()
                    sys.stderr.flush()
                    os._exit(1)
                os._exit(0)
            print(json.dumps({"pid": pid}), flush=True)
        elif command == "reap":
            _, status = os.waitpid(int(arg), 0)
            sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
            code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
            print(json.dumps({"pid": int(arg), "signal": sig, "code": code}), flush=True)
        elif command == "quit":
            return
        else:
            raise SystemExit(f"zygote: unknown command {line!r}")


# -- the fault point ---------------------------------------------------------------


async def _fault_script(path: str) -> None:
    """Appends named ``a``..``e``, with a refused and a failing append among them.

    Run with ``PERDURE_FAULT=commit@3``: the durable appends are a, c and d, so the
    process must die right after ``d`` is durable, before it hears so.
    """
    log = LmdbLog(path)
    async with open_journal(log) as journal:
        for name in "abcde":
            if name == "b":
                for refused in (
                    journal.append([_fault_record("b-stale")], guard=Guard("f", 99)),
                    journal.append([_fault_record("b-nan", at=float("nan"))]),
                ):
                    try:
                        await refused
                    except (StaleGoal, ValueError) as exc:
                        print(json.dumps({"refused": type(exc).__name__}), flush=True)
                continue
            await journal.append([_fault_record(name)])
            print(json.dumps({"ok": name}), flush=True)


def _fault_record(name: str, at: float = 1.0) -> Record:
    return ToolCompleted(session_id="f", call_id=name, output=name, at=at)


# -- the owner -----------------------------------------------------------------------


async def _own(path: str, takeover: bool, map_size: int) -> int:
    log = LmdbLog(path, takeover=takeover, map_size=map_size)
    try:
        async with open_journal(log) as journal:
            pid = os.getpid()
            first = await journal.append(
                [SessionCreated(session_id=f"owner-{pid}", request_id="open", at=1.0)]
            )
            print(json.dumps({"pid": pid, "epoch": log.epoch, "seq": first[0].seq}), flush=True)
            n = 0
            while True:
                command, _, size = (
                    (await trio.to_thread.run_sync(sys.stdin.readline)).strip().partition(" ")
                )
                if command in ("exit", ""):
                    return 0
                if command != "append":
                    raise SystemExit(f"owner: unknown command {command!r}")
                n += 1
                output = "o" * int(size) if size else "from the owner"
                record = ToolCompleted(
                    session_id=f"owner-{pid}", call_id=f"call-{n}", output=output, at=2.0
                )
                try:
                    done = await journal.append([record])
                except LogFenced as exc:
                    print(json.dumps({"fenced": str(exc)}), flush=True)
                    return FENCED_EXIT
                print(json.dumps({"seq": done[0].seq}), flush=True)
    finally:
        log.close()


def main(argv: list[str]) -> int:
    mode = argv[0]
    if mode == "zygote":
        _zygote()
        return 0
    if mode == "fault-script":
        trio.run(_fault_script, argv[1])
        return 0
    if mode == "owner":
        path = argv[1]
        takeover = "--takeover" in argv
        map_size = DEFAULT_MAP_SIZE
        if "--map-size" in argv:
            map_size = int(argv[argv.index("--map-size") + 1])
        return trio.run(_own, path, takeover, map_size)
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
