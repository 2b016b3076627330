"""The fold of a session's log, for tests that check what the core itself holds.

The public read API speaks the read model: ``Runtime.state`` hands its function a
``perdure.SessionLookup``, and ``view`` and ``summary`` answer snapshots. A test of the
runtime that checks the fold's own state (its tasks, checkpoints, requests seen,
revisions) folds the session's log as recovery does, through the runtime's private
read: what it checks is the core's, not a promise of the face.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from perdure._runtime import Runtime
    from perdure.actors.state import SessionState
    from perdure.embed import AsyncioRuntime


async def fold_of(rt: Runtime, session_id: str) -> SessionState:
    """The session's state folded from the log (``UnknownSession`` if it has none)."""
    return await rt._fold(session_id)


async def fold_in_asyncio(rt: AsyncioRuntime, session_id: str) -> SessionState:
    """``fold_of`` for an embedded runtime, read on its trio thread."""
    return await rt.run(rt.trio_runtime._fold, session_id)
