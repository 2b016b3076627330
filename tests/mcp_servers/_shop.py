"""Helpers of the MCP tests: start the shop server (stdio or HTTP), read its ledger, run a turn."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import trio

import perdure
from perdure.actors.state import SessionState
from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse
from perdure.tools.mcp import McpServer
from perdure.view import SessionLookup
from tests.support.fold import fold_of

SERVER = Path(__file__).with_name("shop_server.py")


def first_call(i: int = 1, turn: int = 1) -> str:
    """The scripted provider's id of the i-th call of a turn."""
    return f"toolu_{turn:03d}_{i}"


def stdio_shop(ledger: Path, *, broken_schema: bool = False, **options: Any) -> McpServer:
    env = {"SHOP_LEDGER": str(ledger)}
    if broken_schema:
        env["SHOP_BROKEN_SCHEMA"] = "1"
    return McpServer.stdio("shop", sys.executable, [str(SERVER)], env=env, **options)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def http_shop_process(ledger: Path, port: int | None = None) -> Iterator[tuple[str, int]]:
    """The shop served over streamable HTTP in a subprocess: yields (url, pid)."""
    port = port or free_port()
    env = {**os.environ, "SHOP_LEDGER": str(ledger)}
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), "http", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_listening(port, proc)
        yield f"http://127.0.0.1:{port}/mcp", proc.pid
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()


class HttpShop:
    """The shop over streamable HTTP in a subprocess that a test may kill and start again."""

    def __init__(self, ledger: Path) -> None:
        self.ledger = ledger
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, variant: str = "") -> None:
        env = {**os.environ, "SHOP_LEDGER": str(self.ledger), "SHOP_VARIANT": variant}
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVER), "http", str(self.port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_listening(self.port, self.proc)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


def wait_listening(port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the shop server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"the shop server did not listen on {port} in {timeout}s")


def read_ledger(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def wait_ledger(path: Path, tool: str) -> dict[str, Any]:
    """The first ledger entry of ``tool``, once the server has written it."""
    with trio.fail_after(30):
        while True:
            for entry in read_ledger(path):
                if entry["tool"] == tool:
                    return entry
            await trio.sleep(0.02)


def script(*turns: list[tuple[str, dict[str, Any]]], final: str = "done") -> ScriptedProvider:
    replies = [Reply(tool_uses=[ToolUse(name, args) for name, args in uses]) for uses in turns]
    return ScriptedProvider([*replies, Reply(text=final)])


async def run_turns(rt: perdure.Runtime, sid: str = "s") -> SessionState:
    await rt.create_session(sid)
    await rt.submit(sid, "go", request_id="r1")
    with trio.fail_after(60):
        await rt.wait_idle(sid)
    return await fold_of(rt, sid)


def results(state: SessionState) -> dict[str, tuple[str, bool]]:
    """Each call's output and is_error, as recorded."""
    out = {}
    for call_id, task in state.tasks.items():
        result = task.result
        output = getattr(result, "output", None) or getattr(result, "reason", "")
        out[call_id] = (str(output), bool(getattr(result, "is_error", False)))
    return out


async def wait_phase(rt: perdure.Runtime, call_id: str, phase: str) -> None:
    def get(state: SessionLookup) -> str | None:
        task = state.task_view(call_id)
        return None if task is None else task.phase

    with trio.fail_after(30):
        while await rt.state("s", get) != phase:  # noqa: ASYNC110 (a query, not an event)
            await trio.sleep(0.02)
