"""Child process of the SIGKILL test: one session against the Anthropic provider.

Run as ``python -m tests.providers._kill_child LOG_DIR`` with ``ANTHROPIC_API_KEY``
and ``ANTHROPIC_BASE_URL`` pointing at the parent's fake server. It submits one
input (the same request id every time, so a restarted child adds nothing new),
waits for the session to be idle and prints the outcome as one JSON line. The
parent kills it with SIGKILL during the retry back-off and starts it again.
"""

from __future__ import annotations

import json
import sys
import time

import trio

from perdure import open_runtime
from perdure.providers.anthropic import provider_from_env


async def main(log_dir: str) -> None:
    async with (
        provider_from_env("claude-test") as provider,
        open_runtime(log_dir, provider=provider, retry_base=0.05) as rt,
    ):
        recovered_at = time.time()
        sid = await rt.create_session("s-kill", system="You are a test.")
        await rt.submit(sid, "Say something durable.", request_id="req-kill-1")
        outcome = await rt.wait_idle(sid)
        assert outcome is not None
        result = {
            "status": outcome.status,
            "text": outcome.final_text,
            "reason": outcome.reason,
            "recovered_at": recovered_at,
            "recovered_sessions": rt.recovered_sessions,
        }
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    trio.run(main, sys.argv[1])
