"""Calibration against the users' real runs: in-sample and out-of-sample errors, one table.

For each of the six Qwen3-4B full-trace runs (``../shared/traces/real/lminference/``),
calibrate the starting profile of its server family on that run with its scenario
(``scenarios/lminference-*.toml``) and report the error of p50/p90/mean call latency per
call composition (in sample). Then the real test: calibrate on one configuration and
predict another the fit never saw — ``4B_fw_5_b10`` -> ``4B_separate_queues_no_thinking``,
and ``4B_4queues_nothinking`` (MMLU 50 tokens) -> the two 256-token MMLU runs
(``..._longmmlu`` and ``..._longmmlu_fixedgraph``, two replays of one configuration).

Method (the same as ``simctl calibrate``'s defaults, with 8 local fits): servers that stop
at end of sequence replay the trace with the InfoBench output lengths measured in the fitted
run; objective ``both`` (per-call and quantile residuals); 64 screened points, local fits from
the best 8; the prediction is the best fit's, and the out-of-sample rows also give each
figure's range over every fit the calibration run cannot tell apart. Failed calls count at
the 600 s client timeout on both sides; simulated figures are averaged over 10 seeds (each
seed one whole run). Needs ``../shared/``; deterministic (same output every time).

    python benchmarks/calibration_table.py            # markdown tables
    python benchmarks/calibration_table.py --json
    python benchmarks/calibration_table.py --write-profiles   # also writes the two fits to profiles/
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REQUEST = ROOT.parent / "shared" / "traces" / "real" / "lminference" / "EEElisa@dfb2bf8" / "mingqia2_3" / "request"

#: run -> (scenario, starting profile)
RUNS = {
    "4B_fw_5_b10": ("fw5", "specdec"),
    "4B_fw_5_b10_updated": ("fw5", "specdec"),
    "4B_separate_queues_no_thinking": ("separate-queues", "specdec"),
    "4B_4queues_nothinking": ("4queues", "nospec"),
    "4B_4queues_nothinking_longmmlu": ("4queues-longmmlu", "nospec"),
    "4B_4queues_nothinking_longmmlu_fixedgraph": ("4queues-longmmlu", "nospec"),
}
OUT_OF_SAMPLE = [("4B_fw_5_b10", "4B_separate_queues_no_thinking"),
                 ("4B_4queues_nothinking", "4B_4queues_nothinking_longmmlu"),
                 ("4B_4queues_nothinking", "4B_4queues_nothinking_longmmlu_fixedgraph")]
#: families whose server stops at end of sequence: their InfoBench prompts are replayed with
#: the output tokens measured in the run the profile is fitted on (never the predicted run's)
LENGTH_TASKS = {"nospec": ("infobench",), "nospec-context": ("infobench",), "specdec": ()}
#: a joint fit over both MMLU lengths (simctl calibrate --also), with MMLU's context cost free,
#: predicting the second replay of the 256-token configuration
JOINT = (("4B_4queues_nothinking", "4B_4queues_nothinking_longmmlu"), "4B_4queues_nothinking_longmmlu_fixedgraph")
SCREEN = 64  # quasi-random points tried before the local fits (simctl calibrate --screen)
STARTS = 8   # local fits from the best screened points (simctl calibrate --starts)
MAX_EVALUATIONS = 120  # objective evaluations per local fit (simctl calibrate --max-evaluations)
SEEDS = 10   # simulated runs each out-of-sample prediction averages
FITTED_NAMES = {"4B_fw_5_b10": "qwen3-4b-specdec-fw5", "4B_4queues_nothinking": "qwen3-4b-nospec-4queues"}


def keep_identity(data: dict, path: Path) -> None:
    """Keep the shipped profile's own ``describes`` / ``answers`` (and ``meta.system``, and the
    model error ``meta.model_error`` that benchmarks/uncertainty_coverage.py measured) when it
    is rewritten: what it describes does not change with a refit."""
    if not path.exists():
        return
    shipped = json.loads(path.read_text())
    for key in ("describes", "answers"):
        if key in shipped:
            data[key] = shipped[key]
    for key in ("system", "model_error"):
        if key in shipped.get("meta", {}):
            data.setdefault("meta", {})[key] = shipped["meta"][key]


def rows_of(errors, run: str, kind: str, fitted_on: str) -> list[dict]:
    out = []
    for _, r in errors.iterrows():
        row = {"run": run, "kind": kind, "fitted_on": fitted_on, "group": r["group"], "calls": int(r["calls"]),
               **{f"{s}_{w}": float(r[f"{s}_{w}"]) for s in ("p50", "p90", "mean") for w in ("ref", "other", "err", "sd")}}
        for s in ("p50", "p90", "mean"):
            if f"{s}_low" in r:
                row[f"{s}_low"], row[f"{s}_high"] = float(r[f"{s}_low"]), float(r[f"{s}_high"])
        out.append(row)
    return out


def _fit(run: str, screen: int = SCREEN, starts: int = STARTS, max_evaluations: int = MAX_EVALUATIONS):
    """Calibrate the starting profile of ``run``'s family on it; the fit and the trace it used."""
    from simulator.calibrate import calibrate
    from simulator.observed import read_observed, with_observed_lengths
    from simulator.scenario import build_scenario
    from simulator.trace.formats import load_trace

    scen, family = RUNS[run]
    trace = load_trace(REQUEST / "batch_arrivals.json")
    observed = read_observed(REQUEST / f"batch_results_{run}", trace)
    if LENGTH_TASKS[family]:
        trace = with_observed_lengths(trace, observed, LENGTH_TASKS[family])
    start = json.loads((ROOT / "profiles" / f"qwen3-4b-{family}-start.json").read_text())
    result = calibrate(observed, trace, build_scenario(path=ROOT / "scenarios" / f"lminference-{scen}.toml"), start,
                       screen=screen, starts=starts, max_evaluations=max_evaluations)
    return result, trace


def _fit_joint(runs: tuple[str, ...], screen: int = SCREEN, starts: int = STARTS,
               max_evaluations: int = MAX_EVALUATIONS):
    """One fit over several runs (the first's measured lengths for every one: one workload)."""
    from simulator.calibrate import calibrate
    from simulator.observed import read_observed, with_observed_lengths
    from simulator.scenario import build_scenario
    from simulator.trace.formats import load_trace

    trace = load_trace(REQUEST / "batch_arrivals.json")
    observed = [read_observed(REQUEST / f"batch_results_{run}", trace) for run in runs]
    trace = with_observed_lengths(trace, observed[0], LENGTH_TASKS["nospec-context"])
    scenarios = [build_scenario(path=ROOT / "scenarios" / f"lminference-{RUNS[run][0]}.toml") for run in runs]
    start = json.loads((ROOT / "profiles" / "qwen3-4b-nospec-context-start.json").read_text())
    result = calibrate(observed[0], trace, scenarios[0], start, screen=screen, starts=starts,
                       max_evaluations=max_evaluations, also=list(zip(observed[1:], [trace] * (len(runs) - 1), scenarios[1:], strict=True)))
    return result, trace


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write-docs", action="store_true", help="write the table into docs/calibration.md")
    parser.add_argument("--write-profiles", action="store_true")
    parser.add_argument("--runs", default=",".join(RUNS), help="comma-separated runs to calibrate in sample")
    parser.add_argument("--out-of-sample-from", default=",".join(dict.fromkeys(a for a, _ in OUT_OF_SAMPLE)),
                        help="comma-separated fitted runs whose out-of-sample predictions are made")
    parser.add_argument("--jobs", type=int, default=2, help="fits run in parallel processes")
    parser.add_argument("--no-joint", dest="joint", action="store_false", help="skip the joint fit over both MMLU lengths")
    parser.add_argument("--screen", type=int, default=SCREEN, help="quasi-random points tried before the local fits")
    parser.add_argument("--starts", type=int, default=STARTS, help="local fits from the best screened points")
    parser.add_argument("--max-evaluations", type=int, default=MAX_EVALUATIONS,
                        help="objective evaluations per local fit")
    parser.add_argument("--seeds", type=int, default=SEEDS, help="simulated runs each out-of-sample prediction averages")
    args = parser.parse_args(argv)
    from simulator.calibrate import predict_ensemble
    from simulator.observed import read_observed
    from simulator.profile import profile_from_dict
    from simulator.scenario import build_scenario
    from simulator.trace.formats import load_trace

    if not REQUEST.exists():
        sys.stderr.write(f"the real runs are not at {REQUEST}\n")
        return 2
    trace = load_trace(REQUEST / "batch_arrivals.json")
    pairs = [(a, b) for a, b in OUT_OF_SAMPLE if a in args.out_of_sample_from.split(",")]
    wanted = set(args.runs.split(",")) | {a for a, _ in pairs}
    jobs = [run for run in RUNS if run in wanted]
    joint_key = "+".join(JOINT[0])
    if args.jobs > 1:
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            joint_future = (pool.submit(_fit_joint, JOINT[0], args.screen, args.starts, args.max_evaluations)
                            if args.joint else None)
            futures = [pool.submit(_fit, run, args.screen, args.starts, args.max_evaluations) for run in jobs]
            results = dict(zip(jobs, (f.result() for f in futures), strict=True))
            joint = joint_future.result() if joint_future else None
    else:
        results = {run: _fit(run, args.screen, args.starts, args.max_evaluations) for run in jobs}
        joint = _fit_joint(JOINT[0], args.screen, args.starts, args.max_evaluations) if args.joint else None
    fits, rows, params, traces = {}, [], {}, {}
    for run in jobs:
        result, traces[run] = results[run]
        fits[run] = result.profile
        params[run] = {"values": result.values, "relative_se": result.relative_se,
                       "ensemble": result.ensemble_values, "cost": result.cost}
        if run in args.runs.split(","):
            rows += rows_of(result.errors, run, "in-sample", run)
    for fitted_on, target in pairs:
        scen = RUNS[target][0]
        observed = read_observed(REQUEST / f"batch_results_{target}", trace)
        ensemble = [profile_from_dict(p) for p in results[fitted_on][0].ensemble]
        errors = predict_ensemble(observed, traces[fitted_on],
                                  build_scenario(path=ROOT / "scenarios" / f"lminference-{scen}.toml"), ensemble,
                                  tuple(range(args.seeds)))
        rows += rows_of(errors, target, "out-of-sample", fitted_on)
    if joint is not None:
        result, joint_trace = joint
        params[joint_key] = {"values": result.values, "relative_se": result.relative_se,
                             "ensemble": result.ensemble_values, "cost": result.cost}
        ensemble = [profile_from_dict(p) for p in result.ensemble]
        for run in (*JOINT[0], JOINT[1]):
            kind = "joint (in-sample)" if run in JOINT[0] else "joint (out-of-sample)"
            errors = predict_ensemble(read_observed(REQUEST / f"batch_results_{run}", trace), joint_trace,
                                      build_scenario(path=ROOT / "scenarios" / f"lminference-{RUNS[run][0]}.toml"),
                                      ensemble, tuple(range(args.seeds)))
            rows += rows_of(errors, run, kind, joint_key)
    if args.write_profiles:
        for run, name in FITTED_NAMES.items():
            data = dict(fits[run], name=name)
            lengths = ("Replay it on traces/lminference-4queues-lengths.json, which carries the InfoBench output "
                       "lengths measured in that run. " if LENGTH_TASKS[RUNS[run][1]] else "")
            data["source"] = (f"Calibrated by benchmarks/calibration_table.py (simctl calibrate) on the observed run "
                              f"batch_results_{run} of ../shared/traces/real/lminference/ with scenarios/lminference-"
                              f"{RUNS[run][0]}.toml. {lengths}Started from: " + data.get("source", ""))
            data.setdefault("meta", {})["fit"] = {"run": run, "screen": args.screen, "starts": args.starts, **params[run]}
            keep_identity(data, ROOT / "profiles" / f"{name}.json")
            (ROOT / "profiles" / f"{name}.json").write_text(json.dumps(data, indent=1) + "\n")
    if args.json:
        sys.stdout.write(json.dumps({"rows": rows, "parameters": params}, indent=2) + "\n")
        return 0
    lines = ["| run | kind (fitted on) | calls | p50 obs / sim (err) [fits' range] | p90 obs / sim (err) [fits' range] "
             "| mean err |", "|---|---|---|---|---|---|"]

    def cell(r: dict, s: str) -> str:
        text = f"{r[f'{s}_ref']:.1f} / {r[f'{s}_other']:.1f} ({100 * r[f'{s}_err']:+.0f} %)"
        if f"{s}_low" in r:
            text += f" [{r[f'{s}_low']:.0f}–{r[f'{s}_high']:.0f}]"
        return text

    for r in rows:
        kind = r["kind"] if r["kind"] == "in-sample" else f"{r['kind']} ({r['fitted_on']})"
        lines.append(f"| {r['run']} {r['group']} | {kind} | {r['calls']} | {cell(r, 'p50')} | {cell(r, 'p90')} "
                     f"| {100 * r['mean_err']:+.0f} % |")
    sys.stdout.write("\n".join(lines) + "\n")
    if args.write_docs:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from docs_tables import write_generated

        write_generated("calibration-table", "\n".join(lines), page="calibration.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
