"""What ``perdure run`` and ``perdure serve`` share: turning options into a provider and tools.

``--provider anthropic`` (the default) needs ``ANTHROPIC_API_KEY``; ``--provider
openai`` (Chat Completions; ``openai:responses`` for the Responses API) needs
``OPENAI_API_KEY`` and ``--model``, and ``OPENAI_BASE_URL`` points it at an
OpenAI-compatible server. A vendor's module is imported only on its path, so the
scripted provider works without either SDK.
``--provider scripted:FILE`` replays a JSON script (see ``ScriptedProvider.from_file``).
``--tools MODULE:ATTR`` names a ``Tool`` or an iterable of tools, imported with the
current folder first on the import path (as uvicorn imports an app); without it the
built-in workspace tools are used when this build has them (``perdure run`` has the
ones that change files ask for approval first).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable
from typing import Any

from perdure.providers.base import Provider
from perdure.tools.contract import Tool

DEFAULT_TOOLS = "perdure.tools.workspace:TOOLS"


class SetupError(Exception):
    """A user-facing configuration problem; the message says how to fix it."""


def load_provider(spec: str, model: str | None = None) -> Provider:
    """``anthropic``, ``openai[:chat|:responses]`` or ``scripted:FILE`` -> a provider, or a
    ``SetupError`` in plain words."""
    if spec.startswith("scripted:"):
        from perdure.providers.scripted import ScriptedProvider, ScriptError

        path = spec.removeprefix("scripted:")
        if not path:
            raise SetupError("--provider scripted:FILE needs a file name after the colon")
        try:
            return ScriptedProvider.from_file(path)
        except ScriptError as exc:
            raise SetupError(str(exc)) from None
    if spec in ("openai", "openai:chat", "openai:responses"):
        return _openai(spec, model)
    if spec != "anthropic":
        raise SetupError(
            f"unknown provider {spec!r}: use 'anthropic', 'openai', 'openai:responses' "
            "or 'scripted:FILE'"
        )
    if not (os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("ANTHROPIC_AUTH_TOKEN")):
        raise SetupError(
            "the Anthropic provider needs an API key: export ANTHROPIC_API_KEY=sk-ant-... "
            "(or run without a model API: --provider scripted:FILE)"
        )
    return _from_env("perdure.providers.anthropic", "Anthropic", model)


def _openai(spec: str, model: str | None) -> Provider:
    if not os.environ.get("OPENAI_API_KEY"):
        raise SetupError(
            "the OpenAI provider needs an API key: export OPENAI_API_KEY=sk-... (and "
            "OPENAI_BASE_URL=http://host:port/v1 for an OpenAI-compatible server; one that "
            "checks no key still needs a placeholder), or run without a model API: "
            "--provider scripted:FILE"
        )
    if not model:
        raise SetupError(
            f"--provider {spec} needs --model: the model name (e.g. gpt-4.1, or the name "
            "your OpenAI-compatible server serves)"
        )
    api = "responses" if spec == "openai:responses" else "chat"
    return _from_env("perdure.providers.openai", "OpenAI", model, api=api)


def _from_env(module_name: str, vendor: str, model: str | None, **options: Any) -> Provider:
    """The vendor module's ``provider_from_env``, with its errors said as SetupError."""
    extra = " (pip install 'perdure[openai]')" if vendor == "OpenAI" else ""
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SetupError(
            f"the {vendor} provider is not available in this build ({exc}){extra}; "
            "use --provider scripted:FILE"
        ) from None
    try:
        provider: Provider = module.provider_from_env(model, **options)
    except Exception as exc:  # its own clear error (e.g. missing credentials)
        raise SetupError(str(exc)) from None
    return provider


def _resolve(spec: str) -> Any:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise SetupError(f"--tools {spec!r}: expected MODULE:ATTR, e.g. mypkg.tools:TOOLS")
    # As uvicorn does for its app: a module in the current folder can be named even
    # when the command was started from an installed script, whose folder is on the path.
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)
    try:
        value: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise SetupError(f"--tools {spec!r}: cannot import {module_name}: {exc}") from None
    for part in attr.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise SetupError(f"--tools {spec!r}: {module_name} has no {attr}") from None
    return value


def load_tools(specs: Iterable[str]) -> list[Tool]:
    """Every ``MODULE:ATTR`` resolved to tools (a Tool, or an iterable of Tools)."""
    tools: list[Tool] = []
    for spec in specs:
        value = _resolve(spec)
        found = [value] if isinstance(value, Tool) else value
        try:
            found = list(found)
        except TypeError:
            raise SetupError(f"--tools {spec!r} is neither a tool nor a list of tools") from None
        for t in found:
            if not isinstance(t, Tool):
                raise SetupError(f"--tools {spec!r}: {t!r} is not a @perdure.tool")
        tools.extend(found)
    return tools


def default_tools(*, ask_before_writes: bool = False) -> list[Tool]:
    """The built-in workspace tools when this build has them, else none.

    ``ask_before_writes`` makes the tools that change files ask for approval first
    (``perdure run`` does, as coding agents do: the model works on the user's folder).
    """
    try:
        if ask_before_writes:
            from perdure.tools.workspace import workspace_tools

            return list(workspace_tools(writes_require_approval=True))
        return load_tools([DEFAULT_TOOLS])
    except (ImportError, SetupError):
        return []
