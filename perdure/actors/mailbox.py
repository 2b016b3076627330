"""A session's mailbox: everything its actor is told, one message at a time.

A session actor reads one mailbox and nothing else, so its transitions are serialised
by construction: a caller's command, a result of one of its children, and the end of
one of its own timers are all messages on it, handled in the order they arrive.

* Callers send a ``Message``: a command (``CommandMsg``), a wait for the session to
  be idle (``WaitIdle``), a read of its state inside the actor (``Query``), a request
  to stop dispatching (``Drain``) or to move to another node (``HandOver``). Each
  carries a ``Reply``, a one-shot slot the caller awaits; the actor fills it once (a
  value or an error), and the supervisor fails every reply a dead actor still owed.
* The actor's children (generation and tool actors) send a ``protocol.Result``.
* The actor's own timers send the rest: a result held back by a log outage and due
  for another commit (``RetryResult``), a model call whose back-off is over
  (``CallDue``), a hand-over's deadline (``HandOverDue``), a heartbeat throttle's
  interval (``FlushHeartbeat``).

The ``Mailbox`` outlives actor restarts, so no message is lost when an actor crashes
and the supervisor starts another. It is closed when its actor is evicted or handed
over: a sender then gets ``trio.BrokenResourceError`` and goes through the supervisor,
which starts a fresh actor and mailbox (or names the node the session moved to).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

import trio
from attrs import define, field

from perdure.actors import protocol
from perdure.actors.state import SessionState
from perdure.storage.records import RunFinished

T = TypeVar("T")
A = TypeVar("A", protocol.Accepted, protocol.Done)


class Reply(Generic[T]):
    """A one-shot answer slot for a caller waiting on the session."""

    def __init__(self) -> None:
        self._done = trio.Event()
        self._value: T | None = None
        self._error: BaseException | None = None

    def set(self, value: T) -> None:
        if not self._done.is_set():
            self._value = value
            self._done.set()

    def fail(self, error: BaseException) -> None:
        if not self._done.is_set():
            self._error = error
            self._done.set()

    async def wait(self) -> T:
        await self._done.wait()
        if self._error is not None:
            raise self._error
        return cast(T, self._value)  # set() stored a T


@define
class CommandMsg(Generic[A]):
    """A caller's command; ``A`` is the answer it gets (``Accepted`` for a submit)."""

    command: protocol.Command
    reply: Reply[A] = field(factory=Reply)


@define
class WaitIdle:
    reply: Reply[RunFinished | None] = field(factory=Reply)


@define
class Query(Generic[T]):
    """Read the state inside the actor (consistent with its commits)."""

    fn: Callable[[SessionState], T]
    reply: Reply[T] = field(factory=Reply)


@define
class Drain:
    """Stop dispatching; answer once no tool of this session is running."""

    reply: Reply[None] = field(factory=Reply)


@define
class HandOver:
    """Move to node ``target``: finish the current step, start nothing new, and stop at
    the next safe point (answered then); give up at ``deadline`` (trio clock)."""

    target: str
    deadline: float
    reply: Reply[None] = field(factory=Reply)


Message = CommandMsg[Any] | WaitIdle | Query[Any] | Drain | HandOver


@define
class RetryResult:
    result: protocol.Result


@define
class CallDue:
    """The back-off before a model call (or a summary's) is over: start it now, unless
    it was cancelled meanwhile (``timer`` is then no longer the call's entry)."""

    effect: protocol.CallModel | protocol.Summarize
    timer: trio.CancelScope
    durable: trio.Event | None


@define
class HandOverDue:
    """The hand-over's deadline passed: if no safe point came, the session stays."""

    handover: HandOver


@define
class FlushHeartbeat:
    """The throttle interval of a call's heartbeats has passed: commit the one held."""

    call_id: str


# Everything a session's mailbox carries: a caller's message, a result of one of its
# actors (model calls, tool calls, back-off timers), or one of its own timers.
Inbox = Message | protocol.Result | RetryResult | CallDue | HandOverDue | FlushHeartbeat


@define
class Mailbox:
    """A session's inbox; it outlives actor restarts so no message is lost.

    An evicted session's mailbox is closed (``evicted`` is set): a sender gets
    ``BrokenResourceError`` and the supervisor starts a fresh actor and mailbox. A
    session handed over to another node is closed the same way (``handed_over``).
    """

    send: trio.MemorySendChannel[Inbox]
    receive: trio.MemoryReceiveChannel[Inbox]
    evicted: bool = False
    handed_over: bool = False

    @classmethod
    def open(cls, size: int = 256) -> Mailbox:
        s, r = trio.open_memory_channel[Inbox](size)
        return cls(s, r)
