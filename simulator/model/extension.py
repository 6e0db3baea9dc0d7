"""The kernel compiled into an extension module, ahead of time, by numba's ``pycc``.

:func:`build` compiles ``run_kernel`` (with the functions it calls) and ``group_prompts`` of
:mod:`simulator.model.batch_kernel` — the same Python functions numba's just-in-time
compiler compiles — for the argument types a replay passes, the native trace reader's pass
over call lines (:func:`simulator.trace.formats.native_scan.scan_call_lines`) and the
summary's pass over a small run's log (:func:`simulator.summary_kernel.summary_passes`),
these two compiled only here, into one shared library with its stamp
(:data:`~simulator.model.compiled.EXTENSION_STAMP`). Loading it needs numpy only, not numba
(:mod:`simulator.model.compiled`).

Why this and not only numba's cache: a cache entry loads only through numba, whose import
and type registries cost about 0.6 CPU-seconds in every process, however small the run. The
extension costs a library load. ``pycc`` compiles the exported functions for the build
machine's architecture, not its exact CPU, in about 15 CPU-seconds; it needs a C compiler
(the library's numpy and helper code are C). Where the build has none, the wheel carries
numba's cache alone and runs load it (``precompile`` says so).

The typed list of service streams a run of several drawing tasks needs cannot be passed to
an exported function; ``run_kernel_streams`` takes up to
:data:`~simulator.model.compiled.MAX_STREAMS` generators and builds the list itself.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from simulator.model.compiled import EXTENSION_STAMP, MAX_STREAMS, MODULE, extension_stamp
from simulator.model.kernel_layout import RUN_ARGS, SRNG_ARG


def _streams_entry(run_kernel):
    """``run_kernel_streams(<run_kernel's arguments, SRNG replaced by n, s0 ... s15>)``:
    the typed list of the first ``n`` streams made inside, then ``run_kernel``."""
    from numba.typed import List

    streams = [f"s{i}" for i in range(MAX_STREAMS)]
    params = [*RUN_ARGS[:SRNG_ARG], "n_streams", *streams, *RUN_ARGS[SRNG_ARG + 1:]]
    lines = [f"def run_kernel_streams({', '.join(params)}):", "    SRNG = List()", "    SRNG.append(s0)"]
    lines += [f"    if n_streams > {i}:\n        SRNG.append(s{i})" for i in range(1, MAX_STREAMS)]
    lines.append(f"    return run_kernel({', '.join(RUN_ARGS)})")
    scope = {"List": List, "run_kernel": run_kernel}
    exec("\n".join(lines), scope)  # (the parameters are run_kernel's own: no *args in an exported function)
    return scope["run_kernel_streams"]


@contextmanager
def _plain_reference_counts() -> Iterator[None]:
    """While the extension is compiled, numba's reference counts are plain increments and
    decrements, not atomic ones. numba makes them atomic because its functions may run in
    several threads at once; the extension's functions run while their caller holds the GIL
    (``pycc``'s wrappers never release it), and each call adapts its own arrays, so no count
    is touched by two threads at once. The atomic ones cost a locked instruction each, and
    the kernel counts a reference each time it reads one of its run's arrays: about a
    quarter of its time. (Where numba no longer defines the function replaced here, the
    counts stay atomic.)"""
    from numba.core.runtime import nrtdynmod

    atomic = getattr(nrtdynmod, "_define_atomic_inc_dec", None)
    if atomic is None:
        yield
        return
    from llvmlite import ir

    def plain(module: Any, op: str, ordering: str) -> Any:
        """``nrt_atomic_add`` / ``nrt_atomic_sub`` as numba defines them (the new count
        returned), without the atomic instruction."""
        word = nrtdynmod._word_type
        function = ir.Function(module, ir.FunctionType(word, [word.as_pointer()]), name=f"nrt_atomic_{op}")
        builder = ir.IRBuilder(function.append_basic_block())
        [pointer] = function.args
        new = getattr(builder, op)(builder.load(pointer), ir.Constant(word, 1))
        builder.store(new, pointer)
        builder.ret(new)
        return function

    nrtdynmod._define_atomic_inc_dec = plain
    try:
        yield
    finally:
        nrtdynmod._define_atomic_inc_dec = atomic


def _summary_signature() -> Any:
    """The signature of :func:`simulator.summary_kernel.summary_passes` as
    :func:`simulator.metrics._compiled_figures` calls it: read-only float and 64-bit integer
    columns (the caller converts them: an exported function reads its arrays as typed here,
    whatever they hold), integer counts; four float arrays and the makespan back."""
    from numba import types

    def column(dtype: Any) -> Any:
        return types.Array(dtype, 1, "C", readonly=True)

    floats, ints, flags = column(types.float64), column(types.int64), column(types.boolean)
    table = types.Array(types.float64, 2, "C")
    returns = types.Tuple((table, table, table, table, types.float64))
    count, number = types.int64, types.float64
    return returns(floats, floats, floats, floats, ints, flags, ints, ints, count, ints, count, ints, ints, ints, count,
                   ints, ints, ints, ints, ints, ints, ints, ints, number, number, count, floats, floats, ints, floats)


def build(folder: Path) -> Path:
    """Compile the extension into ``folder``, with its stamp; the library's path. The kernel's
    argument types are those of its specialisations compiled in this process (a replay of each
    kind of service streams: the precompile's), one generator and a typed list of them."""
    import warnings

    from numba import types
    from numba.core.errors import NumbaPendingDeprecationWarning

    with warnings.catch_warnings():  # (pending since numba 0.57: docs/model.md says what happens without it)
        warnings.simplefilter("ignore", NumbaPendingDeprecationWarning)
        from numba.pycc import CC

    from simulator.model.batch_kernel import group_prompts, run_kernel
    from simulator.summary_kernel import summary_passes
    from simulator.trace.formats.native_scan import scan_call_lines

    kernels: dict[tuple, Any] = run_kernel.overloads  # (argument types: their compiled results)
    groupings: dict[tuple, Any] = group_prompts.overloads
    by_streams = {isinstance(sig[SRNG_ARG], types.ListType): sig for sig in kernels}
    if set(by_streams) != {False, True} or len(groupings) != 1:
        raise RuntimeError("the extension is built after replays that compile run_kernel with one stream and with a "
                           "typed list of them, and group_prompts once")
    one = by_streams[False]
    returns = kernels[one].signature.return_type
    generator = one[SRNG_ARG]
    (grouping,) = groupings
    cc = CC(MODULE)
    cc.output_dir = str(folder)
    cc.verbose = False
    cc.export("run_kernel_one", returns(*one))(run_kernel.py_func)
    cc.export("run_kernel_streams", returns(*one[:SRNG_ARG], types.int64, *([generator] * MAX_STREAMS),
                                            *one[SRNG_ARG + 1:]))(_streams_entry(run_kernel))
    cc.export("group_prompts", groupings[grouping].signature.return_type(*grouping))(
        group_prompts.py_func)
    # the native trace reader's pass over a block of call lines (plain Python: numba types it here)
    lines = types.Array(types.uint8, 1, "C", readonly=True)
    ints, chars = types.Array(types.int64, 1, "A"), types.Array(types.uint8, 1, "A")
    fields = types.Tuple((types.boolean, ints, ints, types.Array(types.float64, 1, "A"), chars, ints, types.boolean))
    cc.export("scan_call_lines", fields(lines, types.boolean))(scan_call_lines)
    # the summary's pass over a small run's log (plain Python too: simulator.summary_kernel)
    cc.export("summary_passes", _summary_signature())(summary_passes)
    with _plain_reference_counts():
        cc.compile()
    stamp = extension_stamp()
    library = folder / stamp["file"]
    if not library.is_file():
        raise RuntimeError(f"numba's pycc wrote no {library.name} in {folder}")
    (folder / EXTENSION_STAMP).write_text(json.dumps(stamp, indent=1) + "\n")
    return library
