"""The two C library calls perdure makes about its own memory, looked up once.

* ``madvise``: ``LmdbLog.release_mapped_pages`` drops the log's map pages from the
  resident set once the log is quiet;
* ``malloc_trim``: the supervisor gives the heap's free pages back to the kernel
  after it froze idle sessions' states (``trim_heap``). Memory a program frees stays
  with its allocator otherwise: after a thousand sessions ran at once, the holes
  they left would stay resident for as long as the process lives.

Linux only; ``malloc_trim`` is glibc's. Where either is missing the callers do
nothing. ``ctypes`` is imported on the first call, not with ``perdure``.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, cast


@functools.cache
def _libc() -> Any | None:
    """The process's C library (one ``CDLL``: one per call kept ~50 bytes alive each)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


@functools.cache
def _madvise() -> Callable[[int, int, int], int] | None:
    libc = _libc()
    if libc is None:
        return None
    import ctypes

    madvise = libc.madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return cast(Callable[[int, int, int], int], madvise)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None)  # glibc only
    if trim is None:
        return None
    import ctypes

    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return cast(Callable[[int], int], trim)


def dont_need(start: int, end: int) -> int:
    """``madvise(MADV_DONTNEED)`` on ``[start, end)``; the bytes advised.

    Raises ``OSError`` if the call fails or the platform has no ``madvise``.
    """
    import ctypes
    import mmap

    madvise = _madvise()
    if madvise is None:
        raise OSError("madvise is not available on this platform")
    if madvise(start, end - start, mmap.MADV_DONTNEED) != 0:
        raise OSError(ctypes.get_errno(), "madvise(MADV_DONTNEED) failed on the log's map")
    return end - start


def trim_heap() -> bool:
    """Give the free pages of the C heap back to the kernel (``malloc_trim(0)``).

    True if any memory was released; False if none was, or the C library has no
    ``malloc_trim``. Blocking: it walks every malloc arena under the arena's lock,
    a few milliseconds on a heap of 100 MB, so call it from a worker thread (ctypes
    releases the GIL for the call).
    """
    trim = _malloc_trim()
    return trim is not None and trim(0) == 1
