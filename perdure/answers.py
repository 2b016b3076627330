"""What a caller's command answers, and the ``if_busy`` policies input may name.

These few records are shared by every face of perdure: the runtime answers with them,
and the HTTP clients build the same ones from the daemon's JSON, so that code written
against an embedded runtime reads a remote one alike. They import nothing of the
runtime, so the clients can use them without it.
"""

from __future__ import annotations

from typing import Literal, cast

from attrs import frozen

IfBusy = Literal["queue", "interrupt", "reject", "steer"]
IF_BUSY: tuple[str, ...] = ("queue", "interrupt", "reject", "steer")


def check_if_busy(value: str | None) -> IfBusy | None:
    """``value`` if it names an ``if_busy`` policy (or is None), else a ValueError."""
    if value is not None and value not in IF_BUSY:
        raise ValueError(f"if_busy must be one of {', '.join(IF_BUSY)}, not {value!r}")
    return cast(IfBusy | None, value)


@frozen
class Accepted:
    """The answer to a submit: durable before the caller sees it."""

    submission_id: str
    seq: int
    duplicate: bool = False
    # queued (waits its turn, or started at once), interrupted (the busy run was
    # cancelled for it) or steered (it revised the running request ``submission_id``)
    disposition: str = "queued"


@frozen
class Done:
    """The answer to other commands. ``seq`` is 0 when nothing had to be recorded."""

    ref: str
    seq: int = 0
    duplicate: bool = False


@frozen
class Forked:
    """The answer to a fork: the new session, and where in the source it was taken."""

    session_id: str
    source: str
    position: int  # the source's seq the fork was taken at
    duplicate: bool = False


@frozen
class Rewound:
    """The answer to a rewind: the workspace's files were put back as ``tree``.

    ``position`` is the session's log position whose workspace was restored;
    ``before`` the workspace just before the rewind (rewind to it to undo).
    """

    session_id: str
    tree: str
    position: int
    before: str = ""
    duplicate: bool = False


@frozen
class CallDiff:
    """What one attempt of a workspace call changed: its checkpoints and their diff."""

    call_id: str
    attempt: int
    tool_name: str
    before: str  # trees of the workspace history store
    after: str
    changed: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()  # files left out of the snapshots for their size
    patch: str = ""  # a unified diff (binary files are named, not shown)
