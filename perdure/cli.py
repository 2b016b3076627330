"""The ``perdure`` command line: run, serve, demo, sessions, show, check.

``run`` and ``serve`` own the log while they run; ``sessions``, ``show``, ``check``
and ``export`` open it read-only, so they are safe beside a running daemon and work
on a log they may not write. Which session ``run`` uses is ``perdure._run_identity``;
how a file problem ends a command (one line, a documented exit status) is
``perdure._cli_errors``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NoReturn

import click

from perdure import _cli_control
from perdure._cli_errors import EXIT_STATUSES
from perdure.stuck import DEFAULT_STUCK_AFTER, StuckRun

if TYPE_CHECKING:
    from perdure.storage.backend import LogBackend, SessionInfo

STYLES: dict[str, dict[str, object]] = {
    "title": {"bold": True},
    "input": {"fg": "cyan"},
    "model": {"fg": "blue"},
    "tool": {"fg": "green"},
    "restart": {"fg": "magenta", "bold": True},
    "recovery": {"fg": "yellow"},
    "warning": {"fg": "red"},
    "outcome": {"fg": "green", "bold": True},
    "dim": {"dim": True},
    "plain": {},
}


def echo(text: str, style: str = "plain", *, nl: bool = True, err: bool = False) -> None:
    """Print with a style; colour only when writing to a terminal (click decides)."""
    attributes = STYLES.get(style, {})
    if attributes:
        click.secho(text, nl=nl, err=err, **attributes)  # type: ignore[arg-type]
    else:
        click.echo(text, nl=nl, err=err)


def _say(text: str, style: str = "plain") -> None:
    echo(text, style)
    sys.stdout.flush()


def _fail(message: str, code: int = 1) -> NoReturn:
    echo(f"perdure: {message}", "warning", err=True)
    raise SystemExit(code)


def _fail_log(exc: BaseException, log_dir: str | None, code: int = 1) -> NoReturn:
    """A log error in one line: a file problem as ``perdure._cli_errors`` says it, any
    other documented log error with its own message."""
    from perdure._cli_errors import explain

    problem = explain(exc, log_dir)
    if problem is not None:
        _fail(problem.line(), problem.status)
    _fail(str(exc), code)


LOG_KEY = "perdure.log"  # where the command's --log is kept, for the error messages


def _remember_log(ctx: click.Context, _: click.Parameter, value: str) -> str:
    ctx.meta[LOG_KEY] = value
    return value


log_option = click.option(
    "--log",
    "log_dir",
    default=".perdure",
    show_default=True,
    callback=_remember_log,
    help="The log: a directory (LMDB) or a postgresql:// URL.",
)


def _workspace(path: Path, create: bool, *, can_create: bool = True) -> Path:
    """The workspace, which must exist unless ``--create-workspace`` asks for it."""
    from perdure._cli_errors import USAGE, Problem

    if path.is_dir():
        return path
    if path.exists():
        problem = Problem(
            "the workspace is not a folder", str(path), "give --workspace a folder", USAGE
        )
        _fail(problem.line(), problem.status)
    if not create:
        problem = Problem(
            "the workspace does not exist",
            str(path),
            "create it, or pass --create-workspace to have it created"
            if can_create
            else "create it first",
            USAGE,
        )
        _fail(problem.line(), problem.status)
    path.mkdir(parents=True)
    return path


create_workspace_option = click.option(
    "--create-workspace",
    is_flag=True,
    help="Create the --workspace folder if it does not exist (else a missing one is an error).",
)
provider_option = click.option(
    "--provider",
    default="anthropic",
    show_default=True,
    metavar="anthropic|openai|openai:responses|scripted:FILE",
    help="The model: Anthropic (needs ANTHROPIC_API_KEY), an OpenAI-compatible API (needs "
    "OPENAI_API_KEY and --model; OPENAI_BASE_URL for another server) or a JSON script.",
)
model_option = click.option(
    "--model", default=None, help="The model name (required with --provider openai)."
)
tools_option = click.option(
    "--tools",
    "tool_specs",
    multiple=True,
    metavar="MODULE:ATTR",
    help="Tools to register: a @perdure.tool or a list of them (repeat or comma-separate), "
    "imported from the current folder as uvicorn does. Default: the built-in workspace tools.",
)


mcp_config_option = click.option(
    "--mcp-config",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help='MCP servers to connect: {"mcpServers": {name: {command, args, env} | {url, headers}}}, '
    "with perdure's trustAnnotations and tools overrides beside them (needs perdure[mcp]).",
)


def _mcp_servers(path: Path | None) -> list[Any]:
    if path is None:
        return []
    try:
        from perdure.tools.mcp import McpConfigError, load_config
    except ImportError:
        _fail("--mcp-config needs the mcp extra: pip install 'perdure[mcp]'", 2)
    try:
        return load_config(path)
    except McpConfigError as exc:
        _fail(str(exc), 2)


def _split(specs: Iterable[str]) -> list[str]:
    return [part.strip() for spec in specs for part in spec.split(",") if part.strip()]


def _setup(
    provider: str, model: str | None, tool_specs: Iterable[str], *, ask_before_writes: bool = False
) -> tuple[Any, Any]:
    from perdure._setup import SetupError, default_tools, load_provider, load_tools

    try:
        specs = _split(tool_specs)
        tools = load_tools(specs) if specs else default_tools(ask_before_writes=ask_before_writes)
        return load_provider(provider, model), tools
    except SetupError as exc:
        _fail(str(exc), 2)


class _Commands(click.Group):
    """The command group: a file problem ends any command in one line, not a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        from perdure._cli_errors import explain

        try:
            return super().invoke(ctx)
        except Exception as exc:
            if isinstance(exc, click.ClickException | click.exceptions.Exit):
                raise
            problem = explain(exc, ctx.meta.get(LOG_KEY))
            if problem is None:
                raise
            _fail(problem.line(), problem.status)


@click.group(cls=_Commands, epilog=EXIT_STATUSES)
@click.version_option(package_name="perdure")
def main() -> None:
    """perdure: a durable runtime for LLM agents."""
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s: %(message)s"
    )


@main.command()
@click.option("--keep", is_flag=True, help="Keep the demo's log and workspace afterwards.")
def demo(keep: bool) -> None:
    """Crash an agent right after a side effect, recover it, and show the timeline."""
    from perdure import demo as demo_module

    raise SystemExit(demo_module.main(echo, keep=keep))


# -- serve -------------------------------------------------------------------------------


@main.command()
@log_option
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8765, show_default=True, type=int, help="0 picks a free port.")
@provider_option
@model_option
@tools_option
@click.option(
    "--workspace",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The directory the tools work in (it must exist).",
)
@create_workspace_option
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Read the API token from this file (else PERDURE_TOKEN, else a generated one "
    "stored in the log directory).",
)
@click.option(
    "--token-key-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The key that signs scoped session tokens (else PERDURE_TOKEN_KEY, else "
    "token.key generated in the log directory); replacing it revokes them all.",
)
@click.option("--takeover", is_flag=True, help="Take the log from a stuck owner (fences it).")
@click.option(
    "--heartbeat",
    default=15.0,
    show_default=True,
    type=float,
    help="Seconds between keep-alive comments on idle event streams.",
)
@click.option(
    "--durability",
    type=click.Choice(["full", "fast"]),
    default="full",
    show_default=True,
    help="fast: no meta-page fsync (a power loss may undo the last commits).",
)
@click.option(
    "--idle-timeout",
    default=300.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds before an idle session leaves memory (0: never).",
)
@click.option(
    "--hibernate-after",
    default=1.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds before an idle session's actor stops, its state kept in memory.",
)
@click.option(
    "--stuck-after",
    default=DEFAULT_STUCK_AFTER,
    show_default=True,
    type=click.FloatRange(min=0),
    metavar="SECONDS",
    help="Seconds without a committed record after which a session with unfinished "
    "work is reported stuck (the perdure_stuck_runs metric, the page's mark).",
)
@click.option(
    "--context-window",
    type=click.IntRange(min=1),
    default=None,
    metavar="TOKENS",
    help="Context compaction: the model's context window (default: the built-in table "
    "by model; a model it does not know is not compacted automatically).",
)
@click.option(
    "--compact-at",
    type=click.FloatRange(min=0, max=1, min_open=True),
    default=0.8,
    show_default=True,
    metavar="SHARE",
    help="Summarise a session's older turns once the last request filled this share of "
    "the context window (docs/COMPACTION.md).",
)
@click.option(
    "--keep-recent",
    type=click.IntRange(min=0),
    default=6,
    show_default=True,
    metavar="ITEMS",
    help="Conversation items (inputs, model turns with their tool results) a compaction "
    "keeps verbatim.",
)
@mcp_config_option
@click.option(
    "--metrics-port",
    type=click.IntRange(min=0, max=65535),
    default=None,
    help="Also serve Prometheus GET /metrics without the token on this port, on "
    "127.0.0.1 only (GET /metrics on the API port always needs the token).",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="json: one JSON object per log line, with session, run and call ids.",
)
def serve(
    log_dir: str,
    host: str,
    port: int,
    provider: str,
    model: str | None,
    tool_specs: tuple[str, ...],
    workspace: Path | None,
    create_workspace: bool,
    token_file: Path | None,
    token_key_file: Path | None,
    takeover: bool,
    heartbeat: float,
    durability: str,
    idle_timeout: float,
    hibernate_after: float,
    stuck_after: float,
    context_window: int | None,
    compact_at: float,
    keep_recent: int,
    mcp_config: Path | None,
    metrics_port: int | None,
    log_format: str,
) -> None:
    """Serve the HTTP API, event streams and web page; recover interrupted runs first.

    A start that fails (a port in use, a log it cannot open) leaves behind none of the
    token files it created.
    """
    import trio

    if log_format == "json":
        from perdure.observability.logs import use_json_logs

        use_json_logs()

    from perdure._setup import SetupError
    from perdure.budget import CompactionPolicy
    from perdure.server.daemon import ServeOptions, check_port, resolve_token
    from perdure.server.daemon import serve as serve_daemon
    from perdure.server.tokens import resolve_token_key
    from perdure.storage import LogBusy, LogError

    if workspace is not None:
        workspace = _workspace(workspace, create_workspace)
    try:
        # The ports first: a start that fails there has created nothing.
        check_port(host, port)
        if metrics_port is not None:
            if importlib.util.find_spec("prometheus_client") is None:
                raise SetupError("--metrics-port needs prometheus-client: perdure[metrics]")
            check_port("127.0.0.1", metrics_port)
    except SetupError as exc:
        _fail(str(exc), 2)
    prov, tools = _setup(provider, model, tool_specs)
    servers = _mcp_servers(mcp_config)
    created = _Created.before(log_dir)
    listening = False

    def say(text: str, style: str = "plain") -> None:
        nonlocal listening
        listening = listening or text.startswith("perdure serve: listening on")
        _say(text, style)

    try:
        token, source, show = resolve_token(log_dir, token_file, os.environ, host)
        token_key, _ = resolve_token_key(log_dir, token_key_file, os.environ, token)
    except SetupError as exc:
        created.remove()
        _fail(str(exc), 2)
    except BaseException:
        created.remove()
        raise
    names = ", ".join(t.name for t in tools) or "none"
    if servers:
        names += "; MCP servers: " + ", ".join(f"{s.name} ({s.transport})" for s in servers)
    _say(f"perdure serve: token from {source}; tools: {names}", "plain")
    opts = ServeOptions(
        log=log_dir,
        provider=prov,
        tools=tools,
        token=token,
        token_key=token_key,
        host=host,
        port=port,
        workspace=workspace,
        takeover=takeover,
        heartbeat=heartbeat,
        durability="fast" if durability == "fast" else "full",
        idle_timeout=idle_timeout or None,
        hibernate_after=hibernate_after,
        stuck_after=stuck_after,
        compaction=CompactionPolicy(
            threshold=compact_at, keep_recent=keep_recent, window=context_window
        ),
        mcp_servers=servers,
        metrics_port=metrics_port,
    )
    try:
        trio.run(lambda: serve_daemon(opts, say, show_token=show))
    except BaseException as exc:
        if not listening:
            created.remove()  # a failed start leaves nothing behind
        if isinstance(exc, LogBusy):
            _fail(f"{exc} (perdure serve --takeover takes it over)")
        if isinstance(exc, LogError):
            _fail_log(exc, log_dir)
        if isinstance(exc, SetupError):
            _fail(str(exc), 2)
        if isinstance(exc, Exception) and servers:
            _fail_mcp_start(exc)
        raise


class _Created:
    """What ``perdure serve`` may create before it listens (the log folder, its token
    files), so that a start that fails can remove what it created, and only that."""

    def __init__(self, paths: list[Path]) -> None:
        self.missing = [p for p in paths if not p.exists()]

    @classmethod
    def before(cls, log_dir: str) -> _Created:
        from perdure.server.daemon import TOKEN_FILE
        from perdure.server.tokens import KEY_FILE
        from perdure.storage import is_postgres

        if is_postgres(log_dir):
            return cls([])
        root = Path(log_dir)
        # The files first, the folder last (removed only if it is then empty).
        return cls([root / TOKEN_FILE, root / KEY_FILE, root])

    def remove(self) -> None:
        import contextlib

        for path in self.missing:
            with contextlib.suppress(OSError):
                if path.is_dir():
                    path.rmdir()  # only when empty: a log opened meanwhile stays
                else:
                    path.unlink()


def _fail_mcp_start(exc: Exception) -> None:
    """An MCP server that could not be started, or a name collision: say so and exit."""
    from perdure.errors import find_exception
    from perdure.tools.mcp import McpStartError

    found = find_exception(exc, McpStartError)
    if found is not None:
        _fail(str(found))


# -- tools -------------------------------------------------------------------------------


@main.command("tools")
@tools_option
@mcp_config_option
@click.option(
    "--log",
    "log_dir",
    default=None,
    callback=_remember_log,
    help="A log (a directory or a postgresql:// URL): also list its calls in flight that "
    "are pinned to an older version of a tool, which keeps that version needed.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the table as JSON.")
def tools_command(
    tool_specs: tuple[str, ...], mcp_config: Path | None, log_dir: str | None, as_json: bool
) -> None:
    """List every tool a run gets, with its version, replay policy, approval, and why.

    MCP servers (--mcp-config) are started and listed, exactly as a run would.
    Without --tools: the built-in tools as ``perdure run`` gives them (the ones that
    change files ask for approval). Several versions of one tool are listed one per
    line; the newest is the one the model sees. With --log, the calls not finished
    that will finish on an older version are listed under it (read-only): once an
    older version has none, it can be removed.
    """
    import trio

    from perdure._setup import SetupError, default_tools, load_tools
    from perdure.tools.contract import ToolDefinitionError, registry

    try:
        specs = _split(tool_specs)
        native = load_tools(specs) if specs else default_tools(ask_before_writes=True)
        registered = registry(native)
    except (SetupError, ToolDefinitionError, ValueError, TypeError) as exc:
        _fail(str(exc), 2)
    pinned = _pinned_calls(log_dir) if log_dir is not None else None
    rows: list[dict[str, Any]] = []
    for newest in registered.values():
        for t in (*newest.earlier, newest):
            approval = t.requires_approval
            rows.append(
                {
                    "name": t.name,
                    "version": t.version,
                    "newest": t is newest,
                    "registered": True,
                    "server": None,
                    "replay": t.replay.value,
                    "approval": approval if isinstance(approval, bool) else "policy",
                    "why": t.policy_reason or "declared with @perdure.tool",
                }
            )
    servers = _mcp_servers(mcp_config)
    if servers:
        try:
            rows += trio.run(_mcp_rows, servers)
        except Exception as exc:
            _fail_mcp_start(exc)
            raise
    if pinned is not None:
        rows += _with_pinned(rows, pinned)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    width = max((len(str(r["name"])) for r in rows if r["registered"]), default=4)
    vwidth = max((len(str(r["version"] or "-")) for r in rows if r["registered"]), default=1)
    for r in rows:
        if not r["registered"]:
            continue
        shown = {True: "approval", False: "-"}.get(r["approval"], "policy")
        echo(
            f"{r['name']:<{width}}  {r['version'] or '-':<{vwidth}}  {r['replay'] or '-':<5}  "
            f"{shown:<8}  {r['why']}"
        )
    if pinned is not None and log_dir is not None:
        _print_pinned(rows, log_dir)


def _with_pinned(
    rows: list[dict[str, Any]], pinned: dict[tuple[str, str], list[str]]
) -> list[dict[str, Any]]:
    """Put each older version's pinned calls on its row (``pinned``), and return rows
    for the versions calls are pinned to that are not registered here."""
    for r in rows:
        r["pinned"] = [] if r["newest"] else pinned.pop((r["name"], r["version"]), [])
    newest = {r["name"]: r["version"] for r in rows if r["newest"]}
    # An MCP tool has one version, the one it was listed with: its calls are not pinned.
    served = {r["name"] for r in rows if r["server"] is not None}
    return [
        {
            "name": name,
            "version": version,
            "newest": False,
            "registered": False,
            "server": None,
            "replay": None,
            "approval": None,
            "why": "not registered here: recovery gives these calls to the newest version "
            "if their arguments fit it, else reports their outcome unknown"
            if name in newest
            else "no version of this tool is registered here: recovery reports these "
            "calls' outcome unknown",
            "pinned": calls,
        }
        for (name, version), calls in sorted(pinned.items())
        if newest.get(name) != version and name not in served
    ]


def _pinned_calls(log_dir: str) -> dict[tuple[str, str], list[str]]:
    """The log's calls not finished, as ``session/call (phase)``, by the (tool, version)
    they are pinned to. Only the sessions with unfinished work are read."""
    from perdure.actors.state import SessionState
    from perdure.storage.codec import CorruptRecord

    log = _open_readonly(log_dir)
    found: dict[tuple[str, str], list[str]] = {}
    try:
        for info in sorted(log.sessions(), key=lambda i: i.first_seq):
            if not info.open_submissions:
                continue
            try:
                records = log.read_session(info.session_id)
            except CorruptRecord as exc:
                _fail(f"{exc} (run: perdure check --log {_where(log_dir)})")
            state = SessionState.fold(info.session_id, records)
            for task in state.pinned_calls():
                assert task.pinned_version is not None
                found.setdefault((task.tool_name, task.pinned_version), []).append(
                    f"{info.session_id}/{task.call_id} ({task.phase})"
                )
    finally:
        log.close()
    return found


def _print_pinned(rows: list[dict[str, Any]], log_dir: str) -> None:
    older = [r for r in rows if not r["newest"]]
    if not older:
        echo(f"\nno older tool version registered or in flight in {_where(log_dir)}", "dim")
        return
    echo(f"\ncalls in flight on an older version, in {_where(log_dir)}:", "title")
    for r in older:
        calls = ", ".join(r["pinned"])
        if not r["registered"]:
            echo(f"  {r['name']} version {r['version']}: {calls} ({r['why']})", "warning")
        elif calls:
            echo(f"  {r['name']} version {r['version']}: {calls}", "warning")
        else:
            echo(f"  {r['name']} version {r['version']}: none; it can be removed")


async def _mcp_rows(servers: list[Any]) -> list[dict[str, Any]]:
    from perdure.tools.mcp import connect, describe_tools

    rows: list[dict[str, Any]] = []
    async with connect(servers) as hub:
        for name, conn in hub.connections.items():
            for info in describe_tools(conn.server, conn.listed):
                policy = info.policy
                approval = policy.requires_approval if policy is not None else False
                rows.append(
                    {
                        "name": info.name,
                        "version": None,
                        "newest": True,
                        "registered": True,
                        "server": name,
                        "replay": None if info.problem or policy is None else policy.replay.value,
                        "approval": approval if isinstance(approval, bool) else "policy",
                        "why": f"left out: {info.problem}"
                        if info.problem
                        else f"MCP {name}/{info.mcp_name}: {policy.reason if policy else ''}",
                    }
                )
    return rows


# -- run ---------------------------------------------------------------------------------


@main.command()
@click.argument("task")
@click.option(
    "--workspace",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="The directory the tools work in (it must exist).",
)
@create_workspace_option
@model_option
@provider_option
@log_option
@tools_option
@click.option(
    "--session",
    "session_id",
    default=None,
    help="Use this session (default: the task's own, named by the task and the workspace).",
)
@click.option(
    "--new",
    is_flag=True,
    help="Start a fresh run of the task instead of continuing or reporting the last one.",
)
@click.option(
    "--request-id",
    default=None,
    help="Deduplication key (default: derived from the session and the task, so re-running "
    "the same command after a crash does not submit the task twice).",
)
@click.option(
    "--yes",
    is_flag=True,
    help="Approve every tool call that asks for approval (the built-in tools that change "
    "files ask first; without --yes and without a terminal, they are denied).",
)
@mcp_config_option
def run(
    task: str,
    workspace: Path,
    create_workspace: bool,
    model: str | None,
    provider: str,
    log_dir: str,
    tool_specs: tuple[str, ...],
    session_id: str | None,
    new: bool,
    request_id: str | None,
    yes: bool,
    mcp_config: Path | None,
) -> None:
    """Run one task to completion, streaming the model's text and the tool calls.

    The same command (the same task text, workspace and log) is the same run: after a
    crash it continues the interrupted run, with the same session, request and
    idempotency keys; once the run has finished it prints the outcome and runs nothing.
    --new starts a fresh run of the task on purpose; the command then follows that one.

    Without --tools the model gets the built-in file tools; the ones that write files
    ask for approval first (at the terminal, or --yes approves them all).
    """
    import trio

    from perdure.storage import LogError

    if new and session_id is not None:
        _fail("--new starts a fresh session of its own; leave out --session", 2)
    prov, tools = _setup(provider, model, tool_specs, ask_before_writes=True)
    workspace = _workspace(workspace, create_workspace)
    choice = _choose_run(log_dir, workspace, task, session_id, request_id, new)
    previous = choice.previous
    if previous is not None and previous.finished is not None:
        raise SystemExit(_report_finished(previous, log_dir))
    servers = _mcp_servers(mcp_config)
    try:
        status = trio.run(_run_task, task, workspace, log_dir, prov, tools, choice, yes, servers)
    except LogError as exc:
        _fail_log(exc, log_dir)
    except KeyboardInterrupt:
        _fail("interrupted; the run is in the log and resumes the next time it is opened", 130)
    except Exception as exc:
        if servers:
            _fail_mcp_start(exc)
        raise
    raise SystemExit(0 if status == "completed" else 1)


@main.command()
@click.argument("source")
@click.option(
    "--at",
    "at",
    default=None,
    help="A run id or a sequence number of SOURCE that "
    "ends a run or a turn (default: the latest such point).",
)
@click.option("--as", "new_id", default=None, help="The fork's session id (default: derived).")
@click.option(
    "--files",
    is_flag=True,
    help="Also put the workspace's files back as they were at that point (with --workspace).",
)
@click.option(
    "--workspace",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=None,
    help="The workspace of the session (needed with --files).",
)
@click.option(
    "--request-id",
    default=None,
    help="Deduplication key (default: derived from SOURCE and --at, so repeating the "
    "command forks once).",
)
@log_option
@provider_option
@model_option
@tools_option
def fork(
    source: str,
    at: str | None,
    new_id: str | None,
    files: bool,
    workspace: Path | None,
    request_id: str | None,
    log_dir: str,
    provider: str,
    model: str | None,
    tool_specs: tuple[str, ...],
) -> None:
    """Start a new session from SOURCE's history up to the end of a run or of a turn.

    With --files, the workspace's files are put back as they were at that point too.

    The fork's pending work (a turn to continue, queued input) starts like any
    recovered work, with the given provider and tools. Against a running daemon, use
    its route instead: POST /v1/sessions/SOURCE/forks.
    """
    import trio

    from perdure.errors import Refused
    from perdure.storage import LogError

    where: int | str | None = int(at) if at is not None and at.isdigit() else at
    rid = request_id or "fork-" + hashlib.sha256(f"{source}\x00{at}".encode()).hexdigest()[:24]
    prov, tools = _setup(provider, model, tool_specs)

    async def go() -> Any:
        import perdure

        if files and workspace is None:
            _fail("--files needs --workspace: the folder whose files are put back", 2)
        async with perdure.open_runtime(
            log_dir, provider=prov, tools=tools, workspace=workspace
        ) as rt:
            return await rt.fork(source, at=where, session_id=new_id, request_id=rid, files=files)

    try:
        forked = trio.run(go)
    except Refused as exc:
        _fail(str(exc))
    except LogError as exc:
        _fail_log(exc, log_dir)
    again = " (already forked by this request)" if forked.duplicate else ""
    echo(f"session {forked.session_id} forked from {source} at record {forked.position}{again}")


workspace_option = click.option(
    "--workspace",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=Path("."),
    show_default=True,
    help="The workspace whose history (its .perdure-tools/history.git) is used.",
)


@main.command()
@click.argument("session")
@click.option(
    "--to",
    "to",
    required=True,
    help="A call id (the workspace just before that call) or a sequence number of "
    "SESSION that ends a run or a turn.",
)
@click.option(
    "--request-id",
    default=None,
    help="Deduplication key (default: derived from SESSION and --to, so repeating the "
    "command rewinds once).",
)
@workspace_option
@log_option
@provider_option
@model_option
@tools_option
def rewind(
    session: str,
    to: str,
    request_id: str | None,
    workspace: Path,
    log_dir: str,
    provider: str,
    model: str | None,
    tool_specs: tuple[str, ...],
) -> None:
    """Put the workspace's files back as they were at a call or a settled point.

    The conversation stays (to rewind both, fork with --files). Refused while the
    session has a run in progress. The rewind is recorded before any file is
    touched, so an interrupted one finishes the next time the log is opened. Against
    a running daemon, use its route: POST /v1/sessions/SESSION/rewind.
    """
    import trio

    from perdure.errors import Refused
    from perdure.storage import LogError

    where: int | str = int(to) if to.isdigit() else to
    rid = request_id or "rewind-" + hashlib.sha256(f"{session}\x00{to}".encode()).hexdigest()[:24]
    prov, tools = _setup(provider, model, tool_specs)

    async def go() -> Any:
        import perdure

        async with perdure.open_runtime(
            log_dir, provider=prov, tools=tools, workspace=workspace
        ) as rt:
            return await rt.rewind(session, to=where, request_id=rid)

    try:
        done = trio.run(go)
    except Refused as exc:
        _fail(str(exc))
    except LogError as exc:
        _fail_log(exc, log_dir)
    again = " (already done by this request)" if done.duplicate else ""
    echo(
        f"the workspace of {session} is back at record {done.position} (tree "
        f"{done.tree[:12]}; before the rewind: {done.before[:12]}){again}"
    )


@main.command()
@click.argument("session")
@click.argument("call", required=False)
@workspace_option
@log_option
@click.option("--stat", is_flag=True, help="Only the files each call changed, no patch.")
def diff(session: str, call: str | None, workspace: Path, log_dir: str, stat: bool) -> None:
    """Show what each workspace call of SESSION changed (or only CALL's), as a diff.

    Read-only: the log and the workspace's checkpoint store are only read.
    """
    from perdure.actors.state import SessionState
    from perdure.storage.codec import CorruptRecord
    from perdure.tools.history import HistoryError, WorkspaceHistory

    log = _open_readonly(log_dir)
    try:
        if log.session_info(session) is None:
            _fail(f"no session {session!r} in {_where(log_dir)} (see: perdure sessions)", 2)
        state = SessionState.fold(session, log.read_session(session))
    except CorruptRecord as exc:
        _fail(f"{exc} (run: perdure check --log {_where(log_dir)})")
    finally:
        log.close()
    marks = [m for m in state.checkpoints if call is None or m.call_id == call]
    if not marks:
        which = f"call {call!r} of " if call is not None else ""
        _fail(f"no workspace checkpoint of {which}session {session!r}", 2)
    history = WorkspaceHistory(workspace)
    for mark in marks:
        task = state.tasks.get(mark.call_id)
        name = task.tool_name if task is not None else "?"
        files = ", ".join(mark.changed) if mark.changed else "no file changed"
        echo(f"call {mark.call_id} ({name}, attempt {mark.attempt}): {files}", "title")
        if mark.outside:
            others = ", ".join(mark.outside)
            echo(f"  changed before it by others (another session, a person): {others}", "warning")
        if mark.skipped:
            echo(f"  not in the checkpoints (over the size limit): {', '.join(mark.skipped)}")
        if stat or not mark.changed or not mark.after:
            continue
        try:
            click.echo(history.patch(mark.before, mark.after), nl=False)
        except HistoryError as exc:
            _fail(str(exc))


def _choose_run(
    log_dir: str,
    workspace: Path,
    task: str,
    session_id: str | None,
    request_id: str | None,
    new: bool,
) -> Any:
    """The session and request of this run (``perdure._run_identity``), read from the
    log read-only before the run takes ownership of it."""
    from perdure._run_identity import choose
    from perdure.storage import LogError, is_postgres, open_log

    def pick(log: Any) -> Any:
        return choose(
            log,
            workspace=workspace,
            task=task,
            session_id=session_id,
            request_id=request_id,
            new=new,
        )

    if not is_postgres(log_dir) and not (Path(log_dir) / "data.mdb").exists():
        return pick(None)
    try:
        log = open_log(log_dir, readonly=True)
    except LogError as exc:
        _fail_log(exc, log_dir)
    try:
        return pick(log)
    finally:
        log.close()


def _moment(at: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _report_finished(previous: Any, log_dir: str) -> int:
    """Say that this task's run already finished, and its outcome; the exit status."""
    finished = previous.finished
    echo(
        f"this task already finished: session {previous.session_id}, started "
        f"{_moment(previous.accepted_at)}, {finished.status} {_moment(finished.at)}; "
        "nothing was run (--new runs it again)",
        "dim",
    )
    if finished.final_text:
        echo(finished.final_text, "outcome" if finished.status == "completed" else "plain")
    if finished.reason:
        echo(f"reason: {finished.reason}", "warning")
    echo(f"(its timeline: perdure show {previous.session_id} --log {_where(log_dir)})", "dim")
    return 0 if finished.status == "completed" else 1


async def _run_task(
    task: str,
    workspace: Path,
    log_dir: str,
    provider: Any,
    tools: list[Any],
    choice: Any,
    yes: bool,
    mcp_servers: list[Any],
) -> str:
    from contextlib import aclosing

    import perdure

    progress = Progress(enabled=sys.stderr.isatty())
    async with perdure.open_runtime(
        log_dir, provider=provider, tools=tools, workspace=workspace, mcp_servers=mcp_servers
    ) as rt:
        sid = await rt.create_session(choice.session_id)
        accepted = await rt.submit(sid, task, request_id=choice.request_id)
        echo(f"session {sid}, input {accepted.submission_id} (log {rt.location})", "dim")
        if choice.previous is not None:
            echo(
                f"continuing the interrupted run of this task: session {sid}, started "
                f"{_moment(choice.previous.accepted_at)} (--new starts a fresh one)",
                "dim",
            )
        elif accepted.duplicate:
            echo("this task was already submitted: following it to its outcome", "dim")
        else:
            echo("a new run of this task (the same command continues it after a crash)", "dim")
        live = Live(rt, sid, accepted.submission_id, progress, yes)
        async with progress.running():
            progress.status("waiting for the model")
            events = rt.events(sid, after=accepted.seq - 1, restarts=True)
            async with aclosing(events) as stream:
                async for event in stream:
                    outcome = await live.show(event)
                    if outcome is not None:
                        return outcome
    return "failed"


class Live:
    """``perdure run``'s output: the model's text as it streams, and every record as
    the shared ``Timeline`` renders it (the same lines as ``perdure show``), with the
    prompts a record calls for (an approval, a call that needs a person)."""

    def __init__(
        self, rt: Any, session_id: str, submission_id: str, progress: Progress, yes: bool
    ) -> None:
        from perdure.timeline import Timeline

        self.rt = rt
        self.session_id = session_id
        self.submission_id = submission_id
        self.progress = progress
        self.yes = yes
        self.timeline = Timeline()
        self.mid_text = False  # streamed text not yet ended by a newline

    async def show(self, event: Any) -> str | None:
        """Print one event; return the run's final status when our submission's run ends."""
        from perdure.storage import records as r

        data, rec, progress = event.data, event.record, self.progress
        ours = data.get("submission_id") == self.submission_id
        if event.kind == "model_call" and ours:
            attempt = data.get("attempt", 1)
            progress.status(
                "waiting for the model" + (f" (attempt {attempt})" if attempt > 1 else "")
            )
            return None
        if event.kind == "text_delta" and ours:
            progress.clear()
            self.timeline.streamed.add(data["generation_id"])
            echo(data.get("text", ""), nl=False)
            self.mid_text = True
            sys.stdout.flush()
            return None
        if rec is None:
            return None
        if isinstance(rec, r.GenerationStarted | r.GenerationCompleted | r.RunFinished) and (
            rec.submission_id != self.submission_id
        ):
            return None  # another input's turn in the same session
        if isinstance(rec, r.ToolExecuting):
            progress.status(f"running {rec.tool_name} [{rec.call_id}]")
        lines = self.timeline.add(event_committed(event))
        if lines:
            progress.clear()
            if self.mid_text:
                echo("")
                self.mid_text = False
        for _, kind, text in lines:
            echo(text, kind)
        if isinstance(rec, r.ToolAwaitingApproval):
            await self._approve(rec.call_id, rec.reason)
        elif isinstance(rec, r.ToolAwaitingHuman):
            await _resolve_at_the_terminal(
                self.rt, self.session_id, rec.call_id, unknown_outcome=rec.unknown_outcome
            )
        elif isinstance(rec, r.RunFinished) and rec.status != "interrupted":
            return rec.status
        return None

    async def _approve(self, call_id: str, reason: str) -> None:
        import trio

        approved, note = self.yes, "approved with --yes"
        if not self.yes and sys.stdin.isatty():
            approved = await trio.to_thread.run_sync(
                lambda: click.confirm(f"approve {call_id}? ({reason})", default=False)
            )
            note = "answered at the terminal"
        elif not self.yes:
            note = "no terminal to ask; run with --yes to approve"
        echo(f"{'approved' if approved else 'denied'}: {call_id} ({note})", "warning")
        await self.rt.approve(
            self.session_id,
            call_id,
            approved=approved,
            request_id=f"cli-approve-{call_id}",
            note=note,
        )


def event_committed(event: Any) -> Any:
    """A committed record's event as the ``Committed`` the timeline reads."""
    from perdure.storage.records import Committed

    return Committed(seq=event.seq, record=event.record)


async def _resolve_at_the_terminal(
    rt: Any, sid: str, call_id: str, *, unknown_outcome: bool = False
) -> None:
    """Ask at the terminal what to do with a call that needs a person (for one whose
    outcome is unknown: whether it was applied); without a terminal, fail it (the model
    is told). A call already resolved (e.g. by an earlier run) is left alone."""
    import trio

    from perdure._cli_control import OUTCOME_ANSWERS
    from perdure.errors import Refused

    action: str = "fail"
    result: Any = None
    if sys.stdin.isatty() and unknown_outcome:
        answers = click.Choice(list(OUTCOME_ANSWERS))
        said = await trio.to_thread.run_sync(
            lambda: click.prompt(
                f"did {call_id} take effect? applied, not-applied (run it once more) or failed",
                type=answers,
                default="failed",
            )
        )
        action = OUTCOME_ANSWERS[said]
        if action == "skip":
            result = await trio.to_thread.run_sync(
                lambda: click.prompt("its result, for the model", default="")
            )
    elif sys.stdin.isatty():
        choices = click.Choice(["retry", "skip", "fail"])
        action = await trio.to_thread.run_sync(
            lambda: click.prompt("retry, skip or fail it?", type=choices, default="fail")
        )
        if action == "skip":
            result = await trio.to_thread.run_sync(
                lambda: click.prompt("the result to record for it", default="")
            )
    else:
        result = "nobody was at a terminal to decide (perdure run without one)"
    try:
        await rt.resolve(sid, call_id, action=action, result=result, request_id=f"cli-{call_id}")
    except Refused as exc:
        echo(f"{call_id}: {exc.message}", "warning")
        return
    echo(f"resolved: {call_id} ({action})", "warning")


class Progress:
    """A one-line spinner on stderr (terminals only) saying what the run waits for."""

    FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._text: str | None = None
        self._shown = False

    def status(self, text: str) -> None:
        self._text = text

    def clear(self) -> None:
        self._text = None
        if self._shown:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
            self._shown = False

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Progress]:
        import trio

        async with trio.open_nursery() as nursery:
            if self.enabled:
                nursery.start_soon(self._spin)
            try:
                yield self
            finally:
                self.clear()
                nursery.cancel_scope.cancel()

    async def _spin(self) -> None:
        import trio

        i = 0
        while True:
            await trio.sleep(0.1)
            if self._text is not None:
                frame = self.FRAMES[i % len(self.FRAMES)]
                sys.stderr.write(f"\r\033[K{frame} {self._text}")
                sys.stderr.flush()
                self._shown = True
                i += 1


# -- read-only commands ------------------------------------------------------------------


def _open_readonly(log_dir: str) -> Any:
    """The log for reading only, either backend; a clear message if there is none."""
    from perdure._cli_errors import USAGE, Problem
    from perdure.storage import LogError, is_postgres, open_log

    if not is_postgres(log_dir) and Path(log_dir).is_file():
        problem = Problem(
            "--log names a file, not a log folder",
            log_dir,
            "give --log the log's folder or a postgresql:// URL",
            USAGE,
        )
        _fail(problem.line(), problem.status)
    if not is_postgres(log_dir) and not (Path(log_dir) / "data.mdb").exists():
        _no_log(log_dir)
    try:
        return open_log(log_dir, readonly=True)
    except FileNotFoundError:
        _no_log(log_dir)
    except LogError as exc:
        _fail_log(exc, _where(log_dir))


def _no_log(log_dir: str) -> NoReturn:
    _fail(
        f"there is no perdure log here ({log_dir}): give --log the log's folder or a "
        "postgresql:// URL (perdure run and perdure serve create a log)",
        2,
    )


def _where(log_dir: str) -> str:
    """The log's location for a message: a PostgreSQL URL without its password."""
    from perdure.storage import is_postgres

    if is_postgres(log_dir):
        from perdure.storage.pg_log import redact

        return redact(log_dir)
    return log_dir


# A page of ``perdure sessions`` unless --limit or --all says otherwise: a screenful,
# read from the log's index by creation, so a log of any size answers at once.
SESSIONS_PAGE = 50


@main.command()
@log_option
@click.option(
    "--stuck",
    is_flag=True,
    help="List only the sessions with unfinished work and no record committed for "
    "--stuck-after seconds, with what each waits for.",
)
@click.option(
    "--stuck-after",
    type=click.FloatRange(min=0),
    default=DEFAULT_STUCK_AFTER,
    show_default=True,
    metavar="SECONDS",
    help="How long without a committed record makes a session stuck (--stuck, and "
    "--json's stuck fields).",
)
@click.option(
    "--order",
    type=click.Choice(["newest", "id"]),
    default=None,
    help="newest (the default): by creation, newest first; id: by session id.",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help=f"A page of at most N sessions (default {SESSIONS_PAGE}).",
)
@click.option(
    "--before",
    type=click.IntRange(min=1),
    default=None,
    metavar="SEQ",
    help="Newest first: the page of sessions created before SEQ (the last page's next).",
)
@click.option(
    "--after",
    default=None,
    metavar="SESSION",
    help="By id: the page after this session id (the last page's next; implies --order id).",
)
@click.option("--all", "every", is_flag=True, help="Every session, in one list (not paged).")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print the list as JSON: {"sessions": [...], "next": ...}, the body of the '
    "daemon's GET /v1/sessions.",
)
def sessions(
    log_dir: str,
    stuck: bool,
    stuck_after: float,
    order: str | None,
    limit: int | None,
    before: int | None,
    after: str | None,
    every: bool,
    as_json: bool,
) -> None:
    """List the sessions of a log (read-only), a page at a time: the newest first,
    50 to a page, and how to ask for the next (--before); --order id pages by session
    id (--after); --all lists every one."""
    order = _sessions_order(order, after, before, every, limit, stuck)
    log = _open_readonly(log_dir)
    try:
        if stuck:  # only the sessions with unfinished work are read
            infos = log.sessions(active=True, after=after or "", limit=limit)
            runs = _find_stuck(log, infos, stuck_after, log_dir)
            if as_json:
                stuck_ids = {r.session_id for r in runs}
                _print_session_list([i for i in infos if i.session_id in stuck_ids], runs)
            else:
                _print_stuck(runs, stuck_after, log_dir)
            return
        page = None if every else (limit or SESSIONS_PAGE)
        if order == "id":
            infos = log.sessions(after=after or "", limit=None if page is None else page + 1)
        elif page is None:  # every one: one scan of the summaries, then sorted
            infos = sorted(log.sessions(), key=lambda i: i.first_seq, reverse=True)
        else:  # a page: a range of the index by creation
            infos = log.newest_sessions(before=before or 0, limit=page + 1)
        # One more than the page was read: whether a next page exists, without a count.
        more = page is not None and len(infos) > page
        infos = infos[:page]
        following: str | None = None
        if more:
            following = infos[-1].session_id if order == "id" else str(infos[-1].first_seq)
        found = _find_stuck(log, infos, stuck_after, log_dir) if as_json else []
    finally:
        log.close()
    if as_json:
        _print_session_list(infos, found, following if page is not None else False)
        return
    if not infos:
        paged = after is not None or before is not None
        echo(f"no sessions {'in this page of' if paged else 'in'} {_where(log_dir)}")
        return
    width = max(7, *(len(i.session_id) for i in infos))
    echo(f"{'SESSION':<{width}}  {'RECORDS':>7}  {'FIRST':>7}  {'LAST':>7}  REV  OPEN", "title")
    for i in infos:
        style = "warning" if i.open_submissions else "plain"
        echo(
            f"{i.session_id:<{width}}  {i.records:>7}  {i.first_seq:>7}  {i.last_seq:>7}  "
            f"{i.goal_rev:>3}  {i.open_submissions:>4}",
            style,
        )
    if following is not None:
        # On standard error: standard output stays the table, for a script to read.
        cursor = f"--after {following}" if order == "id" else f"--before {following}"
        echo(
            f"more sessions: the next page with {cursor} (every session: --all)",
            "dim",
            err=True,
        )


def _sessions_order(
    order: str | None,
    after: str | None,
    before: int | None,
    every: bool,
    limit: int | None,
    stuck: bool,
) -> str:
    """The order ``perdure sessions`` lists in, its options checked against it."""
    if order is None:
        order = "id" if after is not None else "newest"
    if after is not None and order != "id":
        raise click.UsageError("--after pages by session id: it goes with --order id")
    if before is not None and order != "newest":
        raise click.UsageError("--before pages newest first: it goes with --order newest")
    if every and (limit is not None or after is not None or before is not None):
        raise click.UsageError("--all lists every session: leave out --limit, --after and --before")
    if stuck and (before is not None or every):
        raise click.UsageError("--stuck lists every stuck session by id (a page: --limit, --after)")
    return order


def _print_session_list(
    infos: list[SessionInfo], stuck: list[StuckRun], following: str | Literal[False] | None = False
) -> None:
    """The list as the daemon's ``GET /v1/sessions`` answers it (the same code): with
    ``next`` for a page (``following``: its cursor, None after the last; False: no page)."""
    from perdure.server.payloads import session_list

    body = session_list(infos, stuck, next_after=following)
    click.echo(json.dumps(body, indent=2, ensure_ascii=False))


def _find_stuck(
    log: LogBackend, infos: list[SessionInfo], after: float, log_dir: str
) -> list[StuckRun]:
    """The stuck runs among ``infos`` (those with unfinished work only are read)."""
    from perdure.actors.state import SessionState
    from perdure.storage.codec import CorruptRecord
    from perdure.stuck import last_progress_at, stuck_run

    now = time.time()
    found = []
    for info in infos:
        if not info.open_submissions:
            continue
        try:
            records = log.read_session(info.session_id)
        except CorruptRecord as exc:
            _fail(f"{exc} (run: perdure check --log {_where(log_dir)})")
        last = last_progress_at(records)
        if last is None:
            continue
        state = SessionState.fold(info.session_id, records)
        run = stuck_run(state, last, now=now, after=after)
        if run is not None:
            found.append(run)
    return found


def _print_stuck(found: list[StuckRun], after: float, log_dir: str) -> None:
    if not found:
        echo(f"no stuck sessions in {_where(log_dir)} (threshold {after:g}s)")
        return
    width = max(7, *(len(r.session_id) for r in found))
    run_width = max(3, *(len(r.run_id or "-") for r in found))
    echo(f"{'SESSION':<{width}}  {'RUN':<{run_width}}  {'IDLE':>8}  WAITING FOR", "title")
    for r in found:
        echo(
            f"{r.session_id:<{width}}  {r.run_id or '-':<{run_width}}  "
            f"{r.idle_for:>7.0f}s  {r.waiting.describe()}",
            "warning",
        )


@main.command()
@click.argument("session")
@log_option
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON only.")
def show(session: str, log_dir: str, as_json: bool) -> None:
    """Show a session's timeline (restarts and recovery decisions included) and summary."""
    from perdure.actors.state import SessionState
    from perdure.inspect import render, summarize
    from perdure.storage.codec import CorruptRecord
    from perdure.timeline import render as timeline
    from perdure.timeline import with_restarts

    log = _open_readonly(log_dir)
    try:
        if log.session_info(session) is None:
            _fail(f"no session {session!r} in {_where(log_dir)} (see: perdure sessions)", 2)
        records = log.read_session(session)
        system = log.read_system()
    except CorruptRecord as exc:
        _fail(f"{exc} (run: perdure check --log {_where(log_dir)})")
    finally:
        log.close()
    summary = summarize(SessionState.fold(session, records))
    if as_json:
        click.echo(json.dumps(summary, indent=2, ensure_ascii=False))
        return
    lines = timeline(with_restarts(records, system))
    echo(f"Timeline of {session} ({len(records)} records):", "title")
    for seq, kind, text in lines:
        echo(f"  #{seq:<5} {text}", kind)
    echo("")
    for style, text in render(summary):
        echo(text, style)


@main.command()
@log_option
@click.option(
    "--settled",
    is_flag=True,
    help="Every session must be finished (no pending work) — e.g. after a clean shutdown.",
)
@click.option(
    "--workspace",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=None,
    help="Also check this workspace's checkpoint store against the log's checkpoints.",
)
def check(log_dir: str, settled: bool, workspace: Path | None) -> None:
    """Verify every record's checksum and the design's invariants (read-only)."""
    from perdure.check import check_log, last_seq

    _open_readonly(log_dir).close()  # a clear message if there is no log
    total = last_seq(log_dir)
    with click.progressbar(
        length=total, label="checking records", file=sys.stderr, hidden=not sys.stderr.isatty()
    ) as bar:
        seen = [0]

        def tick(seq: int) -> None:
            bar.update(seq - seen[0])
            seen[0] = seq

        report = check_log(
            log_dir, settled="all" if settled else "idle", on_frame=tick, workspace=workspace
        )
    echo(
        f"{report.records} records, {report.sessions} sessions checked"
        + (f"; {len(report.unfinished)} with work pending" if report.unfinished else ""),
        "plain",
    )
    if report.ok:
        echo("OK: every record is intact and every invariant holds", "outcome")
        return
    for seq in report.damaged:
        echo(f"DAMAGED: record {seq}", "warning")
    for text in report.violations:
        echo(f"  {text}", "warning")
    echo(f"FAILED: {len(report.violations)} problem(s)", "warning")
    raise SystemExit(1)


@main.command()
@click.option(
    "--tools",
    "tool_specs",
    multiple=True,
    required=True,
    metavar="MODULE:ATTR",
    help="Your tools (a @perdure.tool or a list of them); repeatable.",
)
@click.option(
    "--examples",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="JSON object: tool name -> the arguments to call it with (else synthesised).",
)
@click.option(
    "--workspace-template",
    type=click.Path(file_okay=False, path_type=Path),
    help="A directory copied into each scratch workspace before a run (it must exist).",
)
@click.option(
    "--world-command",
    help="A shell command whose output is part of the world (run in the scratch workspace).",
)
@click.option("--only", multiple=True, help="Check only these tools (by name).")
def conformance(
    tool_specs: tuple[str, ...],
    examples: Path | None,
    workspace_template: Path | None,
    world_command: str | None,
    only: tuple[str, ...],
) -> None:
    """Crash-test your tools against the replay policy they declare."""
    import json

    from perdure import conformance as conf
    from perdure._setup import SetupError, load_tools

    specs = _split(tool_specs)
    if workspace_template is not None:
        _workspace(workspace_template, create=False, can_create=False)
    try:
        tools = load_tools(specs)
    except SetupError as exc:
        _fail(str(exc), 2)
    if only:
        tools = [t for t in tools if t.name in only]
    if not tools:
        _fail("no tools to check", 2)
    given = json.loads(examples.read_text()) if examples else None
    reports = conf.run(
        tools,
        ",".join(specs),
        examples=given,
        template=workspace_template,
        world_command=world_command,
        progress=lambda text: (
            echo(f"  … {text}", "plain", err=True) if sys.stderr.isatty() else None
        ),
    )
    for report in reports:
        policy = report.replay + (" + reconcile" if report.has_reconcile else "")
        echo(f"{report.tool} ({policy}), called with {report.args}", "title")
        if report.error:
            echo(f"  ERROR: {report.error}", "warning")
            continue
        for p in report.points:
            style = "warning" if p.flagged else "tool"
            echo(f"  {p.point:<36} {p.result:<12} {p.verdict}   [{p.decision}]", style)
    flagged = [r.tool for r in reports if r.flagged]
    if flagged:
        echo(f"FLAGGED: {', '.join(flagged)}", "warning")
        raise SystemExit(1)
    echo(f"OK: {len(reports)} tool(s) behave as declared at every crash point", "outcome")


# -- retention: the log's owner for a moment, without running any session ----------------


@asynccontextmanager
async def _maintenance(log_dir: str) -> AsyncIterator[Any]:
    """The log's Journal, owned by this command while it runs (no session is started)."""
    import trio

    from perdure.storage import LogBusy, open_log
    from perdure.storage.journal import open_journal

    try:
        log = await trio.to_thread.run_sync(lambda: open_log(log_dir))
    except LogBusy as exc:
        _fail(f"{exc}; stop the process that owns the log first", 2)
    try:
        async with open_journal(log) as journal:
            yield journal
    finally:
        await trio.to_thread.run_sync(log.close)


def _when(text: str) -> float:
    """A date (2026-01-31), a date and time (2026-01-31T12:00), or seconds since 1970."""
    from datetime import UTC, datetime

    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        _fail(f"--finished-before: not a date: {text!r} (e.g. 2026-01-31 or 2026-01-31T12:00)", 2)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


@main.command()
@click.option(
    "--finished-before",
    "before",
    required=True,
    help="A date (UTC): prune "
    "sessions whose last record is older, and that have no unfinished work.",
)
@click.option("--dry-run", is_flag=True, help="Only list what would be deleted.")
@log_option
def prune(before: str, dry_run: bool, log_dir: str) -> None:
    """Delete finished sessions older than a date (each in one transaction)."""
    import time

    import trio

    from perdure import retention

    cutoff = _when(before)

    async def go() -> Any:
        async with _maintenance(log_dir) as journal:
            return await retention.prune(journal, cutoff, time.time(), dry_run=dry_run)

    deleted, kept = trio.run(go)
    verb = "would delete" if dry_run else "deleted"
    for p in deleted:
        echo(f"{verb} {p.session_id} ({p.records} records)")
    for sid, why in kept:
        echo(f"kept {sid}: {why}", "warning")
    echo(f"{len(deleted)} session(s) {verb}, {len(kept)} kept", "outcome")


@main.command(name="export")
@click.argument("session")
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write to this file (default: standard output).",
)
@log_option
def export_session(session: str, output: Path | None, log_dir: str) -> None:
    """Write a session as JSON lines: its records with their sequence numbers (read-only)."""
    from perdure import retention

    log = _open_readonly(log_dir)
    try:
        records = log.read_session(session)
    finally:
        log.close()
    if not records:
        _fail(f"no session {session!r} in {log_dir}")
    lines = "".join(line + "\n" for line in retention.export_lines(session, records))
    if output is None:
        click.echo(lines, nl=False)
    else:
        output.write_text(lines)


@main.command(name="import")
@click.argument("source", type=click.File("r"))
@log_option
def import_session(source: Any, log_dir: str) -> None:
    """Restore a session exported by ``perdure export`` into this log (one commit)."""
    import trio

    from perdure import retention
    from perdure.errors import Refused
    from perdure.storage import LogError

    lines = source.read().splitlines()

    async def go() -> tuple[str, int]:
        async with _maintenance(log_dir) as journal:
            return await retention.import_session(journal, lines)

    try:
        sid, count = trio.run(go)
    except (Refused, ValueError) as exc:
        _fail(str(exc))
    except LogError as exc:
        _fail_log(exc, log_dir)
    echo(f"imported session {sid} ({count} records)")


@main.command()
@log_option
def compact(log_dir: str) -> None:
    """Rewrite an LMDB log into a smaller file (LMDB's compacting copy); no owner may run."""
    from perdure import retention
    from perdure.storage import LogBusy

    if Path(log_dir).is_file():
        _fail(f"--log names a file, not a log folder ({log_dir}): give --log the log's folder", 2)
    if not (Path(log_dir) / "data.mdb").exists():
        _no_log(log_dir)
    try:
        before, after = retention.compact(log_dir)
    except LogBusy as exc:
        _fail(f"{exc}; stop the process that owns the log first", 2)
    echo(f"compacted {log_dir}: {before} -> {after} bytes")


_cli_control.register(main)  # cancel, approve, deny, resolve, pause, resume, revise

if __name__ == "__main__":
    main()
