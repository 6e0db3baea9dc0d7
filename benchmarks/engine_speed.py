"""How fast is a replay, whole command first, against an idiomatic simpy model of the same queue?

Every comparison with simpy is like for like: customers through the same M/M/4 queue (Poisson
arrivals of one-prompt calls at load 0.8, four exclusive GPUs behind one shared queue, batches
of one, exponential service of mean 1 s), the same arrival instants, CPU time on both sides:

* **whole command**: ``simctl replay`` of the ``simctl-trace/1`` JSON file of those
  ``--mm4-calls`` calls (200,000) in a fresh process, against ``simpy_baseline.py --once``
  simulating the same calls in a fresh process; each the CPU time of the child, start-up,
  imports, reading (or drawing) the input, the run and its results included. The compiled
  kernel is loaded from its on-disk cache (put there beforehand), as on every replay after
  the first on an installation;
* **library call**: ``simulate()`` on the trace already in memory as columns, against
  :func:`simpy_baseline.simpy_mmc` on arrays already drawn, both in this process, best of
  ``--repeat``.

Then, also whole commands, ``simctl replay`` of a file of ``--calls`` (1,000,000) such calls:
prompts per second of CPU time, and its peak memory per prompt over that of the same command
on a 1,000-call file (interpreter, imports, the kernel: the part no trace size changes).

The library table times ``simulate`` (lowering the scenario, the run, the event log; file
parsing not counted) of the fast engine and, on a smaller trace, the reference engine, per
case; simpy appears there only beside M/M/4, the one case it models:

* ``M/M/4``: the queue above.
* ``flush-window batching``: the same GPUs at twice the arrival rate (6.4 calls/s), a flush
  window of 0.5 s and batches of up to 8, gamma service growing with the batch (0.6 s + 0.4 s
  a prompt): full batches would serve 8.4 calls/s, so the queue keeps up, its batches below
  the largest (``tests/test_benchmarks.py`` checks that no backlog builds).
* ``design-notes``: the users' server (``scenarios/design-notes.toml``: a CPU task, a
  one-worker queue taking a GPU per batch, a two-worker queue, processor-sharing GPUs) on a
  synthetic trace with the production statistics of the bundled one (1-8 prompts per call).
* ``design-notes, spec_decode profile`` (with ``--spec-decode``): the same trace and
  scenario on a composed profile whose tasks are ``spec_decode`` (infobench), ``iteration``
  (mmlu) and ``distribution`` (graph): batch times drawn per iteration and per row as
  batches form.

Peak memory per prompt of the fast engine's library call is measured in a child process (its
peak resident set size, less the size before the run, over the prompts).

    python benchmarks/engine_speed.py --write-docs        # full sizes; docs and README rows
    python benchmarks/engine_speed.py --quick             # a quick check
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
ROOT = Path(__file__).resolve().parent.parent


#: The flush-window case's arrival rate over the M/M/4's (3.2 calls/s): 6.4 calls/s, against
#: 8.4/s that four GPUs serve in full batches of 8 (8 prompts per 0.6 s + 8 × 0.4 s each).
BATCHING_SPEEDUP = 2.0


def mm4_trace(arrivals):
    """A trace of one-prompt calls of task ``q`` at ``arrivals``, built as columns."""
    import numpy as np

    from simulator.trace.model import Trace, TraceColumns, id_column

    n = len(arrivals)
    columns = TraceColumns.of_sizes(
        call_t=np.asarray(arrivals, dtype=float), call_ids=id_column([str(i) for i in range(n)]),
        sizes=np.ones(n, dtype=np.int64), task_names=("q",), task_of=np.zeros(n, dtype=np.int32),
        prompt_tokens=np.full(n, -1, dtype=np.int32), max_tokens=np.zeros(n, dtype=np.int32))
    return Trace(columns=columns)


#: The M/M/4 as the command reads it: the scenario file and the profile (one task ``q``).
MM4_SCENARIO = """name = "mm4"
[run]
gpus = 4
gpu_sharing = "exclusive"
[tasks.q]
topology = "shared"
policy = "oldest"
flush = 0.0
max_batch = 1
"""
MM4_PROFILE = {"tasks": {"q": {"resource": "gpu",
                               "service": {"kind": "distribution", "dist": "exponential", "mean": 1.0}}}}


def mmc_case(calls: int, seed: int, batching: bool):
    """Trace, scenario and profile of the M/M/4 or flush-window batching case."""
    from simpy_baseline import mmc_inputs

    from simulator import build_scenario
    from simulator.profile import profile_from_dict

    arrivals, _ = mmc_inputs(calls, 4, 0.8, seed)
    if batching:
        arrivals = arrivals / BATCHING_SPEEDUP
    trace = mm4_trace(arrivals)
    service = ({"kind": "distribution", "dist": "gamma", "cv": 0.5, "mean": {"base": 0.6, "per_prompt": 0.4}}
               if batching else {"kind": "distribution", "dist": "exponential", "mean": 1.0})
    profile = profile_from_dict({"tasks": {"q": {"resource": "gpu", "service": service}}})
    task = {"topology": "shared", "policy": "oldest", "flush": 0.5 if batching else 0.0,
            "max_batch": 8 if batching else 1}
    scenario = build_scenario(run={"gpus": 4, "gpu_sharing": "exclusive"}, tasks={"q": task})
    return trace, scenario, profile


def design_case(calls: int, seed: int):
    from simulator import build_scenario, load_profile, synthesize
    from simulator.trace.synth import SynthSpec

    mean_gap = 10.05
    spec = SynthSpec(duration=mean_gap * calls * 1.05, arrival="gamma", mean=mean_gap, cv=0.65)
    trace = synthesize(spec, seed)
    trace = type(trace)(calls=trace.calls[:calls], meta=trace.meta, source="synthetic")
    return trace, build_scenario(path=ROOT / "scenarios" / "design-notes.toml"), load_profile("seed-calibrated")


def spec_decode_case(calls: int, seed: int):
    from simulator import load_profile

    trace, scenario, _ = design_case(calls, seed)
    return trace, scenario, load_profile("a100-sxm-qwen3-4b-qwen3-0.6b-hf-eager")


def time_engine(trace, scenario, profile, engine: str, repeat: int, seed: int = 0) -> float:
    """CPU seconds of ``simulate`` (best of ``repeat``), the trace already in columns."""
    from simulator.model import simulate

    trace.columns  # noqa: B018 - the trace in memory as columns, before the clock starts
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        log = simulate(trace, scenario, profile, seed, engine=engine)
        best = min(best, time.process_time() - t0)
        assert log.attrs["engine"] == engine and len(log) == trace.n_prompts
    return best


def memory_per_prompt(calls: int, seed: int) -> dict:
    """Peak memory of one fast replay of the design-notes case, per prompt, in a child process
    (Linux: the peak resident set is reset after the trace is built, then read after the run):
    the run (lowering, kernel, event log) on top of the trace, and the trace's own columns."""
    code = f"""
import json, sys
sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
from engine_speed import design_case
from simulator.model import simulate

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

trace, scenario, profile = design_case({calls}, {seed})
simulate(trace.__class__(calls=trace.calls[:50], meta=trace.meta), scenario, profile, 0, engine="fast")
before_columns = status("VmRSS")
columns = trace.columns
with open("/proc/self/clear_refs", "w") as fh:
    fh.write("5")  # reset the peak resident set size
before = status("VmRSS")
log = simulate(trace, scenario, profile, 0, engine="fast")
peak = status("VmHWM")
print(json.dumps({{"run": (peak - before) / trace.n_prompts, "columns": (before - before_columns) / trace.n_prompts}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


#: Prefixed to a child's code: at exit it reports its own peak resident set size (VmHWM of
#: its image; the parent's size at fork, which ``wait4`` would count, is not in it).
REPORT_PEAK = ("import atexit, sys\n"
               "def _peak():\n"
               "    for line in open('/proc/self/status'):\n"
               "        if line.startswith('VmHWM'):\n"
               "            sys.stderr.write('simctl-peak-kb ' + line.split()[1] + '\\n')\n"
               "atexit.register(_peak)\n")


def child(code: str, *args: str) -> tuple[float, int]:
    """CPU seconds (user + system) and peak resident set size (bytes) of a fresh child Python
    running ``code``: the whole command, its start-up and imports included."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, "-c", REPORT_PEAK + code, *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    peaks = [int(line.split()[1]) for line in out.stderr.splitlines() if line.startswith("simctl-peak-kb ")]
    if out.returncode or not peaks:
        raise RuntimeError(f"{code} {' '.join(args)} failed: {out.stderr[-2000:]}")
    return seconds, peaks[-1] * 1024


#: Calls of the small trace whose replay measures the fixed part of a replay's memory.
SMALL_CALLS = 1000
#: The command a child runs: ``simctl`` itself.
SIMCTL = "import sys; sys.argv[0] = 'simctl'; from simulator.cli import main; main()"


def write_mm4(folder: Path, calls: int, seed: int) -> Path:
    """The M/M/4's ``calls`` arrivals as a ``simctl-trace/1`` file in ``folder`` (with the
    scenario and profile files beside it); the trace's path."""
    from simpy_baseline import mmc_inputs

    from simulator import save_trace

    (folder / "mm4.toml").write_text(MM4_SCENARIO)
    (folder / "mm4-profile.json").write_text(json.dumps(MM4_PROFILE))
    path = folder / f"mm4-{calls}.json"
    save_trace(mm4_trace(mmc_inputs(calls, 4, 0.8, seed)[0]), path, force=True)
    return path


def replay_command(path: Path) -> tuple[str, ...]:
    """``simctl replay`` of an M/M/4 trace file, its summary written as JSON, on the compiled
    kernel (``auto`` would give the :data:`SMALL_CALLS` file to the reference engine: the
    fixed part measured on it would then leave out the kernel's loading)."""
    folder = path.parent
    return (SIMCTL, "replay", str(path), "-c", str(folder / "mm4.toml"), "-p", str(folder / "mm4-profile.json"),
            "--engine", "fast", "--json", str(folder / "summary.json"), "--force")


def command_figures(mm4_calls: int, calls: int, seed: int, repeat: int, warm: bool = True) -> dict:
    """Whole commands, each in a fresh process, best of ``repeat`` (CPU time): ``simctl
    replay`` of the ``mm4_calls``-call M/M/4 file against the simpy model of the same calls
    (the two in turn);
    ``simctl replay`` of a ``calls``-call file (prompts/s, and peak memory per prompt over the
    same command on a :data:`SMALL_CALLS`-call file); reading the large file alone. ``warm=False``
    skips the untimed replay that puts the kernel in its on-disk cache first (the quick mode,
    whose figures are a check that every step runs, not a measurement)."""
    import tempfile

    simpy_script = str(Path(__file__).resolve().parent / "simpy_baseline.py")
    simpy_code = f"import sys, runpy; sys.argv = [{simpy_script!r}] + sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
    import compileall

    # every module's bytecode written first, as pip writes it at install: a child never
    # compiles a source (where PYTHONDONTWRITEBYTECODE is set, it would in every child)
    compileall.compile_dir(str(ROOT / "simulator"), quiet=1)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        small, compared, large = (write_mm4(folder, n, seed) for n in (SMALL_CALLS, mm4_calls, calls))
        if warm:
            child(*replay_command(small))  # the kernel in its on-disk cache, before any clock runs
        # the two sides taken in turn, so that a drift in the machine's speed (a shared machine's
        # neighbours) meets both alike; best of each
        simpy_runs: list[float] = []
        compared_runs: list[tuple[float, int]] = []
        for _ in range(repeat):
            simpy_runs.append(child(simpy_code, "--once", "--customers", str(mm4_calls), "--seed", str(seed))[0])
            compared_runs.append(child(*replay_command(compared)))
        simpy_cpu = min(simpy_runs)
        simctl_cpu = min(seconds for seconds, _ in compared_runs)
        # where the compared file is the small one (the quick mode), its runs give the fixed
        # part of the memory too: the same command on the same file, not run again
        small_runs = compared_runs if compared == small else [child(*replay_command(small)) for _ in range(repeat)]
        fixed = min(peak for _, peak in small_runs)
        fixed_cpu = min(seconds for seconds, _ in small_runs)
        whole = min(child(*replay_command(large)) for _ in range(repeat))
        parse = min(child(f"from simulator import load_trace; load_trace({str(large)!r}).columns")[0]
                    for _ in range(repeat))
    return {"mm4_calls": mm4_calls, "command_simpy_customers_per_s": mm4_calls / simpy_cpu,
            "command_simctl_customers_per_s": mm4_calls / simctl_cpu, "command_x_simpy": simpy_cpu / simctl_cpu,
            "cli_calls": calls, "cli_prompts": calls, "cli_prompts_per_s": calls / whole[0],
            "cli_cpu_s": whole[0], "cli_peak_bytes": whole[1], "small_calls": SMALL_CALLS, "small_peak_bytes": fixed,
            "cli_bytes_per_prompt": (whole[1] - fixed) / (calls - SMALL_CALLS),
            "small_cpu_s": fixed_cpu, "simpy_cpu_s": simpy_cpu, "fixed_bound_x_simpy": simpy_cpu / fixed_cpu,
            "parse_prompts_per_s": calls / parse, "kernel_loaded_from": _kernel_loaded_from()}


def _kernel_loaded_from() -> str:
    """How the commands above got the compiled kernel: the package's extension (no numba
    imported), else numba and its cache."""
    from simulator.model.compiled import extension

    if extension() is not None:
        return "the kernel's extension loaded, numba never imported"
    return "numba imported, the compiled kernel loaded from its cache"


def run(calls: int, mm4_calls: int, reference_calls: int, repeat: int, seed: int, memory: bool,
        spec_decode: bool = False, warm: bool = True) -> dict:
    from simpy_baseline import simpy_customers_per_second

    from simulator.model import simulate

    result: dict = {"python": platform.python_version(), "machine": platform.machine(), "repeat": repeat,
                    "seed": seed, "reference_calls": reference_calls}
    result.update(command_figures(mm4_calls, calls, seed, repeat, warm))
    # Load (or compile once, then cache) the kernel before any clock runs.
    for warm in (design_case(50, seed), spec_decode_case(50, seed)) if spec_decode else (design_case(50, seed),):
        simulate(*warm, engine="fast")
    baseline = simpy_customers_per_second(mm4_calls, 4, seed=seed, repeat=repeat)
    mm4 = mmc_case(mm4_calls, seed, False)
    library = mm4[0].n_prompts / time_engine(*mm4, "fast", repeat)
    result.update({"simpy_customers_per_s": baseline, "library_customers_per_s": library,
                   "library_x_simpy": library / baseline})
    rows = []
    cases = [("M/M/4", lambda n: mmc_case(n, seed, False)),
             ("flush-window batching", lambda n: mmc_case(n, seed, True)),
             ("design-notes", lambda n: design_case(n, seed))]
    if spec_decode:
        cases.append(("design-notes, spec_decode profile", lambda n: spec_decode_case(n, seed)))
    for name, make in cases:
        trace, scenario, profile = make(calls)
        fast = trace.n_prompts / time_engine(trace, scenario, profile, "fast", repeat)
        small = make(reference_calls)
        reference = small[0].n_prompts / time_engine(*small, "reference", 1)
        rows.append({"case": name, "calls": len(trace), "prompts": trace.n_prompts,
                     "fast_prompts_per_s": fast, "reference_prompts_per_s": reference,
                     "fast_x_reference": fast / reference})
    result["rows"] = rows
    if memory and Path("/proc/self/clear_refs").exists():
        result["bytes_per_prompt"] = memory_per_prompt(calls, seed)
        result["memory_calls"] = calls
    return result


def table(result: dict) -> str:
    r = result
    lines = [
        f"**Whole command**, M/M/4 at load 0.8, {r['mm4_calls']:,} one-prompt calls, each in a fresh process "
        f"(CPU time, start-up and imports included, the two taken in turn, best of {r['repeat']}): `simctl replay` of the trace file "
        f"(`simctl-trace/1` JSON; summary written as JSON) **{r['command_simctl_customers_per_s']:,.0f} customers/s**, "
        f"an idiomatic simpy model of the same calls {r['command_simpy_customers_per_s']:,.0f} customers/s: "
        f"**{r['command_x_simpy']:.2f}× simpy**. What every replay pays whatever its size, the same command on a "
        f"{r['small_calls']:,}-call file (start-up, imports: numpy with one BLAS thread, typer without "
        f"pydantic for values written plainly, pandas only where the event log or figures are written, simpy "
        f"only for the reference engine; {r['kernel_loaded_from']}), is {r['small_cpu_s']:.2f} CPU-s against simpy's {r['simpy_cpu_s']:.2f} for all its calls: that "
        f"fixed part alone holds the whole command under **{r['fixed_bound_x_simpy']:.1f}× simpy** at this size.",
        "",
        f"**Whole command** at {r['cli_calls']:,} one-prompt calls (`simctl replay` of the M/M/4 trace file): "
        f"**{r['cli_prompts_per_s']:,.0f} prompts/s** ({r['cli_cpu_s']:.2f} CPU-s); its peak memory, "
        f"{r['cli_peak_bytes'] / 2**20:,.0f} MiB, is **{r['cli_bytes_per_prompt']:,.0f} bytes per prompt** over the "
        f"{r['small_peak_bytes'] / 2**20:,.0f} MiB of the same command on a {r['small_calls']:,}-call file "
        f"(interpreter, imports, the compiled kernel). Reading the file alone (a fresh process "
        f"loading it into columns): {r['parse_prompts_per_s']:,.0f} prompts/s.",
        "",
        f"**Library call** `simulate()`, the trace already in memory (the same {r['mm4_calls']:,} calls): "
        f"{r['library_customers_per_s']:,.0f} customers/s against simpy's {r['simpy_customers_per_s']:,.0f} in this "
        f"process: **{r['library_x_simpy']:.1f}× simpy**. Per case (library calls, best of {r['repeat']}):",
        "",
        "| case | calls | prompts | fast engine, prompts/s | reference engine, prompts/s | fast ÷ reference |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in r["rows"]:
        lines.append(f"| {row['case']} | {row['calls']:,} | {row['prompts']:,} | {row['fast_prompts_per_s']:,.0f} | "
                     f"{row['reference_prompts_per_s']:,.0f} | {row['fast_x_reference']:.0f} |")
    lines.append("")
    lines.append(f"The reference engine ran {r['reference_calls']:,} calls of each case. CPU time, one core, "
                 f"Python {r['python']} on {r['machine']}.")
    if "bytes_per_prompt" in r:
        memory = r["bytes_per_prompt"]
        lines.append(f"Peak memory of a fast `simulate()` of the design-notes case at {r['memory_calls']:,} calls: "
                     f"**{memory['run']:,.0f} bytes per prompt** for the run (lowering, kernel and event log), "
                     f"on top of {memory['columns']:,.0f} bytes per prompt for the trace's columns.")
    return "\n".join(lines)


def headline(result: dict) -> str:
    """The README's headline row of replay speed."""
    r = result
    design = next(row for row in r["rows"] if row["case"] == "design-notes")
    return (f"| replay speed, one core, CPU time (fast engine: compiled kernel, same event log as the simpy reference "
            f"engine) | whole command `simctl replay`, M/M/4 at load 0.8, {r['mm4_calls']:,} one-prompt calls from "
            f"a JSON trace file: {r['command_x_simpy']:.2f}× an idiomatic simpy model of the same calls "
            f"(customers/s, both fresh processes); at {r['cli_calls']:,} calls {r['cli_prompts_per_s']:,.0f} "
            f"prompts/s at {r['cli_bytes_per_prompt']:,.0f} bytes per prompt of peak memory over the same command on "
            f"a small trace; library call `simulate()` (trace in memory): M/M/4 {r['library_x_simpy']:.1f}× simpy, "
            f"design-notes {design['fast_prompts_per_s']:,.0f} prompts/s "
            f"({design['fast_x_reference']:.0f}× the reference engine) | `benchmarks/engine_speed.py`, "
            f"`benchmarks/continuous_speed.py`, [docs/benchmarks.md](docs/benchmarks.md) |")


def write_readme_row(row: str) -> None:
    """Replace the README's headline row of replay speed with ``row``, keeping the clause of
    continuous_speed.py's figure, which that script measures."""
    from docs_tables import write_row

    current = next((line for line in (ROOT / "README.md").read_text().split("\n")
                    if line.startswith("| replay speed,")), "")
    kept = re.search(r"; continuous batching.*?(?= \| `benchmarks/)", current)
    write_row("replay speed,", row.replace(" | `benchmarks/engine_speed.py`", (kept.group(0) if kept else "")
                                           + " | `benchmarks/engine_speed.py`", 1), page="README.md")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1_000_000, help="calls per case for the fast engine")
    parser.add_argument("--mm4-calls", type=int, default=200_000, help="calls of the M/M/4 compared with simpy")
    parser.add_argument("--reference-calls", type=int, default=50_000, help="calls per case for the reference engine")
    parser.add_argument("--repeat", type=int, default=3, help="runs; the best is reported")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat, no memory figure, no warm-up replay")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--spec-decode", action="store_true",
                        help="also time the design-notes case on a spec_decode/iteration profile")
    parser.add_argument("--write-docs", action="store_true",
                        help="write the figures into docs/benchmarks.md and the README's headline row")
    parser.add_argument("--from-json", type=Path, metavar="FILE",
                        help="measure nothing: take the result an earlier --json run printed into FILE")
    args = parser.parse_args(argv)
    if args.quick:
        args.calls, args.mm4_calls, args.reference_calls, args.repeat = 3000, SMALL_CALLS, 500, 1
    if args.from_json is not None:
        result = json.loads(args.from_json.read_text())
    else:
        result = run(args.calls, args.mm4_calls, args.reference_calls, args.repeat, args.seed,
                     memory=not args.quick, spec_decode=args.spec_decode, warm=not args.quick)
    if args.write_docs:
        from docs_tables import write_generated

        write_generated("engine-speed", table(result))
        write_readme_row(headline(result))
    print(json.dumps(result, indent=2) if args.json else table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
