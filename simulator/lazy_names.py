"""A package's public names imported on first use (PEP 562): the package ``simulator`` and
``simulator.model`` name what they offer without importing the modules that hold it, so a
light script (or a run on the compiled kernel) pulls in only what it uses."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def on_first_use(package: str, exports: Mapping[str, Sequence[str]],
                 namespace: dict[str, Any]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of the package ``package`` whose ``namespace`` (its
    ``globals()``) offers the names ``exports`` maps each module to: a name's module is
    imported when the name is first read, the value then kept in the namespace."""
    module_of = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(module_of))

    return __getattr__, __dir__
