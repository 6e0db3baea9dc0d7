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
draws from its stream, a typed list of them otherwise). The replays of :data:`PROFILES` cover each; a
specialisation they miss is compiled on first use, once, and saved in the user's cache.

The compile runs in a child process with an empty ``NUMBA_CACHE_DIR`` of its own, so what
is packaged is exactly what it compiled, whatever caches this machine already holds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: The bundled profiles replayed through the design-notes scenario to compile the kernel: the
#: users' design (one stream drawn at most), and a speculative-decoding profile whose tasks
#: each draw from their own stream (the typed list of streams).
PROFILES = ("seed-calibrated", "a100-sxm-qwen3-4b-qwen3-0.6b-hf-eager")


def _compile() -> None:
    """Replay :data:`PROFILES` on the fast engine (in the child: its cache is the fresh one)."""
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
    print(f"{len(run_kernel.signatures)} specialisation(s) of run_kernel compiled", file=sys.stderr)


def precompile(out: Path) -> int:
    """Compile the kernel into a fresh cache and lay its files out in ``out`` (replaced),
    a folder per source folder; the number of files written."""
    from simulator.model.kernel_cache import PACKAGE

    with tempfile.TemporaryDirectory(prefix="simctl-precompile-") as tmp:
        env = {**os.environ, "NUMBA_CACHE_DIR": tmp, "SIMCTL_NO_PACKAGED_CACHE": "1"}
        code = "from simulator.model.precompile import _compile; _compile()"
        # the package compiled is the one imported here (a wheel's build folder, a checkout)
        env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE.parent), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        subprocess.run([sys.executable, "-c", code], env=env, check=True, cwd=tmp)
        out.parent.mkdir(parents=True, exist_ok=True)
        staged = Path(tempfile.mkdtemp(prefix=".compiled-", dir=out.parent))  # beside out: renamed into place
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
    if out.exists():
        shutil.rmtree(out)
    staged.rename(out)
    return written


def main(argv: list[str] | None = None) -> int:
    from simulator.model.kernel_cache import COMPILED

    parser = argparse.ArgumentParser(prog="python -m simulator.model.precompile", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=COMPILED, help="the packaged cache folder (default: %(default)s)")
    args = parser.parse_args(argv)
    written = precompile(args.out)
    print(f"{args.out}: {written} compiled-cache files", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
