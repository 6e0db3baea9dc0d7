"""numba's on-disk cache of the compiled kernel, keyed on every source file it is made of.

numba keys a cached function on its own file alone, but the kernel compiles functions of
other files into itself (service times from ``kernel_service.py``, the table kind's
interpolation, the spec_decode cost forms...). Edited or upgraded, any of those would
otherwise leave a stale kernel in the cache, silently computing the old rules. Importing
this module (which every kernel module does before it defines a compiled function) makes
the cache of a function in this package key on the digest of all of :data:`KERNEL_SOURCES`
as well.

The stamp is the digest alone, not the files' modification times, so that a cache compiled
from the same sources elsewhere is valid here. That is what makes the packaged cache work: a
wheel built by ``setup.py`` carries the kernel compiled at build time in :data:`COMPILED`
(written by :mod:`simulator.model.precompile`), laid out as the package's source folders.
Before numba first reads a function's cache, the locator copies the packaged entries it
lacks into the cache numba reads and writes (``NUMBA_CACHE_DIR``, else the package's
``__pycache__``, else the user's cache folder): the packaged folder is only ever read, so a
read-only site-packages works, and a specialisation compiled later is saved where numba
saves it anyway. numba keys an entry on its version, the Python version and the CPU's name
and features as well: where any of them differs from the build's, the entry is never hit and
numba compiles once, announcing it (:data:`COMPILING`, through :mod:`simulator.notices`).
``SIMCTL_NO_PACKAGED_CACHE=1`` leaves the packaged cache unread.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import types
import uuid
from functools import cache
from pathlib import Path
from typing import Any

from numba.core import caching, event

from simulator import notices

PACKAGE = Path(__file__).resolve().parent.parent
#: The files whose code a compiled function of the package may include.
KERNEL_SOURCES = ("model/*.py", "profile/*.py", "profile/kinds/*.py")
#: The packaged cache: numba's index and data files of every kernel function, compiled when
#: the wheel was built, in a folder per source folder (``model/``, ``profile/kinds/``).
COMPILED = PACKAGE / "model" / "_compiled"
#: The line said before numba compiles a kernel function (no usable cache).
COMPILING = "simctl: compiling the fast engine for this machine (once, about a minute)..."


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
            if not _ours(py_file):
                return None
            locator = super().from_function(py_func, py_file)  # None: not writable here
            if locator is not None:
                try:
                    seed(locator, py_func, py_file)
                except (OSError, EOFError, ValueError, AttributeError, ImportError):
                    pass  # an unreadable packaged entry is one not there: numba compiles
            return locator

        def get_source_stamp(self):
            # the content of every kernel source, not their times: a copy made elsewhere of
            # the same sources (the packaged cache) is as valid as one made here
            return "sources", sources_digest()

    Locator.__name__ = Locator.__qualname__ = f"KernelSources{base.__name__}"
    return Locator


_BASES = (caching.UserProvidedCacheLocator, caching.InTreeCacheLocator, caching.UserWideCacheLocator)
if not any(getattr(c, "__name__", "").startswith("KernelSources") for c in caching.CacheImpl._locator_classes):
    caching.CacheImpl._locator_classes[:0] = [_keyed_on_sources(base) for base in _BASES]


def _filename_base(locator: Any, py_func: Any) -> str:
    """The name numba gives the function's cache files (``CacheImpl.get_filename_base``)."""
    modname = os.path.splitext(os.path.basename(py_func.__code__.co_filename))[0]
    impl: Any = types.SimpleNamespace(locator=locator)  # all get_filename_base reads of its CacheImpl
    return caching.CacheImpl.get_filename_base(impl,
                                               f"{modname}.{py_func.__qualname__}", getattr(sys, "abiflags", ""))


def seed(locator: Any, py_func: Any, py_file: str) -> int:
    """Copy the packaged cache entries of ``py_func`` that the cache at ``locator`` lacks
    into it; the number copied. Entries for other sources, numba versions or Python
    versions are not read (numba's own index checks); the cache's own entries are kept."""
    if os.environ.get("SIMCTL_NO_PACKAGED_CACHE"):
        return 0  # (the precompile's own compile, and measurements of a compile from scratch)
    packaged = COMPILED / Path(py_file).resolve().parent.relative_to(PACKAGE)
    base = _filename_base(locator, py_func)
    if not (packaged / f"{base}.nbi").is_file():
        return 0
    stamp = locator.get_source_stamp()
    theirs = caching.IndexDataCacheFile(str(packaged), base, stamp)._load_index()
    if not theirs:
        return 0
    target = Path(locator.get_cache_path())
    here = caching.IndexDataCacheFile(str(target), base, stamp)
    ours = here._load_index()
    missing = {key: name for key, name in theirs.items() if key not in ours}
    if not missing:
        return 0
    target.mkdir(parents=True, exist_ok=True)
    used = set(ours.values())
    number = 0
    for key, name in missing.items():
        while True:
            number += 1
            new = f"{base}.{number}.nbc"
            if new not in used:
                break
        # data first, under a temporary name: a reader never sees an index naming a partial file
        tmp = target / f"{new}.tmp.{uuid.uuid4().hex[:16]}"
        shutil.copyfile(packaged / name, tmp)
        os.replace(tmp, target / new)
        used.add(new)
        ours[key] = new
    here._save_index(ours)
    return len(missing)


class _FirstCompile(event.Listener):
    """Says :data:`COMPILING` when numba starts compiling a kernel function (it found no
    usable cache entry), once a process."""

    said = False

    def on_start(self, ev: event.Event) -> None:
        dispatcher = ev.data.get("dispatcher") if isinstance(ev.data, dict) else None
        py_func = getattr(dispatcher, "py_func", None)
        if not self.said and py_func is not None and _ours(py_func.__code__.co_filename):
            self.said = notices.say(COMPILING)

    def on_end(self, ev: event.Event) -> None:
        pass


event.register("numba:compile", _FirstCompile())
