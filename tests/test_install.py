"""simctl works wherever it is installed: bundled data by name, a fast listing, a real wheel.

The last test builds a wheel, installs it into a fresh virtualenv outside the checkout and
runs the documented commands and a notebook from a temporary folder, as a ``pip`` user
would. The wheel's dependencies are not downloaded and installed again: the virtualenv sees
exactly the distributions the wheel declares (``simctl-llm[test]``, followed transitively
through their own requirements), linked from the environment running the tests, and nothing
else of it. So a dependency missing from pyproject.toml still fails the test (its import
fails), a declared one that the environment lacks or has at a version outside the declared
range fails it too, and the test costs no download nor unpacking of numpy, pandas and the rest.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from simulator import bundled
from simulator.cli import COMMANDS, _load, app
from simulator.errors import ProfileError, ScenarioError, TraceError
from simulator.profile import load_profile
from simulator.scenario import build_scenario
from simulator.trace.formats import load_trace

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()


def test_bundled_files_load_by_name_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    trace = load_trace("example")
    assert len(trace) == len(load_trace(REPO / "traces" / "batch_arrivals.json")) == 118
    assert load_profile("seed-calibrated").name == "seed-calibrated"
    assert build_scenario(path="design-notes").name == "design-notes"
    assert "example" in bundled.names("traces") and "design-notes" in bundled.names("scenarios")


def test_an_existing_path_wins_over_a_bundled_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "design-notes").write_text('name = "mine"\n')
    assert build_scenario(path="design-notes").name == "mine"


@pytest.mark.parametrize("load, error, kind", [
    (load_trace, TraceError, "trace"), (load_profile, ProfileError, "profile"),
    (lambda name: build_scenario(path=name), ScenarioError, "scenario")])
def test_an_unknown_name_lists_the_bundled_ones(load, error, kind, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(error, match=f"no such file, and no bundled {kind} of that name \\(bundled: "):
        load("no-such-thing")


def test_user_profiles_are_found_by_name(tmp_path, monkeypatch):
    monkeypatch.setenv("SIMCTL_HOME", str(tmp_path))
    (tmp_path / "profiles").mkdir()
    shutil.copy(REPO / "profiles" / "seed-calibrated.json", tmp_path / "profiles" / "my-h100.json")
    assert load_profile("my-h100").path == str(tmp_path / "profiles" / "my-h100.json")


def test_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout.startswith("simctl ")


def test_version_reads_the_distribution_that_pyproject_names():
    """``--version`` asks importlib.metadata for the distribution by name: the name it asks
    for must be the one pyproject.toml builds (``simctl`` on PyPI is another project)."""
    import tomllib

    from simulator.cli import DISTRIBUTION

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["name"] == DISTRIBUTION == "simctl-llm"
    assert project["scripts"]["simctl"].startswith("simulator.")


def test_help_lists_every_command_without_importing_the_model():
    """The listing imports no command module, so none of the heavy libraries."""
    code = ("import sys\nfrom typer.testing import CliRunner\nfrom simulator.cli import app\n"
            "r = CliRunner().invoke(app, ['--help'])\nassert r.exit_code == 0, r.output\n"
            "print(r.output)\n"
            "heavy = {'pandas', 'numpy', 'scipy', 'simpy', 'matplotlib', 'pyarrow'}\n"
            "print('HEAVY', sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True).stdout
    assert "HEAVY []" in out
    for name in COMMANDS:
        assert name in out


@pytest.mark.parametrize("name", list(COMMANDS))
def test_listing_help_is_the_commands_own(name):
    command = _load(name)
    assert (command.help or "").strip().splitlines()[0] == COMMANDS[name][1]


def _venv_bin(root: Path, name: str) -> Path:
    return root / ("Scripts" if os.name == "nt" else "bin") / name


def _wheel_requirements(wheel: Path) -> list[str]:
    """The ``Requires-Dist`` lines of ``wheel``'s metadata."""
    import email

    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        return email.message_from_string(zf.read(name).decode()).get_all("Requires-Dist") or []


def _requirements_closure(declared: list[str], extras: set[str]) -> dict[str, Any]:
    """The installed distributions that the requirements ``declared`` need with ``extras``:
    those, then theirs, transitively (environment markers evaluated, a requirement's own
    extras followed); canonical name -> distribution. Fails naming a requirement that is not
    installed here, or is at a version outside its declared range."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pending = [(Requirement(r), {"", *extras}) for r in declared]
    found: dict[str, Any] = {}
    while pending:
        req, wanted = pending.pop()
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in wanted):
            continue
        key = canonicalize_name(req.name)
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            pytest.fail(f"{req} (required by the wheel, transitively) is not installed in the test environment")
        assert req.specifier.contains(dist.version, prereleases=True), (
            f"{req}: the test environment has {dist.version}, outside the declared range")
        if key in found:
            continue
        found[key] = dist
        pending += [(Requirement(r), {"", *req.extras}) for r in dist.requires or []]
    return found


def _add_dependencies(python: Path, dists: dict[str, Any], view: Path) -> None:
    """Make the distributions ``dists`` importable by the virtualenv of ``python``, linked
    from this environment (:func:`_dependency_view`) and nothing else of it: a path entry
    after the virtualenv's own site-packages, so that what pip installs there wins."""
    _dependency_view(dists, view)
    site_packages = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                   capture_output=True, text=True, check=True).stdout.strip()
    (Path(site_packages) / "simctl-test-dependencies.pth").write_text(str(view) + "\n")


def _dependency_view(dists: dict[str, Any], view: Path) -> None:
    """Links in ``view`` to the top-level files of ``dists`` (their packages, modules and
    ``.dist-info`` folders), so a path entry to ``view`` imports those and nothing else."""
    view.mkdir()
    for dist in dists.values():
        assert dist.files, f"{dist.metadata['Name']} lists no files (no RECORD)"
        for top in {f.parts[0] for f in dist.files if f.parts and f.parts[0] != ".."}:
            source = Path(dist.locate_file(top))
            if source.exists() and not (view / top).exists() and not top.endswith(".pth"):
                (view / top).symlink_to(source)


#: Run by the installed package's interpreter, from a folder outside the checkout, with an
#: empty numba cache: the first replay on the kernel (``simctl replay example -c design-notes
#: --engine fast``) and its kernel's cache hits and misses, the same replay from the library,
#: the documented commands, where the package reads its data from, and the notebook named by
#: its argument in a Jupyter kernel of the installed environment; prints JSON. The commands run in this one
#: process through typer's CliRunner, as the console script runs them (the test runs the
#: script itself as a real process too): a process each would only pay the interpreter's and
#: the libraries' start-up again.
_INSTALLED_RUN = """
import json
import sys

import nbclient
import nbformat

from typer.testing import CliRunner

from simulator.cli import app

commands = {
    "first": ["replay", "example", "-c", "design-notes", "--engine", "fast"],  # (auto: a small run, no kernel)
    "replay": ["replay", "example", "--flush", "0.5"],
    "json": ["replay", "example", "-c", "design-notes", "-p", "seed-calibrated", "--json", "out.json"],
    "sweep": ["sweep", "example", "--flush", "0,1", "-j", "1", "-o", "s.parquet"],
    "plan": ["plan", "example", "--slo", "infobench.latency.p95<=400", "--max-gpus", "2", "--flush", "0.5",
             "--topology", "shared", "--max-batch", "8", "-j", "1"],
}
found = {}
for name, args in commands.items():
    result = CliRunner().invoke(app, args)
    found[name] = {"status": result.exit_code, "stdout": result.stdout, "stderr": result.stderr,
                   "exception": repr(result.exception)}
    if name == "first":
        import os

        from simulator.model import compiled

        found["extension"] = compiled.extension() is not None
        found["numba_loaded"] = "numba" in sys.modules
        # the same replay on numba's kernel: the packaged cache, loaded, not compiled
        os.environ[compiled.NO_EXTENSION] = "1"
        compiled.extension.cache_clear()
        found["on_numba"] = CliRunner().invoke(app, args).exit_code
        del os.environ[compiled.NO_EXTENSION]
        compiled.extension.cache_clear()
        from simulator.model import batch_kernel

        stats = batch_kernel.run_kernel.stats
        found["hits"], found["misses"] = sum(stats.cache_hits.values()), sum(stats.cache_misses.values())
        import simulator as sim

        found["library_prompts"] = sim.replay("example", sim.build_scenario(path="design-notes")).summary[
            "overall"]["prompts"]

import simulator.bundled
from simulator.hardware import load_gpu

found["bundled"] = str(simulator.bundled.folder("traces"))
found["gemm_tag"] = load_gpu("a100-sxm").gemm(1, 4096, 4096).tag

nb = nbformat.read(sys.argv[1], as_version=4)
nbclient.NotebookClient(nb, timeout=600, kernel_name="python3").execute()
found["figures"] = sum(1 for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {}))
print(json.dumps(found))
"""


@pytest.mark.install
def test_wheel_installs_and_runs_from_a_temporary_folder(tmp_path):
    import tomllib

    from simulator.model import compiled, kernel_cache, precompile

    # Nothing of the checkout on the path: pip would take its simctl_llm.egg-info for an installed simctl-llm.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # The wheel is built where pip's build isolation would build it: an environment holding
    # pyproject.toml's build-system requirements (followed transitively) and nothing else, so
    # a requirement the build imports but does not declare still fails the build; made of
    # links to this environment's copies instead of numba, numpy, pandas ... unpacked anew.
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    build_env = tmp_path / "build-env"
    venv.create(build_env, with_pip=False)
    _add_dependencies(_venv_bin(build_env, "python"), _requirements_closure(requires, set()),
                      tmp_path / "build-dependencies")
    wheels = tmp_path / "wheels"
    # The PEP 517 backend that pyproject.toml names, called in that environment as a build
    # frontend calls it (pip's own start-up would only add a process resolving nothing);
    # setup.py's output says whether the kernel was compiled or the checkout's copied.
    backend = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["build-backend"]
    build_wheel = (f"import importlib, os, sys; os.chdir(sys.argv[1]); "
                   f"print(importlib.import_module({backend!r}).build_wheel(sys.argv[2]))")
    build = subprocess.run([str(_venv_bin(build_env, "python")), "-c", build_wheel, str(REPO), str(wheels)],
                           env=env, capture_output=True, text=True)
    assert build.returncode == 0, f"building the wheel failed:\n{(build.stdout + build.stderr)[-3000:]}"
    wheel = next(wheels.glob("simctl_llm-*.whl"))
    with zipfile.ZipFile(wheel) as packed:  # the fast engine compiled at build time (setup.py)
        assert any(n.startswith("simulator/model/_compiled/model/batch_kernel.run_kernel-") and n.endswith(".nbi")
                   for n in packed.namelist())
        assert f"simulator/model/_compiled/{compiled.extension_stamp()['file']}" in packed.namelist()
        packed_stamp = json.loads(packed.read(f"simulator/model/_compiled/{kernel_cache.STAMP}"))
    assert not wheel.name.endswith("-none-any.whl")  # (a wheel with an extension is for its platform)
    # A checkout whose compiled folder is current (make env) is not compiled again, where the
    # build's numba is the one it was compiled with.
    if precompile.reusable(kernel_cache.COMPILED) and packed_stamp == precompile.build_key():
        assert "its stamp matches" in build.stdout + build.stderr
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = _venv_bin(env_dir, "python")
    # This environment's pip installs into the new one (--python): the wheel alone, its
    # dependencies come from the view below
    pip = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                          "-q", "--no-deps", str(wheel)], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert pip.returncode == 0, f"installing the wheel failed:\n{pip.stderr[-3000:]}"
    # After the wheel (pip must not see this environment's editable simctl-llm through it):
    # the declared dependencies only.
    _add_dependencies(python, _requirements_closure(_wheel_requirements(wheel), {"test"}), tmp_path / "dependencies")

    work = tmp_path / "elsewhere"
    work.mkdir()
    env.update(COLUMNS="100", SIMCTL_HOME=str(tmp_path / "home"), NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"))
    env.pop("SIMCTL_NO_PACKAGED_CACHE", None)

    notebook = work / "latency_cdfs.ipynb"
    shutil.copy(REPO / "notebooks" / "latency_cdfs.ipynb", notebook)
    done = subprocess.run([str(python), "-c", _INSTALLED_RUN, str(notebook)], cwd=work, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    for name in ("first", "replay", "json", "sweep", "plan"):
        assert found[name]["status"] == 0, (name, found[name])
    # The first replay runs the wheel's extension of the kernel, without loading numba; on
    # numba's kernel, with an empty numba cache, it loads the packaged cache: hits, no compile.
    assert found["extension"] and not found["numba_loaded"]
    assert found["on_numba"] == 0 and found["hits"] >= 1 and found["misses"] == 0
    assert "engine=fast" in found["first"]["stdout"]
    assert "compiling the fast engine" not in found["first"]["stderr"]
    assert found["library_prompts"] == 347
    assert "Latency per task" in found["replay"]["stdout"]
    assert "engine=fast" in found["replay"]["stdout"]
    assert json.loads((work / "out.json").read_text())["overall"]["prompts"] == 347
    assert (work / "s.parquet").exists()
    assert "meets every SLO" in found["plan"]["stdout"]
    # The installed package must not be reading the checkout ...
    assert str(REPO) not in found["bundled"] and "_bundled" in found["bundled"]
    # ... and the hardware cost model's tables came with the wheel.
    assert found["gemm_tag"] == "exact"
    # ... and a notebook runs on it in a kernel of that environment, figures and all.
    assert found["figures"] == 2

    # The console script, as a real process (found by its distribution name).
    version = subprocess.run([str(_venv_bin(env_dir, "simctl")), "--version"], cwd=work, env=env,
                             capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.strip() == f"simctl {wheel.name.split('-')[1]}"
