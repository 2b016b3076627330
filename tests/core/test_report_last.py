"""``report_last``: a child actor's final message, a cancel point but no schedule point."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from perdure.actors.context import report_last


async def test_delivers_without_yielding_to_other_tasks() -> None:
    send, receive = trio.open_memory_channel[Any](1)
    ran: list[str] = []

    async def other() -> None:
        ran.append("other")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other)
        # ``other`` is runnable; a schedule point here would let it run first.
        await report_last(send, "done")
        assert ran == []
        assert receive.receive_nowait() == "done"
    assert ran == ["other"]


async def test_a_cancelled_child_reports_nothing() -> None:
    send, receive = trio.open_memory_channel[Any](1)
    with trio.CancelScope() as scope:
        scope.cancel()
        await report_last(send, "stale")
    assert scope.cancelled_caught
    with pytest.raises(trio.WouldBlock):
        receive.receive_nowait()


async def test_waits_for_room_in_a_full_mailbox() -> None:
    send, receive = trio.open_memory_channel[Any](1)
    send.send_nowait("first")
    delivered = trio.Event()

    async def child() -> None:
        await report_last(send, "second")
        delivered.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(child)
        await trio.testing.wait_all_tasks_blocked()
        assert not delivered.is_set()
        assert await receive.receive() == "first"
        assert await receive.receive() == "second"
    assert delivered.is_set()
