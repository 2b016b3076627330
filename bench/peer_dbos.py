"""DBOS running the workload: one workflow looping over two steps, SQLite system database.

Runs in the peers' own virtual environment (never perdure's):

    python bench/peer_dbos.py turns DB K
    python bench/peer_dbos.py concurrency DB SESSIONS K

The workflow keeps the conversation in memory (as a DBOS agent does) and calls the
model step, then the tool step, each of whose outputs DBOS checkpoints before the
workflow goes on. Everything runs on one asyncio loop (async workflow and steps).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

from dbos import DBOS, DBOSConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import workload
from bench.common import emit

STARTS: dict[str, list[float]] = {}
RECORD = True


@DBOS.step()
async def model_step(messages: list[dict[str, Any]], k: int) -> dict[str, Any]:
    if RECORD:
        STARTS.setdefault(DBOS.workflow_id or "", []).append(time.perf_counter())
    turns = sum(1 for m in messages if m["role"] == "assistant")
    if workload.wants_tool(turns, k):
        call = {
            "id": workload.call_id(turns + 1),
            "name": workload.TOOL_NAME,
            "args": dict(workload.TOOL_ARGS),
        }
        return {"role": "assistant", "content": workload.REPLY_TEXT, "tool_calls": [call]}
    return {"role": "assistant", "content": workload.FINAL_TEXT, "tool_calls": []}


@DBOS.step()
async def lookup(query: str) -> str:
    return workload.TOOL_OUTPUT


@DBOS.workflow()
async def agent(k: int) -> str:
    messages: list[dict[str, Any]] = [{"role": "user", "content": workload.USER_TEXT}]
    while True:
        reply = await model_step(messages, k)
        messages.append(reply)
        if not reply["tool_calls"]:
            return str(reply["content"])
        for call in reply["tool_calls"]:
            output = await lookup(**call["args"])
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})


def _launch(db: str) -> None:
    config: DBOSConfig = {
        "name": "perdure-bench",
        "system_database_url": f"sqlite:///{db}",
        "log_level": "WARNING",
    }
    DBOS(config=config)
    DBOS.launch()
    logging.getLogger("dbos").setLevel(logging.WARNING)


def _describe(db: str) -> dict[str, Any]:
    conn = sqlite3.connect(db)
    try:
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        sync = conn.execute("PRAGMA synchronous").fetchone()[0]
        steps = conn.execute("SELECT count(*) FROM operation_outputs").fetchone()[0]
    finally:
        conn.close()
    names = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
    return {"sqlite": {"journal_mode": mode, "synchronous": names[sync]}, "step_rows": steps}


async def _turns(db: str, k: int) -> dict[str, Any]:
    warm = await DBOS.start_workflow_async(agent, workload.WARMUP_TURNS)  # warm-up first
    await warm.get_result()
    handle = await DBOS.start_workflow_async(agent, k)
    text = await handle.get_result()
    assert text == workload.FINAL_TEXT
    starts = STARTS[handle.get_workflow_id()]
    assert len(starts) == k + 1, len(starts)
    return {"system": "dbos", "k": k, **workload.turn_stats(starts)}


async def _concurrency(sessions: int, k: int) -> dict[str, Any]:
    global RECORD
    RECORD = False

    async def one() -> None:
        handle = await DBOS.start_workflow_async(agent, k)
        assert await handle.get_result() == workload.FINAL_TEXT

    cpu = time.process_time()
    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(sessions)))
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu
    return {
        "system": "dbos",
        "sessions": sessions,
        "k": k,
        "elapsed_s": elapsed,
        "turns_per_s": sessions * k / elapsed,
        "cpu_ms_per_turn": cpu / (sessions * k) * 1e3,
    }


def versions() -> dict[str, str]:
    names = ("dbos", "sqlalchemy")
    return {name: version(name) for name in names} | {"sqlite": sqlite3.sqlite_version}


def main(argv: list[str]) -> dict[str, Any]:
    cmd, db, *nums = argv
    _launch(db)
    try:
        if cmd == "turns":
            result = asyncio.run(_turns(db, int(nums[0])))
        elif cmd == "concurrency":
            result = asyncio.run(_concurrency(int(nums[0]), int(nums[1])))
        else:
            raise SystemExit(f"unknown command {cmd!r}")
    finally:
        DBOS.destroy()
    return result | _describe(db) | {"versions": versions()}


if __name__ == "__main__":
    emit(main(sys.argv[1:]))
