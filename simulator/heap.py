"""The C heap of a process that holds a large trace: the largest arrays on pages of their own,
and memory freed on the heap given back to the system after a trace is read.

Both are glibc's (``mallopt``, ``malloc_trim``); where the C library is another, nothing is
done. They change where memory sits, never a result.
"""

from __future__ import annotations

import ctypes
from functools import cache
from typing import Any

#: glibc's mallopt parameter: allocations from this size up are mapped pages of their own.
_M_MMAP_THRESHOLD = -3
#: Prompts from which a loaded trace is worth giving freed heap memory back after (a trim
#: walks the heap: milliseconds, which a small trace's load does not need).
TRIM_FROM_PROMPTS = 1 << 16


@cache
def _glibc() -> Any | None:
    """The process's C library where it is glibc, else ``None``."""
    try:
        process = ctypes.CDLL(None)  # the symbols already loaded, the C library's among them
    except OSError:
        return None
    if not (hasattr(process, "gnu_get_libc_version") and hasattr(process, "mallopt")
            and hasattr(process, "malloc_trim")):
        return None
    return process


def map_large_allocations(threshold: int = 32 << 20) -> None:
    """Have glibc map every allocation of ``threshold`` bytes or more on pages of its own and
    take every smaller one from the heap, from the process's first array on (glibc's own
    threshold starts at 128 KiB and rises with the first large frees, so where an array lands
    would depend on what was freed before it).

    The default, 32 MiB (the ceiling of glibc's own), keeps the columns of runs up to four
    million prompts on the heap: a replay makes and frees dozens of column-sized temporaries,
    and one made where another was freed reuses its pages, where a mapped one faults every page
    in anew (most of the system time of a large replay); the peak is a little higher, the
    heap's fragmentation (``benchmarks/engine_speed.py`` measures both). Larger columns, where a
    trace's memory is what limits it, are mapped and go back to the system as they are freed."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(_M_MMAP_THRESHOLD, threshold)


def give_back_freed_memory() -> None:
    """Return the heap's free pages to the system (``malloc_trim``). Reading a large trace
    makes and frees many arrays (a block's columns, the blocks joined): freed, their pages stay
    the process's, scattered among those still held, and the run after the read would reach
    a higher peak than with them given back."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
