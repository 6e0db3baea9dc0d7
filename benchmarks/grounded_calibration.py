"""Grounded profiles against the users' real runs: kernel costs fixed, engine overhead fitted on one run.

The users' server runs Qwen3-4B (and a Qwen3-0.6B draft) in Hugging Face ``generate`` on two
A100-SXM4-80GB GPUs driven by one Python process. For each server family the profile is
composed from NVIDIA's measured A100 per-op tables (``simctl profile --gpu a100-sxm --engine
hf-eager``; nothing here is fitted to latencies):

* ``nospec`` (runs ``4B_4queues_*``): MMLU and InfoBench as batched generate with a KV cache;
* ``specdec`` (runs ``4B_fw_5_b10*``, ``4B_separate_queues_*``): MMLU as generate, InfoBench as
  speculative decoding without a KV cache (acceptance 0.02, the figure the users' notes give).

Then, for each of the six full-trace runs, only the engine's host costs (``launch_s``,
``step_s``, ``row_s``, ``interpreter_share``; one engine for every task and both families) are calibrated on that
ONE run (``simctl calibrate``'s method and defaults), and every run is predicted with them —
all directions, across families: 50 → 256-token MMLU and back, separate queues → shared
queue and back, speculative → plain and back. The scenarios model one process driving both
GPUs (``host_lock``): the interpreter-lock share of each batch is computed from the engine's
host time, not fitted. InfoBench lengths for the ``nospec`` runs (they stop at end of
sequence) are the ones measured in a different run of that family than the one predicted.

Each simulated figure is the mean over 10 seeds of that figure of one whole run; failed
calls count at the 600 s client timeout on both sides. The two replays of the 256-token
configuration (``..._longmmlu``, ``..._fixedgraph``) differ from each other by about 20 % at
p50: the run-to-run spread no model can beat, reported beside the errors. Needs ``../shared/``.

    python benchmarks/grounded_calibration.py [--write-docs] [--write-profiles] [--json]
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from calibration_table import REQUEST, ROOT, RUNS, keep_identity  # noqa: E402  (run -> (scenario, server family))

SHORT = {"4B_fw_5_b10": "fw5", "4B_fw_5_b10_updated": "fw5-upd", "4B_separate_queues_no_thinking": "sepq",
         "4B_4queues_nothinking": "4q-50", "4B_4queues_nothinking_longmmlu": "4q-256",
         "4B_4queues_nothinking_longmmlu_fixedgraph": "4q-256b"}
#: InfoBench output lengths for a run that stops at end of sequence: measured in another run
LENGTHS_FROM = {"4B_4queues_nothinking": "4B_4queues_nothinking_longmmlu",
                "4B_4queues_nothinking_longmmlu": "4B_4queues_nothinking",
                "4B_4queues_nothinking_longmmlu_fixedgraph": "4B_4queues_nothinking"}
#: the users' speculative decoder: its acceptance per the users' notes (../shared/modeled-system.md)
ACCEPTANCE = 0.02
SHIPPED = {"nospec": "a100-sxm-qwen3-4b-hf-eager", "specdec": "a100-sxm-qwen3-4b-qwen3-0.6b-hf-eager"}
#: the run each shipped profile's engine costs are calibrated on: the first full-trace run of
#: its server family (the two families disagree on the host cost per kernel: see the docs)
SHIP_FROM = {"nospec": "4B_4queues_nothinking", "specdec": "4B_fw_5_b10"}
TARGET = 0.15
#: the engine parameters calibrated (the others keep their stated defaults)
FREE = ("launch_s",)


def family_profile(family: str, engine_values: dict[str, float] | None = None,
                   free: tuple[str, ...] = FREE, source: str = "calibrated") -> dict[str, Any]:
    """The composed profile of a server family (JSON data), with ``engine_values`` set on every
    GPU task's engine block (keys ``engine.launch_s`` ..., their provenance ``source``) and
    ``free`` the engine parameters calibration frees. A copy of the caller's own: each
    predicted run composes the same few profiles again (one per fit of an ensemble)."""
    values = tuple(sorted((engine_values or {}).items()))
    return copy.deepcopy(_family_profile(family, values, tuple(free), source))


@functools.lru_cache(maxsize=64)
def _family_profile(family: str, engine_values: tuple[tuple[str, float], ...], free: tuple[str, ...],
                    source: str) -> dict[str, Any]:
    from simulator.hardware import load_gpu
    from simulator.hardware.engines import get_engine
    from simulator.hardware.grounded import GpuTask, grounded_profile
    from simulator.harness.presets import get_preset

    gpu, engine, target = load_gpu("a100-sxm"), get_engine("hf-eager"), get_preset("qwen3-4b")
    values = {name.split(".", 1)[1]: value for name, value in engine_values}
    common = {"overrides": values, "overrides_source": source, "free": free}
    if family == "nospec":
        base = json.loads((ROOT / "profiles" / "qwen3-4b-nospec-start.json").read_text())
        return grounded_profile(base, gpu, engine, target, tasks=[GpuTask("mmlu", 250, 256, 30),
                                                                  GpuTask("infobench", 350, 512, 8)], **common)
    base = json.loads((ROOT / "profiles" / "qwen3-4b-specdec-start.json").read_text())
    return grounded_profile(base, gpu, engine, target, get_preset("qwen3-0.6b"),
                            tasks=[GpuTask("mmlu", 250, 256, 15), GpuTask("infobench", 350, 512, 10, True)],
                            kv_cache=False, acceptance=ACCEPTANCE, **common)


@functools.cache
def _inputs(run: str):
    """The observed run, its trace and scenario (read once a process: every prediction of
    ``run`` and every fit on it reads the same files)."""
    from simulator.observed import read_observed, with_observed_lengths
    from simulator.scenario import build_scenario
    from simulator.trace.formats import load_trace

    scen, family = RUNS[run]
    trace = load_trace(REQUEST / "batch_arrivals.json")
    observed = read_observed(REQUEST / f"batch_results_{run}", trace)
    if family == "nospec":
        lengths = read_observed(REQUEST / f"batch_results_{LENGTHS_FROM[run]}", trace)
        trace = with_observed_lengths(trace, lengths, ("infobench",))
    return observed, trace, build_scenario(path=ROOT / "scenarios" / f"lminference-{scen}.toml")


def fit(run: str, free: tuple[str, ...] = FREE, search: dict[str, int] | None = None) -> dict[str, Any]:
    """Calibrate the engine's host costs ``free`` on ``run`` alone (simctl calibrate's defaults,
    or the ``search`` settings ``screen``/``starts``/``max_evaluations`` given)."""
    from simulator.calibrate import calibrate

    observed, trace, scenario = _inputs(run)
    result = calibrate(observed, trace, scenario, family_profile(RUNS[run][1], free=free), **(search or {}))
    return {"values": result.values, "relative_se": result.relative_se, "ensemble": result.ensemble_values,
            "cost": result.cost, "evaluations": result.evaluations}


#: simulated runs (seeds) each prediction averages
SEEDS = 10


def predict_run(run: str, ensemble: list[dict[str, float]], seeds: int = SEEDS):
    """Errors of the prediction of ``run`` from engine values (the best first) and the range
    over every fit in ``ensemble``, each figure the mean over ``seeds`` simulated runs."""
    from simulator.calibrate import predict_ensemble
    from simulator.profile import profile_from_dict

    observed, trace, scenario = _inputs(run)
    profiles = [profile_from_dict(family_profile(RUNS[run][1], values)) for values in ensemble]
    return predict_ensemble(observed, trace, scenario, profiles, tuple(range(seeds)))


#: the latency-only fits shipped (profiles/, docs/calibration.md's first table): run -> profile
LATENCY_ONLY = {"4B_fw_5_b10": "qwen3-4b-specdec-fw5", "4B_4queues_nothinking": "qwen3-4b-nospec-4queues"}


def latency_only(fitted_on: str, target: str, seeds: int = SEEDS):
    """The shipped latency-only fit of ``fitted_on`` (its fits' ensemble) predicting ``target``,
    with the same inputs as the grounded prediction."""
    from simulator.calibrate import _with_values, free_parameters, predict_ensemble
    from simulator.profile import profile_from_dict

    data = json.loads((ROOT / "profiles" / f"{LATENCY_ONLY[fitted_on]}.json").read_text())
    params = free_parameters(data, LATENCY_ONLY[fitted_on])
    profiles = [profile_from_dict(_with_values(data, params, np.array([v[p.name] for p in params])))
                for v in data["meta"]["fit"]["ensemble"]]
    observed, trace, scenario = _inputs(target)
    return predict_ensemble(observed, trace, scenario, profiles, tuple(range(seeds)))


def run_to_run_spread() -> dict[str, dict[str, float]]:
    """How far two real replays of one configuration are from each other (overall p50, p90)."""
    from simulator.observed import compare_calls

    out = {}
    for a_run, b_run in (("4B_4queues_nothinking_longmmlu", "4B_4queues_nothinking_longmmlu_fixedgraph"),
                         ("4B_fw_5_b10", "4B_fw_5_b10_updated")):
        a, _, scenario = _inputs(a_run)
        b, _, _ = _inputs(b_run)
        table = compare_calls(a.classified(scenario.compositions).calls, b.classified(scenario.compositions).calls)
        overall = table[table["group"] == "overall"].iloc[0]
        out[f"{SHORT[a_run]} vs {SHORT[b_run]}"] = {s: float(overall[f"{s}_other"] / overall[f"{s}_ref"] - 1)
                                                   for s in ("p50", "p90")}
    return out


def study(jobs: int = 2, free: tuple[str, ...] = FREE, fitted_on_runs: list[str] | None = None,
          search: dict[str, int] | None = None, seeds: int = SEEDS) -> dict[str, Any]:
    runs = list(RUNS)
    fitted_runs = fitted_on_runs or runs
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            fits = dict(zip(fitted_runs, pool.map(fit, fitted_runs, [free] * len(fitted_runs),
                                                  [search] * len(fitted_runs)), strict=True))
    else:
        fits = {run: fit(run, free, search) for run in fitted_runs}
    rows = []
    for fitted_on in fitted_runs:
        for target in runs:
            errors = predict_run(target, fits[fitted_on]["ensemble"], seeds)
            for _, r in errors.iterrows():
                if r["group"] == "graph-only":
                    continue  # 0.1 s calls: a fixed overhead, not the GPU's (see the docs)
                rows.append({"fitted_on": fitted_on, "run": target, "group": r["group"], "calls": int(r["calls"]),
                             **{f"{s}_{w}": float(r[f"{s}_{w}"]) for s in ("p50", "p90")
                                for w in ("ref", "other", "err", "low", "high")}})
    side = []
    for fitted_on in LATENCY_ONLY:
        if fitted_on not in fits:
            continue
        for target in runs:
            if target == fitted_on or RUNS[target][1] != RUNS[fitted_on][1]:
                continue
            r = latency_only(fitted_on, target, seeds).set_index("group").loc["overall"]
            side.append({"fitted_on": fitted_on, "run": target,
                         **{f"{x}_{w}": float(r[f"{x}_{w}"]) for x in ("p50", "p90") for w in ("err", "low", "high", "ref")}})
    return {"fits": fits, "rows": rows, "spread": run_to_run_spread(), "free": list(free), "latency_only": side,
            "seeds": seeds}


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """Share of (pair, class, p50/p90) figures within the target, out of sample and overall."""
    out = [r for r in result["rows"] if r["fitted_on"] != r["run"]]
    errs = np.abs([r[f"{s}_err"] for r in out for s in ("p50", "p90")])
    overall = np.abs([r[f"{s}_err"] for r in out if r["group"] == "overall" for s in ("p50", "p90")])
    family = np.abs([r[f"{s}_err"] for r in out if r["group"] == "overall" and RUNS[r["run"]][1] == RUNS[r["fitted_on"]][1]
                     for s in ("p50", "p90")])
    return {"figures": int(errs.size), "within": int((errs <= TARGET).sum()), "median_abs": float(np.median(errs)),
            "family_within": int((family <= TARGET).sum()), "family_figures": int(family.size),
            "family_median_abs": float(np.median(family)) if family.size else float("nan"),
            "overall_within": int((overall <= TARGET).sum()), "overall_figures": int(overall.size),
            "overall_median_abs": float(np.median(overall))}


def markdown(result: dict[str, Any]) -> str:
    runs = list(RUNS)
    fitted_runs = list(result["fits"])
    s = summary(result)
    lines = [f"Engine host costs calibrated on one run (rows), every run predicted (columns): overall call "
             f"latency p50 / p90 error, simulated − observed; diagonal in sample. Out of sample "
             f"{s['overall_within']} of {s['overall_figures']} overall figures within ±{100 * TARGET:.0f} % "
             f"(median |error| {100 * s['overall_median_abs']:.0f} %); per class and overall {s['within']} of "
             f"{s['figures']} (median |error| {100 * s['median_abs']:.0f} %); between runs of one server family "
             f"(same code, other configuration) {s['family_within']} of {s['family_figures']} overall figures "
             f"(median |error| {100 * s['family_median_abs']:.0f} %). Two real replays of one configuration "
             f"differ by " + "; ".join(f"{100 * v['p50']:+.0f} % at p50 and {100 * v['p90']:+.0f} % at p90 ({k})"
                                       for k, v in result["spread"].items()) + ".", "",
             "| fitted on ↓ / predicted → | " + " | ".join(SHORT[r] for r in runs) + " |",
             "|---|" + "---|" * len(runs)]
    cell = {(r["fitted_on"], r["run"]): r for r in result["rows"] if r["group"] == "overall"}
    for a in fitted_runs:
        lines.append(f"| {SHORT[a]} | " + " | ".join(
            f"{100 * cell[a, b]['p50_err']:+.0f} / {100 * cell[a, b]['p90_err']:+.0f} %" for b in runs) + " |")
    if result.get("latency_only"):
        grounded = {(r["fitted_on"], r["run"]): r for r in result["rows"] if r["group"] == "overall"}

        def rng(r: dict[str, Any], x: str) -> str:
            return (f"{100 * r[f'{x}_err']:+.0f} % [{100 * (r[f'{x}_low'] / r[f'{x}_ref'] - 1):+.0f}, "
                    f"{100 * (r[f'{x}_high'] / r[f'{x}_ref'] - 1):+.0f}]")
        lines += ["", "Beside the latency-only fits (first table on this page; same run fitted, same inputs; overall "
                  "p50 and p90 error, [range over the fits the run cannot tell apart]):", "",
                  "| fitted on → predicted | grounded p50 | grounded p90 | latency-only p50 | latency-only p90 |",
                  "|---|---|---|---|---|"]
        for r in result["latency_only"]:
            g = grounded[r["fitted_on"], r["run"]]
            lines.append(f"| {SHORT[r['fitted_on']]} → {SHORT[r['run']]} | {rng(g, 'p50')} | {rng(g, 'p90')} | "
                         f"{rng(r, 'p50')} | {rng(r, 'p90')} |")
    lines += ["", "Fitted engine host costs (best fit; range over the fits the run cannot tell apart):", "",
              "| fitted on | launch_s (µs per kernel) | step_s (ms per pass) | row_s (ms per row and step) "
              "| interpreter share |", "|---|---|---|---|---|"]
    for run, f in result["fits"].items():
        def val(name: str, scale: float, f: dict[str, Any] = f) -> str:
            values = [e[name] * scale for e in f["ensemble"]]
            return f"{f['values'][name] * scale:.3g} [{min(values):.3g}–{max(values):.3g}]"
        lines.append(f"| {SHORT[run]} | " + " | ".join(
            val(f"engine.{p}", scale) if f"engine.{p}" in f["values"] else "(default)"
            for p, scale in (("launch_s", 1e6), ("step_s", 1e3), ("row_s", 1e3), ("interpreter_share", 1))) + " |")
    lines += ["", "Per composition class, out of sample (p50 / p90 error; range over equally good fits):", "",
              "| fitted on | predicted | class | calls | p50 obs / sim (err) [range] | p90 obs / sim (err) [range] |",
              "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        if r["fitted_on"] == r["run"] or r["group"] == "overall":
            continue
        lines.append(f"| {SHORT[r['fitted_on']]} | {SHORT[r['run']]} | {r['group']} | {r['calls']} | "
                     + " | ".join(f"{r[f'{x}_ref']:.1f} / {r[f'{x}_other']:.1f} ({100 * r[f'{x}_err']:+.0f} %) "
                                  f"[{r[f'{x}_low']:.0f}–{r[f'{x}_high']:.0f}]" for x in ("p50", "p90")) + " |")
    return "\n".join(lines)


def write_profiles(result: dict[str, Any]) -> None:
    """Ship both families' profiles with the engine costs calibrated on :data:`SHIP_FROM`."""
    for family, name in SHIPPED.items():
        run = SHIP_FROM[family]
        f = result["fits"][run]
        data = family_profile(family, f["values"], free=tuple(result["free"]),
                              source=f"calibrated on the observed run {run} (benchmarks/grounded_calibration.py)")
        data["name"] = name
        data["source"] += (f" Engine host costs ({', '.join(result['free'])}) calibrated on the observed run "
                           f"batch_results_{run} of ../shared/traces/real/lminference/ (scenario "
                           f"lminference-{RUNS[run][0]}.toml) by benchmarks/grounded_calibration.py; kernel "
                           f"costs not fitted; the other engine parameters keep their stated defaults. Replay it with "
                           f"the scenarios lminference-*.toml (one process drives both GPUs: host_lock).")
        data["meta"]["fit"] = {"run": run, **{k: f[k] for k in ("values", "relative_se", "ensemble", "cost")}}
        keep_identity(data, ROOT / "profiles" / f"{name}.json")
        (ROOT / "profiles" / f"{name}.json").write_text(json.dumps(data, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write-docs", action="store_true", help="write the tables into docs/calibration.md")
    parser.add_argument("--write-profiles", action="store_true", help="write the shipped A100 profiles to profiles/")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--free", default=",".join(FREE), help="engine parameters to calibrate")
    parser.add_argument("--fitted-on", default=",".join(RUNS), help="runs to calibrate on (each predicts every run)")
    parser.add_argument("--screen", type=int, help="quasi-random points before the local fits (calibrate's default)")
    parser.add_argument("--starts", type=int, help="local fits (calibrate's default)")
    parser.add_argument("--max-evaluations", type=int, help="objective evaluations per local fit (calibrate's default)")
    parser.add_argument("--seeds", type=int, default=SEEDS, help="simulated runs each prediction averages")
    args = parser.parse_args(argv)
    if not REQUEST.exists():
        sys.stderr.write(f"the real runs are not at {REQUEST}\n")
        return 2
    search = {k: v for k, v in (("screen", args.screen), ("starts", args.starts),
                                ("max_evaluations", args.max_evaluations)) if v is not None}
    result = study(args.jobs, tuple(args.free.split(",")), args.fitted_on.split(","), search, args.seeds)
    if args.write_profiles and not set(SHIP_FROM.values()) <= set(result["fits"]):
        sys.stderr.write(f"--write-profiles needs fits on {', '.join(SHIP_FROM.values())}\n")
        return 2
    text = markdown(result)
    print(json.dumps({**result, "summary": summary(result)}, indent=1) if args.json else text)
    if args.write_profiles:
        write_profiles(result)
    if args.write_docs:
        from docs_tables import write_generated

        write_generated("grounded-calibration", text, page="calibration.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
