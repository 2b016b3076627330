"""A damaged record is reported exactly and nothing is executed from it.

A run is killed while a NEVER tool call is executing; then bytes of that call's
``ToolExecuting`` record are flipped in the log file. On restart the session's
actor cannot fold its records: the supervisor retries, then parks the session
with a reason naming the damaged record's sequence number. Recovery never runs
for it (the tool is not called again, no "outcome unknown" is invented), and
another session in the same log is unaffected.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from perdure.storage.codec import CorruptRecord, decode
from perdure.storage.lmdb_log import LmdbLog
from perdure.storage.records import SessionParked, ToolExecuting
from tests.support.ledger_tools import effects
from tests.support.procs import run_child


def _flip(data_file: Path, needle: bytes) -> int:
    """Flip one byte inside every copy of ``needle`` (LMDB may keep old page copies)."""
    raw = bytearray(data_file.read_bytes())
    hits = 0
    start = raw.find(needle)
    while start != -1:
        raw[start + len(needle) // 2] ^= 0x20
        hits += 1
        start = raw.find(needle, start + 1)
    data_file.write_bytes(bytes(raw))
    return hits


def test_damaged_record_parks_its_session_and_runs_nothing(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    script: list[dict[str, Any]] = [
        {"text": "x", "tool_uses": [{"name": "send_note", "input": {"text": "unique-7f3a"}}]},
        {"text": "done"},
    ]
    plan = {
        "log": str(tmp_path / "log"),
        "workspace": str(ws),
        "script": script,
        "sessions": {"s1": [{"text": "go", "request_id": "r1"}]},
    }
    assert run_child(plan, fault="tool.before:send_note").killed
    log = LmdbLog(tmp_path / "log", readonly=True)
    try:
        executing = [c for c in log.read_global() if isinstance(c.record, ToolExecuting)]
    finally:
        log.close()
    assert len(executing) == 1
    damaged_seq = executing[0].seq
    # The executing record's arguments are stored literally in its frame.
    assert _flip(tmp_path / "log" / "data.mdb", b'"args":{"text":"unique-7f3a"}') >= 1

    # A healthy session in the same log still runs.
    plan["sessions"] = {"s2": [{"text": "other", "request_id": "r2"}]}
    plan["script"] = [{"text": "fine"}]
    result = run_child(plan)
    assert result.outcome("s2")["status"] == "completed"
    assert f"record {damaged_seq} is damaged" in result.stderr

    log = LmdbLog(tmp_path / "log", readonly=True)
    try:
        parked, damaged = [], []
        for seq, frame in log.scan_frames():
            try:
                record = decode(seq, frame)
            except CorruptRecord:
                damaged.append(seq)
                continue
            if isinstance(record, SessionParked):
                parked.append(record)
        assert damaged == [damaged_seq], "exactly the flipped record is reported"
        with pytest.raises(CorruptRecord) as info:
            log.read_session("s1")
        assert info.value.seq == damaged_seq
    finally:
        log.close()
    assert len(parked) == 1
    assert parked[0].session_id == "s1"
    assert f"record {damaged_seq}" in parked[0].reason
    assert effects(ws) == [], "a tool ran from a damaged log"
