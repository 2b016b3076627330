"""``perdure._libc``: the C library calls perdure makes about its own memory.

``trim_heap`` is checked for its effect, in a child process with a heap of its own:
memory freed in the middle of the heap stays resident until it is given back.
"""

from __future__ import annotations

import ctypes.util
import json
import subprocess
import sys
import textwrap

import pytest

from perdure import _libc

GLIBC = sys.platform.startswith("linux") and (ctypes.util.find_library("c") or "").startswith(
    "libc.so"
)

_CHILD = textwrap.dedent(
    """
    import json, os
    from perdure import _libc

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    # 64 MiB of 4 KiB blocks (from malloc's heap, not its own maps), one in 16 kept:
    # the free runs between them are whole pages the heap's top cannot trim.
    blocks = [bytes(4096) for _ in range(16384)]
    kept = blocks[::16]
    del blocks
    freed = rss()
    trimmed = _libc.trim_heap()
    print(json.dumps({"freed": freed, "after": rss(), "trimmed": trimmed, "kept": len(kept)}))
    """
)


@pytest.mark.skipif(not GLIBC, reason="malloc_trim is glibc's (Linux)")
def test_trim_heap_gives_freed_pages_back_to_the_kernel() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=60, check=True
    )
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["trimmed"] is True
    # 60 of the 64 MiB were freed; most of it leaves the resident set.
    assert result["freed"] - result["after"] > 40 * (1 << 20), result


def test_dont_need_refuses_a_range_it_cannot_advise() -> None:
    # An unaligned start: the kernel says EINVAL, and the caller gets an OSError naming it.
    with pytest.raises(OSError, match="madvise"):
        _libc.dont_need(1, 4097)
