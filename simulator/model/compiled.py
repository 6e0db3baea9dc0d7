"""The compiled kernel's entry points: the extension a build compiled, else numba.

A build (``python -m simulator.model.precompile``: ``setup.py`` runs it for a wheel, ``make
env`` for a checkout) compiles the kernel twice from the same functions: into numba's cache
(:mod:`simulator.model.kernel_cache`) and, through numba's ahead-of-time compiler, into an
extension module (:mod:`simulator.model.extension`) in :data:`COMPILED`. A run here calls
the extension where it was compiled from these sources (:func:`extension`), without importing
numba: numba's import and the loading of its cache cost about 0.6 CPU-seconds in every
process, half of what a small replay costs in all. Elsewhere — no extension (a build without
a C compiler, ``SIMCTL_NO_EXTENSION=1``), one of other sources or another numpy, or more
service streams than it takes (:data:`MAX_STREAMS`) — the same kernel runs from numba's cache
(compiled once where the cache lacks it). Both are compiled from the same functions, so the
event log is the same (``tests/test_compiled_kernel.py``).

The kernel takes its tasks' service streams (``SRNG``, see :mod:`simulator.model.kernel_service`)
as one generator, or as a numba typed list of every task's. A typed list can only be made
with numba loaded, so lowering passes a Python list and the extension takes the generators
one by one (:data:`MAX_STREAMS` of them, and how many are real).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import sys
from functools import cache
from types import ModuleType
from typing import Any

import numpy as np

from simulator.model.kernel_layout import SRNG_ARG
from simulator.model.kernel_sources import COMPILED, python_tag, sources_digest

#: The extension's module name (its file: this plus the interpreter's extension suffix).
MODULE = "_simctl_kernel"
#: The extension's stamp, beside it: the sources, numpy and Python it was compiled from.
EXTENSION_STAMP = "extension.json"
#: Set (to anything), runs use numba's kernel even where the extension is usable.
NO_EXTENSION = "SIMCTL_NO_EXTENSION"
#: Service streams the extension takes (a run of more tasks that draw runs on numba's kernel).
MAX_STREAMS = 16


def extension_stamp() -> dict[str, Any]:
    """What an extension compiled here is compiled from and for."""
    return {"sources": sources_digest(), "numpy": np.__version__, "python": python_tag(),
            "file": MODULE + importlib.machinery.EXTENSION_SUFFIXES[0]}


def _numpy_compatible(built: str) -> bool:
    """Whether an extension compiled against numpy ``built`` runs on this numpy: the same
    major version, no older a minor one (numpy keeps its C interface for later minors)."""
    try:
        b_major, b_minor = (int(x) for x in built.split(".")[:2])
        major, minor = (int(x) for x in np.__version__.split(".")[:2])
    except ValueError:
        return False
    return major == b_major and minor >= b_minor


@cache
def extension() -> ModuleType | None:
    """The compiled extension where it is usable here: built from these kernel sources, for
    this Python, against a numpy this one can run; else ``None``."""
    if os.environ.get(NO_EXTENSION):
        return None
    try:
        stamp = json.loads((COMPILED / EXTENSION_STAMP).read_text())
    except (OSError, ValueError):
        return None
    here = extension_stamp()
    if not isinstance(stamp, dict) or any(stamp.get(k) != here[k] for k in ("sources", "python", "file")) \
            or not _numpy_compatible(str(stamp.get("numpy", ""))):
        return None
    spec = importlib.util.spec_from_file_location(MODULE, COMPILED / here["file"])
    if spec is None or spec.loader is None:
        return None
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except (ImportError, OSError):
        return None  # (a file that does not load here: numba's kernel runs)
    return module


def ready() -> bool:
    """Whether a run on the compiled kernel costs no more than the run: the extension is
    usable, or numba's kernel is loaded in this process already."""
    if extension() is not None:
        return True
    kernel = sys.modules.get("simulator.model.batch_kernel")
    # (the module may be half imported: another thread of this process loading it now)
    run_kernel = getattr(kernel, "run_kernel", None)
    return run_kernel is not None and len(run_kernel.overloads) > 0


def run_kernel(args: tuple) -> tuple:
    """``run_kernel(*args)``, on the extension where it is usable, else on numba's kernel;
    ``args[SRNG_ARG]`` is a list of the service streams: none or one (the lone task that
    draws), else every task's."""
    streams = list(args[SRNG_ARG])
    before, after = args[:SRNG_ARG], args[SRNG_ARG + 1:]
    module = extension()
    if module is not None and len(streams) <= MAX_STREAMS:
        if len(streams) <= 1:
            return module.run_kernel_one(*before, streams[0] if streams else np.random.default_rng(0), *after)
        padded = streams + [streams[0]] * (MAX_STREAMS - len(streams))
        return module.run_kernel_streams(*before, len(streams), *padded, *after)
    from simulator.model.batch_kernel import run_kernel as numba_kernel
    from simulator.model.kernel_cache import without_blas_probe

    kernel: Any = numba_kernel  # (numba's dispatcher: typed by the arguments it meets)
    with without_blas_probe():
        return kernel(*before, _numba_streams(streams), *after)


def _numba_streams(streams: list[np.random.Generator]) -> Any:
    """The streams as numba's kernel takes them: the one generator (or an unused one), else a
    numba typed list (its first one in a process costs a compilation, about a second)."""
    if len(streams) <= 1:
        return streams[0] if streams else np.random.default_rng(0)
    from numba import typed, typeof

    out = typed.List.empty_list(typeof(streams[0]))
    for g in streams:
        out.append(g)
    return out


def group_prompts(call_start: np.ndarray, task_of: np.ndarray, rank: np.ndarray, n_tasks: int) -> tuple:
    """:func:`simulator.model.batch_kernel.group_prompts`, on the extension where it is usable."""
    module = extension()
    if module is not None:
        return module.group_prompts(call_start, task_of, rank, n_tasks)
    from simulator.model.batch_kernel import group_prompts as numba_group_prompts
    from simulator.model.kernel_cache import without_blas_probe

    with without_blas_probe():  # (a run's first call into numba's kernel)
        return numba_group_prompts(call_start, task_of, rank, n_tasks)


def summary_pass() -> Any:
    """The compiled summary pass (:func:`simulator.summary_kernel.summary_passes`) where the
    extension is usable, else ``None``: the summary takes the same figures with numpy."""
    module = extension()
    return None if module is None else getattr(module, "summary_passes", None)
