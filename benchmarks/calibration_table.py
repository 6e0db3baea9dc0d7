"""Calibration against the users' real runs: in-sample and out-of-sample errors, one table.

For each of the six Qwen3-4B full-trace runs (``../shared/traces/real/lminference/``),
calibrate the starting profile of its server family on that run with its scenario
(``scenarios/lminference-*.toml``) and report the error of p50/p90/mean call latency per
call composition (in sample). Then the real test: calibrate on one configuration and
predict another the fit never saw — ``4B_fw_5_b10`` -> ``4B_separate_queues_no_thinking``,
and ``4B_4queues_nothinking`` (MMLU 50 tokens) -> ``..._longmmlu`` (256 tokens). Failed
calls count at the 600 s client timeout on both sides; simulated figures are averaged over
3 seeds. Needs ``../shared/``.

    python benchmarks/calibration_table.py            # markdown tables
    python benchmarks/calibration_table.py --json
    python benchmarks/calibration_table.py --write-profiles   # also writes the two fits to profiles/
"""

from __future__ import annotations

import argparse
import json
import sys
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
                 ("4B_4queues_nothinking", "4B_4queues_nothinking_longmmlu")]
FITTED_NAMES = {"4B_fw_5_b10": "qwen3-4b-specdec-fw5", "4B_4queues_nothinking": "qwen3-4b-nospec-4queues"}


def rows_of(errors, run: str, kind: str, fitted_on: str) -> list[dict]:
    out = []
    for _, r in errors.iterrows():
        out.append({"run": run, "kind": kind, "fitted_on": fitted_on, "group": r["group"], "calls": int(r["calls"]),
                    **{f"{s}_{w}": float(r[f"{s}_{w}"]) for s in ("p50", "p90", "mean") for w in ("ref", "other", "err")}})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write-profiles", action="store_true")
    parser.add_argument("--runs", default=",".join(RUNS), help="comma-separated runs to calibrate in sample")
    args = parser.parse_args(argv)
    from simulator.calibrate import calibrate, predict
    from simulator.observed import read_observed
    from simulator.profile import profile_from_dict
    from simulator.scenario import build_scenario
    from simulator.trace.formats import load_trace

    if not REQUEST.exists():
        sys.stderr.write(f"the real runs are not at {REQUEST}\n")
        return 2
    trace = load_trace(REQUEST / "batch_arrivals.json")
    fits, rows, params = {}, [], {}
    wanted = set(args.runs.split(",")) | {a for a, _ in OUT_OF_SAMPLE}
    for run, (scen, family) in RUNS.items():
        if run not in wanted:
            continue
        observed = read_observed(REQUEST / f"batch_results_{run}", trace)
        start = json.loads((ROOT / "profiles" / f"qwen3-4b-{family}-start.json").read_text())
        result = calibrate(observed, trace, build_scenario(path=ROOT / "scenarios" / f"lminference-{scen}.toml"), start)
        fits[run] = result.profile
        params[run] = {"values": result.values, "relative_se": result.relative_se}
        if run in args.runs.split(","):
            rows += rows_of(result.errors, run, "in-sample", run)
    for fitted_on, target in OUT_OF_SAMPLE:
        scen = RUNS[target][0]
        observed = read_observed(REQUEST / f"batch_results_{target}", trace)
        errors = predict(observed, trace, build_scenario(path=ROOT / "scenarios" / f"lminference-{scen}.toml"),
                         profile_from_dict(fits[fitted_on]))
        rows += rows_of(errors, target, "out-of-sample", fitted_on)
    if args.write_profiles:
        for run, name in FITTED_NAMES.items():
            data = dict(fits[run], name=name)
            data["source"] = (f"Calibrated by benchmarks/calibration_table.py (simctl calibrate) on the observed run "
                              f"batch_results_{run} of ../shared/traces/real/lminference/ with scenarios/lminference-"
                              f"{RUNS[run][0]}.toml. " + data.get("source", ""))
            data.setdefault("meta", {})["fit"] = {"run": run, **params[run]}
            (ROOT / "profiles" / f"{name}.json").write_text(json.dumps(data, indent=1) + "\n")
    if args.json:
        sys.stdout.write(json.dumps({"rows": rows, "parameters": params}, indent=2) + "\n")
        return 0
    lines = ["| run | kind (fitted on) | calls | p50 obs / sim (err) | p90 obs / sim (err) | mean err |", "|---|---|---|---|---|---|"]
    for r in rows:
        kind = r["kind"] if r["kind"] == "in-sample" else f"out-of-sample ({r['fitted_on']})"
        lines.append(f"| {r['run']} {r['group']} | {kind} | {r['calls']} | {r['p50_ref']:.1f} / {r['p50_other']:.1f} "
                     f"({100 * r['p50_err']:+.0f} %) | {r['p90_ref']:.1f} / {r['p90_other']:.1f} ({100 * r['p90_err']:+.0f} %) "
                     f"| {100 * r['mean_err']:+.0f} % |")
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
