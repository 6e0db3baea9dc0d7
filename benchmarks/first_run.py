"""The first replay after ``pip install``: CPU time of a whole command on a fresh install.

Builds the wheel from a copy of the checkout's files (so it compiles the fast engine into its
packaged cache, ``setup.py``, rather than copying a ``_compiled/`` folder ``make env`` left),
installs it into a fresh virtualenv in a temporary folder and runs ``simctl replay example -c
design-notes`` from another folder, measuring each command's CPU time (user + system of the
child processes, so other work on the machine does not count):

* the first replay, as a user types it, with an empty ``NUMBA_CACHE_DIR``: ``run.engine =
  auto`` runs it on the kernel's extension, compiled into the wheel, without loading numba
  (``simulator.model.compiled``);
* the same replay on numba's kernel (``SIMCTL_NO_EXTENSION=1``: as where the extension is
  unusable), with an empty ``NUMBA_CACHE_DIR``: the kernel comes from the packaged cache;
  then a second time, with the cache the first left;
* for reference, a replay on numba's kernel that compiles it: an empty ``NUMBA_CACHE_DIR`` and
  the packaged cache left unread (``SIMCTL_NO_PACKAGED_CACHE=1``), as on a machine whose CPU,
  numba or Python differs from the build's.

To download nothing, the virtualenv reads its dependencies from this interpreter's
site-packages (a ``.pth`` file) and the wheel is built with this interpreter's numba
(``--no-build-isolation``): the packaged cache is valid for the numba that runs it, as it is
when ``pip install .`` builds and installs with the same resolved versions. simctl itself
comes from the wheel (checked), never from the checkout.

``--write-docs`` writes the figures into docs/benchmarks.md (block ``first-run``) and the
README's row.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import venv
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from docs_tables import report, write_row  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
COMMAND = ("replay", "example", "-c", "design-notes")
ON_KERNEL = ("--engine", "fast")
COMPILING = "compiling the fast engine"
README_ROW = "| first replay after `pip install`"


def _cpu(args: list[str], **kwargs) -> tuple[float, subprocess.CompletedProcess]:
    """CPU seconds (user + system) of a child command, and its result. On failure the
    command's whole output is kept in a log file outside the temporary folder, named in the
    error (a wheel build's cause is often far from its last lines)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(args, capture_output=True, text=True, **kwargs)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        fd, log = tempfile.mkstemp(prefix="simctl-first-run-", suffix=".log")
        with os.fdopen(fd, "w") as f:
            f.write(f"$ {' '.join(args)}\nexit status {done.returncode}\n--- stdout\n{done.stdout}\n"
                    f"--- stderr\n{done.stderr}")
        raise SystemExit(f"{' '.join(args)} exited {done.returncode}; its whole output: {log}\n"
                         f"{done.stderr[-1500:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), done


def _snapshot(root: Path) -> Path:
    """A copy of the checkout's files (tracked, and untracked ones git does not ignore) in
    ``root``: the wheel is built from what would be committed, never from a ``build/`` folder
    or a ``_compiled/`` folder an earlier build or ``make env`` left in the checkout."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        src = REPO / name
        if src.is_file():  # (a file deleted but not yet committed is listed too)
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, root / name)
    return root


def measure(root: Path) -> dict:
    wheels = root / "wheels"
    source = _snapshot(root / "source")
    build_cpu, _ = _cpu([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v",
                         "-w", str(wheels), str(source)])
    wheel = next(wheels.glob("simctl_llm-*.whl"))
    env_dir = root / "venv"
    venv.create(env_dir, with_pip=False)  # pip runs from this interpreter (``--python``)
    python = env_dir / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # the dependencies from this interpreter's site-packages (its .pth files, an editable
    # simctl among them, are not read: a .pth line adds a folder, not its .pth files)
    Path(site, "deps-from-base.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "NUMBA_CACHE_DIR",
                                                            "SIMCTL_NO_PACKAGED_CACHE")}
    _cpu([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)], env=env)
    work = root / "elsewhere"
    work.mkdir()
    where = subprocess.run([str(python), "-c", "import simulator; print(simulator.__file__)"], cwd=work, env=env,
                           capture_output=True, text=True, check=True).stdout.strip()
    if not where.startswith(site):
        raise SystemExit(f"simctl imported from {where}, not from the wheel installed in {site}")
    simctl = str(env_dir / "bin" / "simctl")

    def replay(cache: Path, *options: str, **extra: str) -> tuple[float, str, str]:
        cache.mkdir(exist_ok=True)
        seconds, done = _cpu([simctl, *COMMAND, *options], cwd=work,
                             env={**env, "NUMBA_CACHE_DIR": str(cache), **extra})
        # the run line's engine: "fast", "reference", or "reference (a small run: ...)"
        ran = re.search(r"engine=(\S+(?: \(a small run)?)", " ".join(done.stdout.split()))
        return seconds, done.stderr, ran.group(1) if ran else "?"

    plain, plain_err, plain_engine = replay(root / "plain-cache")
    on_numba = {"SIMCTL_NO_EXTENSION": "1"}
    first, first_err, first_engine = replay(root / "cache", *ON_KERNEL, **on_numba)
    second, second_err, _ = replay(root / "cache", *ON_KERNEL, **on_numba)
    cold, cold_err, _ = replay(root / "cold-cache", *ON_KERNEL, SIMCTL_NO_PACKAGED_CACHE="1", **on_numba)
    if first_engine != "fast":
        raise SystemExit(f"simctl {' '.join(COMMAND + ON_KERNEL)} ran on engine={first_engine}, not the kernel")
    extension = subprocess.run([str(python), "-c", "from simulator.model.compiled import extension; "
                                "print(extension() is not None)"], cwd=work, env=env, capture_output=True,
                               text=True, check=True).stdout.strip() == "True"
    return {
        "command": "simctl " + " ".join(COMMAND),
        "plain_replay_cpu_s": round(plain, 2), "plain_replay_engine": plain_engine,
        "plain_replay_compiled": COMPILING in plain_err, "extension": extension,
        "first_replay_cpu_s": round(first, 2), "first_replay_compiled": COMPILING in first_err,
        "second_replay_cpu_s": round(second, 2), "second_replay_compiled": COMPILING in second_err,
        "compiling_replay_cpu_s": round(cold, 2), "compiling_replay_said_so": COMPILING in cold_err,
        "wheel_build_cpu_s": round(build_cpu, 1),
        "python": platform.python_version(), "machine": platform.machine(),
    }


def _engine_words(r: dict) -> str:
    engine = r["plain_replay_engine"]
    if engine == "fast":
        return "the kernel's extension, numba never loaded" if r["extension"] else "numba's kernel"
    return "the reference engine: a small run" if engine.startswith("reference (a small run") else f"engine {engine}"


def text_of(r: dict) -> str:
    return (f"First replay after `pip install` (`{r['command']}`, whole command, empty `NUMBA_CACHE_DIR`; "
            f"{_engine_words(r)}): **{r['plain_replay_cpu_s']:.1f} CPU-s**. The same command on numba's kernel "
            f"(`--engine fast` with `SIMCTL_NO_EXTENSION=1`, as where the extension is unusable; the kernel "
            f"loaded from the wheel's packaged cache): {r['first_replay_cpu_s']:.1f} CPU-s the first time, "
            f"{r['second_replay_cpu_s']:.1f} CPU-s the second; a replay that compiles the kernel (no usable "
            f"cache: another CPU, numba or Python than the build's) {r['compiling_replay_cpu_s']:.1f} CPU-s. "
            f"Building the wheel, which compiles the kernel into numba's cache and into the extension, "
            f"{r['wheel_build_cpu_s']:.0f} CPU-s. CPU time of the child processes (user + system), Python "
            f"{r['python']} on {r['machine']}.")


def readme_row(r: dict) -> str:
    return (f"{README_ROW} (`{r['command']}`, empty numba cache, whole command) | **{r['plain_replay_cpu_s']:.1f} "
            f"CPU-s** ({_engine_words(r)}); on numba's kernel {r['first_replay_cpu_s']:.1f} CPU-s, loaded from the "
            f"wheel's packaged cache; compiling instead (no usable cache) "
            f"{r['compiling_replay_cpu_s']:.0f} CPU-s | `benchmarks/first_run.py`, "
            f"[docs/benchmarks.md](docs/benchmarks.md#the-first-run) |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-docs", action="store_true", help="write docs/benchmarks.md's block and the README row")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="simctl-first-run-") as tmp:
        result = measure(Path(tmp))
    if args.write_docs:
        write_row(README_ROW[2:], readme_row(result), page="README.md")
    return report(result, text_of(result), "first-run", write_docs=args.write_docs, as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
