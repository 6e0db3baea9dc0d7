"""How fast is each engine, as a multiple of plain simpy measured in the same run?

Every figure is divided by the yardstick of :mod:`simpy_baseline` (an idiomatic simpy M/M/4,
measured first, in this process), so a figure reads "N times plain simpy on this machine,
now"; absolute rates are printed beside it. Cases:

* ``M/M/4``: Poisson arrivals of one-prompt calls, four exclusive GPUs, one shared queue
  with a worker per GPU, batches of one, exponential service (load 0.8): the model simpy
  itself computes, in simctl's terms.
* ``flush-window batching``: the same arrivals and GPUs, a flush window of 0.5 s and batches
  of up to 8, gamma service growing with the batch.
* ``design-notes``: the users' server (``scenarios/design-notes.toml``: a CPU task, a
  one-worker queue taking a GPU per batch, a two-worker queue, processor-sharing GPUs) on a
  synthetic trace with the production statistics of the bundled one (1-8 prompts per call).
* ``design-notes, spec_decode profile`` (with ``--spec-decode``): the same trace and
  scenario on a composed profile whose tasks are ``spec_decode`` (infobench), ``iteration``
  (mmlu) and ``distribution`` (graph): batch times drawn per iteration and per row as
  batches form.

For each, ``simulate`` is timed (lowering the scenario, the run, building the event log;
the trace is already in memory as columns: file parsing is not counted), best of
``--repeat``, for the fast engine and, on a smaller trace, the reference engine. The
compiled kernel is loaded (or compiled and cached) before timing. Peak memory per prompt of
the fast engine is measured in a child process (its peak resident set size, less the size
before the run, over the prompts).

    python benchmarks/engine_speed.py --write-docs        # full sizes (1,000,000 calls)
    python benchmarks/engine_speed.py --quick             # a quick check
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
ROOT = Path(__file__).resolve().parent.parent


def mmc_case(calls: int, seed: int, batching: bool):
    """Trace, scenario and profile of the M/M/4 or flush-window batching case."""
    from simpy_baseline import mmc_inputs

    from simulator import build_scenario
    from simulator.profile import profile_from_dict
    from simulator.trace.model import Call, Prompt, Trace

    arrivals, _ = mmc_inputs(calls, 4, 0.8, seed)
    if batching:
        arrivals = arrivals / 4.0  # four times the load: batches of ~4 keep up
    trace = Trace(tuple(Call(str(i), float(t), (Prompt("q"),)) for i, t in enumerate(arrivals)))
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
    from simulator.model import simulate

    trace.columns  # noqa: B018 - the trace in memory as columns, before the clock starts
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        log = simulate(trace, scenario, profile, seed, engine=engine)
        best = min(best, time.perf_counter() - t0)
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
    """Wall seconds and peak resident set size (bytes) of a child Python running ``code``."""
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", REPORT_PEAK + code, *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - t0
    peaks = [int(line.split()[1]) for line in out.stderr.splitlines() if line.startswith("simctl-peak-kb ")]
    if out.returncode or not peaks:
        raise RuntimeError(f"{code} {' '.join(args)} failed: {out.stderr[-2000:]}")
    return seconds, peaks[-1] * 1024


#: Calls of the small trace whose replay measures the fixed part of a replay's memory.
SMALL_CALLS = 1000


def cli_figures(calls: int, seed: int, repeat: int) -> dict:
    """``simctl replay`` on a design-notes trace file of ``calls`` calls, end to end (start,
    reading the file, the run, the summary, writing it): prompts per second, and the peak
    memory of the process per prompt over that of a process that only imports what the
    command imports; the same for reading the file alone (over a process importing the
    reader). Best of ``repeat``."""
    import tempfile

    from simulator import save_trace

    imports = "import simulator.cli.replay, simulator.model.batch_kernel, simulator.trace.formats"
    with tempfile.TemporaryDirectory() as tmp:
        path, small_path = Path(tmp) / "trace.json", Path(tmp) / "small.json"
        trace = design_case(calls, seed)[0]
        prompts = trace.n_prompts
        save_trace(trace, path)
        small = design_case(SMALL_CALLS, seed)[0]
        save_trace(small, small_path)

        def replay(trace_path: Path) -> tuple[str, ...]:
            return ("from simulator.cli import main; main()", "replay", str(trace_path), "-c", "design-notes",
                    "--json", str(Path(tmp) / "summary.json"), "--force")

        del trace
        _, base = child(imports)
        _, parse_base = child("from simulator import load_trace")
        # the same command on a small trace: the fixed part (interpreter, imports, the
        # compiled kernel loaded from its cache), which no trace size changes
        _, fixed = min(child(*replay(small_path)) for _ in range(repeat))
        whole = min(child(*replay(path)) for _ in range(repeat))
        parse = min(child(f"from simulator import load_trace; load_trace({str(path)!r}).columns")
                    for _ in range(repeat))
    return {"cli_calls": calls, "cli_prompts": prompts,
            "cli_prompts_per_s": prompts / whole[0], "parse_prompts_per_s": prompts / parse[0],
            "cli_bytes_per_prompt": (whole[1] - base) / prompts, "parse_bytes_per_prompt": (parse[1] - parse_base) / prompts,
            "import_bytes": base, "cli_peak_bytes": whole[1], "small_calls": SMALL_CALLS, "small_peak_bytes": fixed,
            "cli_marginal_bytes_per_prompt": (whole[1] - fixed) / (prompts - small.n_prompts)}


def run(calls: int, reference_calls: int, repeat: int, seed: int, memory: bool, spec_decode: bool = False) -> dict:
    from simpy_baseline import simpy_customers_per_second

    from simulator.model import simulate

    # Load (or compile once, then cache) the kernel before any clock runs.
    for warm in (design_case(50, seed), spec_decode_case(50, seed)) if spec_decode else (design_case(50, seed),):
        simulate(*warm, engine="fast")
    baseline = simpy_customers_per_second(min(calls, 200_000), 4, repeat=repeat)
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
                     "fast_x_simpy": fast / baseline, "reference_x_simpy": reference / baseline,
                     "fast_x_reference": fast / reference})
    result = {"simpy_customers_per_s": baseline, "rows": rows, "python": platform.python_version(),
              "machine": platform.machine(), "repeat": repeat, "seed": seed,
              "reference_calls": reference_calls}
    result.update(cli_figures(calls, seed, repeat))
    if memory and Path("/proc/self/clear_refs").exists():
        result["bytes_per_prompt"] = memory_per_prompt(calls, seed)
        result["memory_calls"] = calls
    return result


def table(result: dict) -> str:
    lines = ["| case | calls | prompts | fast engine, prompts/s | × simpy | reference engine, prompts/s | × simpy | fast ÷ reference |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        lines.append(f"| {r['case']} | {r['calls']:,} | {r['prompts']:,} | {r['fast_prompts_per_s']:,.0f} | "
                     f"{r['fast_x_simpy']:.1f} | {r['reference_prompts_per_s']:,.0f} | {r['reference_x_simpy']:.2f} | "
                     f"{r['fast_x_reference']:.0f} |")
    lines.append("")
    lines.append(f"Yardstick: idiomatic simpy M/M/4, {result['simpy_customers_per_s']:,.0f} customers/s in the same "
                 f"run. The reference engine ran {result['reference_calls']:,} calls of each case. Best of "
                 f"{result['repeat']}, one core, Python {result['python']} on {result['machine']}.")
    lines.append(f"Through the CLI, end to end (`simctl replay TRACE -c design-notes --json F` on a "
                 f"{result['cli_calls']:,}-call trace file of {result['cli_prompts']:,} prompts): "
                 f"**{result['cli_prompts_per_s']:,.0f} prompts/s**. Its peak memory, "
                 f"{result['cli_peak_bytes'] / 2**20:,.0f} MiB, is "
                 f"**{result['cli_marginal_bytes_per_prompt']:,.0f} bytes per prompt** over the "
                 f"{result['small_peak_bytes'] / 2**20:,.0f} MiB of the same command on a "
                 f"{result['small_calls']:,}-call trace (interpreter, imports and the compiled kernel loaded "
                 f"from its cache), {result['cli_bytes_per_prompt']:,.0f} over the "
                 f"{result['import_bytes'] / 2**20:,.0f} MiB of a process that only imports the command; "
                 f"reading the file alone runs at {result['parse_prompts_per_s']:,.0f} prompts/s "
                 f"({result['parse_bytes_per_prompt']:,.0f} bytes per prompt at its peak, the trace's "
                 f"columns included).")
    if "bytes_per_prompt" in result:
        memory = result["bytes_per_prompt"]
        lines.append(f"Peak memory of a fast replay of the design-notes case at {result['memory_calls']:,} calls: "
                     f"**{memory['run']:,.0f} bytes per prompt** for the run (lowering, kernel and event log), "
                     f"on top of {memory['columns']:,.0f} bytes per prompt for the trace's columns.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1_000_000, help="calls per case for the fast engine")
    parser.add_argument("--reference-calls", type=int, default=50_000, help="calls per case for the reference engine")
    parser.add_argument("--repeat", type=int, default=3, help="runs; the best is reported")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat, no memory figure")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--spec-decode", action="store_true",
                        help="also time the design-notes case on a spec_decode/iteration profile")
    parser.add_argument("--write-docs", action="store_true", help="write the table into docs/benchmarks.md")
    args = parser.parse_args(argv)
    if args.quick:
        args.calls, args.reference_calls, args.repeat = 3000, 1000, 1
    result = run(args.calls, args.reference_calls, args.repeat, args.seed, memory=not args.quick,
                 spec_decode=args.spec_decode)
    if args.write_docs:
        from docs_tables import write_generated

        write_generated("engine-speed", table(result))
    print(json.dumps(result, indent=2) if args.json else table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
