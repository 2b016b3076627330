"""What a failed call to a vendor's HTTP API means for the runtime: one table, every vendor.

The SDK-backed providers (Anthropic, OpenAI) switch their SDK's own retries off and
hand every failure to ``classify_failure``, which turns it into one
``ProviderError``: retryable or not, the server's ``retry-after``, the status, the
usage the attempt had already cost, and whether the provider is *exhausted* (a quota
or spend limit: waiting does not help it, another provider might). The runtime turns
a retryable error into a durable ``RetryPending`` record; a fallback moves on.

=============================================  =========  ================================
failure                                        retryable  notes
=============================================  =========  ================================
429 rate limit                                 yes        ``retry-after`` honoured
429 quota or spend limit                       no         exhausted: waiting does not cure
500 and every other 5xx (529 overloaded too)   yes        ``retry-after`` honoured
408 request timeout, 409 conflict              yes        as the SDKs' own policy
400, 401, 403, 404, 413, 422, other 4xx        no         the server's message is kept
connection refused or reset, timeout           yes        the SDK's connection errors
stream cut midway (socket closed, truncated)   yes        httpx2 ``TransportError``
stream ended before its end marker             yes        ``StreamBroken``
error event midway through the stream          by kind    as its status would be
anything else the SDK raises                   no         e.g. a bad client setup
=============================================  =========  ================================

A vendor describes itself with a ``Vendor``: its SDK's exception classes, and how to
read one of its error responses (``StatusDetails``) and one of its in-stream error
events. The decisions above are made here only.
"""

from __future__ import annotations

import contextlib
import email.utils
import math
import time
from collections.abc import Callable, Mapping
from types import ModuleType

import httpx2
from attrs import frozen

from perdure.providers.base import ProviderError
from perdure.storage.records import Usage

__all__ = [
    "StatusDetails",
    "StreamBroken",
    "Vendor",
    "classify_failure",
    "retry_after",
    "retryable_status",
]


class StreamBroken(Exception):
    """The response stream ended, or failed, before a complete reply arrived."""

    def __init__(self, message: str, *, error_type: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.error_type = error_type  # the vendor's error kind, for an in-stream error event


@frozen(kw_only=True)
class StatusDetails:
    """What a vendor's error response says, read by the vendor's own ``describe``."""

    label: str  # e.g. "429 rate_limit_error/insufficient_quota"
    message: str  # the server's own words
    request_id: str | None = None
    exhausted: bool = False  # a quota or spend limit: waiting does not cure it


@frozen(kw_only=True)
class Vendor:
    """One vendor's SDK, as the classification needs to know it."""

    name: str  # "Anthropic", "OpenAI": used in messages
    status_error: type[Exception]  # the SDK's error for a 4xx/5xx response
    connection_error: type[Exception]  # the SDK's "cannot reach" error
    timeout_error: type[Exception]  # the SDK's time-out (a kind of connection error)
    sdk_error: type[Exception]  # the SDK's base error
    describe: Callable[[Exception], tuple[int, StatusDetails]]  # status error -> status, details
    stream_error: Callable[[StreamBroken], tuple[int, bool]]  # error event -> status, exhausted

    @classmethod
    def of_sdk(
        cls,
        sdk: ModuleType,
        name: str,
        describe: Callable[[Exception], tuple[int, StatusDetails]],
        stream_error: Callable[[StreamBroken], tuple[int, bool]],
    ) -> Vendor:
        """A vendor whose SDK names its errors as both vendors' SDKs do (``APIStatusError``,
        ``APIConnectionError``, ``APITimeoutError``, a base ``<Name>Error``)."""
        return cls(
            name=name,
            status_error=sdk.APIStatusError,
            connection_error=sdk.APIConnectionError,
            timeout_error=sdk.APITimeoutError,
            sdk_error=getattr(sdk, f"{name}Error"),
            describe=describe,
            stream_error=stream_error,
        )


def retryable_status(status: int, *, exhausted: bool = False) -> bool:
    """Whether an HTTP status is worth retrying (the one rule both vendors follow)."""
    if exhausted:
        return False
    return status >= 500 or status in (408, 409, 429)


def classify_failure(
    vendor: Vendor, exc: BaseException, usage: Usage | None = None
) -> ProviderError:
    """The one place that decides what a failed vendor call means (see the module table).

    ``usage`` is what the server reported for this attempt before it failed (a stream
    that broke midway); it is carried on the error so failed attempts count too.
    """
    usage = usage or Usage()
    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, StreamBroken):
        if exc.error_type is None:
            return ProviderError(exc.message, retryable=True, usage=usage)
        status, exhausted = vendor.stream_error(exc)
        return ProviderError(
            f"the response stream broke: {exc.error_type}: {exc.message}",
            retryable=retryable_status(status, exhausted=exhausted),
            status=status,
            usage=usage,
            exhausted=exhausted,
        )
    if isinstance(exc, vendor.status_error):
        status, details = vendor.describe(exc)
        retryable = retryable_status(status, exhausted=details.exhausted)
        text = f"{vendor.name} API error {details.label}: {details.message}"
        if details.request_id:
            text += f" (request-id {details.request_id})"
        response = getattr(exc, "response", None)
        headers = response.headers if isinstance(response, httpx2.Response) else {}
        return ProviderError(
            text,
            retryable=retryable,
            retry_after=retry_after(headers) if retryable else None,
            status=status,
            usage=usage,
            exhausted=details.exhausted,
        )
    if isinstance(exc, vendor.timeout_error):
        return ProviderError(
            f"the request to the {vendor.name} API timed out", retryable=True, usage=usage
        )
    if isinstance(exc, vendor.connection_error):
        cause = exc.__cause__
        detail = f": {type(cause).__name__}: {cause}" if cause is not None else ""
        return ProviderError(
            f"cannot reach the {vendor.name} API{detail}", retryable=True, usage=usage
        )
    if isinstance(exc, httpx2.TransportError):
        return ProviderError(
            f"the connection broke while the reply streamed: {type(exc).__name__}: {exc}",
            retryable=True,
            usage=usage,
        )
    if isinstance(exc, ConnectionError | TimeoutError | OSError):
        return ProviderError(f"{type(exc).__name__}: {exc}", retryable=True, usage=usage)
    if isinstance(exc, vendor.sdk_error):
        return ProviderError(
            f"the {vendor.name} SDK failed: {type(exc).__name__}: {exc}",
            retryable=False,
            usage=usage,
        )
    return ProviderError(
        f"the {vendor.name} provider raised {type(exc).__name__}: {exc}",
        retryable=False,
        usage=usage,
    )


def retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds the server asks us to wait: ``retry-after-ms``, or ``retry-after``
    (seconds or an HTTP date). ``None`` when absent or unreadable."""
    lowered = {k.lower(): v for k, v in headers.items()}
    raw_ms = lowered.get("retry-after-ms")
    if raw_ms is not None:
        with contextlib.suppress(ValueError):
            value = float(raw_ms) / 1000.0
            if math.isfinite(value) and value >= 0:
                return value
    raw = lowered.get("retry-after")
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError):
            return None
        value = when.timestamp() - (time.time() if now is None else now)
        return max(0.0, value)
    return value if math.isfinite(value) and value >= 0 else None
