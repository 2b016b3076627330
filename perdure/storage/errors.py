"""The storage layer's documented errors, shared by every backend and the Journal.

Each says what happened to the log and whether the same call may succeed later;
none of them is raised for a bug in the code above the log.
"""

from __future__ import annotations


class LogError(Exception):
    """Base class of the log's documented errors."""


class LogBusy(LogError):
    """Another live process owns the log."""


class LogFenced(LogError):
    """This process lost ownership of the log (it was taken over); it must stop writing."""


class SessionFenced(LogFenced):
    """This node lost one session's lease (another node took it over): that session's
    actor must stop; the node's other sessions go on."""

    def __init__(self, session_id: str, detail: str) -> None:
        super().__init__(f"session {session_id}: {detail}; nothing was written")
        self.session_id = session_id


class NotOwner(LogError):
    """The session is leased by another live node; send the command there."""

    def __init__(self, session_id: str, owner: str, expires_in: float, about: str = "") -> None:
        where = f" ({about})" if about else ""
        super().__init__(
            f"session {session_id} is owned by node {owner}{where}, whose lease runs "
            f"{expires_in:.1f} s more; send the command to that node (or retry after "
            "the lease expires if that node is gone)"
        )
        self.session_id = session_id
        self.owner = owner
        self.expires_in = expires_in


class LogUnavailable(LogError):
    """The log cannot be reached right now (a database outage, a broken connection).

    Transient: what failed did not happen, and the same call may succeed later.
    """


class CommitUnknown(LogUnavailable):
    """The connection failed while a commit was in flight: it may or may not have landed.

    The session actors concerned restart from the log (fold + recover), which is
    exactly how a crash at that point would be handled.
    """


class LogFormatError(LogError):
    """The log was written in a layout this build does not read (a newer perdure's)."""

    def __init__(self, path: str, layout: bytes, expected: bytes) -> None:
        shown = layout.decode(errors="replace")
        super().__init__(
            f"the log was written by a newer perdure (layout {shown}; this one reads "
            f"layout {expected.decode()})"
        )
        self.path = path
        self.layout = layout


class StorageFull(LogError):
    """The disk (or the map, beyond its limit) is full; the commit did not happen."""


class SessionBusy(LogError):
    """A session with unfinished work cannot be deleted; nothing was removed."""

    def __init__(self, session_id: str, open_submissions: int) -> None:
        super().__init__(
            f"session {session_id} has unfinished work ({open_submissions} open "
            "submissions or compensations); nothing was deleted"
        )
        self.session_id = session_id


class StaleGoal(LogError):
    """A guarded append was prepared under an older goal revision and was refused."""

    def __init__(self, session_id: str, expected: int, found: int) -> None:
        super().__init__(
            f"session {session_id}: append prepared under goal revision {expected}, "
            f"but revision {found} is in force; nothing was written"
        )
        self.expected = expected
        self.found = found


class CorruptRecord(Exception):
    """A stored record could not be decoded; nothing was guessed or skipped."""

    def __init__(self, seq: int, reason: str) -> None:
        super().__init__(f"record {seq} is damaged or unreadable: {reason}")
        self.seq = seq
        self.reason = reason
