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

import glob
import hashlib
import json
import os
import pickle
import shutil
import sys
import threading
import types
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

from numba.core import caching, event

from simulator import notices
from simulator.model.kernel_sources import COMPILED, PACKAGE, STAMP, python_tag, sources_digest

#: Set (to anything), the packaged cache is left unread.
NO_PACKAGED_CACHE = "SIMCTL_NO_PACKAGED_CACHE"
#: The line said before numba compiles a kernel function (no usable cache).
COMPILING = "simctl: compiling the fast engine for this machine (once, about a minute)..."


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
                seed_folder(locator, py_func, py_file)
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


def stamp_fields() -> dict[str, str]:
    """What a compiled cache must have been compiled from and with to be used here: the kernel
    sources' digest, numba's version and Python's (:data:`STAMP` holds them, and the CPU)."""
    import numba

    return {"sources": sources_digest(), "numba": numba.__version__, "python": python_tag()}


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
    if not isinstance(stamp, dict) or any(stamp.get(k) != v for k, v in stamp_fields().items()):
        return None
    return hashlib.sha256(raw).hexdigest()[:16]


#: The cache folders checked in this process (a folder is seeded at most once a process).
_checked: set[str] = set()
#: Per cache folder, the indexes both it and the packaged cache hold, merged entry by entry as
#: their functions are met (unpickling an index needs its function's module defined).
_to_merge: dict[str, set[str]] = {}


def _filename_base(locator: Any, py_func: Any) -> str:
    """The name numba gives the function's cache files (``CacheImpl.get_filename_base``)."""
    modname = os.path.splitext(os.path.basename(py_func.__code__.co_filename))[0]
    impl: Any = types.SimpleNamespace(locator=locator)  # all get_filename_base reads of its CacheImpl
    return caching.CacheImpl.get_filename_base(impl, f"{modname}.{py_func.__qualname__}",
                                               getattr(sys, "abiflags", ""))


def _copy(src: Path, dst: Path) -> None:
    """``src`` copied to ``dst`` under a temporary name, then renamed: a reader never sees
    part of a file."""
    tmp = dst.with_name(f"{dst.name}.tmp.{uuid.uuid4().hex[:16]}")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def seed_folder(locator: Any, py_func: Any, py_file: str) -> int:
    """Copy the packaged cache of ``py_file``'s folder into the cache at ``locator`` the first
    time this process meets that cache folder, and merge the packaged entries of ``py_func``
    into an index of its own the folder already held; the number of indexes copied and
    entries merged.

    An index the cache folder lacks is copied as it is, with its data files, unread (its
    entries name its functions' types, which a module being imported may not have defined
    yet). A marker file in the cache folder, named by :func:`packaged_key`, records that this
    packaged cache was copied there, so later processes check that one file (numba compiles
    what an entry removed since lacks)."""
    if os.environ.get(NO_PACKAGED_CACHE):
        return 0  # (the precompile's own compile, and measurements of a compile from scratch)
    target = Path(locator.get_cache_path())
    packaged = COMPILED / Path(py_file).resolve().parent.relative_to(PACKAGE)
    done = 0
    if str(target) not in _checked:
        _checked.add(str(target))
        key = packaged_key()
        marker = target / f".simctl-packaged-{key}"
        if key is None or marker.exists():
            return 0
        both: set[str] = set()
        try:
            target.mkdir(parents=True, exist_ok=True)
            for index in sorted(packaged.glob("*.nbi")):
                base = index.name[: -len(".nbi")]
                if (target / index.name).exists():
                    both.add(base)
                    continue
                for data in sorted(packaged.glob(f"{glob.escape(base)}.*.nbc")):  # data first, then its index
                    _copy(data, target / data.name)
                _copy(index, target / index.name)
                done += 1
            marker.touch()
        except OSError:
            pass  # a packaged index not copied is one not there: numba compiles
        _to_merge[str(target)] = both
    base = _filename_base(locator, py_func)
    if base in _to_merge.get(str(target), ()):
        _to_merge[str(target)].discard(base)
        try:
            done += seed(target, packaged, base, locator.get_source_stamp())
        except (OSError, EOFError, ValueError, AttributeError, ImportError, pickle.UnpicklingError):
            pass  # an unreadable packaged entry is one not there: numba compiles
    return done


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
        _copy(packaged / name, target / new)  # data first: an index never names a partial file
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


#: What numba imports, the first time its array functions load in a process (the kernel's
#: first call), to see whether BLAS is there: scipy's BLAS bindings, and with them most of
#: scipy.linalg (about 0.25 CPU-s and 12 MB, a tenth of a replay's fixed part). The answer
#: only picks BLAS over a plain loop for numba's np.vdot of floats, which the kernel never
#: calls; numba's BLAS-backed functions import the bindings themselves when compiled.
BLAS_PROBE = "scipy.linalg.cython_blas"


@contextmanager
def without_blas_probe() -> Iterator[None]:
    """Within this block, the first load of numba's array functions skips its BLAS probe
    (:data:`BLAS_PROBE`: an import of it fails at once); nothing changes where they are
    loaded already, where the bindings are imported already, or where another thread runs
    (it might import scipy.linalg meanwhile)."""
    if BLAS_PROBE in sys.modules or "numba.np.arraymath" in sys.modules or threading.active_count() > 1:
        yield
        return
    # None in sys.modules: an import of that name raises ImportError (the import system's rule)
    sys.modules[BLAS_PROBE] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        if BLAS_PROBE in sys.modules and sys.modules[BLAS_PROBE] is None:
            del sys.modules[BLAS_PROBE]
