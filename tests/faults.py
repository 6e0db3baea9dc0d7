"""Interrupting simctl at a seeded moment (SIGKILL or SIGINT sent from Python), then running
the same command again: shared by ``tests/test_faults.py`` and ``benchmarks/hostile_inputs.py``.
The commands: replay, a sweep on local processes, a sweep on a Dask cluster (a
``LocalCluster`` on 127.0.0.1 the harness keeps), and calibrate on a small observed run.

One :func:`interrupt` returns what the README promises about interruptions, as figures:
``orphans`` (processes of the interrupted command still alive after it), ``leftovers``
(``.part`` files after the next run of the same command), ``rows_lost`` (sweep rows finished
before the interruption that the next run redid), ``identical`` (the resumed outputs equal an
uninterrupted run's: byte for byte for replay's and calibrate's files, row for row for a
sweep), ``said`` (a Ctrl-C'd command said in one line what it kept).

The quick form starts the interrupted commands as forks of one interpreter that imported
simctl once (:class:`Forker`); a caller ends it with :func:`close_forker` (or at exit).
"""

from __future__ import annotations

import functools
import io
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIMCTL = [sys.executable, "-c", "from simulator.cli import main; main()"]
#: The same, saying on the file descriptor given after ``-c``'s code that simctl is imported
#: and its main is being entered, so that a signal timed from that moment lands in the
#: command, never in the interpreter's start-up (where a Ctrl-C is a traceback, as for any
#: program the shell has not started yet), however loaded the machine is.
_SIMCTL_READY = [sys.executable, "-c", "import os, sys; from simulator.cli import main; fd = int(sys.argv.pop(1)); "
                 "os.write(fd, b'.'); os.close(fd); main()"]

#: Each command, run in its folder with relative paths (so two folders' outputs compare);
#: ``{cluster}``: the address of the harness's Dask cluster (:func:`cluster_address`).
_SWEEP = ["sweep", "long.json", "-c", "design-notes", "--flush", "0,0.1,0.2,0.3,0.4,0.5", "--seeds", "2"]
COMMANDS = {
    # (the engine named: the event log records which engine ran, and ``auto`` gives a fresh
    # process's small replay to the reference engine but the kernel to a process that has it
    # loaded already, as the quick form's rerun in this process has)
    "replay": ["replay", "long.json", "-c", "design-notes", "--json", "summary.json", "--events", "events.parquet",
               "--engine", "reference", "--force"],
    "sweep": [*_SWEEP, "--jobs", "2", "--out", "results.parquet"],
    "sweep --cluster": [*_SWEEP, "--cluster", "{cluster}", "--out", "results.parquet"],
    "calibrate": ["calibrate", "run", "--scenario", "{calibrate_scenario}", "--start", "qwen3-4b-nospec-start",
                  "-o", "fit.json", "--seeds", "1", "--screen", "6", "--starts", "2", "--max-evaluations", "15",
                  "--force"],
}
#: The suite's cheaper form of a command (``quick``): calibrate with a smaller fit (2 screened
#: points, one local fit of at most 6 evaluations) on a run of :data:`QUICK_RUN_CALLS` calls,
#: a second or so of fitting after the start-up where the full form fits for four: still a
#: run read, a fit screened, refined and written, which is what an interruption lands in.
QUICK_COMMANDS = {
    "calibrate": ["calibrate", "run", "--scenario", "{calibrate_scenario}", "--start", "qwen3-4b-nospec-start",
                  "-o", "fit.json", "--seeds", "1", "--screen", "2", "--starts", "1", "--max-evaluations", "6",
                  "--force"],
}
QUICK_RUN_CALLS = 20
#: The quick form's trace for replay and sweep: the bundled trace repeated this many times
#: (the full form: 40). Its commands run forked with their modules imported (:func:`start`),
#: so the moments are fractions of the work alone: a quarter of the work still has each
#: moment land in the same stage of it (a sweep's 12 replays still load the compiled kernel).
QUICK_TRACE_REPEATS = 10
OUTPUTS = {"replay": ("summary.json", "events.parquet"), "sweep": ("results.parquet",),
           "sweep --cluster": ("results.parquet",), "calibrate": ("fit.json",)}


@functools.cache
def cluster_address() -> str:
    """A Dask ``LocalCluster`` on 127.0.0.1 (two worker threads in this process), started
    once and kept for the process's life: an interrupted sweep's client dies, the cluster
    lives on, as a shared one does."""
    import atexit

    import distributed

    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, protocol="tcp://",
                                       host="127.0.0.1", dashboard_address=None)
    atexit.register(cluster.close)
    return cluster.scheduler_address


def command(kind: str, quick: bool = False) -> list[str]:
    """The command line of ``kind`` (its :data:`QUICK_COMMANDS` form if ``quick`` and it has
    one), its placeholders filled in."""
    args = QUICK_COMMANDS.get(kind, COMMANDS[kind]) if quick else COMMANDS[kind]
    if "{cluster}" in args:
        args = [cluster_address() if a == "{cluster}" else a for a in args]
    return [str(CALIBRATE_SCENARIO) if a == "{calibrate_scenario}" else a for a in args]


def prepare(kind: str, folder: Path, quick: bool = False) -> None:
    """The inputs of ``kind`` in ``folder`` (``quick``: those of its quick form)."""
    if kind == "calibrate":
        make_run(folder, QUICK_RUN_CALLS if quick else 40)
    else:
        make_trace(folder, QUICK_TRACE_REPEATS if quick else 40)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def make_trace(folder: Path, repeats: int = 40) -> Path:
    """The bundled trace repeated ``repeats`` times end to end: a replay of a second or so."""
    from simulator.trace.formats import load_trace, save_trace
    from simulator.trace.model import Call, Trace

    bundled = load_trace(ROOT / "traces" / "batch_arrivals.json")
    span = bundled.calls[-1].t + 1
    calls = tuple(Call(f"{k}-{c.id}", c.t + k * span, c.prompts) for k in range(repeats) for c in bundled.calls)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "long.json"
    save_trace(Trace(calls=calls), path, force=True)
    return path


#: Scenario and start profile of the calibrate fixture (those of tests/test_calibrate.py).
CALIBRATE_SCENARIO = ROOT / "scenarios" / "lminference-4queues.toml"


def make_run(folder: Path, calls: int = 40) -> Path:
    """A small observed run of the users' client: ``batch_arrivals.json`` (the bundled
    trace's first ``calls`` calls) and ``run/batch_NNNN.json``, each call's latency as the
    simulator gives it for the calibrate fixture's scenario and start profile."""
    import json

    from simulator.metrics import client_calls
    from simulator.model import simulate
    from simulator.profile import load_profile
    from simulator.scenario import build_scenario
    from simulator.trace.formats import load_trace

    folder.mkdir(parents=True, exist_ok=True)
    records = json.loads((ROOT / "traces" / "batch_arrivals.json").read_text())[:calls]
    (folder / "batch_arrivals.json").write_text(json.dumps(records))
    trace = load_trace(folder / "batch_arrivals.json")
    log = simulate(trace, build_scenario(path=CALIBRATE_SCENARIO), load_profile("qwen3-4b-nospec-start"), seed=0)
    # 30 % slower than the start profile says: the fit has something to move
    latency = 1.3 * client_calls(log, None).set_index("call_id")["latency_s"]
    run = folder / "run"
    run.mkdir(exist_ok=True)
    for call in trace.calls:
        t, lat = call.t, float(latency[call.id])
        (run / f"batch_{int(call.id):04d}.json").write_text(json.dumps({
            "batch_id": int(call.id), "batch_size": len(call.prompts), "scheduled_arrival_time": t,
            "actual_send_time": t, "request_duration": lat, "completion_time": t + lat, "status_code": 200,
            "prompt_idxs": list(range(len(call.prompts))), "error": None,
            "response": {"choices": [{"text": "answer", "index": i} for i in range(len(call.prompts))]}}))
    return run


#: Seconds an uninterrupted run of each command took from entering simctl's main (measured by
#: :func:`reference`).
DURATIONS: dict[str, float] = {}


@functools.cache
def reference(kind: str, base: str, quick: bool = False) -> dict[str, bytes]:
    """The outputs of an uninterrupted run of ``kind`` (``quick``: its quick form; in
    ``base``/ref-KIND); its duration goes into :data:`DURATIONS` (keyed by
    :func:`_key`)."""
    folder = Path(base) / f"ref-{kind.replace(' --', '-')}{'-quick' if quick else ''}"
    prepare(kind, folder, quick)
    # Once, and again only when that run compiled kernel code into the cache (its duration
    # would then be the compiler's, not the command's): with the kernel precompiled, once.
    while True:
        for name in OUTPUTS[kind]:  # a sweep would resume its finished file
            (folder / name).unlink(missing_ok=True)
        cache = _kernel_cache()
        proc, began = start(command(kind, quick), folder, quick, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
        if proc.wait(timeout=300) != 0:
            raise subprocess.CalledProcessError(proc.returncode, command(kind, quick))
        DURATIONS[_key(kind, quick)] = time.monotonic() - began
        if _kernel_cache() == cache:
            return {name: (folder / name).read_bytes() for name in OUTPUTS[kind]}


def _key(kind: str, quick: bool) -> str:
    return f"{kind} (quick)" if quick else kind


def _kernel_cache() -> dict[str, int]:
    """The compiled-kernel cache files (numba's ``.nbi``/``.nbc``) and their modification
    times: they change when a run compiles."""
    places = [ROOT / "simulator"]
    if os.environ.get("NUMBA_CACHE_DIR"):
        places.append(Path(os.environ["NUMBA_CACHE_DIR"]))
    return {str(f): f.stat().st_mtime_ns for place in places for f in place.rglob("*.nb[ic]")}


def start(args: list[str], folder: Path, quick: bool = False, **popen: object) -> tuple[subprocess.Popen, float]:
    """Start ``simctl ARGS`` in ``folder``; return it and the instant it entered simctl's
    main (after the interpreter's start-up and the imports), once it has. ``quick``: a fork
    of :func:`forker`'s interpreter (``popen``'s ``stdout`` and ``stderr`` are then
    ``subprocess.DEVNULL`` or ``subprocess.PIPE``)."""
    if quick:
        return forker().fork(args, folder, **popen), time.monotonic()
    ready, tell = os.pipe()
    try:
        proc = subprocess.Popen([*_SIMCTL_READY, str(tell), *args], cwd=folder, env=_env(), pass_fds=(tell,),
                                preexec_fn=_default_sigint, **popen)  # type: ignore[call-overload]
    finally:
        os.close(tell)
    with os.fdopen(ready, "rb") as pipe:
        pipe.read(1)  # b"." once main is entered; b"" if the process ended before (a hang guard: it ends)
    return proc, time.monotonic()


#: The forking interpreter of :class:`Forker`: it imports the modules named on its command
#: line, then for each request on stdin (JSON: ``args``, ``cwd``, ``stdout`` and ``stderr``,
#: file names or null for /dev/null) forks a process that enters simctl's main with that
#: command line, in that folder, with those files as its stdout and stderr, as a shell would
#: start it; it writes the process's pid, then, on the next line read and once the process
#: has ended, its exit status as ``subprocess`` gives it (``-9``: killed by SIGKILL).
_FORKER = r"""
import json, os, sys, threading
for name in sys.argv[1:]:
    __import__(name)
# A fork copies only the thread that calls it: with no other thread, no lock is left held.
assert threading.active_count() == 1, threading.enumerate()
from simulator.cli import main
import gc
# What was imported is never collected: each process's collections, and its end, then pass
# those objects by instead of walking them (and copying each page they are on), a second of
# CPU less a command.
gc.freeze()
while True:
    line = sys.stdin.readline()
    if not line:  # (freeing its modules would be half a second of nothing)
        os._exit(0)
    ask = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        break
    sys.stdout.write(f"{pid}\n")
    sys.stdout.flush()
    # Reaped only when asked: until then an ended process stays a zombie, so a signal sent to
    # its pid can never reach another process that was given the same pid.
    sys.stdin.readline()
    sys.stdout.write(f"{os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])}\n")
    sys.stdout.flush()
os.chdir(ask["cwd"])
null = os.open(os.devnull, os.O_RDWR)
os.dup2(null, 0)
for fd, name in ((1, ask["stdout"]), (2, ask["stderr"])):
    os.dup2(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) if name else null, fd)
sys.argv = ["simctl", *ask["args"]]
main()  # and the process ends as any Python process does
"""
#: What :func:`forker`'s interpreter imports before it forks: what simctl's replay, sweep and
#: calibrate import once their main is entered.
_PRELOADED = ("simulator.cli", "simulator.cli.replay", "simulator.cli.sweep", "simulator.cli.calibrate",
              "simulator.cli.importer", "simulator.replay", "simulator.sweep", "simulator.calibrate",
              "simulator.events", "simulator.observed", "simulator.observed_formats", "simulator.cost",
              "simulator.metrics", "simulator.notices", "simulator.trace.stats", "simulator.model.kernel_service",
              "simulator.model.batch_kernel", "numba", "pandas", "pyarrow.parquet", "pydantic", "scipy.optimize",
              "scipy.stats", "typer._adapters", "typer._click.decorators")


class Forked:
    """A command's process forked by a :class:`Forker`: what ``subprocess.Popen`` offers
    :func:`interrupt` (``pid``, ``send_signal``, ``wait``, ``communicate``, ``returncode``)."""

    def __init__(self, forker: Forker, pid: int, stderr: Path | None) -> None:
        self.forker, self.pid, self.stderr = forker, pid, stderr
        self.returncode: int | None = None

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.forker.status(timeout)
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[None, str | None]:
        self.wait(timeout)
        return None, None if self.stderr is None else self.stderr.read_text()


class Forker:
    """One interpreter that has imported simctl's modules once (:data:`_PRELOADED`) and forks
    a process for each command (:data:`_FORKER`). Each such process is the command's own, a
    signal sent to its pid lands in it alone, and it ends with its own exit status, as a
    command a shell started does; what it skips is the second or so of imports every fresh
    interpreter spends before a command starts its work. One command at a time."""

    def __init__(self) -> None:
        # (dask.distributed is left to the command to import: imported before the fork, its
        # exit handler fails on the client the command made after it, which a process that
        # imported it itself never does)
        self.proc = subprocess.Popen([sys.executable, "-c", _FORKER, *_PRELOADED], env=_env(), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, preexec_fn=_default_sigint)

    def fork(self, args: list[str], folder: Path, stdout: object = None, stderr: object = None,
             **_: object) -> Forked:
        """``simctl ARGS`` in ``folder`` as a forked process; ``stderr=subprocess.PIPE``:
        its stderr into a file beside ``folder``, read by :meth:`Forked.communicate`."""
        import json

        assert self.proc.stdin is not None and self.proc.stdout is not None
        err = folder.parent / f"{folder.name}.stderr" if stderr == subprocess.PIPE else None
        out = None if stdout in (None, subprocess.DEVNULL) else stdout
        self.proc.stdin.write(json.dumps({"args": args, "cwd": str(folder), "stdout": out,
                                          "stderr": str(err) if err else None}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the forking interpreter ended (status {self.proc.wait()})")
        return Forked(self, int(line), err)

    def status(self, timeout: float | None) -> int:
        """The exit status of the process forked last, once it has ended."""
        import select

        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("wait\n")
        self.proc.stdin.flush()
        if not select.select([self.proc.stdout], [], [], timeout)[0]:
            raise subprocess.TimeoutExpired("forked simctl", timeout or 0)
        return int(self.proc.stdout.readline())

    def close(self) -> None:
        """End the interpreter and wait for it (its CPU time, and that of every process it
        forked, is then counted in this process's children's)."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


_forker: Forker | None = None


def forker() -> Forker:
    """The :class:`Forker` of this process, started on first use."""
    global _forker
    if _forker is None or _forker.proc.poll() is not None:
        import atexit

        _forker = Forker()
        atexit.register(_forker.close)
    return _forker


def close_forker() -> None:
    """End :func:`forker`'s interpreter, if started."""
    global _forker
    if _forker is not None:
        _forker.close()
        _forker = None


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (read from /proc)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            parents.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _rows(folder: Path) -> int:
    """Sweep rows on disk now: the journal's whole row lines, or the results file's rows."""
    journal = folder / "results.parquet.journal"
    if journal.exists():
        return sum(1 for line in journal.read_text().splitlines() if line.startswith("[") and line.endswith("]"))
    if (folder / "results.parquet").exists():
        import pandas as pd

        return len(pd.read_parquet(folder / "results.parquet"))
    return 0


def _default_sigint() -> None:
    """Give the command Ctrl-C's default action: a harness started in the background (``&``
    in a shell) ignores SIGINT, its children inherit that, and Python then installs no
    KeyboardInterrupt handler: the Ctrl-C would never reach the command."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_again(args: list[str], folder: Path, in_process: bool) -> tuple[int, str]:
    """``simctl ARGS`` run in ``folder`` to completion: exit status and stdout. In a fresh
    interpreter, or, ``in_process``, in this one through typer's runner: the same command
    code on the same files (what the next run finds and does is what is checked, not how a
    process starts), without the seconds of imports and kernel loading a fresh interpreter
    spends first."""
    if not in_process:
        again = subprocess.run([*SIMCTL, *args], cwd=folder, env=_env(), capture_output=True, text=True, timeout=300)
        return again.returncode, again.stdout
    from typer.testing import CliRunner

    from simulator.cli import app

    here = os.getcwd()
    os.chdir(folder)  # the command's paths are relative to its folder, as in a shell there
    try:
        result = CliRunner().invoke(app, args)
    finally:
        os.chdir(here)
    return result.exit_code, result.stdout


def interrupt(kind: str, sig: signal.Signals, moment: float, folder: Path, base: Path,
              quick: bool = False) -> dict[str, object]:
    """Run ``kind`` in ``folder``, send ``sig`` at ``moment`` (a fraction, in (0, 1), of an
    uninterrupted run's duration on this machine from entering simctl's main, counted from
    the same point, so the signal falls inside the command however fast the machine is),
    run it again; the figures. ``quick`` (the suite's form): the command's
    :data:`QUICK_COMMANDS` form; the interrupted run and the reference run are processes of
    their own, forked by :func:`forker` with simctl's modules already imported, so that the
    moments fall in the command's work (and not in its imports) and no process spends a
    second importing; the run after the interruption runs in this process
    (:func:`run_again`). Without ``quick`` both are fresh interpreters.

    ``said``: a command that exits 130 (Ctrl-C) said so on stderr in one line, with what it
    kept and that the same command finishes the work."""
    expected = reference(kind, str(base), quick)
    sweep = kind.startswith("sweep")
    prepare(kind, folder, quick)
    args = command(kind, quick)
    proc, _ = start(args, folder, quick, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    delay = moment * DURATIONS[_key(kind, quick)]
    time.sleep(delay)
    tree = descendants(proc.pid)
    finished_before = _rows(folder) if sweep else 0
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    until = time.monotonic() + 10
    while time.monotonic() < until and any(alive(p) for p in tree):
        time.sleep(0.05)
    orphans = sum(alive(p) for p in tree)
    lines = err.strip().splitlines()
    one_line = proc.returncode == -9 or ("Traceback" not in err and len(lines) <= 1)
    said = proc.returncode != 130 or (len(lines) == 1 and lines[0].startswith("interrupted")
                                      and "run the same command" in lines[0])
    finished = max(finished_before, _rows(folder)) if sweep else 0
    again_code, again_out = run_again(args, folder, quick)
    skipped = 0
    if sweep:
        match = re.search(r"(\d+) already in the file skipped", " ".join(again_out.split()))
        skipped = int(match.group(1)) if match else 0
    leftovers = len(list(folder.rglob(".*.part")))
    if sweep:
        import pandas as pd

        key = ["config_key", "seed"]
        got = pd.read_parquet(folder / "results.parquet").sort_values(key).reset_index(drop=True)
        want = pd.read_parquet(io.BytesIO(expected["results.parquet"])).sort_values(key).reset_index(drop=True)
        identical = again_code == 0 and got.equals(want)
    else:
        identical = again_code == 0 and all((folder / n).read_bytes() == b for n, b in expected.items())
    return {"kind": kind, "signal": sig.name, "moment": moment, "delay": round(delay, 2), "exit": proc.returncode, "orphans": orphans,
            "leftovers": leftovers, "rows_lost": max(0, finished - skipped) if sweep else 0,
            "identical": identical, "one_line": one_line, "said": said, "stderr": err[-400:]}
