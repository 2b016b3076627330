"""LangGraph running the workload: a StateGraph model -> tool loop, checkpointed to SQLite.

Runs in the peers' own virtual environment (never perdure's):

    python bench/peer_langgraph.py turns DB K              # SqliteSaver, graph.invoke
    python bench/peer_langgraph.py concurrency DB SESSIONS K   # AsyncSqliteSaver, asyncio

Every superstep is checkpointed before the next one starts (``durability="sync"``):
per turn, the model node's checkpoint and the tool node's checkpoint. The tool node is
hand-written (lighter than ``ToolNode``), which can only flatter LangGraph. The model
node answers like perdure's fake provider: it counts the assistant messages.
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import workload
from bench.common import emit


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


STARTS: dict[str, list[float]] = {}
RECORD = True


def lookup(query: str) -> str:
    return workload.TOOL_OUTPUT


def _model(state: State, config: RunnableConfig) -> dict[str, Any]:
    if RECORD:
        thread = config["configurable"]["thread_id"]
        STARTS.setdefault(thread, []).append(time.perf_counter())
    turns = sum(1 for m in state["messages"] if isinstance(m, AIMessage))
    if workload.wants_tool(turns, K):
        call = {
            "name": workload.TOOL_NAME,
            "args": dict(workload.TOOL_ARGS),
            "id": workload.call_id(turns + 1),
            "type": "tool_call",
        }
        return {"messages": [AIMessage(content=workload.REPLY_TEXT, tool_calls=[call])]}
    return {"messages": [AIMessage(content=workload.FINAL_TEXT)]}


def _tools(state: State) -> dict[str, Any]:
    last = state["messages"][-1]
    assert isinstance(last, AIMessage)
    out = [
        ToolMessage(content=lookup(**call["args"]), tool_call_id=call["id"], name=call["name"])
        for call in last.tool_calls
    ]
    return {"messages": out}


async def _amodel(state: State, config: RunnableConfig) -> dict[str, Any]:
    return _model(state, config)


async def _atools(state: State) -> dict[str, Any]:
    return _tools(state)


def _route(state: State) -> str:
    last = state["messages"][-1]
    return "tools" if isinstance(last, AIMessage) and last.tool_calls else END


def _graph(asynchronous: bool) -> StateGraph[State]:
    graph = StateGraph(State)
    graph.add_node("model", _amodel if asynchronous else _model)  # type: ignore[arg-type]
    graph.add_node("tools", _atools if asynchronous else _tools)  # type: ignore[arg-type]
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", _route, ["tools", END])
    graph.add_edge("tools", "model")
    return graph


K = 0


def _config(thread: str, k: int) -> RunnableConfig:
    return {"configurable": {"thread_id": thread}, "recursion_limit": 2 * k + 10}


def _pragmas(conn: sqlite3.Connection) -> dict[str, Any]:
    sync = conn.execute("PRAGMA synchronous").fetchone()[0]
    mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    return {
        "synchronous": {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}[sync],
        "journal_mode": mode,
    }


def turns(db: str, k: int) -> dict[str, Any]:
    global K
    with SqliteSaver.from_conn_string(db) as saver:
        app = _graph(False).compile(checkpointer=saver)
        K = workload.WARMUP_TURNS  # warm-up: a short thread first, in the same process
        app.invoke(
            {"messages": [HumanMessage(content=workload.USER_TEXT)]},
            _config("warm-up", K),
            durability="sync",
        )
        K = k
        out = app.invoke(
            {"messages": [HumanMessage(content=workload.USER_TEXT)]},
            _config("t1", k),
            durability="sync",
        )
        pragmas = _pragmas(saver.conn)
        checkpoints = saver.conn.execute("SELECT count(*) FROM checkpoints").fetchone()[0]
    assert out["messages"][-1].content == workload.FINAL_TEXT
    starts = STARTS["t1"]
    assert len(starts) == k + 1, len(starts)
    return {
        "system": "langgraph",
        "k": k,
        "saver": "SqliteSaver (sync invoke)",
        "sqlite": pragmas,
        "checkpoints": checkpoints,
        **workload.turn_stats(starts),
    }


async def _concurrency(db: str, sessions: int, k: int) -> dict[str, Any]:
    global K, RECORD
    K, RECORD = k, False
    async with AsyncSqliteSaver.from_conn_string(db) as saver:
        app = _graph(True).compile(checkpointer=saver)

        async def one(i: int) -> None:
            out = await app.ainvoke(
                {"messages": [HumanMessage(content=workload.USER_TEXT)]},
                _config(f"c{i}", k),
                durability="sync",
            )
            assert out["messages"][-1].content == workload.FINAL_TEXT

        cpu = time.process_time()
        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(sessions)))
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu
    return {
        "system": "langgraph",
        "saver": "AsyncSqliteSaver (asyncio, ainvoke)",
        "sessions": sessions,
        "k": k,
        "elapsed_s": elapsed,
        "turns_per_s": sessions * k / elapsed,
        "cpu_ms_per_turn": cpu / (sessions * k) * 1e3,
    }


def versions() -> dict[str, str]:
    names = (
        "langgraph",
        "langgraph-checkpoint",
        "langgraph-checkpoint-sqlite",
        "langchain-core",
        "aiosqlite",
    )
    return {name: version(name) for name in names} | {"sqlite": sqlite3.sqlite_version}


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    if cmd == "turns":
        emit(turns(args[0], int(args[1])) | {"versions": versions()})
    elif cmd == "concurrency":
        emit(
            asyncio.run(_concurrency(args[0], int(args[1]), int(args[2])))
            | {"versions": versions()}
        )
    else:
        raise SystemExit(f"unknown command {cmd!r}")
