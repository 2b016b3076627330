"""The operations ``AsyncioRuntime`` gained to match ``Runtime``, each called for real.

(``tests/client/test_faces.py`` checks the parameters; this checks they do the work:
input policies and trace context passed through, fork, delete, prune, export and
import, sub-agents, the sessions moved between nodes.)
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import perdure.embed
from perdure.providers.scripted import Reply, ScriptedProvider
from tests.embed.test_embed import MODES


@pytest.mark.parametrize("mode", MODES)
def test_fork_delete_prune_export_and_import_from_asyncio(mode: str, tmp_path: Path) -> None:
    async def main() -> None:
        model = ScriptedProvider([Reply(text="first"), Reply(text="second")])
        async with perdure.embed.open_runtime(tmp_path / "log", mode=mode, provider=model) as rt:
            assert await rt.create_session("a", if_busy="reject") == "a"
            assert not await rt.ensure_session("a", if_busy="reject")
            traced = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
            accepted = await rt.submit("a", "one", request_id="r1", traceparent=traced)
            assert accepted.disposition == "queued"
            done = await rt.wait_idle("a")
            assert done is not None and done.final_text == "first"
            forked = await rt.fork("a", session_id="b", request_id="f1")
            assert forked.session_id == "b" and forked.source == "a"
            assert await rt.children("a") == []
            lines = await rt.export_session("b")
            assert await rt.delete_session("b", reason="tidy") > 0
            assert {i.session_id for i in await rt.sessions()} == {"a"}
            assert await rt.import_session(iter(lines)) == "b"
            assert len(await rt.transcript("b")) == len(await rt.transcript("a"))
            would, kept = await rt.prune(4e9, dry_run=True)
            assert sorted(p.session_id for p in would) == ["a", "b"] and kept == []
            assert {i.session_id for i in await rt.sessions()} == {"a", "b"}  # a dry run
            assert await rt.received_sessions() == [] and await rt.handed_over_sessions() == []
            again = await rt.submit("a", "two", request_id="r2", if_busy="reject")
            assert again.disposition == "queued"  # idle: nothing to reject
            assert (await rt.wait_idle("a")).final_text == "second"  # type: ignore[union-attr]

    asyncio.run(main())
