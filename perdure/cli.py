"""The ``perdure`` command line: run, serve, demo, sessions, show, check.

``run`` and ``serve`` own the log while they run; ``sessions``, ``show`` and
``check`` open it read-only, so they are safe beside a running daemon.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import sys
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, NoReturn

import click

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


log_option = click.option(
    "--log",
    "log_dir",
    default=".perdure",
    show_default=True,
    help="The log: a directory (LMDB) or a postgresql:// URL.",
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
    help="Tools to register: a @perdure.tool or a list of them (repeat or comma-separate). "
    "Default: the built-in workspace tools.",
)


def _split(specs: Iterable[str]) -> list[str]:
    return [part.strip() for spec in specs for part in spec.split(",") if part.strip()]


def _setup(provider: str, model: str | None, tool_specs: Iterable[str]) -> tuple[Any, Any]:
    from perdure._setup import SetupError, default_tools, load_provider, load_tools

    try:
        specs = _split(tool_specs)
        tools = load_tools(specs) if specs else default_tools()
        return load_provider(provider, model), tools
    except SetupError as exc:
        _fail(str(exc), 2)


@click.group()
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
    help="The directory the tools work in.",
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Read the API token from this file (else PERDURE_TOKEN, else a generated one "
    "stored in the log directory).",
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
    help="Seconds before an idle session's actor leaves memory (0: never).",
)
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
    token_file: Path | None,
    takeover: bool,
    heartbeat: float,
    durability: str,
    idle_timeout: float,
    metrics_port: int | None,
    log_format: str,
) -> None:
    """Serve the HTTP API, event streams and web page; recover interrupted runs first."""
    import trio

    if log_format == "json":
        from perdure.observability.logs import use_json_logs

        use_json_logs()

    from perdure._setup import SetupError
    from perdure.server.daemon import ServeOptions, check_port, resolve_token
    from perdure.server.daemon import serve as serve_daemon
    from perdure.storage import LogBusy, LogError

    try:
        token, source, show = resolve_token(log_dir, token_file, os.environ, host)
        check_port(host, port)
        if metrics_port is not None:
            if importlib.util.find_spec("prometheus_client") is None:
                raise SetupError("--metrics-port needs prometheus-client: perdure[metrics]")
            check_port("127.0.0.1", metrics_port)
    except SetupError as exc:
        _fail(str(exc), 2)
    prov, tools = _setup(provider, model, tool_specs)
    if workspace is not None:
        workspace.mkdir(parents=True, exist_ok=True)
    names = ", ".join(t.name for t in tools) or "none"
    _say(f"perdure serve: token from {source}; tools: {names}", "plain")
    opts = ServeOptions(
        log=log_dir,
        provider=prov,
        tools=tools,
        token=token,
        host=host,
        port=port,
        workspace=workspace,
        takeover=takeover,
        heartbeat=heartbeat,
        durability="fast" if durability == "fast" else "full",
        idle_timeout=idle_timeout or None,
        metrics_port=metrics_port,
    )
    try:
        trio.run(lambda: serve_daemon(opts, _say, show_token=show))
    except LogBusy as exc:
        _fail(f"{exc} (perdure serve --takeover takes it over)")
    except LogError as exc:
        _fail(str(exc))
    except SetupError as exc:
        _fail(str(exc), 2)


# -- run ---------------------------------------------------------------------------------


@main.command()
@click.argument("task")
@click.option(
    "--workspace",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="The directory the tools work in.",
)
@model_option
@provider_option
@log_option
@tools_option
@click.option("--session", "session_id", default=None, help="Continue this session.")
@click.option(
    "--request-id",
    default=None,
    help="Deduplication key (default: derived from the session and the task, so re-running "
    "the same command after a crash does not submit the task twice).",
)
@click.option("--yes", is_flag=True, help="Approve every tool call that asks for approval.")
def run(
    task: str,
    workspace: Path,
    model: str | None,
    provider: str,
    log_dir: str,
    tool_specs: tuple[str, ...],
    session_id: str | None,
    request_id: str | None,
    yes: bool,
) -> None:
    """Run one task to completion, streaming the model's text and the tool calls."""
    import trio

    from perdure.storage import LogError

    prov, tools = _setup(provider, model, tool_specs)
    try:
        status = trio.run(
            _run_task, task, workspace, log_dir, prov, tools, session_id, request_id, yes
        )
    except LogError as exc:
        _fail(str(exc))
    except KeyboardInterrupt:
        _fail("interrupted; the run is in the log and resumes the next time it is opened", 130)
    raise SystemExit(0 if status == "completed" else 1)


async def _run_task(
    task: str,
    workspace: Path,
    log_dir: str,
    provider: Any,
    tools: list[Any],
    session_id: str | None,
    request_id: str | None,
    yes: bool,
) -> str:
    from contextlib import aclosing

    import perdure

    progress = Progress(enabled=sys.stderr.isatty())
    async with perdure.open_runtime(
        log_dir, provider=provider, tools=tools, workspace=workspace
    ) as rt:
        sid = await rt.create_session(session_id)
        rid = request_id or "run-" + hashlib.sha256(f"{sid}\x00{task}".encode()).hexdigest()[:24]
        accepted = await rt.submit(sid, task, request_id=rid)
        echo(f"session {sid}, input {accepted.submission_id} (log {rt.location})", "dim")
        if accepted.duplicate:
            echo("this task was already submitted: following it to its outcome", "dim")
        prefix = accepted.submission_id + "."
        streamed: set[str] = set()
        async with progress.running() as show:
            show.status("waiting for the model")
            events = rt.events(sid, after=accepted.seq - 1, restarts=True)
            async with aclosing(events) as stream:
                async for event in stream:
                    outcome = await _show_event(rt, sid, event, prefix, streamed, show, yes)
                    if outcome is not None:
                        return outcome
    return "failed"


async def _show_event(
    rt: Any, sid: str, event: Any, prefix: str, streamed: set[str], show: Any, yes: bool
) -> str | None:
    """Print one event of our submission; return the run's final status when it ends."""
    import trio

    from perdure.storage import records as r

    rec = event.record
    data = event.data
    if event.kind == "model_call" and str(data.get("generation_id", "")).startswith(prefix):
        attempt = data.get("attempt", 1)
        show.status("waiting for the model" + (f" (attempt {attempt})" if attempt > 1 else ""))
    elif event.kind == "text_delta" and str(data.get("generation_id", "")).startswith(prefix):
        show.clear()
        streamed.add(data["generation_id"])
        echo(data.get("text", ""), nl=False)
        sys.stdout.flush()
    elif isinstance(rec, r.LogOpened):
        show.clear()
        echo(f"── runtime started (epoch {rec.epoch}, pid {rec.pid}) ──", "restart")
    elif isinstance(rec, r.GenerationCompleted) and rec.generation_id.startswith(prefix):
        show.clear()
        if rec.generation_id not in streamed and rec.text:
            echo(rec.text, nl=False)
        if rec.text:
            echo("")
        for call in rec.tool_calls:
            echo(f"→ {call.name}({json.dumps(call.input, ensure_ascii=False)[:200]})", "model")
    elif isinstance(rec, r.ToolAwaitingApproval):
        show.clear()
        approved, note = yes, "approved with --yes"
        if not yes and sys.stdin.isatty():
            approved = await trio.to_thread.run_sync(
                lambda: click.confirm(f"approve {rec.call_id}? ({rec.reason})", default=False)
            )
            note = "answered at the terminal"
        elif not yes:
            note = "no terminal to ask; run with --yes to approve"
        echo(f"{'approved' if approved else 'denied'}: {rec.call_id} ({note})", "warning")
        await rt.approve(
            sid, rec.call_id, approved=approved, request_id=f"cli-approve-{rec.call_id}", note=note
        )
    elif isinstance(rec, r.ToolAwaitingHuman):
        show.clear()
        echo(f"! {rec.call_id} needs a person: {rec.reason}", "warning")
        await _resolve_at_the_terminal(rt, sid, rec.call_id)
    elif isinstance(rec, r.ToolRetryPending):
        show.clear()
        wait = max(0.0, rec.not_before - rec.at)
        echo(
            f"↻ {rec.call_id}: attempt {rec.attempt} failed ({_short(rec.error)}); "
            f"retrying in {wait:.1f}s",
            "warning",
        )
    elif isinstance(rec, r.ToolExecuting):
        show.status(f"running {rec.tool_name} [{rec.call_id}]")
    elif isinstance(rec, r.ToolCompleted):
        show.clear()
        style = "warning" if rec.is_error else "tool"
        echo(f"{'✗' if rec.is_error else '✓'} {rec.call_id}: {_short(rec.output)}", style)
    elif isinstance(rec, r.ToolOutcomeUnknown):
        show.clear()
        echo(f"? {rec.call_id}: OUTCOME UNKNOWN — {rec.reason}", "warning")
    elif isinstance(rec, r.ToolCancelled):
        show.clear()
        echo(f"✗ {rec.call_id}: cancelled — {rec.reason}", "warning")
    elif isinstance(rec, r.RecoveryDecision):
        show.clear()
        echo(
            f"recovery: {rec.subject}: found {rec.found} → {rec.action} ({rec.reason})", "recovery"
        )
    elif isinstance(rec, r.RunFinished) and rec.submission_id + "." == prefix:
        if rec.status == "interrupted":
            return None
        show.clear()
        style = "outcome" if rec.status == "completed" else "warning"
        echo(f"run {rec.status}" + (f": {rec.reason}" if rec.reason else ""), style)
        return rec.status
    return None


async def _resolve_at_the_terminal(rt: Any, sid: str, call_id: str) -> None:
    """Ask at the terminal what to do with a call that needs a person; without one, fail it
    (the model is told). A call already resolved (e.g. by an earlier run) is left alone."""
    import trio

    from perdure.errors import Refused

    action, result = "fail", None
    if sys.stdin.isatty():
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


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- read-only commands ------------------------------------------------------------------


def _open_readonly(log_dir: str) -> Any:
    from perdure.storage.lmdb_log import LmdbLog

    try:
        return LmdbLog(log_dir, readonly=True)
    except FileNotFoundError:
        _fail(f"no perdure log at {log_dir} (use --log DIR)", 2)


@main.command()
@log_option
def sessions(log_dir: str) -> None:
    """List the sessions of a log (read-only)."""
    log = _open_readonly(log_dir)
    try:
        infos = sorted(log.sessions(), key=lambda i: i.first_seq)
    finally:
        log.close()
    if not infos:
        echo(f"no sessions in {log_dir}")
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
            _fail(f"no session {session!r} in {log_dir} (see: perdure sessions)", 2)
        records = log.read_session(session)
        system = log.read_system()
    except CorruptRecord as exc:
        _fail(f"{exc} (run: perdure check --log {log_dir})")
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
def check(log_dir: str, settled: bool) -> None:
    """Verify every record's checksum and the design's invariants (read-only)."""
    from perdure.check import check_log, last_seq
    from perdure.storage import is_postgres

    if not is_postgres(log_dir) and not (Path(log_dir) / "data.mdb").exists():
        _fail(f"no perdure log at {log_dir} (use --log DIR or --log postgresql://...)", 2)
    total = last_seq(log_dir)
    with click.progressbar(
        length=total, label="checking records", file=sys.stderr, hidden=not sys.stderr.isatty()
    ) as bar:
        seen = [0]

        def tick(seq: int) -> None:
            bar.update(seq - seen[0])
            seen[0] = seq

        report = check_log(log_dir, settled="all" if settled else "idle", on_frame=tick)
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
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="A directory copied into each scratch workspace before a run.",
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


if __name__ == "__main__":
    main()
