"""The documentation's code runs, and its links lead somewhere.

Every Python block of README.md and docs/*.md is run by pytest-examples, in a fresh
temporary folder (the examples write their logs and files relative to the current
folder). A ``#> `` comment under a ``print`` is the output the block must print.

A block that cannot run on its own (it needs a daemon, a service, or names defined
elsewhere) is marked as a fragment by its fence: ```` ```python {test="fragment"} ````.
A fragment is compiled (top-level ``await`` and ``async with`` allowed) and its
imports are run, so a renamed or removed API still fails here; nothing else of it runs.

The link checks read every relative link and every backquoted repository path of the
README, the guides and bench/README.md, and check that the file (and the heading an
anchor names) exists.
"""

from __future__ import annotations

import ast
import json
import re
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
from pytest_examples import CodeExample, EvalExample, find_examples

import perdure
from perdure.providers import ScriptedProvider
from perdure.providers.base import ToolResultBlock

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md"]
EXAMPLES = list(find_examples(ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))))


def _run(run: Callable[[CodeExample], object], example: CodeExample) -> None:
    """Run an example; its exception becomes a plain test failure.

    pytest-examples rewrites an example's traceback so that it points at the Markdown
    lines, and on Python 3.11 pytest cannot render such a traceback: the report itself
    raises, and that INTERNALERROR would end the whole test session. So the failure is
    reported here as text, with the example's lines the rewritten traceback names.
    """
    __tracebackhide__ = True
    failure = None
    try:
        run(example)
    except Exception as exc:
        lines = []
        tb = exc.__traceback__
        while tb is not None:
            lines.append(f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}")
            tb = tb.tb_next
        detail = "".join(traceback.format_exception_only(exc)).strip()
        failure = f"{example}: {detail}\n  at " + "\n  at ".join(lines)
    if failure is not None:  # outside the handler: no chained exception for pytest to render
        pytest.fail(failure, pytrace=False)


def _is_fragment(example: CodeExample) -> bool:
    return example.prefix_settings().get("test") == "fragment"


def test_the_docs_have_python_blocks_to_run() -> None:
    # A change to the fence syntax or to the finder must not leave this file testing nothing.
    runnable = [e for e in EXAMPLES if not _is_fragment(e)]
    assert len(runnable) >= 3, [str(e) for e in EXAMPLES]
    assert any(e.path.name == "README.md" for e in runnable)


@pytest.mark.parametrize("example", EXAMPLES, ids=str)
def test_python_block(
    example: CodeExample,
    eval_example: EvalExample,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if _is_fragment(example):
        tree = compile(
            example.source,
            str(example),
            "exec",
            flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT,
            dont_inherit=True,
        )
        imports = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
        assert imports, f"{example}: a fragment with no import checks nothing"
        module = ast.Module(body=list(imports), type_ignores=[])
        exec(compile(module, str(example), "exec"), {})
        return
    # Formatted by black and linted by ruff from the repository's root, so that ruff reads
    # the project's settings (perdure is first-party); then run in an empty folder.
    monkeypatch.chdir(ROOT)
    eval_example.set_config(line_length=100, quotes="double", target_version="py310")
    eval_example.lint(example)
    monkeypatch.chdir(tmp_path)
    _run(eval_example.run_print_check, example)


def _quick_start() -> CodeExample:
    (example,) = [
        e
        for e in EXAMPLES
        if e.path.name == "README.md" and "def add_note" in e.source and not _is_fragment(e)
    ]
    return example


def test_quick_start_run_twice_runs_once_and_says_so(
    eval_example: EvalExample,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    example = _quick_start()
    _run(eval_example.run, example)
    first = capsys.readouterr().out
    assert "submitted before" not in first
    _run(eval_example.run, example)
    second = capsys.readouterr().out
    assert "'add-note' was submitted before" in second
    assert "completed Added the note" in second
    notes = (tmp_path / "perdure-quickstart" / "notes.md").read_text()
    assert notes == "- try perdure\n"  # one effect, whatever the number of runs

    async def tool_results() -> list[str]:
        async with perdure.open_runtime(
            tmp_path / "perdure-quickstart" / "log", provider=ScriptedProvider([])
        ) as rt:
            messages = await rt.transcript("notes")
        return [
            block.content
            for message in messages
            for block in message.content
            if isinstance(block, ToolResultBlock)
        ]

    # What the model was told: the note was added, and the count is right.
    assert trio.run(tool_results) == ["added", "1"]


def test_scripted_provider_example_script_loads(tmp_path: Path) -> None:
    text = (ROOT / "docs" / "PROVIDERS.md").read_text()
    section = text.split("## The scripted provider's script", 1)[1]
    script = re.search(r"```json\n(.*?)```", section, re.S)
    assert script is not None
    path = tmp_path / "script.json"
    path.write_text(script.group(1))
    provider = ScriptedProvider.from_file(path)
    assert [r.text for r in provider.replies][-1] == "Done: notes.md has the new line."
    assert provider.replies[1].fail_attempts == 1
    assert set(provider.by_system) == {"You summarise."}
    json.loads(script.group(1))  # plain JSON, as the section says


# -- links -------------------------------------------------------------------------------

_LINK = re.compile(r"\]\(([^)\s]+)\)")
_CODE_PATH = re.compile(r"`((?:perdure|tests|examples|bench|docs|\.ci)/[\w./-]+)`")
_FENCE = re.compile(r"^ *```.*?^ *```", re.M | re.S)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = _FENCE.sub("", path.read_text())
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_and_paths_exist(doc: Path) -> None:
    text = doc.read_text()
    problems = []
    prose = _FENCE.sub("", text)
    for target in _LINK.findall(prose):
        if re.match(r"[a-z]+:", target):  # https:, mailto: ...: not checked offline
            continue
        file_part, _, anchor = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if not dest.exists():
            problems.append(f"link to a missing file: {target}")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            problems.append(f"link to a missing heading: {target}")
    for path in _CODE_PATH.findall(prose):
        # Files only (a name with a suffix): `perdure/idempotency-key` is a metadata key.
        if any(ch in path for ch in "*<>{}") or "." not in path.rsplit("/", 1)[-1]:
            continue
        if not (ROOT / path).exists():
            problems.append(f"a path that does not exist: {path}")
    assert not problems, f"{doc.relative_to(ROOT)}: " + "; ".join(problems)


def test_json_blocks_parse() -> None:
    blocks = [
        (doc, m.group(1))
        for doc in DOCS
        for m in re.finditer(r"^ *```json\n(.*?)^ *```", doc.read_text(), re.S | re.M)
    ]
    assert blocks
    for doc, block in blocks:  # a config or a script the reader copies must be valid JSON
        try:
            json.loads(block)
        except ValueError as exc:
            pytest.fail(f"{doc.relative_to(ROOT)}: a JSON block does not parse: {exc}")


def test_commands_named_in_the_docs_exist() -> None:
    from perdure.cli import main

    named = {
        (doc.relative_to(ROOT), command)
        for doc in DOCS
        for command in re.findall(r"`perdure ([a-z][a-z-]*)", doc.read_text())
    }
    assert named
    missing = sorted(
        f"{doc}: perdure {command}" for doc, command in named if command not in main.commands
    )
    assert not missing


def test_slugs_follow_github() -> None:
    assert _slug("4. Recovery") == "4-recovery"
    conformance = "Check your tools: `perdure conformance`"
    assert _slug(conformance) == "check-your-tools-perdure-conformance"
    assert _slug("Frontends: the AI SDK and AG-UI") == "frontends-the-ai-sdk-and-ag-ui"
