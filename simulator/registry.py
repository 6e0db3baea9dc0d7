"""Named registries for the pluggable parts: batching policies, topologies, dispatch rules,
GPU sharing modes and profile kinds.

A registered name is a public contract: scenario files and saved sweeps refer to it, so a
change of behaviour gets a new name rather than a silent change under an old one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from simulator.errors import UnknownName

T = TypeVar("T")


class Registry(Generic[T]):
    """A mapping from CLI name to a class (or factory), filled by the ``register`` decorator."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def add(entry: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.what} '{name}' registered twice")
            self._entries[name] = entry
            return entry

        return add

    def get(self, name: str) -> T:
        """The entry for ``name``; raises :class:`UnknownName` listing the valid names."""
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownName(self.what, name, self.names()) from None

    def names(self) -> list[str]:
        """Registered names, in registration order (the order the CLI lists them)."""
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)
