"""The guards of three promises kept by the shells, run against the mutant that breaks each.

The mutation campaign mutates the pure core only. These promises live in the shells,
where each was once broken by a change that passed every test (docs/RELIABILITY.md,
"Mutation testing"); here each change is rebuilt (a function of the shell replaced by
its mutant, in this process) and the test that now guards the promise must fail
against it, after passing against the real code. The fourth promise of that table (a
paused session stays paused across a restart) is proven in a child process, where no
mutant of this process reaches.
"""

from __future__ import annotations
import __future__

import inspect
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from perdure import embed, retention
from perdure.actors import conversation
from tests.embed import test_cancellation
from tests.runtime import test_agent_dependency, test_render_growth


def failed(guard: Callable[[], None]) -> BaseException | None:
    """What ``guard`` failed with (an assertion, pytest's failure), or None if it passed."""
    try:
        guard()
    except (AssertionError, pytest.fail.Exception) as exc:
        return exc
    except BaseExceptionGroup as group:
        found = group.subgroup(lambda e: isinstance(e, AssertionError | pytest.fail.Exception))
        if found is None:
            raise
        return found
    return None


def test_rendering_the_whole_history_on_every_model_call_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def guard() -> None:
        trio.run(
            test_render_growth.test_each_model_call_renders_only_the_turns_added_since_the_last
        )

    assert failed(guard) is None
    real = conversation.request

    def uncached(*args: Any, **kwargs: Any) -> Any:
        args = args[:4]  # the session actor's MessageCache, dropped
        kwargs.pop("cache", None)
        return real(*args, **kwargs)

    monkeypatch.setattr(conversation, "request", uncached)
    assert failed(guard) is not None


def test_a_dependency_check_that_finds_none_is_caught(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    runs = iter(range(2))

    def guard() -> None:
        log_dir = tmp_path / f"log{next(runs)}"
        trio.run(test_agent_dependency.test_a_child_is_kept_while_its_parent_call_waits, log_dir)

    assert failed(guard) is None

    async def no_dependency(journal: Any, session_id: str) -> str | None:
        return None

    monkeypatch.setattr(retention, "dependency", no_dependency)
    assert failed(guard) is not None


def test_an_asyncio_cancel_that_leaves_the_trio_task_running_is_caught(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    runs = iter(range(2))

    def guard() -> None:
        test_cancellation.test_a_cancelled_call_cancels_its_trio_task(
            "thread", tmp_path / f"run{next(runs)}"
        )

    assert failed(guard) is None
    line = "self.to_trio(scope.cancel)"
    source = textwrap.dedent(inspect.getsource(embed._Portal.call))
    assert source.count(line) == 1, "_Portal.call no longer cancels this way"
    mutated = source.replace(line, "pass  # the trio task is left running")
    namespace = dict(vars(embed))
    flags = __future__.annotations.compiler_flag
    exec(compile(mutated, embed.__file__, "exec", flags=flags), namespace)
    monkeypatch.setattr(embed._Portal, "call", namespace["call"])
    monkeypatch.setattr(test_cancellation, "WAIT", 1.0)  # its note never comes: wait less
    assert failed(guard) is not None
