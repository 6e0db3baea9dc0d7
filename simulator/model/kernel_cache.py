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
The first time a process meets a cache folder numba reads and writes (``NUMBA_CACHE_DIR``,
else the package's ``__pycache__``, else the user's cache folder), before numba reads it, the
locator copies the packaged entries that folder lacks into it and leaves a marker there named
after the packaged cache's stamp (:data:`STAMP`), so later processes check that one file
instead of every function's index. The packaged folder is only ever read, so a read-only
site-packages works, and a specialisation compiled later is saved where numba saves it
anyway. numba keys an entry on its version, the Python version and the CPU's name and
features as well: a packaged cache stamped with another numba or Python is not copied, one
for another CPU is copied but never hit, and numba compiles once, announcing it
(:data:`COMPILING`, through :mod:`simulator.notices`). ``SIMCTL_NO_PACKAGED_CACHE=1`` leaves
the packaged cache unread.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import sys
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
#: The packaged cache's stamp: what it was compiled from and for (written by the precompile).
STAMP = "stamp.json"
#: Set (to anything), the packaged cache is left unread.
NO_PACKAGED_CACHE = "SIMCTL_NO_PACKAGED_CACHE"
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
                seed_folder(locator, py_file)
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


def python_tag() -> str:
    """The Python a cache file is for, as numba names it in the file (``3.11``, with ABI flags)."""
    return f"{sys.version_info[0]}.{sys.version_info[1]}{getattr(sys, 'abiflags', '')}"


@cache
def packaged_key() -> str | None:
    """A digest of the packaged cache's stamp (:data:`STAMP`: the sources, numba, Python and
    CPU it was compiled from and for), or None where there is none usable here: no packaged
    cache, one of other sources, or one for another numba or Python (numba would ignore its
    entries; the CPU is left to numba's own check, which needs its compiler started)."""
    try:
        raw = (COMPILED / STAMP).read_bytes()
        stamp = json.loads(raw)
    except (OSError, ValueError):
        return None
    import numba

    mine = {"sources": sources_digest(), "numba": numba.__version__, "python": python_tag()}
    if not isinstance(stamp, dict) or any(stamp.get(k) != v for k, v in mine.items()):
        return None
    return hashlib.sha256(raw).hexdigest()[:16]


#: The cache folders checked in this process (a folder is seeded at most once a process).
_checked: set[str] = set()


def seed_folder(locator: Any, py_file: str) -> int:
    """Copy the packaged entries of every kernel function of ``py_file``'s folder into the
    cache at ``locator``, the first time this process meets that cache folder; the number
    copied. A marker file in the cache folder, named by :func:`packaged_key`, records that
    this packaged cache was copied there, so later processes check one file instead of
    unpickling two indexes per function (numba compiles what an entry removed since lacks)."""
    target = Path(locator.get_cache_path())
    if os.environ.get(NO_PACKAGED_CACHE) or str(target) in _checked:
        return 0  # (the precompile's own compile, and measurements of a compile from scratch)
    _checked.add(str(target))
    key = packaged_key()
    if key is None:
        return 0
    marker = target / f".simctl-packaged-{key}"
    if marker.exists():
        return 0
    packaged = COMPILED / Path(py_file).resolve().parent.relative_to(PACKAGE)
    copied = 0
    try:
        for index in sorted(packaged.glob("*.nbi")):
            copied += seed(target, packaged, index.name[: -len(".nbi")], locator.get_source_stamp())
        marker.touch()
    except (OSError, EOFError, ValueError, AttributeError, ImportError, pickle.UnpicklingError):
        pass  # an unreadable packaged entry is one not there: numba compiles
    return copied


def seed(target: Path, packaged: Path, base: str, stamp: Any) -> int:
    """Copy the entries of the packaged index ``packaged/base.nbi`` that the index of the
    same name in ``target`` lacks into it; the number copied. An index of other sources
    (``stamp``) or of another numba version is not read (numba's own checks); the target's
    own entries are kept."""
    theirs = caching.IndexDataCacheFile(str(packaged), base, stamp)._load_index()
    if not theirs:
        return 0
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
