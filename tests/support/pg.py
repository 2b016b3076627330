"""A throwaway PostgreSQL cluster for tests and benchmarks: initdb, start, databases, stop.

``PgCluster.start()`` finds the server binaries (``PERDURE_PG_BIN``, then ``PATH``,
then Debian's ``/usr/lib/postgresql/<version>/bin``), runs ``initdb`` into a fresh
temporary directory, and starts ``postgres`` on a free TCP port of 127.0.0.1 with
its unix socket in that directory; clients connect through the socket. PostgreSQL
refuses to run as root, so under root the cluster runs as an unprivileged user
(``PERDURE_PG_USER``, default ``nobody``) that owns the directory.

``new_database()`` creates an empty database and returns its ``postgresql://`` URL;
``stop()`` stops the server and removes everything. ``PgUnavailable`` says why a
cluster could not be started (the tests skip with that reason).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any


class PgUnavailable(Exception):
    """PostgreSQL cannot be started here; the message says why."""


def find_bin(name: str = "pg_ctl") -> Path:
    """The directory holding PostgreSQL's server binaries."""
    candidates: list[str] = []
    env = os.environ.get("PERDURE_PG_BIN")
    if env:
        candidates.append(env)
    found = shutil.which(name)
    if found:
        candidates.append(str(Path(found).resolve().parent))
    versions = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0,
        reverse=True,
    )
    candidates += versions
    for directory in candidates:
        if all((Path(directory) / tool).exists() for tool in ("initdb", "pg_ctl", "postgres")):
            return Path(directory)
    raise PgUnavailable(
        "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found: install the "
        "postgresql package or set PERDURE_PG_BIN"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class PgCluster:
    def __init__(self, *, fsync: bool = False) -> None:
        self.fsync = fsync
        self.bin = find_bin()
        self.root = Path(tempfile.mkdtemp(prefix="perdure-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self.user: str | None = None
        self._uid: int | None = None
        self._gid: int | None = None
        if os.geteuid() == 0:
            self.user = os.environ.get("PERDURE_PG_USER", "nobody")
            try:
                entry = pwd.getpwnam(self.user)
            except KeyError:
                raise PgUnavailable(f"running as root; user {self.user!r} does not exist") from None
            self._uid, self._gid = entry.pw_uid, entry.pw_gid
            os.chown(self.root, self._uid, self._gid)
            self.root.chmod(0o755)

    def _run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        kwargs: dict[str, Any] = {}
        if self._uid is not None:
            kwargs.update(user=self._uid, group=self._gid, extra_groups=[])
        return subprocess.run(
            [str(a) for a in args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.root,
            env={**os.environ, "LC_ALL": "C"},
            check=False,
            **kwargs,
        )

    def start(self) -> PgCluster:
        try:
            init = self._run(
                str(self.bin / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "perdure",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            )
            if init.returncode != 0:
                raise PgUnavailable(f"initdb failed: {init.stderr.strip()[-500:]}")
            options = (
                f"-c listen_addresses=127.0.0.1 -c port={self.port} "
                f"-c unix_socket_directories={self.root} -c max_connections=300 "
                f"-c fsync={'on' if self.fsync else 'off'} "
                f"-c full_page_writes={'on' if self.fsync else 'off'} "
                "-c shared_buffers=64MB"
            )
            started = self._run(
                str(self.bin / "pg_ctl"),
                "-D",
                str(self.data),
                "-l",
                str(self.root / "server.log"),
                "-o",
                options,
                "-w",
                "-t",
                "60",
                "start",
            )
            if started.returncode != 0:
                log = (self.root / "server.log").read_text(errors="replace")[-800:]
                raise PgUnavailable(f"postgres did not start: {started.stderr.strip()}\n{log}")
        except (OSError, subprocess.SubprocessError) as exc:
            self.stop()
            raise PgUnavailable(f"cannot run PostgreSQL: {exc}") from exc
        except PgUnavailable:
            self.stop()
            raise
        return self

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://perdure@/{database}?host={self.root}&port={self.port}"

    def admin(self) -> Any:
        import psycopg

        return psycopg.connect(self.url(), autocommit=True)

    def new_database(self, name: str | None = None, template: str | None = None) -> str:
        name = name or f"t_{uuid.uuid4().hex[:12]}"
        clause = f" TEMPLATE {template}" if template else ""
        with self.admin() as conn:
            conn.execute(f"CREATE DATABASE {name}{clause}")
        return self.url(name)

    def drop_database(self, name: str) -> None:
        with self.admin() as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop")
        for _ in range(50):
            if not (self.data / "postmaster.pid").exists():
                break
            time.sleep(0.1)
        shutil.rmtree(self.root, ignore_errors=True)


def database_of(url: str) -> str:
    """The database name of a URL made by ``PgCluster.url``."""
    return url.split("/", 3)[3].split("?", 1)[0]
