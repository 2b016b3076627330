"""``perdure serve``: one process, one ``open_runtime``, many sessions, a graceful exit.

Start-up: the token is settled first (``--token-file``, ``PERDURE_TOKEN``, or a
token generated into the log directory with mode 0600 and reused by later starts,
so clients and the page keep working across restarts); binding a non-loopback
address without an explicit token is refused. Then ``open_runtime`` recovers and
continues every interrupted run before a single request is served (then the
process's garbage collector is tuned: ``perdure.tune_gc``), and Hypercorn's trio
worker serves the Starlette app on the same trio loop as the runtime.

Shutdown on SIGTERM or SIGINT: event streams end (clients reconnect to the next
process with ``Last-Event-ID``), Hypercorn stops accepting and finishes open
requests (up to ``graceful_timeout``), then the ``open_runtime`` block is left
normally, so running tools finish and their results are committed. A second
signal stops at once; whatever was in flight is recovered by the next start.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import secrets
import signal
import socket
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, cast

import hypercorn.trio
import trio
from attrs import frozen
from hypercorn.config import Config
from hypercorn.typing import ASGIFramework

from perdure import CompactionPolicy, open_runtime
from perdure._setup import SetupError
from perdure.collector import tune_gc
from perdure.errors import find_exception
from perdure.observability.hooks import auto_observers
from perdure.providers.base import Provider
from perdure.server.address import forget_address, write_address
from perdure.server.app import create_app
from perdure.storage import Durability, LogError, is_postgres
from perdure.stuck import DEFAULT_STUCK_AFTER
from perdure.tools.contract import Tool

if TYPE_CHECKING:
    from perdure.observability.metrics import RuntimeMetrics

TOKEN_FILE: Final = "daemon.token"
Say = Callable[[str, str], None]  # (text, style)


@frozen(kw_only=True)
class ServeOptions:
    log: str  # a directory (LMDB) or a postgresql:// URL
    provider: Provider
    tools: list[Tool]
    token: str
    token_key: bytes | None = None  # signs scoped session tokens (perdure.server.tokens)
    host: str = "127.0.0.1"
    port: int = 8765
    workspace: Path | None = None
    takeover: bool = False
    heartbeat: float = 15.0
    durability: Durability = "full"
    graceful_timeout: float = 5.0
    shutdown_grace: float = 10.0
    idle_timeout: float | None = 300.0
    hibernate_after: float | None = 1.0
    stuck_after: float = DEFAULT_STUCK_AFTER  # no committed record for this long: stuck
    compaction: CompactionPolicy | None = None  # context compaction (None: the default)
    mcp_servers: Sequence[Any] = ()  # perdure.tools.mcp.McpServer (the mcp extra)
    # Prometheus /metrics: on the API port behind the token, or (also) without the
    # token on this separate port, bound to loopback only. Needs perdure[metrics].
    metrics: bool = True
    metrics_port: int | None = None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve anywhere


def resolve_token(
    log: str | Path, token_file: Path | None, env: Mapping[str, str], host: str
) -> tuple[str, str, bool]:
    """``(token, where it came from, show it)``; refuses what would be unsafe.

    Blocking file I/O: call it before the trio loop starts.
    """
    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except OSError as exc:
            raise SetupError(f"cannot read --token-file {token_file}: {exc}") from None
        if not token:
            raise SetupError(f"--token-file {token_file} is empty")
        return token, f"--token-file {token_file}", False
    if "PERDURE_TOKEN" in env:
        token = env["PERDURE_TOKEN"].strip()
        if not token:
            raise SetupError("PERDURE_TOKEN is set but empty")
        return token, "PERDURE_TOKEN", False
    if not is_loopback(host):
        raise SetupError(
            f"refusing to listen on {host} (not a loopback address) with a generated token: "
            "give one explicitly with --token-file FILE or PERDURE_TOKEN"
        )
    if is_postgres(log):
        raise SetupError(
            "a PostgreSQL log has no directory to keep a generated token in: give one with "
            "--token-file FILE or PERDURE_TOKEN (the same on every node)"
        )
    log = Path(log)
    path = log / TOKEN_FILE
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        token = ""
    if token:
        os.chmod(path, 0o600)
        return token, str(path), True
    log.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, (token + "\n").encode())
    finally:
        os.close(fd)
    return token, f"{path} (generated)", True


def check_port(host: str, port: int) -> None:
    """Fail fast, before the log is opened and recovery starts, if the port is taken."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise SetupError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def _bind(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def serve(opts: ServeOptions, say: Say, *, show_token: bool = False) -> None:
    """Run the daemon until SIGTERM/SIGINT; see the module docstring."""
    closing = trio.Event()
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        try:
            async with trio.open_nursery() as top:
                top.start_soon(_on_signals, signals, closing, top.cancel_scope, say)
                await _serve(opts, closing, say, show_token)
                top.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            # The log's errors (busy, fenced, disk full) are for the user, not a traceback.
            found = find_exception(group, LogError)
            if found is not None:
                raise found from None
            raise


async def _on_signals(
    signals: AsyncIterator[int],
    closing: trio.Event,
    everything: trio.CancelScope,
    say: Say,
) -> None:
    async for signum in signals:
        name = signal.Signals(signum).name
        if not closing.is_set():
            say(
                f"perdure serve: {name}: stopping; running tools finish "
                "(send it again to stop at once)",
                "warning",
            )
            closing.set()
        else:
            say(f"perdure serve: {name} again: stopping at once", "warning")
            everything.cancel()
            return


async def _keep_address(
    log: str, url: str, closing: trio.Event, *, task_status: trio.TaskStatus[None]
) -> None:
    """Say where this daemon answers in the log's directory until it stops serving
    (``perdure.server.address``), so commands run beside the log find it; started
    (written) before the daemon says it listens."""
    if is_postgres(log):
        task_status.started()
        return  # no directory to write into: such clients are given --url
    await trio.to_thread.run_sync(write_address, log, url)
    task_status.started()
    try:
        await closing.wait()
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(forget_address, log)


def _metrics(opts: ServeOptions) -> RuntimeMetrics | None:
    if not opts.metrics and opts.metrics_port is None:
        return None
    try:
        from perdure.observability.metrics import RuntimeMetrics
    except ImportError:
        if opts.metrics_port is not None:
            raise SetupError(
                "--metrics-port needs prometheus-client: pip install 'perdure[metrics]'"
            ) from None
        return None  # the extra is absent: no /metrics route
    return RuntimeMetrics()


async def _serve(opts: ServeOptions, closing: trio.Event, say: Say, show_token: bool) -> None:
    metrics = _metrics(opts)
    async with open_runtime(
        opts.log,
        provider=opts.provider,
        tools=opts.tools,
        workspace=opts.workspace,
        takeover=opts.takeover,
        durability=opts.durability,
        shutdown_grace=opts.shutdown_grace,
        idle_timeout=opts.idle_timeout,
        hibernate_after=opts.hibernate_after,
        stuck_after=opts.stuck_after,
        compaction=opts.compaction,
        mcp_servers=opts.mcp_servers,
        telemetry=auto_observers() + ((metrics,) if metrics is not None else ()),
    ) as rt:
        # This process is the daemon's own: tune its collector, once recovery has
        # loaded the sessions it resumed (perdure.collector says why).
        tune_gc()
        if metrics is not None:
            metrics.attach(rt)
        recovered = rt.recovered_sessions
        say(
            f"perdure serve: log {rt.location} (epoch {rt.epoch}); "
            + (
                f"recovered {len(recovered)} session(s) with unfinished work: "
                + ", ".join(recovered[:10])
                + (" …" if len(recovered) > 10 else "")
                if recovered
                else "nothing to recover"
            ),
            "restart" if recovered else "plain",
        )
        # create_app reads the page's static files: off the trio loop, like all file I/O.
        build = partial(
            create_app,
            rt,
            token=opts.token,
            closing=closing,
            heartbeat=opts.heartbeat,
            token_key=opts.token_key,
            metrics=metrics if opts.metrics else None,
        )
        app = cast(ASGIFramework, await trio.to_thread.run_sync(build))
        config = Config()
        config.bind = [_bind(opts.host, opts.port)]
        config.accesslog = None
        config.graceful_timeout = opts.graceful_timeout
        config.include_server_header = False
        config.errorlog = logging.getLogger("perdure.http")
        async with trio.open_nursery() as nursery:
            binds: list[str] = await nursery.start(
                partial(
                    hypercorn.trio.serve, app, config, shutdown_trigger=closing.wait, mode="asgi"
                )
            )
            url = binds[0] if binds else f"http://{config.bind[0]}"
            await nursery.start(_keep_address, opts.log, url, closing)
            say(f"perdure serve: listening on {url}", "title")
            if metrics is not None and opts.metrics_port is not None:
                side = Config()
                side.bind = [_bind("127.0.0.1", opts.metrics_port)]
                side.accesslog = None
                side.include_server_header = False
                side.errorlog = config.errorlog
                scrape = cast(ASGIFramework, metrics.asgi_app())
                serving = partial(
                    hypercorn.trio.serve, scrape, side, shutdown_trigger=closing.wait, mode="asgi"
                )
                side_binds: list[str] = await nursery.start(serving)
                where = side_binds[0] if side_binds else f"http://{side.bind[0]}"
                say(f"perdure serve: metrics on {where}/metrics", "plain")
            if show_token:
                say(f"perdure serve: web page: {url}/?token={opts.token}", "plain")
                say(f"perdure serve: API docs: {url}/docs?token={opts.token}", "plain")
        say("perdure serve: HTTP stopped; waiting for running tools", "plain")
    say("perdure serve: stopped", "plain")
