"""Commands for a person: ``perdure cancel | approve | deny | resolve | pause | resume |
revise | compact-context SESSION …``, the API's changes of course from a shell.

Where a command goes:

1. ``--url URL``: to that daemon (its token from ``--token-file``, ``PERDURE_TOKEN``,
   or ``daemon.token`` in the ``--log`` directory);
2. else to the daemon that owns the ``--log`` directory, found from the
   ``daemon.json`` it writes there while it serves (``perdure.server.address``);
3. else, when no process owns the log, to the log itself: the command is decided
   by the core and recorded, nothing is run (``perdure._unowned`` says why and
   what the next owner does with it);
4. a log owned by a process that has no daemon to talk to (``perdure run``,
   another program's runtime) is left alone: the command says so and exits 1.

Every command carries a request id, as through the API: the same id is answered
as it was the first time, never recorded twice. Without ``--request-id`` it is
derived from the session and from what the command acts on, so running the same
command twice by accident records it once, while the same command later, about
something new, is a new request: ``cancel`` — the current run; ``approve`` and
``deny`` — the call; ``resolve`` — the call, its attempt, and the answer;
``revise`` — the current run and the text; ``pause`` and ``resume`` — the
session's last record (a second pause of a paused session records nothing anyway);
``compact-context`` — likewise the session's last record.

Exit statuses, within the command line's (``perdure._cli_errors``): 0 done (or
nothing to do: already done by this request, already paused, no run to cancel); 1
refused by the session (no such session or call, not in a state that takes the
command, a request id used for another command, a parked session), nobody to
deliver it to (the log's owner has no reachable daemon, the daemon cannot be
reached or refuses the token), or a failure of the log or daemon; 2 bad usage
(arguments, no log at ``--log``, a missing extra); 3 and 4 the log's file problems
(permissions, a read-only log, a newer format; no space), said as every command
says them.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final, Literal, NoReturn, cast

import click
from attrs import frozen

Resolution = Literal["retry", "skip", "fail"]
Kind = Literal[
    "cancel", "approve", "deny", "resolve", "pause", "resume", "revise", "compact-context"
]

EXIT_REFUSED: Final = 1  # also: nobody to deliver it to (as a log owned by a live process)
EXIT_USAGE: Final = 2
DAEMON_RETRY_S: Final = 5.0  # how long an unreachable or restarting daemon is retried


class NotDelivered(Exception):
    """Nobody to deliver the command to, or its daemon failed; the message says why
    (exit 1)."""


@frozen(kw_only=True)
class Order:
    """What the person asked for, before it is addressed to a daemon or a log."""

    kind: Kind
    session_id: str
    call_id: str = ""
    text: str = ""  # revise: the new request; approve and deny: the note
    action: Resolution = "retry"  # resolve
    result: Any = None  # resolve: what skip records, or what fail tells the model
    request_id: str | None = None

    def with_request_id(self, summary: Mapping[str, Any]) -> str:
        """The request id given, or the default derived from the session's summary (see
        the module docstring for what each command's default depends on)."""
        if self.request_id is not None:
            return self.request_id
        current = summary.get("current_run")
        anchor: list[Any]
        if self.kind == "cancel":
            anchor = [current]
        elif self.kind == "revise":
            anchor = [current, self.text]
        elif self.kind in ("approve", "deny"):
            anchor = [self.call_id]
        elif self.kind == "resolve":
            attempts = [
                t.get("attempt")
                for t in summary.get("tasks", ())
                if t.get("call_id") == self.call_id
            ]
            anchor = [self.call_id, attempts[0] if attempts else None, self.action, self.result]
        else:
            anchor = [summary.get("last_seq")]
        body = json.dumps([self.session_id, self.kind, *anchor], sort_keys=True, default=str)
        return f"person-{self.kind}-" + hashlib.sha256(body.encode()).hexdigest()[:20]


@frozen
class Outcome:
    """What happened: the runtime's answer, and through whom."""

    ref: str
    seq: int
    duplicate: bool
    request_id: str
    via: str  # "the daemon at URL" or "the log DIR"
    direct: bool  # recorded in a log nobody owns


def describe(order: Order, out: Outcome) -> str:
    """One line saying what happened."""
    sid = order.session_id
    if out.duplicate:
        return (
            f"session {sid}: already done by an earlier {order.kind} with request id "
            f"{out.request_id} (record #{out.seq}); nothing new recorded ({out.via})"
        )
    if not out.seq:
        nothing = {
            "cancel": "no run in progress, nothing to cancel"
            if not out.ref
            else f"run {out.ref} is already being cancelled",
            "pause": "already paused",
            "resume": "not paused, nothing to resume",
            "compact-context": f"context compaction {out.ref} is already in progress",
        }.get(order.kind, "nothing to record")
        return f"session {sid}: {nothing} ({out.via})"
    done = {
        "cancel": f"cancel of run {out.ref} recorded",
        "approve": f"call {order.call_id} approved",
        "deny": f"call {order.call_id} denied",
        "resolve": f"call {order.call_id} resolved: {order.action}",
        "pause": "paused (nothing new is dispatched; running tools finish)",
        "resume": "resumed",
        "revise": f"request revised (revision {out.ref})",
        "compact-context": f"context compaction {out.ref} started (the summary follows)",
    }[order.kind]
    later = (
        "; nothing runs now: the next process to open the log carries it out" if out.direct else ""
    )
    return f"session {sid}: {done} (record #{out.seq}, {out.via}{later})"


# -- delivery ------------------------------------------------------------------------------


def deliver(
    order: Order,
    log_dir: str,
    url: str | None,
    token_file: Path | None,
    tools: Callable[[], list[Any]],
) -> Outcome:
    """Send ``order`` where the module docstring says; raises ``Refused`` (and kin),
    ``NotDelivered`` or a log error."""
    from perdure.client.errors import Unavailable
    from perdure.server.address import read_address
    from perdure.storage import is_postgres

    if url is not None:
        try:
            return _via_daemon(order, url, _token(log_dir, token_file, url))
        except Unavailable as exc:
            raise NotDelivered(f"{exc.message} ({url}): is it running? check --url") from None
    if is_postgres(log_dir):
        _fail(
            "a PostgreSQL log is reached through one of its daemons: pass --url URL "
            "(and its token: --token-file FILE or PERDURE_TOKEN)",
            EXIT_USAGE,
        )
    if not (Path(log_dir) / "data.mdb").exists():
        _fail(
            f"no perdure log here ({log_dir}): give --log the log's folder, or --url URL "
            "for a daemon",
            EXIT_USAGE,
        )
    found = read_address(log_dir)
    if found is None or not found.alive():
        return _directly(order, log_dir, tools, daemon=None)
    try:
        return _via_daemon(order, found.url, _token(log_dir, token_file, found.url))
    except Unavailable as exc:
        # Its process lives but does not answer: a daemon still starting, or stuck.
        # If it has let go of the log meanwhile, the log itself takes the command.
        return _directly(order, log_dir, tools, daemon=(found.url, exc.message))


def _token(log_dir: str, token_file: Path | None, url: str) -> str:
    from perdure.server.daemon import TOKEN_FILE

    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except OSError as exc:
            _fail(f"cannot read --token-file {token_file}: {exc.strerror or exc}", EXIT_USAGE)
        if not token:
            _fail(f"--token-file {token_file} is empty", EXIT_USAGE)
        return token
    if os.environ.get("PERDURE_TOKEN", "").strip():
        return os.environ["PERDURE_TOKEN"].strip()
    try:
        token = (Path(log_dir) / TOKEN_FILE).read_text().strip()
    except OSError:
        token = ""
    if not token:
        raise NotDelivered(
            f"no token for the daemon ({url}): pass --token-file FILE or set PERDURE_TOKEN "
            f"(a daemon's generated token is in its log folder, {TOKEN_FILE})"
        )
    return token


def _via_daemon(order: Order, url: str, token: str) -> Outcome:
    try:
        from perdure.client import PerdureClient, Retry, Unauthorized
    except ImportError:
        _fail(
            "talking to a daemon needs the client extra: pip install 'perdure[client]'",
            EXIT_USAGE,
        )
    from perdure.client.errors import DaemonError, Unavailable
    from perdure.errors import Refused

    try:
        return _send(order, url, PerdureClient(url, token, retry=Retry(timeout=DAEMON_RETRY_S)))
    except Unauthorized:
        raise NotDelivered(
            f"the daemon refused the token ({url}): pass its token with "
            "--token-file FILE or PERDURE_TOKEN"
        ) from None
    except DaemonError as exc:
        if isinstance(exc, Refused | Unavailable):
            raise  # the session's refusal, as the runtime says it; or nobody answers
        raise NotDelivered(f"the daemon could not do it ({url}): {exc.message}") from None


def _send(order: Order, url: str, client: Any) -> Outcome:
    with client:
        summary = client.state(order.session_id).summary
        rid = order.with_request_id(summary)
        sid = order.session_id
        if order.kind == "cancel":
            done = client.cancel(sid, request_id=rid)
        elif order.kind in ("approve", "deny"):
            approved = order.kind == "approve"
            done = client.approve(
                sid, order.call_id, approved=approved, request_id=rid, note=order.text
            )
        elif order.kind == "resolve":
            done = client.resolve(
                sid, order.call_id, action=order.action, result=order.result, request_id=rid
            )
        elif order.kind == "pause":
            done = client.pause(sid, request_id=rid)
        elif order.kind == "resume":
            done = client.resume(sid, request_id=rid)
        elif order.kind == "compact-context":
            done = client.compact_context(sid, request_id=rid)
        else:
            done = client.revise(sid, order.text, request_id=rid)
    return Outcome(done.ref, done.seq, done.duplicate, rid, f"the daemon at {url}", False)


def _directly(
    order: Order,
    log_dir: str,
    tools: Callable[[], list[Any]],
    daemon: tuple[str, str] | None,
) -> Outcome:
    import trio

    from perdure.storage import LogBusy

    try:
        return trio.run(_apply, order, log_dir, tools())
    except LogBusy as exc:
        owner = str(exc).split(" is owned by ", 1)[-1].split(";", 1)[0]
        if daemon is not None:
            where, why = daemon
            raise NotDelivered(
                f"the log is owned by {owner}, and its daemon at {where} does not answer "
                f"({log_dir}; {why}): wait for it to start, or use --url"
            ) from None
        raise NotDelivered(
            f"the log is owned by {owner}, which has no daemon to talk to ({log_dir}): "
            "answer at its terminal (perdure run asks there), or stop it and run this again"
        ) from None


async def _apply(order: Order, log_dir: str, tools: list[Any]) -> Outcome:
    from perdure._runtime import resolution
    from perdure._unowned import owning
    from perdure.actors import protocol
    from perdure.inspect import summarize
    from perdure.settings import Settings
    from perdure.tools.contract import registry

    # No runtime owns the log, so none has settings to lend: the command is decided
    # under those a runtime opened with no options would have, and records what that
    # runtime would.
    async with owning(log_dir, registry(tools), settings=Settings()) as log:
        state = await log.state(order.session_id)
        rid = order.with_request_id(summarize(state))
        command: protocol.Command
        if order.kind == "cancel":
            command = protocol.Cancel(rid)
        elif order.kind in ("approve", "deny"):
            command = protocol.Approve(order.call_id, order.kind == "approve", rid, order.text)
        elif order.kind == "resolve":
            command = resolution(order.call_id, order.action, order.result, rid)
        elif order.kind == "pause":
            command = protocol.Pause(rid)
        elif order.kind == "resume":
            command = protocol.Resume(rid)
        elif order.kind == "compact-context":
            command = protocol.CompactContext(rid)
        else:
            command = protocol.Revise(rid, order.text)
        done = await log.apply(state, command)
    return Outcome(done.ref, done.seq, done.duplicate, rid, f"the log {log_dir}", True)


# -- the click commands -----------------------------------------------------------------


def _fail(message: str, code: int) -> NoReturn:
    click.secho(f"perdure: {message}", fg="red", err=True)
    raise SystemExit(code)


def _run(
    order: Order,
    log_dir: str,
    url: str | None,
    token_file: Path | None,
    tool_specs: tuple[str, ...] = (),
) -> None:
    """Deliver ``order``, print one line, exit with the documented status."""
    from perdure._cli_errors import explain
    from perdure.errors import Refused
    from perdure.storage import LogError

    def tools() -> list[Any]:
        from perdure._setup import SetupError, default_tools, load_tools

        specs = [p.strip() for spec in tool_specs for p in spec.split(",") if p.strip()]
        try:
            return load_tools(specs) if specs else default_tools()
        except SetupError as exc:
            _fail(str(exc), EXIT_USAGE)

    try:
        outcome = deliver(order, log_dir, url, token_file, tools)
    except NotDelivered as exc:
        _fail(str(exc), EXIT_REFUSED)
    except Refused as exc:
        hint = " (another --request-id sends it as a new request)" if exc.code == "conflict" else ""
        _fail(f"session {order.session_id}: {exc.message}{hint}", EXIT_REFUSED)
    except Exception as exc:
        problem = explain(exc, log_dir)
        if problem is not None:  # the log's file problems, said as every command says them
            _fail(problem.line(), problem.status)
        if isinstance(exc, LogError):
            _fail(f"{exc} ({log_dir})", EXIT_REFUSED)
        raise
    click.echo(describe(order, outcome))
    sys.stdout.flush()


def _common(f: Callable[..., None]) -> Callable[..., None]:
    """The options every command for a person takes: where to send it, and its id."""
    options = [
        click.option(
            "--request-id",
            default=None,
            help="Deduplication key (default: derived from what the command acts on, so "
            "running it twice by accident records it once).",
        ),
        click.option(
            "--token-file",
            type=click.Path(dir_okay=False, path_type=Path),
            default=None,
            help="The daemon's token (else PERDURE_TOKEN, else daemon.token in --log).",
        ),
        click.option(
            "--url",
            default=None,
            help="A daemon's address (default: the one serving --log, found from the "
            "daemon.json it writes there; without one, the log itself).",
        ),
        click.option(
            "--log",
            "log_dir",
            default=".perdure",
            show_default=True,
            help="The log (a directory).",
        ),
    ]
    for option in options:
        f = option(f)
    return f


_tools_option = click.option(
    "--tools",
    "tool_specs",
    multiple=True,
    metavar="MODULE:ATTR",
    help="Without a daemon: the agent's tools, as given to perdure run or serve, which "
    "say which completed calls a compensation can undo (default: the built-in tools).",
)

_EPILOG = (
    "Sent to the daemon serving the log (or --url); with no process owning the log, "
    "recorded in it directly, nothing run until a process next opens it. Exit status: "
    "0 done or nothing to do; 1 refused by the session, or nobody to deliver it to; 2 "
    "bad usage; 3 and 4 the log's file problems (see perdure --help)."
)


@click.command(epilog=_EPILOG)
@click.argument("session")
@_tools_option
@_common
def cancel(
    session: str,
    tool_specs: tuple[str, ...],
    log_dir: str,
    url: str | None,
    token_file: Path | None,
    request_id: str | None,
) -> None:
    """Cancel SESSION's current run (input queued after it still runs)."""
    _run(
        Order(kind="cancel", session_id=session, request_id=request_id),
        log_dir,
        url,
        token_file,
        tool_specs,
    )


def _decision(kind: Literal["approve", "deny"], summary: str) -> click.Command:
    @click.command(kind, help=summary, epilog=_EPILOG)
    @click.argument("session")
    @click.argument("call")
    @click.option("--note", default="", help="Why, recorded with the decision.")
    @_common
    def decided(
        session: str,
        call: str,
        note: str,
        log_dir: str,
        url: str | None,
        token_file: Path | None,
        request_id: str | None,
    ) -> None:
        order = Order(kind=kind, session_id=session, call_id=call, text=note, request_id=request_id)
        _run(order, log_dir, url, token_file)

    return decided


approve = _decision("approve", "Approve tool call CALL of SESSION, which awaits approval.")
deny = _decision("deny", "Deny tool call CALL of SESSION (the model is told it was denied).")


_RESOLUTIONS: tuple[Resolution, ...] = ("retry", "skip", "fail")
# A call whose outcome is unknown: what the person says happened, as the action it means.
OUTCOME_ANSWERS: dict[str, Resolution] = {
    "applied": "skip",
    "not-applied": "retry",
    "failed": "fail",
}


@click.command(epilog=_EPILOG)
@click.argument("session")
@click.argument("call")
@click.argument("action", type=click.Choice([*_RESOLUTIONS, *OUTCOME_ANSWERS]))
@click.option(
    "--result",
    default=None,
    help="skip/applied: the result to record; fail/failed: what the model is told "
    "(JSON, else text).",
)
@_common
def resolve(
    session: str,
    call: str,
    action: str,
    result: str | None,
    log_dir: str,
    url: str | None,
    token_file: Path | None,
    request_id: str | None,
) -> None:
    """Answer tool call CALL of SESSION, which waits for a person: run it again
    (retry, with the same idempotency key), record a result (skip), or fail it.

    For a call whose outcome is unknown, say what happened in the same words or in
    these: applied (= skip, with --result), not-applied (= retry: run it once more,
    same key) or failed (= fail)."""
    action = OUTCOME_ANSWERS.get(action, action)
    if action == "retry" and result is not None:
        _fail("--result goes with skip or fail; a retry runs the call again", EXIT_USAGE)
    value: Any = result
    if result is not None:
        try:
            value = json.loads(result)
        except ValueError:
            value = result  # plain text
    order = Order(
        kind="resolve",
        session_id=session,
        call_id=call,
        action=cast(Resolution, action),
        result=value,
        request_id=request_id,
    )
    _run(order, log_dir, url, token_file)


@click.command(epilog=_EPILOG)
@click.argument("session")
@_common
def pause(
    session: str, log_dir: str, url: str | None, token_file: Path | None, request_id: str | None
) -> None:
    """Pause SESSION: nothing new is dispatched (running tools finish), across restarts."""
    _run(Order(kind="pause", session_id=session, request_id=request_id), log_dir, url, token_file)


@click.command(epilog=_EPILOG)
@click.argument("session")
@_common
def resume(
    session: str, log_dir: str, url: str | None, token_file: Path | None, request_id: str | None
) -> None:
    """Resume SESSION after a pause."""
    _run(Order(kind="resume", session_id=session, request_id=request_id), log_dir, url, token_file)


@click.command(epilog=_EPILOG)
@click.argument("session")
@click.argument("text")
@_tools_option
@_common
def revise(
    session: str,
    text: str,
    tool_specs: tuple[str, ...],
    log_dir: str,
    url: str | None,
    token_file: Path | None,
    request_id: str | None,
) -> None:
    """Replace the request of SESSION's current run with TEXT (unstarted calls of the
    old request are cancelled; the next model turn reads the new one)."""
    order = Order(kind="revise", session_id=session, text=text, request_id=request_id)
    _run(order, log_dir, url, token_file, tool_specs)


@click.command("compact-context", epilog=_EPILOG)
@click.argument("session")
@_common
def compact_context(
    session: str, log_dir: str, url: str | None, token_file: Path | None, request_id: str | None
) -> None:
    """Summarise SESSION's conversation now: the model is sent the summary in place of
    its older turns (the log keeps every record). Not ``perdure compact``, which
    compacts the log file."""
    order = Order(kind="compact-context", session_id=session, request_id=request_id)
    _run(order, log_dir, url, token_file)


COMMANDS: Final = (cancel, approve, deny, resolve, pause, resume, revise, compact_context)


def register(group: click.Group) -> None:
    """Add the commands for a person to the ``perdure`` group."""
    for command in COMMANDS:
        group.add_command(command)
