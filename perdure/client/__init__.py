"""Typed clients of ``perdure serve``: ``PerdureClient`` (sync) and ``AsyncPerdureClient``.

Both send the same calls (``perdure.client._model``): every route of the daemon's
``/v1`` API as a method returning attrs objects (``perdure.Accepted``,
``perdure.Done`` and ``perdure.Forked`` for commands, as the embedded runtime
returns them; the frontend protocols ``/chat`` and ``/ag-ui`` are for their own
SDKs), commands re-sent with the same request id when the daemon cannot be
reached or answers a retryable error (it deduplicates, so a command is recorded
once), event streams that reconnect with ``Last-Event-ID`` across daemon
restarts, and errors typed by the daemon's codes
(``perdure.client.errors``). Needs the ``client`` extra (httpx):
``pip install 'perdure[client]'``.
"""

from perdure.client._async import AsyncPerdureClient
from perdure.client._model import (
    EphemeralEvent,
    Grant,
    Health,
    PendingCall,
    RecordEvent,
    Retry,
    Run,
    SessionCreated,
    SessionInfo,
    SessionState,
    SessionToken,
    Stats,
    StreamEvent,
    TranscriptMessage,
    is_final,
)
from perdure.client._sync import PerdureClient
from perdure.client.errors import (
    BadRequest,
    Busy,
    Conflict,
    CorruptRecord,
    DaemonError,
    Forbidden,
    InvalidState,
    LogUnavailable,
    NotFound,
    NotOwner,
    Parked,
    ProtocolError,
    Restarting,
    ServerError,
    TooLarge,
    Unauthorized,
    Unavailable,
)

__all__ = [
    "AsyncPerdureClient",
    "BadRequest",
    "Busy",
    "Conflict",
    "CorruptRecord",
    "DaemonError",
    "EphemeralEvent",
    "Forbidden",
    "Grant",
    "Health",
    "InvalidState",
    "LogUnavailable",
    "NotFound",
    "NotOwner",
    "Parked",
    "PendingCall",
    "PerdureClient",
    "ProtocolError",
    "RecordEvent",
    "Restarting",
    "Retry",
    "Run",
    "ServerError",
    "SessionCreated",
    "SessionInfo",
    "SessionState",
    "SessionToken",
    "Stats",
    "StreamEvent",
    "TooLarge",
    "TranscriptMessage",
    "Unauthorized",
    "Unavailable",
    "is_final",
]
