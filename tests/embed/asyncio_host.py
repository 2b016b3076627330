"""An asyncio program that embeds perdure (``perdure.embed``); the crash tests' child.

    python -m tests.embed.asyncio_host LOG WORKSPACE MODE

It opens the runtime inside ``asyncio.run`` (which recovers whatever a killed
predecessor left), submits one task with a fixed request id (a restarted host
submits it again and relies on deduplication), waits until the session is idle
and prints its outcome as one JSON line. Faults come from PERDURE_FAULT.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import perdure.embed
from perdure.providers.scripted import Reply, ScriptedProvider, _converter
from tests.server.conftest import WORK_SCRIPT
from tests.support import ledger_tools


async def main(log: str, workspace: str, mode: Any) -> None:
    replies = _converter.structure(WORK_SCRIPT, list[Reply])
    async with perdure.embed.open_runtime(
        log,
        mode=mode,
        provider=ScriptedProvider(replies),
        tools=ledger_tools.ALL_TOOLS,
        workspace=workspace,
    ) as rt:
        print(json.dumps({"started": True, "recovered": rt.recovered_sessions}), flush=True)
        await rt.ensure_session("s1")
        accepted = await rt.submit("s1", "do the work", request_id="task-1")
        # The asyncio loop stays free while the runtime works on its own thread/guest run.
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        outcome = await rt.wait_idle("s1")
        ticker.cancel()
        assert outcome is not None
        print(
            json.dumps(
                {
                    "session": "s1",
                    "submission_id": accepted.submission_id,
                    "duplicate": accepted.duplicate,
                    "status": outcome.status,
                    "final_text": outcome.final_text,
                    "ticks": ticks,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
