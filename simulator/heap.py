"""The C heap of a process that holds a large trace: large arrays on pages of their own, and
memory freed on the heap given back to the system.

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


def map_large_allocations(threshold: int = 256 * 1024) -> None:
    """Have glibc map every allocation of ``threshold`` bytes or more on its own pages, so a
    freed column goes back to the system at once. By default glibc raises that threshold
    after the first large free (up to 32 MiB), after which a replay's column-sized arrays
    come from the heap and stay part of the process after they are freed (a third more at
    the peak of a large replay). Setting it fixes it."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(_M_MMAP_THRESHOLD, threshold)


def give_back_freed_memory() -> None:
    """Return the heap's free pages to the system (``malloc_trim``). Reading a large trace
    makes and frees many arrays below the mapping threshold (a block's columns, each block's
    decoded times): freed, they stay the process's, some 50 bytes a prompt of a JSON trace,
    which the arrays made after (mapped pages of their own) never reuse."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
