"""numba's on-disk cache of the compiled kernel, keyed on every source file it is made of.

numba keys a cached function on its own file alone, but the kernel compiles functions of
other files into itself (service times from ``kernel_service.py``, the table kind's
interpolation, the spec_decode cost forms...). Edited or upgraded, any of those would
otherwise leave a stale kernel in the cache, silently computing the old rules. Importing
this module (which every kernel module does before it defines a compiled function) makes
the cache of a function in this package key on the digest of all of :data:`KERNEL_SOURCES`
as well.
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path
from typing import Any

from numba.core import caching

PACKAGE = Path(__file__).resolve().parent.parent
#: The files whose code a compiled function of the package may include.
KERNEL_SOURCES = ("model/*.py", "profile/*.py", "profile/kinds/*.py")


@cache
def sources_digest() -> str:
    """The digest of every kernel source file's name and content."""
    digest = hashlib.sha256()
    for pattern in KERNEL_SOURCES:
        for path in sorted(PACKAGE.glob(pattern)):
            digest.update(path.relative_to(PACKAGE).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _ours(py_file: str) -> bool:
    try:
        return Path(py_file).resolve().is_relative_to(PACKAGE)
    except OSError:
        return False


def _keyed_on_sources(base: Any) -> Any:
    class Locator(base):
        @classmethod
        def from_function(cls, py_func, py_file):
            return super().from_function(py_func, py_file) if _ours(py_file) else None

        def get_source_stamp(self):
            return super().get_source_stamp(), sources_digest()

    Locator.__name__ = Locator.__qualname__ = f"KernelSources{base.__name__}"
    return Locator


_BASES = (caching.UserProvidedCacheLocator, caching.InTreeCacheLocator, caching.UserWideCacheLocator)
if not any(getattr(c, "__name__", "").startswith("KernelSources") for c in caching.CacheImpl._locator_classes):
    caching.CacheImpl._locator_classes[:0] = [_keyed_on_sources(base) for base in _BASES]
