"""A golden log of context compaction, written through the real Anthropic SDK.

``write_compaction_log(path)`` runs a runtime on a real LMDB directory with
``AnthropicProvider`` over the fake server of ``tests/fake_anthropic.py``, a context
window of 1000 tokens and two items kept verbatim. One session, ``compacted``:

* the first reply reports 900 input tokens, so the second input's turn waits for a
  summary: ``CompactionStarted`` then ``ContextCompacted``;
* the second reply reports 950 again, so the third input's turn starts a second
  compaction, whose summary call is overloaded and asked to wait ten minutes:
  ``CompactionRetryPending``.

The runtime then shuts down cleanly: the second compaction and the third input are
unfinished, so the recovery plan (make the summary again after its back-off, then the
turn) is part of the fixture.
"""

from __future__ import annotations

from pathlib import Path

import anthropic
import trio

import perdure
from perdure.providers.anthropic import AnthropicProvider
from tests import fake_anthropic as fa


def _script(a: fa.FakeAnthropic) -> None:
    a.script(
        fa.Reply(content=[fa.Text("Paris.")], usage=fa.FakeUsage(input_tokens=900)),
        fa.Reply(content=[fa.Text("Asked: capital.")]),
        fa.Reply(content=[fa.Text("About 2.1 million.")], usage=fa.FakeUsage(input_tokens=950)),
        fa.HttpError(
            status=529,
            type="overloaded_error",
            message="Overloaded",
            headers={"retry-after": "600"},
        ),
    )


async def _run(log: Path, a: fa.FakeAnthropic) -> None:
    client = anthropic.AsyncAnthropic(api_key="sk-ant-test", base_url=a.url, max_retries=0)
    provider = AnthropicProvider(model="claude-test", max_tokens=1024, client=client)
    policy = perdure.CompactionPolicy(window=1000, keep_recent=2)
    async with (
        client,
        perdure.open_runtime(
            log, provider=provider, compaction=policy, retry_base=0.01, shutdown_grace=1.0
        ) as rt,
    ):
        sid = await rt.create_session("compacted", system="You are the golden log.")
        for n, text in enumerate(("What is the capital of France?", "How many live there?")):
            await rt.submit(sid, text, request_id=f"compacted-{n}")
            with trio.fail_after(60):
                await rt.wait_idle(sid)
        await rt.submit(sid, "And Lyon?", request_id="compacted-2")
        with trio.fail_after(60):
            while True:
                stored = await rt._journal.read_session(sid)
                if any(type(c.record).__name__ == "CompactionRetryPending" for c in stored):
                    break
                await trio.sleep(0.01)


def write_compaction_log(log: Path) -> None:
    """Write the log (module docstring) into the new directory ``log``."""
    with fa.FakeAnthropic() as a:
        _script(a)
        trio.run(_run, log, a)
