"""Child process of the SIGKILL tests: one session against the Anthropic provider.

Run as ``python -m tests.providers._kill_child LOG_DIR [thinking|openai|fallback]``
with ``ANTHROPIC_API_KEY`` and ``ANTHROPIC_BASE_URL`` (``OPENAI_API_KEY`` and
``OPENAI_BASE_URL`` for ``openai`` and ``fallback``) pointing at the parent's fake
servers. It submits one input (the same request id every time, so a restarted
child adds nothing new), waits for the session to be idle and prints the outcome
as one JSON line. The parent kills it with SIGKILL during the retry back-off and
starts it again.

With ``thinking`` the provider has extended thinking on and the model may call
``add``: the retried request is then a tool-use continuation, which the API (and
the fake) accepts only with the reply's thinking blocks handed back.

With ``openai`` the provider is ``OpenAIProvider`` from the environment; with
``fallback`` it is ``FallbackProvider([anthropic, openai], after=1)``, both from
the environment, and the model may call ``add``.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import trio

import perdure
from perdure import ReplayPolicy, open_runtime
from perdure.providers import FallbackProvider
from perdure.providers import openai as openai_provider
from perdure.providers.anthropic import AnthropicProvider, provider_from_env
from perdure.providers.openai import OpenAIProvider


@perdure.tool(replay=ReplayPolicy.SAFE)
async def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def main(log_dir: str, mode: str) -> None:
    options: dict[str, Any] = {}
    provider: AnthropicProvider | OpenAIProvider | FallbackProvider
    if mode == "openai":
        provider = openai_provider.provider_from_env("gpt-test")
    elif mode == "fallback":
        secondary = openai_provider.provider_from_env("gpt-test")
        provider = FallbackProvider([provider_from_env("claude-test"), secondary], after=1)
        options["tools"] = [add]
    elif mode == "thinking":
        provider = AnthropicProvider(
            model="claude-test",
            max_tokens=2048,
            thinking={"type": "enabled", "budget_tokens": 1024},
        )
        options["tools"] = [add]
    else:
        provider = provider_from_env("claude-test")
    async with provider, open_runtime(log_dir, provider=provider, retry_base=0.05, **options) as rt:
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
    trio.run(main, sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "")
