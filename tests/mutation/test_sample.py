"""A sample of the mutation campaign that CI can afford: known mutants must be killed.

The whole campaign (``mutmut run``, docs/RELIABILITY.md) takes too long for CI. This
test keeps its most important findings from regressing: each row below is a change
of the core that once passed every test (an audit of the tests found them), rebuilt
here by editing one line of the function's source, and the test that now guards the
promise must fail against it. A row whose line no longer exists fails too, so a
rewrite of the core has to carry its sample along.
"""

from __future__ import annotations
import __future__

import importlib
import inspect
import textwrap
import tomllib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from perdure.actors import decide
from perdure.storage.records import ToolOutcomeUnknown
from perdure.tools import params
from tests.core import (
    test_commands,
    test_decide,
    test_failure_rows,
    test_held_and_gathered,
    test_session_control,
)
from tests.tools import test_params

DOORS = ("verbs", "advancing", "recovery", "results", "commands", "forks", "settling")


def home_of(where: str) -> tuple[ModuleType, str]:
    """``"recovery._recover_executing"`` -> the module of the decide package, the name."""
    door, name = where.split(".")
    return importlib.import_module(f"perdure.actors.decide.{door}"), name


def mutant_of(where: str, line: str, replacement: str) -> Callable[..., Any]:
    """The function ``where`` names with ``line`` (which must occur once) replaced."""
    module, name = home_of(where)
    source = textwrap.dedent(inspect.getsource(getattr(module, name)))
    assert source.count(line) == 1, f"{where} no longer contains {line!r}"
    namespace = dict(vars(module))
    flags = __future__.annotations.compiler_flag
    exec(
        compile(source.replace(line, replacement), module.__file__ or where, "exec", flags=flags),
        namespace,
    )
    mutant: Callable[..., Any] = namespace[name]
    return mutant


SAMPLE: list[tuple[str, str, str, Callable[[], None]]] = [
    (  # recovery ignores the RECORDED policy: a call recorded NEVER re-run because SAFE now
        "recovery._recover_executing",
        "if recorded.replayable and tool.replay.replayable and still_fits:",
        "if tool.replay.replayable and still_fits:",
        test_decide.test_recover_never_re_runs_a_call_recorded_never_even_if_its_tool_is_safe_now,
    ),
    (  # a NEVER tool's timeout reported as a plain error, not an unknown outcome
        "results._tool_outcome",
        'elif msg.outcome == "timeout" and never:',
        "elif False:",
        lambda: test_decide.test_a_timeout_is_an_unknown_outcome_only_for_a_never_tool(
            "send", {"text": "hi"}, ToolOutcomeUnknown
        ),
    ),
    (  # a constant fingerprint
        "verbs.fingerprint",
        "return hashlib.sha256(canonical.encode()).hexdigest()[:32]",
        'return "0" * 32',
        test_decide.test_the_fingerprint_names_the_tool_its_definition_and_the_arguments,
    ),
    (  # a tool's retry-after ignored by its back-off
        "results._retry_failed_attempt",
        "wait = policy.delay(msg.attempt, msg.jitter, msg.retry_after)",
        "wait = policy.delay(msg.attempt, msg.jitter)",
        test_failure_rows.test_a_retry_after_of_the_tool_is_honoured_by_its_back_off,
    ),
    (  # an automatic compensation recorded under the old revision
        "commands._compensate",
        "goal_rev=s.goal_rev if goal_rev is None else goal_rev,",
        "goal_rev=s.goal_rev,",
        test_commands.test_an_automatic_compensation_interrupted_by_a_crash_is_re_run_not_superseded,
    ),
    (  # a paused session dispatches an approved call (the campaign of 2026-12-02)
        "advancing.advance",
        "if not (s.paused or view.draining):",
        "if not (s.paused and view.draining):",
        test_held_and_gathered.test_an_approval_given_while_paused_runs_the_call_only_on_resume,
    ),
    (  # a fork at an interrupted run taken at the end of whatever run finished last
        "forks.fork_position",
        "if r.submission_id == end.submission_id and r.status in FINAL_RUN_STATUSES",
        "if r.status in FINAL_RUN_STATUSES",
        test_session_control.test_a_fork_at_an_interrupted_run_is_taken_at_the_end_of_the_run_that_resumed_it,
    ),
]


@pytest.mark.parametrize(
    ("where", "line", "replacement", "guard"), SAMPLE, ids=[row[0] for row in SAMPLE]
)
def test_the_guard_of_each_sampled_promise_kills_its_mutant(
    monkeypatch: pytest.MonkeyPatch,
    where: str,
    line: str,
    replacement: str,
    guard: Callable[[], None],
) -> None:
    guard()  # the guard passes on the real core
    module, name = home_of(where)
    original = getattr(module, name)
    mutant = mutant_of(where, line, replacement)
    # Every module of the package that holds the function (its home, the doors that
    # import it, the face), and every table that holds it, gets the mutant.
    for door in (decide, *(importlib.import_module(f"perdure.actors.decide.{d}") for d in DOORS)):
        if getattr(door, name, None) is original:
            monkeypatch.setattr(door, name, mutant)
    tables = (decide.COMMANDS, decide.RESULTS, decide.IF_BUSY, decide.ADVANCE, decide.RECOVER)
    for table in tables:
        for kind, handler in list(table.items()):
            if handler is original:
                monkeypatch.setitem(table, kind, mutant)
    with pytest.raises(AssertionError):
        guard()


def test_every_equivalent_mutant_is_named_with_its_reason() -> None:
    from tests.mutation.score import load_equivalent

    reasons = load_equivalent()
    assert reasons, "the list of equivalent mutants is read"
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    mutated = tomllib.loads(pyproject.read_text())["tool"]["mutmut"]["only_mutate"]
    prefixes = tuple(path.removesuffix(".py").replace("/", ".") + ".x" for path in mutated)
    for name, why in reasons.items():
        assert name.startswith(prefixes), f"{name} names no file of the campaign"
        assert "__mutmut_" in name and len(why) > 20, name


# -- the tools' parameters (perdure.tools.params) -----------------------------------------------

TOOL_SAMPLE: list[tuple[str, str, str, Callable[[], None]]] = [
    (  # the model's arguments not validated: a wrong call would be executed
        "problems",
        "self.model.model_validate(args)",
        "pass",
        test_decide.test_unknown_tool_and_invalid_arguments_become_error_results_not_crashes,
    ),
    (  # the tool handed the model's JSON instead of converted values
        "convert",
        "alias: getattr(validated, field)",
        "alias: args[alias]",
        test_params.test_a_signature_gives_the_schema_the_description_and_the_conversion,
    ),
]


@pytest.mark.parametrize(
    ("name", "line", "replacement", "guard"), TOOL_SAMPLE, ids=[row[0] for row in TOOL_SAMPLE]
)
def test_the_guard_of_each_sampled_tool_promise_kills_its_mutant(
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    line: str,
    replacement: str,
    guard: Callable[[], None],
) -> None:
    guard()  # the guard passes on the real code
    source = textwrap.dedent(inspect.getsource(getattr(params.Parameters, name)))
    assert source.count(line) == 1, f"Parameters.{name} no longer contains {line!r}"
    namespace = dict(vars(params))
    flags = __future__.annotations.compiler_flag
    exec(
        compile(source.replace(line, replacement), params.__file__, "exec", flags=flags), namespace
    )
    monkeypatch.setattr(params.Parameters, name, namespace[name])
    with pytest.raises(AssertionError):
        guard()
