"""Compile the fast engine ahead of its first run, into the packaged cache.

``python -m simulator.model.precompile`` compiles every specialisation of the kernel a
replay can need and writes numba's cache files of it into
:data:`~simulator.model.kernel_cache.COMPILED` (or ``--out``), from where the first replay
of an installed simctl loads them instead of compiling (:mod:`simulator.model.kernel_cache`).
``setup.py`` runs it when it builds a wheel; the Makefile's environment step runs it for the
editable install.

numba compiles a function per combination of argument types, not per path taken, so one
replay compiles every topology, policy and service kind the kernel has. The argument types
that vary between replays are few: the service streams (one generator when at most one task
draws from its stream, a typed list of them otherwise). The replays of :data:`PROFILES` cover
each, and the compile checks that ``run_kernel`` ends with :data:`RUN_KERNEL_SIGNATURES`
specialisations, so that a change adding one fails here instead of compiling on every
user's first run.

The same child then compiles the kernel once more, ahead of time, into an extension module
beside the cache files (:mod:`simulator.model.extension`): runs call it without loading numba
(:mod:`simulator.model.compiled`). It needs a C compiler; without one the folder holds
numba's cache alone, and runs load that.

The compile runs in a child process with an empty ``NUMBA_CACHE_DIR`` of its own, so what
is packaged is exactly what it compiled, whatever caches this machine already holds. It
writes a stamp beside the files (:data:`~simulator.model.kernel_cache.STAMP`, see
:func:`build_key`); ``--reuse FOLDER`` copies a folder whose stamp is this package's and
this interpreter's instead of compiling again (a wheel built from a checkout that ``make
env`` set up), and compiles otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: The bundled profiles replayed through the design-notes scenario to compile the kernel: the
#: users' design and a speculative-decoding profile (at most one task draws from its service
#: stream in either), and one whose mmlu and infobench both draw (the typed list of streams).
PROFILES = ("seed-calibrated", "a100-sxm-qwen3-4b-qwen3-0.6b-hf-eager", "h100-sxm-qwen3-8b-qwen3-0.6b-cuda-graph")
#: The specialisations of ``run_kernel`` that replaying :data:`PROFILES` compiles: one service
#: stream, a typed list of them.
RUN_KERNEL_SIGNATURES = 2
#: The folder of the child's compile where the extension is built (copied into the packaged
#: folder's top: :data:`~simulator.model.compiled.EXTENSION_STAMP` and the library).
EXTENSION_FOLDER = "extension"


def build_key() -> dict:
    """What a compiled cache is valid for, in this process: the kernel sources' digest,
    numba's and Python's versions, and numba's code generator key (target, CPU name and
    features); numba checks each before it loads an entry."""
    from numba.core.registry import cpu_target

    from simulator.model.kernel_cache import stamp_fields

    return {**stamp_fields(), "codegen": [str(x) for x in cpu_target.target_context.codegen().magic_tuple()]}


def _compile(stamp: str) -> None:
    """Replay :data:`PROFILES` on the fast engine (in the child: its cache is the fresh one),
    check the specialisations compiled, and write the stamp of what was compiled to ``stamp``."""
    from simulator.model.batch_kernel import run_kernel
    from simulator.model.fast import simulate_fast, unsupported
    from simulator.profile import load_profile
    from simulator.scenario import build_scenario
    from simulator.trace.formats import load_trace

    trace = load_trace("example")
    scenario = build_scenario(path="design-notes")
    for name in PROFILES:
        profile = load_profile(name)
        why = unsupported(trace, scenario, profile)
        if why is not None:  # (a bundled file changed so that the fast engine no longer runs it)
            raise RuntimeError(f"the fast engine cannot replay design-notes with {name}: {why}")
        simulate_fast(trace, scenario, profile, seed=0)
    compiled = len(run_kernel.signatures)
    if compiled != RUN_KERNEL_SIGNATURES:
        raise RuntimeError(f"run_kernel has {compiled} specialisation(s) after replaying {', '.join(PROFILES)}, "
                           f"not {RUN_KERNEL_SIGNATURES}: the kernel's argument types changed; make PROFILES "
                           "compile every one a replay can need, and RUN_KERNEL_SIGNATURES their number")
    Path(stamp).write_text(json.dumps(build_key(), indent=1) + "\n")
    print(f"{compiled} specialisations of run_kernel compiled", file=sys.stderr)
    from simulator.model.extension import build

    try:
        library = build(Path(stamp).parent / EXTENSION_FOLDER)
    except Exception as exc:  # noqa: BLE001  (no C compiler, a numba without pycc: runs load numba's cache)
        print(f"the kernel's extension was not built ({type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[-1]}); "
              "runs will load the kernel through numba", file=sys.stderr)
    else:
        print(f"the kernel's extension compiled: {library.name}", file=sys.stderr)


def reusable(folder: Path) -> bool:
    """Whether ``folder`` holds a compiled cache whose stamp is this package's sources and
    this interpreter's numba, Python and CPU."""
    from simulator.model.kernel_cache import STAMP

    try:
        stamp = json.loads((folder / STAMP).read_text())
    except (OSError, ValueError):
        return False
    return bool(stamp == build_key())


def _put(staged: Path, out: Path) -> None:
    """``staged`` renamed to ``out``, whatever was there replaced."""
    if out.exists():
        shutil.rmtree(out)
    staged.rename(out)


def precompile(out: Path, reuse: Path | None = None) -> tuple[int, bool]:
    """Lay out the compiled kernel in ``out`` (replaced), a folder per source folder, with
    its stamp: copied from ``reuse`` where that is :func:`reusable`, else compiled into a
    fresh cache. The number of cache files written, and whether they were copied."""
    from simulator.model.kernel_cache import PACKAGE, STAMP

    out.parent.mkdir(parents=True, exist_ok=True)
    # beside out, renamed into place: a reader never sees half a folder
    staged = Path(tempfile.mkdtemp(prefix=".compiled-", dir=out.parent))
    if reuse is not None and reuse.is_dir() and reuse.resolve() != out.resolve() and reusable(reuse):
        shutil.copytree(reuse, staged, dirs_exist_ok=True)
        _put(staged, out)
        return sum(1 for f in out.rglob("*") if f.suffix in (".nbi", ".nbc")), True
    try:
        with tempfile.TemporaryDirectory(prefix="simctl-precompile-") as tmp:
            # (numba's kernel compiled, not an extension of these sources already in the package)
            env = {**os.environ, "NUMBA_CACHE_DIR": tmp, "SIMCTL_NO_PACKAGED_CACHE": "1", "SIMCTL_NO_EXTENSION": "1"}
            stamp = Path(tmp) / STAMP
            code = f"from simulator.model.precompile import _compile; _compile({str(stamp)!r})"
            # the package compiled is the one imported here (a wheel's build folder, a checkout)
            env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE.parent), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
            subprocess.run([sys.executable, "-c", code], env=env, check=True, cwd=tmp)
            written = 0
            # numba names each source folder's cache folder <folder name>_<hash of its path>
            folders = {f"{p.name}_": p.relative_to(PACKAGE) for p in (PACKAGE / "model", PACKAGE / "profile",
                                                                      PACKAGE / "profile" / "kinds")}
            for cache_dir in sorted(Path(tmp).iterdir()):
                rel = next((r for prefix, r in folders.items() if cache_dir.name.startswith(prefix)), None)
                if rel is None or not cache_dir.is_dir():
                    continue
                (staged / rel).mkdir(parents=True, exist_ok=True)
                for f in sorted(cache_dir.iterdir()):
                    if f.suffix in (".nbi", ".nbc"):
                        shutil.copy2(f, staged / rel / f.name)
                        written += 1
            shutil.copy2(stamp, staged / STAMP)
            for f in sorted((Path(tmp) / EXTENSION_FOLDER).glob("*")):  # (none where it was not built)
                shutil.copy2(f, staged / f.name)
                written += 1
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    _put(staged, out)
    return written, False


def main(argv: list[str] | None = None) -> int:
    from simulator.model.kernel_cache import COMPILED

    parser = argparse.ArgumentParser(prog="python -m simulator.model.precompile", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=COMPILED, help="the packaged cache folder (default: %(default)s)")
    parser.add_argument("--reuse", type=Path, metavar="FOLDER",
                        help="copy FOLDER instead of compiling where its stamp is this package's and interpreter's")
    args = parser.parse_args(argv)
    written, copied = precompile(args.out, args.reuse)
    how = f"copied from {args.reuse} (its stamp matches)" if copied else "compiled"
    print(f"{args.out}: {written} compiled-cache files, {how}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
