"""``perdure serve --mcp-config FILE``: the daemon connects the servers of the file."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.mcp_servers._shop import SERVER, read_ledger
from tests.support.daemon import Daemon, idle, wait_for


def test_serve_with_an_mcp_config_calls_the_servers_tools(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    config = tmp_path / "mcp.json"
    config.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "shop": {
                        "command": sys.executable,
                        "args": [str(SERVER)],
                        "env": {"SHOP_LEDGER": str(ledger)},
                        "trustAnnotations": True,
                    }
                }
            }
        )
    )
    script = [
        {"tool_uses": [{"name": "shop__book", "input": {"room": "5"}}]},
        {"text": "booked"},
    ]
    daemon = Daemon(tmp_path, script, extra_args=("--mcp-config", str(config))).start()
    try:
        with daemon.client() as c:
            c.post("/v1/sessions", json={"session_id": "s"}).raise_for_status()
            c.post(
                "/v1/sessions/s/messages", json={"text": "book", "request_id": "r1"}
            ).raise_for_status()
            wait_for(c, "s", idle)
            transcript = c.get("/v1/sessions/s/transcript").json()
    finally:
        daemon.close()
    assert "MCP servers: shop (stdio)" in daemon.output[0]
    (entry,) = read_ledger(ledger)
    assert entry["tool"] == "book" and entry["key"].startswith("pdk_")
    assert "booked 5 (booking B1)" in json.dumps(transcript)
