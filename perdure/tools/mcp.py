"""MCP servers as perdure tools, with the same crash semantics as a native ``@tool``.

``McpServer.stdio(...)`` / ``McpServer.http(...)`` describe a server;
``open_runtime(..., mcp_servers=[...])`` connects each one (with the official ``mcp``
SDK, an extra: ``pip install 'perdure[mcp]'``) before recovery runs, lists its tools
and registers each as a perdure ``Tool`` named ``<server>__<tool>``. The runtime owns
the connections: a server that dies, disconnects or writes something that is not
MCP is reconnected with back-off, and a call made while it is down is retried (SAFE,
KEYED) or an ``is_error`` result that says so; the session goes on.

What a crash does to a call follows from the replay policy each tool gets:

* an untrusted server (the default): every tool is NEVER, whatever its hints say
  (the MCP spec: hints from an untrusted server must not drive decisions);
* ``trust_annotations=True``: ``readOnlyHint`` -> SAFE; else ``idempotentHint`` ->
  KEYED (the idempotency key travels in the request's ``_meta`` as
  ``perdure/idempotency-key``, so the server can deduplicate); else NEVER; and a
  non-read-only tool that is destructive (``destructiveHint``, true by default)
  waits for a person's approval;
* ``overrides={"tool": {"replay": ..., "requires_approval": ..., "timeout": ...,
  "reconcile": ...}}`` always win.

The reason for each tool's policy is recorded in every ``ToolExecuting`` of its calls.
A connection lost in the middle of a call of a NEVER tool is an unknown outcome
(``OutcomeUnknown``): the request may have taken effect; a SAFE or KEYED call is
retried with the same key (``RetryableError``, by the server's ``retry`` policy).

This module is an edge: it depends on the tool contract, never on the actors. The
``mcp`` SDK is imported here only, and this module only when servers are configured.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import re
import sys
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from os import PathLike
from typing import Any, Literal, TextIO

import httpx2
import jsonschema  # type: ignore[import-untyped]
import mcp.types as mt
import trio
from attrs import field, frozen
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from perdure.errors import find_exception
from perdure.tools.contract import (
    OutcomeUnknown,
    ReconcileFn,
    ReplayPolicy,
    RetryableError,
    RetryPolicy,
    Tool,
    ToolContext,
    ToolResult,
)

log = logging.getLogger("perdure.mcp")

IDEMPOTENCY_META_KEY = "perdure/idempotency-key"
"""The ``_meta`` key of every ``tools/call`` request that carries the call's idempotency key."""

SEPARATOR = "__"
_NAME_LIMIT = 64  # Anthropic's and OpenAI's limit on a tool name
_SERVER_NAME = re.compile(r"^[A-Za-z0-9-]+(_[A-Za-z0-9-]+)*$")
_NOT_NAME_CHAR = re.compile(r"[^A-Za-z0-9_-]")
_OVERRIDE_KEYS = frozenset({"replay", "requires_approval", "timeout", "reconcile"})


class McpStartError(Exception):
    """An MCP server could not be connected or listed at start, or its tools' names collide."""


def _check_server_name(instance: Any, attribute: Any, value: Any) -> None:
    if not isinstance(value, str) or len(value) > 32 or not _SERVER_NAME.match(value):
        raise ValueError(
            f"an MCP server name must be 1-32 letters, digits, '-' or single '_' "
            f"(its tools are named <server>__<tool>), not {value!r}"
        )


def _check_overrides(instance: Any, attribute: Any, value: Any) -> None:
    if not isinstance(value, Mapping):
        raise TypeError(f"overrides must map tool names to dicts, not {value!r}")
    for tool_name, options in value.items():
        if not isinstance(options, Mapping):
            raise TypeError(f"overrides[{tool_name!r}] must be a dict, not {options!r}")
        unknown = set(options) - _OVERRIDE_KEYS
        if unknown:
            raise ValueError(
                f"overrides[{tool_name!r}]: unknown option(s) {sorted(unknown)} "
                f"(known: {sorted(_OVERRIDE_KEYS)})"
            )
        if "replay" in options:
            _replay(options["replay"], f"overrides[{tool_name!r}]['replay']")
        timeout = options.get("timeout")
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not 0 < timeout < math.inf
        ):
            raise ValueError(f"overrides[{tool_name!r}]['timeout'] must be seconds > 0 or None")


def _replay(value: Any, where: str) -> ReplayPolicy:
    if isinstance(value, ReplayPolicy):
        return value
    try:
        return ReplayPolicy(str(value).lower())
    except ValueError:
        raise ValueError(f"{where} must be safe, keyed or never, not {value!r}") from None


def _positive(instance: Any, attribute: Any, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise ValueError(f"McpServer.{attribute.name} must be a number > 0, not {value!r}")


@frozen(kw_only=True)
class McpServer:
    """One MCP server the runtime connects to. Build it with ``stdio`` or ``http``."""

    name: str = field(validator=_check_server_name)
    transport: Literal["stdio", "http"]
    command: str = ""
    args: tuple[str, ...] = ()
    # Often secrets (API keys, bearer tokens): kept out of repr, logs and errors.
    env: Mapping[str, str] | None = field(default=None, repr=False)
    cwd: str | None = None
    url: str = ""
    headers: Mapping[str, str] | None = field(default=None, repr=False)
    trust_annotations: bool = False
    overrides: Mapping[str, Mapping[str, Any]] = field(factory=dict, validator=_check_overrides)
    timeout: float | None = field(default=300.0)  # per call, unless overridden; None: none
    connect_timeout: float = field(default=30.0, validator=_positive)
    max_result_chars: int = field(default=100_000, validator=_positive)
    # How SAFE and KEYED calls cut off by a lost connection (or made while the server
    # is down) are retried, with the same key; None: the model reads the error (a KEYED
    # call cut off is then an unknown outcome). Timeouts are not retried.
    retry: RetryPolicy | None = field(
        # 5 attempts over about 8-15 s: room for a stdio server to be started again
        factory=lambda: RetryPolicy(max_attempts=5, initial=1.0, retry_timeouts=False)
    )
    backoff_initial: float = field(default=0.5, validator=_positive)
    backoff_max: float = field(default=30.0, validator=_positive)
    probe_interval: float = field(default=5.0, validator=_positive)
    errlog: TextIO | None = None  # where a stdio server's stderr goes (default: ours)

    @timeout.validator
    def _check_timeout(self, attribute: Any, value: Any) -> None:
        if value is not None:
            _positive(self, attribute, value)

    @classmethod
    def stdio(
        cls,
        name: str,
        command: str,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        **options: Any,
    ) -> McpServer:
        """A server run as a subprocess and spoken to over its stdin/stdout."""
        if not command:
            raise ValueError(f"MCP server {name!r}: command is required")
        return cls(
            name=name,
            transport="stdio",
            command=command,
            args=tuple(args),
            env=dict(env) if env is not None else None,
            cwd=None if cwd is None else str(cwd),
            **options,
        )

    @classmethod
    def http(
        cls, name: str, url: str, headers: Mapping[str, str] | None = None, **options: Any
    ) -> McpServer:
        """A server reached over streamable HTTP at ``url``."""
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"MCP server {name!r}: url must be http(s)://..., not {url!r}")
        headers = dict(headers) if headers is not None else None
        return cls(name=name, transport="http", url=url, headers=headers, **options)


# -- configuration files ---------------------------------------------------------------


class McpConfigError(ValueError):
    """An ``--mcp-config`` file that cannot be used; the message names the place."""


_CONFIG_KEYS = frozenset(
    {"command", "args", "env", "cwd", "url", "headers", "type", "trustAnnotations", "tools"}
)
_TOOL_KEYS = {"replay": "replay", "requiresApproval": "requires_approval", "timeout": "timeout"}


def load_config(path: str | PathLike[str]) -> list[McpServer]:
    """The servers of a ``{"mcpServers": {name: {...}}}`` file (the desktop agents' shape).

    A server is ``{"command", "args", "env", "cwd"}`` (stdio) or ``{"url", "headers"}``
    (streamable HTTP); perdure's keys sit beside them: ``trustAnnotations`` (bool) and
    ``tools: {tool: {replay, requiresApproval, timeout}}`` (overrides).
    """
    where = str(path)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as exc:
        raise McpConfigError(f"{where}: cannot read it: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise McpConfigError(f"{where}: not valid JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("mcpServers"), dict):
        raise McpConfigError(f'{where}: expected {{"mcpServers": {{name: {{...}}}}}}')
    return [_server_of(where, name, spec) for name, spec in data["mcpServers"].items()]


def _server_of(where: str, name: str, spec: Any) -> McpServer:
    at = f"{where}: mcpServers.{name}"
    if not isinstance(spec, dict):
        raise McpConfigError(f"{at}: expected an object, not {spec!r}")
    unknown = set(spec) - _CONFIG_KEYS
    if unknown:
        raise McpConfigError(f"{at}: unknown key(s) {sorted(unknown)}")
    trust = spec.get("trustAnnotations", False)
    if not isinstance(trust, bool):
        raise McpConfigError(f"{at}.trustAnnotations: expected true or false, not {trust!r}")
    overrides: dict[str, dict[str, Any]] = {}
    tools = spec.get("tools", {})
    if not isinstance(tools, dict):
        raise McpConfigError(f"{at}.tools: expected an object of tool names")
    for tool, options in tools.items():
        if not isinstance(options, dict) or set(options) - set(_TOOL_KEYS):
            raise McpConfigError(f"{at}.tools.{tool}: expected an object with {sorted(_TOOL_KEYS)}")
        overrides[tool] = {_TOOL_KEYS[k]: v for k, v in options.items()}
    try:
        if "command" in spec:
            if "url" in spec:
                raise ValueError("give either command (stdio) or url (HTTP), not both")
            args, env = spec.get("args", []), spec.get("env")
            if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
                raise ValueError("args must be a list of strings")
            if env is not None and not _str_map(env):
                raise ValueError("env must map names to strings")
            return McpServer.stdio(
                name,
                str(spec["command"]),
                args,
                env=env,
                cwd=spec.get("cwd"),
                trust_annotations=trust,
                overrides=overrides,
            )
        if "url" in spec:
            headers = spec.get("headers")
            if headers is not None and not _str_map(headers):
                raise ValueError("headers must map names to strings")
            return McpServer.http(
                name, str(spec["url"]), headers, trust_annotations=trust, overrides=overrides
            )
        raise ValueError("needs command (stdio) or url (streamable HTTP)")
    except (TypeError, ValueError) as exc:
        raise McpConfigError(f"{at}: {exc}") from None


def _str_map(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


# -- policy ---------------------------------------------------------------------------


@frozen
class Policy:
    """The replay policy and approval one MCP tool gets, and why."""

    replay: ReplayPolicy
    requires_approval: bool | Callable[[dict[str, Any]], bool]
    timeout: float | None
    reconcile: ReconcileFn | None
    reason: str


def policy_for(
    annotations: mt.ToolAnnotations | None,
    *,
    trusted: bool,
    override: Mapping[str, Any] | None = None,
    default_timeout: float | None = None,
) -> Policy:
    """The policy table of docs/MCP.md, row by row."""
    hints = annotations or mt.ToolAnnotations()
    # The spec's defaults: not read-only, destructive, not idempotent.
    read_only = bool(hints.read_only_hint) if hints.read_only_hint is not None else False
    destructive = bool(hints.destructive_hint) if hints.destructive_hint is not None else True
    idempotent = bool(hints.idempotent_hint) if hints.idempotent_hint is not None else False
    if not trusted:
        replay, approval = ReplayPolicy.NEVER, False
        reason = "untrusted server: annotations ignored, never re-run"
    elif read_only:
        replay, approval = ReplayPolicy.SAFE, False
        reason = "trusted annotations: readOnlyHint"
    else:
        replay = ReplayPolicy.KEYED if idempotent else ReplayPolicy.NEVER
        approval = destructive
        said = "idempotentHint" if idempotent else "not read-only, not idempotent"
        reason = f"trusted annotations: {said}" + (
            ", destructive: needs approval" if destructive else ", not destructive"
        )
    timeout, reconcile = default_timeout, None
    if override:
        changed = []
        if "replay" in override:
            replay = _replay(override["replay"], "replay")
            changed.append(f"replay={replay.value}")
        if "requires_approval" in override:
            approval = override["requires_approval"]
            changed.append(
                f"requires_approval={approval}" if isinstance(approval, bool) else "approval policy"
            )
        if "timeout" in override:
            timeout = override["timeout"]
        if "reconcile" in override:
            reconcile = override["reconcile"]
            changed.append("reconcile")
        if changed:
            reason = f"override: {', '.join(changed)} (else {reason})"
    return Policy(replay, approval, timeout, reconcile, reason)


# -- names, schemas, results -----------------------------------------------------------


def tool_name(server: str, tool: str) -> str:
    """The model-visible name of ``tool`` of ``server``: ``<server>__<tool>``.

    Characters outside ``[A-Za-z0-9_-]`` become ``_``; a name past 64 characters is
    cut and ends with a hash of the original, so every provider accepts it.
    """
    name = f"{server}{SEPARATOR}{_NOT_NAME_CHAR.sub('_', tool)}"
    if len(name) <= _NAME_LIMIT:
        return name
    digest = hashlib.sha256(tool.encode()).hexdigest()[:8]
    return f"{name[: _NAME_LIMIT - 9]}_{digest}"


def _schema_problem(schema: Any) -> str | None:
    """Why ``schema`` is not a usable input schema (None if it is)."""
    if not isinstance(schema, dict):
        return f"its inputSchema is not a JSON object: {schema!r}"
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        return f"its inputSchema is not valid JSON Schema: {exc.message}"
    if schema.get("type", "object") != "object":
        return f"its inputSchema must describe an object, not {schema.get('type')!r}"
    return None


def _validator(schema: dict[str, Any]) -> Callable[[dict[str, Any]], list[str]]:
    checker = jsonschema.validators.validator_for(schema)(schema)

    def check(args: dict[str, Any]) -> list[str]:
        problems = []
        for error in sorted(checker.iter_errors(args), key=lambda e: list(e.absolute_path)):
            where = ".".join(str(p) for p in error.absolute_path) or "arguments"
            problems.append(f"{where}: {error.message}")
        return problems

    return check


def definition_hash(tool: mt.Tool, policy: Policy) -> str:
    """What recovery compares: the tool's name, description, schema, annotations and policy."""
    annotations = tool.annotations.model_dump(by_alias=True) if tool.annotations else None
    definition = {
        "name": tool.name,
        "description": tool.description or "",
        "schema": tool.input_schema,
        "annotations": annotations,
        "replay": policy.replay.value,
        "approval": policy.requires_approval
        if isinstance(policy.requires_approval, bool)
        else "policy",
    }
    encoded = json.dumps(definition, sort_keys=True, default=str).encode()
    return hashlib.sha256(encoded).hexdigest()[:16]


def render_call_result(result: mt.CallToolResult, limit: int) -> ToolResult:
    """What the model reads of a ``CallToolResult``: text, structured content, summaries."""
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, mt.TextContent):
            parts.append(block.text)
        elif isinstance(block, mt.ImageContent | mt.AudioContent):
            kind = "image" if isinstance(block, mt.ImageContent) else "audio"
            size = len(block.data) * 3 // 4 - block.data[-2:].count("=")
            parts.append(f"[{kind} content: {block.mime_type}, about {size} bytes, not shown]")
        elif isinstance(block, mt.EmbeddedResource):
            res = block.resource
            if isinstance(res, mt.TextResourceContents):
                parts.append(f"[resource {res.uri}]\n{res.text}")
            else:
                parts.append(f"[binary resource {res.uri} ({res.mime_type}), not shown]")
        elif isinstance(block, mt.ResourceLink):
            parts.append(f"[resource link: {block.uri}]")
        else:
            parts.append(f"[{getattr(block, 'type', type(block).__name__)} content, not shown]")
    if result.structured_content is not None:
        structured = json.dumps(result.structured_content, ensure_ascii=False, default=str)
        # Servers usually repeat structured content as a JSON text block, and the SDK wraps
        # a plain return value as {"result": value} beside its text: don't say it twice.
        value = result.structured_content
        wrapped = list(value) == ["result"] and value["result"] == "\n".join(parts)
        if not wrapped and not any(_same_json(p, value) for p in parts):
            parts.append(structured)
    text = "\n".join(parts)
    if len(text) > limit:
        text = (
            text[:limit] + f"\n[truncated: the result had {len(text)} characters; "
            f"the first {limit} are shown]"
        )
    return ToolResult(text, is_error=bool(result.is_error))


def _same_json(text: str, value: Any) -> bool:
    try:
        return bool(json.loads(text) == value)
    except ValueError:
        return False


def _shape(tool: mt.Tool) -> str:
    return json.dumps(tool.model_dump(mode="json", by_alias=True), sort_keys=True)


def _first_line(exc: BaseException) -> str:
    return _describe(exc).splitlines()[0][:300]


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return _describe(exc.exceptions[0])
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# -- the connection ---------------------------------------------------------------------


class _Lost(Exception):
    """The connection broke while a call was in flight (or its reply was garbage)."""


class McpConnection:
    """One server's connection, owned by the runtime: connect, list, watch, reconnect."""

    def __init__(self, server: McpServer, *, seed: int | None = None) -> None:
        self.server = server
        self.client: Client | None = None
        self.listed: list[mt.Tool] = []
        self.connects = 0  # successful connections so far (a reconnect adds one)
        self.last_error = ""
        self._broken = trio.Event()
        self._garbled: str | None = None  # what the server wrote that was not MCP, if any
        self._changed = trio.Event()  # set (and replaced) on every connect and disconnect
        self._rng = random.Random(seed)

    @property
    def up(self) -> bool:
        return self.client is not None

    async def wait_connects(self, n: int) -> None:
        """Wait until the server has been connected ``n`` times in all (tests, status)."""
        while self.connects < n or not self.up:
            await self._changed.wait()

    def _flip(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    @asynccontextmanager
    async def _open(self) -> AsyncIterator[Client]:
        s = self.server
        if s.transport == "stdio":
            params = StdioServerParameters(
                command=s.command, args=list(s.args), env=dict(s.env or {}) or None, cwd=s.cwd
            )
            from mcp.client.stdio import stdio_client

            transport = stdio_client(params, errlog=s.errlog or _stderr())
            async with Client(transport, cache=None, message_handler=self._on_message) as client:
                yield client
        else:
            timeout = httpx2.Timeout(s.connect_timeout, read=None)
            async with (
                httpx2.AsyncClient(headers=dict(s.headers or {}), timeout=timeout) as http,
                Client(
                    streamable_http_client(s.url, http_client=http),
                    cache=None,
                    message_handler=self._on_message,
                ) as client,
            ):
                yield client

    async def _list(self, client: Client) -> list[mt.Tool]:
        tools: list[mt.Tool] = []
        cursor: str | None = None
        with trio.fail_after(self.server.connect_timeout):
            while True:
                page = await client.list_tools(cursor=cursor)
                tools.extend(page.tools)
                cursor = page.next_cursor
                if cursor is None:
                    return tools

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep the server connected until cancelled; started once its tools are listed."""
        started = False
        delay = self.server.backoff_initial
        while True:
            # The handshake and first listing must finish in connect_timeout; the scope
            # wraps the whole connection so that the SDK's task groups nest inside it.
            with trio.CancelScope(deadline=trio.current_time() + self.server.connect_timeout) as hs:
                try:
                    async with self._open() as client:
                        listed = await self._list(client)
                        if started:
                            self._relisted(listed)
                        else:
                            self.listed = listed
                        hs.deadline = math.inf
                        self._broken = trio.Event()
                        self._garbled = None
                        self.client = client
                        self.connects += 1
                        self._flip()
                        if not started:
                            started = True
                            task_status.started()
                        else:
                            log.info("MCP server %r reconnected", self.server.name)
                        delay = self.server.backoff_initial
                        try:
                            await self._watch(client)
                        finally:
                            self.client = None
                            self._flip()
                except Exception as exc:
                    self._failed(exc, started)
            if hs.cancelled_caught:
                self._failed(trio.TooSlowError(), started)
            wait = delay * (0.5 + self._rng.random() / 2)
            log.warning(
                "MCP server %r is down (%s); reconnecting in %.1fs",
                self.server.name,
                self.last_error,
                wait,
            )
            await trio.sleep(wait)
            delay = min(self.server.backoff_max, delay * 2)

    def _failed(self, exc: BaseException, started: bool) -> None:
        if isinstance(exc, trio.TooSlowError):
            self.last_error = f"no answer within {self.server.connect_timeout:g}s" + (
                f"; it {self._garbled}" if self._garbled else ""
            )
        else:
            self.last_error = _describe(exc)
        if not started:
            where = self.server.command if self.server.transport == "stdio" else self.server.url
            raise McpStartError(
                f"MCP server {self.server.name!r} ({where}) could not be started: {self.last_error}"
            ) from exc

    async def _watch(self, client: Client) -> None:
        """Return when the connection is broken: a call saw it, or a probe failed."""
        while True:
            with trio.move_on_after(self.server.probe_interval):
                await self._broken.wait()
                return
            try:
                self._relisted(await self._list(client))
            except Exception as exc:
                self.last_error = f"probe failed: {_describe(exc)}"
                return

    def _relisted(self, tools: list[mt.Tool]) -> None:
        """A later listing: the registry is fixed at start, so a change is only said."""
        before = {t.name: _shape(t) for t in self.listed}
        after = {t.name: _shape(t) for t in tools}
        if before != after:
            names = before.keys() | after.keys()
            changed = sorted(n for n in names if before.get(n) != after.get(n))
            log.warning(
                "MCP server %r changed its tools since they were listed (%s); perdure keeps "
                "the tools it registered at start: restart the runtime to take the change",
                self.server.name,
                ", ".join(changed),
            )
        self.listed = tools

    async def call(
        self, name: str, args: dict[str, Any], ctx: ToolContext
    ) -> mt.CallToolResult | str:
        """The server's result, or why the call was not sent (a str); ``_Lost`` if cut off."""
        client = self.client
        if client is None:
            return (
                f"MCP server {self.server.name!r} is down ({self.last_error or 'not connected'}); "
                "perdure is reconnecting. The call was not sent; try again later."
            )
        meta: dict[str, Any] = {IDEMPOTENCY_META_KEY: ctx.idempotency_key}
        garbled = self._garbled
        try:
            return await client.call_tool(name, args, meta=meta)  # type: ignore[arg-type]
        except MCPError as exc:
            if exc.code != mt.CONNECTION_CLOSED:
                raise
            if self._garbled is not garbled and self._garbled is not None:
                # The connection was dropped because the server wrote garbage meanwhile.
                raise _Lost(f"MCP server {self.server.name!r} {self._garbled}") from exc
            self.last_error = "the connection closed"
            self._broken.set()
            raise _Lost(f"the connection to MCP server {self.server.name!r} closed") from exc
        except Exception as exc:  # a reply the SDK could not read: the connection is suspect
            self.last_error = f"sent a reply that could not be read ({_first_line(exc)})"
            self._broken.set()
            raise _Lost(f"MCP server {self.server.name!r} {self.last_error}") from exc

    async def _on_message(self, message: Any) -> None:
        """A server notification (ignored), or something on the wire that is not MCP."""
        if isinstance(message, Exception):
            # The stream is out of step: whatever is in flight may never be answered.
            # Drop the connection (its calls fail by their policy) and start again.
            self._garbled = f"sent something that is not MCP ({_first_line(message)})"
            self.last_error = self._garbled
            log.error("MCP server %r %s; reconnecting", self.server.name, self._garbled)
            self._broken.set()


def _stderr() -> TextIO:
    """Where a stdio server's stderr goes: ours, if it is a real file (not under a capture)."""
    for stream in (sys.stderr, sys.__stderr__):
        try:
            if stream is not None:
                stream.fileno()
                return stream
        except (AttributeError, OSError, ValueError):
            continue
    return open(os.devnull, "w")  # lives as long as the process


# -- tools --------------------------------------------------------------------------------


@frozen
class McpToolInfo:
    """One listed tool as perdure sees it (``perdure tools --mcp-config`` prints these)."""

    server: str
    mcp_name: str
    name: str  # the model-visible name
    policy: Policy | None
    problem: str | None = None  # why it is not registered (None if it is)


def describe_tools(server: McpServer, listed: Iterable[mt.Tool]) -> list[McpToolInfo]:
    """Every listed tool, its perdure name and its policy (or why it is left out)."""
    out = []
    for t in listed:
        name = tool_name(server.name, t.name)
        problem = _schema_problem(t.input_schema)
        policy = policy_for(
            t.annotations,
            trusted=server.trust_annotations,
            override=server.overrides.get(t.name),
            default_timeout=server.timeout,
        )
        out.append(McpToolInfo(server.name, t.name, name, policy, problem))
    return out


def make_tools(conn: McpConnection) -> list[Tool]:
    """The perdure tools of a connected server (tools with a broken schema are left out)."""
    server = conn.server
    tools: list[Tool] = []
    seen: dict[str, str] = {}
    listed = {t.name: t for t in conn.listed}
    for info in describe_tools(server, conn.listed):
        if info.problem is not None:
            log.error(
                "MCP server %r, tool %r is left out: %s", server.name, info.mcp_name, info.problem
            )
            continue
        if info.name in seen:
            raise McpStartError(
                f"MCP server {server.name!r}: tools {seen[info.name]!r} and {info.mcp_name!r} "
                f"both become {info.name!r}"
            )
        seen[info.name] = info.mcp_name
        assert info.policy is not None
        tools.append(_make_tool(conn, listed[info.mcp_name], info.name, info.policy))
    for unknown in set(server.overrides) - set(listed):
        log.warning("MCP server %r lists no tool %r (named in overrides)", server.name, unknown)
    return tools


def _make_tool(conn: McpConnection, spec: mt.Tool, name: str, policy: Policy) -> Tool:
    server, mcp_name, replay = conn.server.name, spec.name, policy.replay
    limit = conn.server.max_result_chars

    retry = conn.server.retry if replay.replayable else None

    async def call(ctx: ToolContext, **args: Any) -> ToolResult:
        try:
            result = await conn.call(mcp_name, args, ctx)
        except _Lost as lost:
            said = f"{lost} during the call of {mcp_name!r}"
            if retry is not None:  # SAFE, or KEYED (the server deduplicates by the key)
                raise RetryableError(said) from None
            if replay is ReplayPolicy.SAFE:
                return ToolResult(said, is_error=True)
            # The request may have reached the server and taken effect.
            raise OutcomeUnknown(f"{said}; it may have taken effect") from None
        except MCPError as exc:  # the server answered with a protocol error
            return ToolResult(
                f"MCP server {server!r} refused the call of {mcp_name!r}: {exc.message}",
                is_error=True,
            )
        if isinstance(result, str):  # the server is down: nothing was sent
            if retry is not None:
                raise RetryableError(result)
            return ToolResult(result, is_error=True)
        return render_call_result(result, limit)

    description = spec.description or spec.title or f"{mcp_name} (MCP server {server})"
    return Tool(
        name=name,
        description=description,
        input_schema=dict(spec.input_schema),
        replay=replay,
        requires_approval=policy.requires_approval,
        timeout=policy.timeout,
        fn=call,
        reconcile=policy.reconcile,
        # As for @tool: a read-only call may be stopped by a cancel or a revision (the
        # server is sent notifications/cancelled); others are left to finish.
        cancellable=replay is ReplayPolicy.SAFE,
        retry=retry,
        check_args=_validator(spec.input_schema),
        policy_reason=f"MCP {server}/{mcp_name}: {policy.reason}",
        definition_hash=definition_hash(spec, policy),
    )


def merge(native: Iterable[Tool], mcp_tools: Mapping[str, list[Tool]]) -> list[Tool]:
    """Native tools and every server's tools, refusing a collision with both names."""
    origin: dict[str, str] = {}
    out: list[Tool] = []
    for t in native:
        origin.setdefault(t.name, f"the perdure tool {t.name!r}")
        out.append(t)
    for server, tools in mcp_tools.items():
        for t in tools:
            here = f"the tool {t.name!r} of MCP server {server!r}"
            if t.name in origin:
                raise McpStartError(f"tool name collision: {here} and {origin[t.name]}")
            origin[t.name] = here
            out.append(t)
    return out


@frozen
class McpHub:
    """The runtime's MCP connections, by server name."""

    connections: dict[str, McpConnection] = field(factory=dict)

    def tools(self) -> dict[str, list[Tool]]:
        return {name: make_tools(conn) for name, conn in self.connections.items()}


async def _start_all(nursery: trio.Nursery, conns: list[McpConnection]) -> None:
    """Start every connection at once; the first that cannot start fails them all."""
    try:
        async with trio.open_nursery() as starting:
            for conn in conns:
                starting.start_soon(nursery.start, conn.run)
    except BaseExceptionGroup as group:
        failed = find_exception(group, McpStartError)
        if failed is None:
            raise
        raise failed from None


@asynccontextmanager
async def connect(
    servers: Sequence[McpServer], *, seed: int | None = None
) -> AsyncIterator[McpHub]:
    """Connect every server (each listed before this yields); disconnect all on exit."""
    names = [s.name for s in servers]
    for s in servers:
        if not isinstance(s, McpServer):
            raise TypeError(f"{s!r} is not an McpServer; use McpServer.stdio or McpServer.http")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"two MCP servers are named {dupes[0]!r}")
    hub = McpHub({s.name: McpConnection(s, seed=seed) for s in servers})
    error: BaseException | None = None
    async with trio.open_nursery() as nursery:
        try:
            await _start_all(nursery, list(hub.connections.values()))
            yield hub
        except BaseException as exc:
            # Re-raised outside the nursery: the caller sees its own exception (or the
            # start error), not an ExceptionGroup around it.
            error = exc
        nursery.cancel_scope.cancel()
    if error is not None:
        raise error


__all__ = [
    "IDEMPOTENCY_META_KEY",
    "McpConfigError",
    "McpConnection",
    "McpHub",
    "McpServer",
    "McpStartError",
    "McpToolInfo",
    "Policy",
    "connect",
    "describe_tools",
    "load_config",
    "merge",
    "policy_for",
    "render_call_result",
    "tool_name",
]
