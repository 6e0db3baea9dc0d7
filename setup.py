"""Build hook: the wheel carries the bundled profiles, scenarios and traces.

They live at the repository's top level (``profiles/``, ``scenarios/``, ``traces/``, ``prices/``), where
users of the checkout find them; at build time they are copied into the package as
``simulator/_bundled/`` so an installed simctl can resolve them by name
(:mod:`simulator.bundled`). Everything else is declared in ``pyproject.toml``.
"""

import shutil
from pathlib import Path

from setuptools import setup
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


setup(cmdclass={"build_py": BuildWithBundledData})
