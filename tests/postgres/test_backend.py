"""The storage interface: the location picks the backend, options are checked, imports lazy.

* a directory opens an ``LmdbLog``, a ``postgresql://`` URL a ``PgLog``; both are
  ``LogBackend``s, read-only opens included;
* an option of the other backend is refused with a clear message;
* ``import perdure`` (and opening an LMDB runtime) never imports psycopg.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from perdure.storage import LogBackend, is_postgres, open_log
from perdure.storage.lmdb_log import LmdbLog
from perdure.storage.pg_log import PgLog
from tests.support.procs import ROOT


def test_a_directory_is_lmdb_and_a_url_is_postgres(tmp_path: Path, pg_url: str) -> None:
    lmdb_log = open_log(tmp_path / "log")
    pg_log = open_log(pg_url, node_id="n1", lease_ttl=5)
    try:
        assert isinstance(lmdb_log, LmdbLog)
        assert isinstance(pg_log, PgLog)
        for log in (lmdb_log, pg_log):
            assert isinstance(log, LogBackend)
        assert not lmdb_log.multi_node
        assert pg_log.multi_node
        assert (pg_log.node_id, pg_log.lease_ttl) == ("n1", 5.0)
        assert lmdb_log.location == str(tmp_path / "log")
    finally:
        lmdb_log.close()
        pg_log.close()
    for location in (tmp_path / "log", pg_url):
        reader = open_log(location, readonly=True)
        try:
            assert len(reader.read_global()) == 1  # the LogOpened of the node above
        finally:
            reader.close()


def test_an_option_of_the_other_backend_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="node_id, lease_ttl: options of a PostgreSQL log"):
        open_log(tmp_path / "log", node_id="n1", lease_ttl=3)
    with pytest.raises(ValueError, match="map_size applies to an LMDB log"):
        open_log("postgresql://nowhere/db", map_size=1 << 20)
    assert is_postgres("postgres://h/db")
    assert not is_postgres(Path("postgresql:"))


def test_import_perdure_never_imports_psycopg(tmp_path: Path) -> None:
    code = (
        "import sys, trio, perdure\n"
        "from perdure.providers.scripted import ScriptedProvider\n"
        "async def main():\n"
        f"    async with perdure.open_runtime({str(tmp_path / 'log')!r},"
        " provider=ScriptedProvider([])):\n"
        "        pass\n"
        "trio.run(main)\n"
        "print('psycopg' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False", out.stderr
