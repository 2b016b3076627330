"""A hibernated session's state, frozen into one compact ``bytes`` until it wakes.

An idle session's folded state is some 20 KiB of small Python objects for ten tool
calls of history; pickled and compressed it is about 2.6 KiB. Kept frozen, a dormant
session also leaves no small objects behind on the allocator's pages: a few objects
surviving a burst of busy sessions keep whole 1 MiB arenas of Python's allocator
resident, and a frozen state is one ``bytes`` (large ones come from ``malloc``), so a
daemon that served a thousand sessions at once gives most of that memory back when
they go idle.

The blob starts with the trio time at which the session is to be evicted, so the
supervisor's table of dormant sessions needs no object per session besides it. The
state only ever comes back into the process that froze it (pickle never reads
anything from outside), and it is a plain attrs record tree folded from the log.
"""

from __future__ import annotations

import pickle
import struct
import zlib

from perdure.actors.state import SessionState

# Past these sizes the supervisor freezes (a state with this many conversation items)
# and thaws (a blob this long) in a worker thread: that takes milliseconds (about
# 40 µs per turn of history each way), which other sessions should not wait for; a
# smaller state costs less than the trip to a thread and back.
OFF_LOOP_ITEMS = 150
OFF_LOOP_BYTES = 16 * 1024

_UNTIL = struct.Struct("<d")
# Fast compression: the blob is thawed in the same process soon or never; a higher
# level costs more CPU at every hibernation than the few hundred bytes it would save.
_LEVEL = 1


def freeze(state: SessionState, until: float) -> bytes:
    """``state`` as one blob that thaws back into an equal state (see ``thaw``)."""
    body = zlib.compress(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL), _LEVEL)
    return _UNTIL.pack(until) + body


def thaw(blob: bytes) -> SessionState:
    """The state ``freeze`` was given: a new, equal object tree (the blob stays valid)."""
    state = pickle.loads(zlib.decompress(memoryview(blob)[_UNTIL.size :]))
    if not isinstance(state, SessionState):  # only freeze writes these: a bug if not
        raise TypeError(f"a dormant blob thawed into a {type(state).__name__}")
    return state


def until(blob: bytes) -> float:
    """The trio time at which the frozen session is to be evicted (inf: never)."""
    (at,) = _UNTIL.unpack_from(blob)
    return float(at)
