"""Build hook: the wheel carries the bundled profiles, scenarios and traces.

They live at the repository's top level (``profiles/``, ``scenarios/``, ``traces/``, ``prices/``), where
users of the checkout find them; at build time they are copied into the package as
``simulator/_bundled/`` so an installed simctl can resolve them by name
(:mod:`simulator.bundled`).

The wheel also carries the fast engine compiled for the building machine
(``simulator/model/_compiled/``, written by ``python -m simulator.model.precompile``): an
extension module of the kernel that runs without numba, and numba's cache files of it, so
the first replay after ``pip install`` neither compiles the kernel for about a minute nor
loads numba; the extension makes the wheel one for this platform and Python. The build
compiles with numba's ahead-of-time compiler, which needs a C compiler (without one the
wheel carries numba's cache alone); that is why ``pyproject.toml``'s build-system
requires the libraries the precompile imports. A checkout's own ``simulator/model/_compiled/``
(``make env`` writes it) is copied instead of compiling again where its stamp matches the
sources built and the building interpreter. ``SIMCTL_NO_PRECOMPILE=1`` builds a wheel
without it (its first replay compiles, once). Everything else is declared in
``pyproject.toml``.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
BUNDLED = {"profiles": ("*.json",), "scenarios": ("*.toml",),
           "traces": ("*.json", "*.csv", "*.jsonl", "README.md"), "prices": ("*.json",)}


class BuildWithBundledData(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:  # an editable install reads the top-level folders directly
            return
        for kind, patterns in BUNDLED.items():
            target = Path(self.build_lib) / "simulator" / "_bundled" / kind
            target.mkdir(parents=True, exist_ok=True)
            for pattern in patterns:
                for src in sorted((HERE / kind).glob(pattern)):
                    shutil.copy2(src, target / src.name)
        if not os.environ.get("SIMCTL_NO_PRECOMPILE"):
            # compiled from the build folder's copy of the package: the cache keys on the
            # content of its kernel sources, which the installed files keep. The checkout's
            # own compiled folder (make env) is copied instead where its stamp says it was
            # compiled from these sources by this interpreter's numba for this CPU.
            out = Path(self.build_lib) / "simulator" / "model" / "_compiled"
            # the build folder first, then what the environment already puts on the path: pip's
            # isolated build reaches its build requirements through PYTHONPATH (a sitecustomize
            # there adds them), so replacing it would leave the precompile without numpy
            path = [str(Path(self.build_lib).resolve())] + [p for p in [os.environ.get("PYTHONPATH")] if p]
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
            subprocess.run([sys.executable, "-m", "simulator.model.precompile", "--out", str(out.resolve()),
                            "--reuse", str(HERE / "simulator" / "model" / "_compiled")],
                           env=env, check=True, cwd=self.build_lib)


class WithCompiledKernel(Distribution):
    """A distribution holding a compiled extension (the kernel's): its wheel is tagged for
    this platform and Python, not as pure Python."""

    def has_ext_modules(self) -> bool:
        return not os.environ.get("SIMCTL_NO_PRECOMPILE")


setup(cmdclass={"build_py": BuildWithBundledData}, distclass=WithCompiledKernel)
