"""``--mcp-config`` files (the desktop agents' ``mcpServers`` shape) and ``perdure tools``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from perdure.cli import main
from perdure.tools.contract import ReplayPolicy
from perdure.tools.mcp import McpConfigError, load_config
from tests.mcp_servers._shop import SERVER, read_ledger


def _write(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps(data))
    return path


def test_both_transports_and_perdure_keys_are_read(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        {
            "mcpServers": {
                "files": {"command": "npx", "args": ["-y", "server-fs", "/tmp"], "env": {"A": "1"}},
                "tickets": {
                    "url": "https://example.test/mcp",
                    "headers": {"Authorization": "Bearer x"},
                    "trustAnnotations": True,
                    "tools": {
                        "close": {"replay": "keyed", "requiresApproval": False, "timeout": 9}
                    },
                },
            }
        },
    )
    files, tickets = load_config(path)
    assert (files.name, files.transport, files.command, files.args) == (
        "files",
        "stdio",
        "npx",
        ("-y", "server-fs", "/tmp"),
    )
    assert files.env == {"A": "1"} and files.trust_annotations is False
    assert (tickets.transport, tickets.url, tickets.headers) == (
        "http",
        "https://example.test/mcp",
        {"Authorization": "Bearer x"},
    )
    assert tickets.trust_annotations is True
    assert "Bearer" not in repr(tickets) and "'A'" not in repr(files)  # secrets stay out
    assert tickets.overrides == {
        "close": {"replay": "keyed", "requires_approval": False, "timeout": 9}
    }


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ({"servers": {}}, '"mcpServers"'),
        ({"mcpServers": {"a": {"args": []}}}, "mcpServers.a: needs command"),
        ({"mcpServers": {"a": {"command": "x", "url": "http://y"}}}, "not both"),
        ({"mcpServers": {"a": {"command": "x", "args": "-v"}}}, "args must be a list"),
        ({"mcpServers": {"a": {"command": "x", "trustAnnotations": "yes"}}}, "true or false"),
        ({"mcpServers": {"a": {"command": "x", "tools": {"t": {"replay": "x"}}}}}, "keyed"),
        ({"mcpServers": {"a": {"command": "x", "tools": {"t": {"retry": 1}}}}}, "mcpServers.a"),
        ({"mcpServers": {"a": {"command": "x", "colour": "red"}}}, "unknown key"),
        ({"mcpServers": {"a b": {"command": "x"}}}, "MCP server name"),
        ({"mcpServers": {"a": {"url": "ftp://x"}}}, "http(s)"),
    ],
)
def test_a_bad_file_is_a_clear_error_naming_the_place(tmp_path: Path, data: Any, said: str) -> None:
    with pytest.raises(McpConfigError, match=r"mcp\.json") as caught:
        load_config(_write(tmp_path, data))
    assert said in str(caught.value)
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(McpConfigError, match="not valid JSON"):
        load_config(tmp_path / "bad.json")


def test_perdure_tools_lists_every_tool_with_its_policy_and_why(tmp_path: Path) -> None:
    config = {
        "mcpServers": {
            "shop": {
                "command": sys.executable,
                "args": [str(SERVER)],
                "env": {"SHOP_LEDGER": str(tmp_path / "ledger"), "SHOP_BROKEN_SCHEMA": "1"},
                "trustAnnotations": True,
                "tools": {"delete": {"requiresApproval": False}},
            }
        }
    }
    path = _write(tmp_path, config)
    result = CliRunner().invoke(main, ["tools", "--mcp-config", str(path), "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for r in json.loads(result.output)}
    assert rows["read_file"]["server"] is None  # the built-in tools are listed too
    assert (rows["shop__lookup"]["replay"], rows["shop__lookup"]["approval"]) == ("safe", False)
    assert rows["shop__lookup"]["why"] == "MCP shop/lookup: trusted annotations: readOnlyHint"
    assert (rows["shop__book"]["replay"], rows["shop__plain"]["approval"]) == ("keyed", True)
    assert rows["shop__delete"]["approval"] is False
    assert rows["shop__delete"]["why"].startswith("MCP shop/delete: override: requires_approval")
    assert rows["shop__broken"]["replay"] is None
    assert rows["shop__broken"]["why"].startswith("left out: its inputSchema is not valid")
    assert ReplayPolicy(rows["shop__append"]["replay"]) is ReplayPolicy.NEVER


def test_perdure_tools_says_which_server_did_not_start(tmp_path: Path) -> None:
    path = _write(tmp_path, {"mcpServers": {"gone": {"command": str(tmp_path / "nope")}}})
    result = CliRunner().invoke(main, ["tools", "--mcp-config", str(path)])
    assert result.exit_code == 1
    assert "MCP server 'gone'" in result.output and "could not be started" in result.output


def _shop_config(tmp_path: Path) -> Path:
    env = {"SHOP_LEDGER": str(tmp_path / "ledger")}
    server = {"command": sys.executable, "args": [str(SERVER)], "env": env}
    return _write(tmp_path, {"mcpServers": {"shop": {**server, "trustAnnotations": True}}})


def test_perdure_run_with_an_mcp_config(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps(
            {
                "replies": [
                    {"tool_uses": [{"name": "shop__lookup", "input": {"city": "Kyiv"}}]},
                    {"text": "it is sunny"},
                ]
            }
        )
    )
    (tmp_path / "ws").mkdir()
    args = ["run", "weather?", "--provider", f"scripted:{script}", "--log", str(tmp_path / "log")]
    args += ["--workspace", str(tmp_path / "ws"), "--mcp-config", str(_shop_config(tmp_path))]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "shop__lookup" in result.output and "it is sunny" in result.output
    assert [e["city"] for e in read_ledger(tmp_path / "ledger")] == ["Kyiv"]


def test_perdure_run_refuses_a_bad_config_before_anything(tmp_path: Path) -> None:
    bad = _write(tmp_path, {"mcpServers": {"shop": {"args": []}}})
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"replies": [{"text": "hi"}]}))
    args = ["run", "x", "--provider", f"scripted:{script}", "--log", str(tmp_path / "log")]
    result = CliRunner().invoke(main, [*args, "--mcp-config", str(bad)])
    assert result.exit_code == 2
    assert "mcpServers.shop: needs command" in result.output
    assert not (tmp_path / "log").exists()
