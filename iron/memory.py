"""Memory for data streamed on every call: anonymous, 2 MiB-aligned, backed by huge pages.

Decode reads every weight once per token. From a file mapping (4 KiB page-cache pages) the
SmolLM2 decode ran at 84-88 tok/s on the development machine; from a copy in huge pages, at
97-105, and it no longer depended on where the kernel happened to put the file's page cache
(two copies of one bundle differed by 17% in their lm-head GEMV). Huge pages cut the TLB misses
of a 269 MB stream from about 65 000 pages a token to about 130.

Linux only grants them on request (``transparent_hugepage`` in ``madvise`` mode) and only for
2 MiB-aligned ranges, hence the alignment; elsewhere the buffer is plain anonymous memory.
"""

from __future__ import annotations

import mmap

import numpy as np

HUGE_PAGE = 2 << 20


def huge_page_buffer(nbytes: int) -> np.ndarray:
    """A zeroed, writable uint8 array of ``nbytes``, starting on a 2 MiB boundary."""
    size = -(-max(nbytes, 1) // HUGE_PAGE) * HUGE_PAGE + HUGE_PAGE  # room to align the start
    arena = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            arena.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # a kernel without transparent huge pages: plain pages still work
            pass
    whole = np.frombuffer(arena, np.uint8)  # keeps ``arena`` alive as its base
    skip = -whole.ctypes.data % HUGE_PAGE
    return whole[skip:skip + nbytes]


def huge_page_copy(array: np.ndarray) -> np.ndarray:
    """``array`` copied into a huge-page buffer of its own (same dtype and shape)."""
    out = huge_page_buffer(array.nbytes).view(array.dtype).reshape(array.shape)
    out[...] = array
    return out
