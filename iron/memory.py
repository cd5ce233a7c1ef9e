"""Memory for data streamed on every call: anonymous, 2 MiB-aligned, backed by huge pages;
and how much memory the host has left (``available_memory``).

Decode reads every weight once per token. From a copy in huge pages it runs faster than from
a file mapping of 4 KiB page-cache pages, and its speed no longer depends on where the kernel
happened to put the file's page cache (README, Performance, has the measurements): a 2 MiB page
covers 512 small ones, so a weight stream needs that many times fewer TLB entries.

Linux only grants them on request (``transparent_hugepage`` in ``madvise`` mode) and only for
2 MiB-aligned ranges, hence the alignment; elsewhere the buffer is plain anonymous memory.
"""

from __future__ import annotations

import mmap
import os

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


def available_memory() -> int:
    """Bytes of memory available to a new process (``MemAvailable``), else free pages."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
