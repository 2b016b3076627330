"""``perdure run --provider openai --model M`` as a user runs it, against the fake OpenAI API.

The command runs in a subprocess with ``OPENAI_API_KEY`` and ``OPENAI_BASE_URL``
pointing at the fake server in this process; ``perdure show`` then names the
provider that answered. Without a key or a model the command says what to set.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fake_openai import FakeOpenAI, Reply, Text, ToolCall
from tests.providers._kill import child_env

TOOLS = "tests.providers._agent:add"


def perdure(*args: str, env: dict[str, str], cwd: Path) -> Any:
    command = [sys.executable, "-m", "perdure.cli", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("spec", ["openai", "openai:responses"])
def test_run_with_the_openai_provider(tmp_path: Path, spec: str) -> None:
    log = str(tmp_path / "log")
    with FakeOpenAI() as fake:
        fake.script(
            Reply(content=[Text("Adding. "), ToolCall("call_1", "add", {"a": 40, "b": 2})]),
            Reply(content=[Text("The answer is 42.")]),
        )
        env = child_env(openai=fake.url)
        common = ["--provider", spec, "--model", "gpt-cli", "--tools", TOOLS, "--log", log]
        common += ["--session", "s-cli"]
        proc = perdure("run", "what is 40 + 2?", *common, env=env, cwd=tmp_path)
        requests = fake.requests
    assert proc.returncode == 0, proc.stderr
    assert "The answer is 42." in proc.stdout
    assert [r.body["model"] for r in requests] == ["gpt-cli", "gpt-cli"]
    path = "/v1/responses" if spec == "openai:responses" else "/v1/chat/completions"
    assert {r.path for r in requests} == {path}
    assert requests[0].headers["authorization"] == "Bearer sk-test"
    shown = perdure("show", "s-cli", "--log", log, env=child_env(), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "model (openai gpt-cli) replied" in shown.stdout


def test_run_with_openai_says_what_is_missing(tmp_path: Path) -> None:
    bare = child_env()
    no_key = perdure("run", "hi", "--provider", "openai", "--model", "m", env=bare, cwd=tmp_path)
    assert no_key.returncode == 2
    assert "OPENAI_API_KEY" in no_key.stderr
    assert "OPENAI_BASE_URL" in no_key.stderr
    no_model = perdure(
        "run", "hi", "--provider", "openai", env={"OPENAI_API_KEY": "k"}, cwd=tmp_path
    )
    assert no_model.returncode == 2
    assert "--model" in no_model.stderr
    unknown = perdure("run", "hi", "--provider", "openai:legacy", env=bare, cwd=tmp_path)
    assert unknown.returncode == 2
    assert "openai:responses" in unknown.stderr
