"""Values kept for the next call on the same objects.

A sweep makes thousands of runs from a few objects that never change: a trace's prompt
columns, a profile's frozen services, a scenario's task defaults, composition rules. What a
run derives from them alone is made once and kept in a :class:`Memo`.

An entry is found by its objects' identities (plus any plain key) and holds the objects
themselves, so that no other object takes one of their ids while the entry lives. A memo is
emptied when it reaches its number of entries, or its bytes of arrays where it has a bound
on those, so what it keeps stays bounded whatever a process runs. Kept values are shared:
their users never write them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")


def array_bytes(value: object) -> int:
    """The bytes of the arrays in ``value`` (an array, or a tuple of them and other things)."""
    items = value if isinstance(value, tuple) else (value,)
    return sum(a.nbytes for a in items if isinstance(a, np.ndarray))


class Memo:
    """At most ``entries`` values (and, with ``max_bytes``, at most that many bytes of arrays,
    counting the objects' arrays too), each made once per objects and key."""

    def __init__(self, entries: int, max_bytes: int | None = None) -> None:
        self.entries = entries
        self.max_bytes = max_bytes
        self.nbytes = 0  # (counted only where max_bytes bounds it)
        self._kept: dict[tuple, tuple[tuple[object, ...], Any]] = {}

    def get(self, objects: tuple[object, ...], key: tuple, make: Callable[[], T]) -> T:
        """The value kept for ``objects`` (the very objects, by identity) and ``key``, else
        ``make()``, kept."""
        full = (*key, *(id(o) for o in objects))
        known = self._kept.get(full)
        if known is not None and all(a is b for a, b in zip(known[0], objects, strict=True)):
            return known[1]
        value = make()
        size = 0 if self.max_bytes is None else array_bytes(value) + array_bytes(objects)
        if len(self._kept) >= self.entries or (self.max_bytes is not None and self.nbytes + size > self.max_bytes):
            self.clear()
        self._kept[full] = (objects, value)
        self.nbytes += size
        return value

    def clear(self) -> None:
        self._kept.clear()
        self.nbytes = 0

    def items(self) -> Iterator[tuple[tuple[object, ...], Any]]:
        """Each entry's objects and value."""
        return iter(self._kept.values())

    def __len__(self) -> int:
        return len(self._kept)


__all__ = ["Memo", "array_bytes"]
