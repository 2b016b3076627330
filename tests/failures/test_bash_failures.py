"""What the workspace ``bash`` tool reports as retryable: only a runner the OS refused to
start for a passing reason (then nothing ran). The OS's refusal is the edge faked here;
everything behind it (the tool, the runtime, the log) is real.
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest
import trio

import perdure
from perdure import RetryableError
from perdure.providers.scripted import ToolUse
from perdure.storage.records import ToolCompleted, ToolExecuting, ToolRetryPending
from perdure.tools import _bash
from perdure.tools.workspace import workspace_tools
from tests.tools._inproc import SESSION, provider
from tests.tools.test_workspace import ctx

BASH = {t.name: t for t in workspace_tools(include_bash=True)}["bash"]


def refuse_to_spawn(monkeypatch: pytest.MonkeyPatch, code: int) -> list[Any]:
    tried: list[Any] = []

    async def refused(*args: Any, **kwargs: Any) -> Any:
        tried.append(args)
        raise OSError(code, "refused by the test's OS")

    monkeypatch.setattr(trio.lowlevel, "open_process", refused)
    return tried


@pytest.mark.parametrize("code", sorted(_bash.TRANSIENT_SPAWN_ERRORS))
async def test_a_runner_the_os_could_not_start_now_is_retryable(
    workspace: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    tried = refuse_to_spawn(monkeypatch, code)
    with pytest.raises(RetryableError, match="the command was not started") as info:
        await BASH.invoke(ctx(workspace, "pdk_k1"), BASH.effective_args({"command": "true"}))
    assert tried, "the tool did try to start it"
    assert "Nothing ran" in info.value.message


async def test_any_other_failure_to_start_is_a_plain_error(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    refuse_to_spawn(monkeypatch, errno.EACCES)
    with pytest.raises(OSError, match="refused by the test") as info:
        await BASH.invoke(ctx(workspace, "pdk_k2"), BASH.effective_args({"command": "true"}))
    assert not isinstance(info.value, RetryableError)


async def test_a_failed_command_is_an_error_result_never_retryable(workspace: Path) -> None:
    result = await BASH.invoke(ctx(workspace, "pdk_k3"), BASH.effective_args({"command": "exit 7"}))
    assert result.is_error and result.content.startswith("exit status: 7")


async def test_the_runtime_hands_a_retryable_bash_failure_to_the_model_without_retrying(
    tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    refuse_to_spawn(monkeypatch, errno.EAGAIN)
    uses = [ToolUse("bash", {"command": "echo hi"})]
    async with perdure.open_runtime(
        tmp_path / "log", provider=provider(uses), tools=[BASH], workspace=workspace
    ) as rt:
        await rt.create_session(SESSION)
        await rt.submit(SESSION, "go", request_id="r1")
        with trio.fail_after(30):
            outcome = await rt.wait_idle(SESSION)
        log = [c.record for c in await rt._journal.read_session(SESSION)]
    assert outcome is not None and outcome.status == "completed"
    assert len([r for r in log if isinstance(r, ToolExecuting)]) == 1, "bash is NEVER"
    assert not [r for r in log if isinstance(r, ToolRetryPending)]
    (done,) = [r for r in log if isinstance(r, ToolCompleted)]
    assert done.is_error and "RetryableError: the command was not started" in done.output
