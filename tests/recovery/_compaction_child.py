"""Child process of the compaction crash test: two inputs, a compaction between them.

Run as ``python -m tests.recovery._compaction_child LOG_DIR`` with ``ANTHROPIC_API_KEY``
and ``ANTHROPIC_BASE_URL`` pointing at the parent's fake server (and ``PERDURE_FAULT``
to die at one of the compaction's commits). The context window is 1000 tokens and the
fake reports 900 for the first reply, so the second input's turn waits for a summary.
The inputs carry fixed request ids, so a restarted child adds nothing new; it waits
for the session to be idle and prints the last outcome as one JSON line.
"""

from __future__ import annotations

import json
import sys

import trio

import perdure
from perdure import open_runtime
from perdure.providers.anthropic import provider_from_env


async def main(log_dir: str) -> None:
    provider = provider_from_env("claude-test")
    policy = perdure.CompactionPolicy(window=1000, keep_recent=2)
    async with (
        provider,
        open_runtime(log_dir, provider=provider, retry_base=0.05, compaction=policy) as rt,
    ):
        sid = await rt.create_session("s-compact", system="You are a test.")
        outcome = None
        for n, text in enumerate(("What is the capital of France?", "How many live there?")):
            await rt.submit(sid, text, request_id=f"req-{n}")
            outcome = await rt.wait_idle(sid)
        assert outcome is not None
        print(json.dumps({"status": outcome.status, "text": outcome.final_text}), flush=True)


if __name__ == "__main__":
    trio.run(main, sys.argv[1])
