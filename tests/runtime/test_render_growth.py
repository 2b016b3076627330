"""A model call renders only what is new: history growth costs O(1) per turn.

The session actor keeps the model's view of its settled history (``MessageCache``) and
each request reuses those very message objects, rendering only the turns added since the
last call. The test counts, in each request a provider receives, the messages it has
never seen before (by identity): with the cache that count stays small however long the
session grows; re-rendering the whole history on every model call makes it grow with
the number of turns, and fails here. ``tests/core/test_conversation_cache.py`` checks
that the cached view equals the view rendered afresh.

An idle session drops its rendered view (memory nobody uses), so the first call of the
next input renders the history once; the promise is per turn of a run.
"""

from __future__ import annotations

import perdure
from perdure import ReplayPolicy, ToolContext
from perdure.providers.base import Emit, Message, ModelReply, ModelRequest
from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse
from perdure.storage.memory_log import MemoryLog

TURNS = 40


@perdure.tool(replay=ReplayPolicy.SAFE)
async def lookup(ctx: ToolContext, query: str) -> str:
    """Look something up."""
    return f"found {query}"


class CountingProvider(ScriptedProvider):
    """Notes, per model call, how many messages of the request are new objects."""

    def __init__(self, replies: list[Reply]) -> None:
        super().__init__(replies)
        self.seen: list[Message] = []  # kept alive, so that no id is reused
        self.seen_ids: set[int] = set()
        self.new_per_call: list[int] = []
        self.lengths: list[int] = []

    async def complete(self, request: ModelRequest, emit: Emit) -> ModelReply:
        fresh = [m for m in request.messages if id(m) not in self.seen_ids]
        self.new_per_call.append(len(fresh))
        self.lengths.append(len(request.messages))
        self.seen += fresh
        self.seen_ids.update(id(m) for m in fresh)
        return await super().complete(request, emit)


async def test_each_model_call_renders_only_the_turns_added_since_the_last() -> None:
    script = [Reply(tool_uses=[ToolUse("lookup", {"query": f"q{n}"})]) for n in range(TURNS)]
    model = CountingProvider([*script, Reply(text="done")])
    async with perdure.open_runtime(
        MemoryLog(), provider=model, tools=[lookup], hibernate_after=None, idle_timeout=None
    ) as rt:
        await rt.create_session("s")
        await rt.submit("s", "go", request_id="r1")
        await rt.wait_idle("s")
        assert [m.role for m in await rt.transcript("s")][-1] == "assistant"
    assert model.calls == TURNS + 1
    # The history grew to 2 * TURNS + 1 messages...
    assert model.lengths[-1] == 2 * TURNS + 1
    # ...yet each call brought at most its last assistant turn and the tool results
    # (the message they are merged into is made anew): a constant, not the history.
    assert max(model.new_per_call) <= 3, model.new_per_call
    assert sum(model.new_per_call) <= 3 * (TURNS + 1)
