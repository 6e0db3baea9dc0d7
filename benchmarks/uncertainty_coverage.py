"""Are the stated 90 % intervals honest? Coverage on the users' real runs, out of sample.

For each of the six Qwen3-4B full-trace runs (``../shared/traces/real/lminference/``), the
engine's host cost per kernel is calibrated on that ONE run exactly as
``benchmarks/grounded_calibration.py`` does (kernel costs from the A100 tables, ``launch_s``
free, ``simctl calibrate``'s defaults), and the profile it gives — carrying its fit's
ensemble and standard error in ``meta.fit`` as the shipped grounded profiles do — predicts
every other run through :func:`simulator.uncertainty.predict_worlds`: N worlds, each one
whole simulated run with its own seed, its own draw of the fit and its own kernel-cost
factor. A figure is covered when the observed run's value lies inside the prediction's
90 % interval. Figures: call latency p50 and p90, overall and per composition class (the
0.1 s graph-only calls left out, as in the grounded benchmark).

Two intervals are scored:

* **as stated** — what ``simctl predict --worlds`` prints: seeds, calibration and kernel
  uncertainty only;
* **with model error, leave one run out** — what ``simctl predict --worlds N --model-error σ``
  states: each world's figure also multiplied by ``exp(σ z)`` (z standard normal, one a world,
  :func:`simulator.uncertainty.model_error_factors`), σ the root mean square of
  log(predicted mean / observed) over the out-of-sample figures of every pair that does not
  involve the predicted run (neither fitted on it nor predicting it): the width is never
  learnt from the run it is scored on.

Needs ``../shared/``. Deterministic (fixed seeds).

    python benchmarks/uncertainty_coverage.py [--worlds 20] [--write-docs] [--json]
    python benchmarks/uncertainty_coverage.py --quick      # one fit, two predictions (the suite)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grounded_calibration import FREE, REQUEST, RUNS, SHORT, _inputs, family_profile, fit  # noqa: E402

LEVEL = 0.9
STATS = ("p50", "p90")
WORLDS = 20


def fitted_profile(family: str, fitted: dict[str, Any]):
    """The composed profile of ``family`` with the engine values of ``fitted`` and its fit's
    ensemble and standard errors in ``meta.fit`` (what :mod:`simulator.uncertainty` draws)."""
    from simulator.profile import profile_from_dict

    data = family_profile(family, fitted["values"])
    data["meta"]["fit"] = {k: fitted[k] for k in ("values", "relative_se", "ensemble")}
    return profile_from_dict(data)


def predict_pair(fitted_on: str, target: str, fitted: dict[str, Any], worlds: int) -> list[dict[str, Any]]:
    """Rows (group, stat): observed, the worlds' values, the stated interval, covered."""
    from simulator.uncertainty import predict_worlds

    observed, trace, scenario = _inputs(target)
    table = predict_worlds(trace, scenario, fitted_profile(RUNS[target][1], fitted), worlds, observed=observed)
    rows = []
    for j, (_, r) in enumerate(table.iterrows()):
        if r["group"] == "graph-only":
            continue  # 0.1 s calls: a fixed overhead, not the GPU's (as in grounded_calibration)
        for stat in STATS:
            rows.append({"fitted_on": fitted_on, "run": target, "group": r["group"], "stat": stat,
                         "observed": float(r[f"{stat}_ref"]), "mean": float(r[stat]),
                         "values": [float(v) for v in table.attrs["values"][stat][:, j]],
                         "low": float(r[f"{stat}_low"]), "high": float(r[f"{stat}_high"]),
                         "covered": bool(r[f"{stat}_inside"])})
    return rows


def _pair(args: tuple[str, str, dict[str, Any], int]) -> list[dict[str, Any]]:
    return predict_pair(*args)


def loro_sigma(rows: list[dict[str, Any]], run: str) -> float:
    """The model-error σ for predictions of ``run``: the root mean square of log(predicted
    mean / observed) over the out-of-sample figures of every pair not involving ``run``."""
    errors = [math.log(o["mean"] / o["observed"]) for o in rows
              if o["fitted_on"] != o["run"] and run not in (o["fitted_on"], o["run"])
              and o["mean"] > 0 and o["observed"] > 0 and math.isfinite(o["mean"])]
    return math.sqrt(float(np.mean(np.square(errors)))) if errors else 0.0


def pooled_sigma(rows: list[dict[str, Any]]) -> float:
    """The model-error σ over every out-of-sample figure of every pair: what the bundled
    profiles of the users' server state (``meta.model_error``), learnt on all six runs."""
    errors = [math.log(o["mean"] / o["observed"]) for o in rows
              if o["mean"] > 0 and o["observed"] > 0 and math.isfinite(o["mean"])]
    return math.sqrt(float(np.mean(np.square(errors)))) if errors else 0.0


def with_model_error(rows: list[dict[str, Any]]) -> None:
    """Add ``sigma``, ``low_me``, ``high_me``, ``covered_me``: the interval ``simctl predict
    --worlds N --model-error σ`` states (each world's value times its factor,
    :func:`simulator.uncertainty.model_error_factors`, seed 0 as predict_worlds draws them),
    σ learnt leave one run out (:func:`loro_sigma`)."""
    from simulator.uncertainty import interval, model_error_factors

    for r in rows:
        sigma = loro_sigma(rows, r["run"])
        widened = np.asarray(r["values"]) * model_error_factors(len(r["values"]), sigma, 0)
        r["sigma"] = sigma
        r["low_me"], r["high_me"] = interval(widened, LEVEL)
        r["covered_me"] = bool(r["low_me"] <= r["observed"] <= r["high_me"])


def study(worlds: int = WORLDS, jobs: int = 2, fitted_on_runs: list[str] | None = None,
          targets: list[str] | None = None, search: dict[str, int] | None = None) -> dict[str, Any]:
    fitted_runs = fitted_on_runs or list(RUNS)
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            fits = dict(zip(fitted_runs, pool.map(fit, fitted_runs, [FREE] * len(fitted_runs),
                                                  [search] * len(fitted_runs)), strict=True))
    else:
        fits = {run: fit(run, FREE, search) for run in fitted_runs}
    pairs = [(a, b, fits[a], worlds) for a in fitted_runs for b in (targets or list(RUNS)) if b != a]
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            found = list(pool.map(_pair, pairs))
    else:
        found = [_pair(p) for p in pairs]
    rows = [r for batch in found for r in batch]
    with_model_error(rows)
    return {"worlds": worlds, "level": LEVEL, "rows": rows,
            "fits": {k: {"values": v["values"], "relative_se": v["relative_se"]} for k, v in fits.items()}}


def summary(result: dict[str, Any]) -> dict[str, Any]:
    rows = result["rows"]
    overall = [r for r in rows if r["group"] == "overall"]

    def share(rs: list[dict[str, Any]], key: str) -> float:
        return sum(r[key] for r in rs) / len(rs) if rs else math.nan

    family = [r for r in rows if RUNS[r["run"]][1] == RUNS[r["fitted_on"]][1]]
    across = [r for r in rows if RUNS[r["run"]][1] != RUNS[r["fitted_on"]][1]]
    widths = [r["high"] / r["low"] - 1 for r in rows if r["low"] > 0 and math.isfinite(r["high"])]
    errors = [abs(r["mean"] / r["observed"] - 1) for r in rows if r["observed"] > 0]
    return {"figures": len(rows), "covered": sum(r["covered"] for r in rows), "coverage": share(rows, "covered"),
            "overall_figures": len(overall), "overall_coverage": share(overall, "covered"),
            "covered_me": sum(r["covered_me"] for r in rows), "coverage_me": share(rows, "covered_me"),
            "overall_coverage_me": share(overall, "covered_me"),
            "family_figures": len(family), "family_coverage": share(family, "covered"),
            "family_coverage_me": share(family, "covered_me"),
            "across_figures": len(across), "across_coverage": share(across, "covered"),
            "across_coverage_me": share(across, "covered_me"),
            "median_width": float(np.median(widths)) if widths else math.nan,
            "median_abs_error": float(np.median(errors)) if errors else math.nan,
            "sigma": sorted({round(r["sigma"], 3) for r in rows}), "pooled_sigma": pooled_sigma(rows)}


def markdown(result: dict[str, Any]) -> str:
    s = summary(result)
    sig = s["sigma"]
    lines = [
        f"Engine host cost calibrated on one run, each other run predicted over {result['worlds']} worlds; "
        f"a figure is covered when the observed value lies in the stated {100 * LEVEL:.0f} % interval. "
        f"Call latency p50 and p90 per composition class and overall, {s['figures']} out-of-sample figures.", "",
        f"| interval | covered | coverage | overall figures | same server family ({s['family_figures']}) "
        f"| across families ({s['across_figures']}) |", "|---|---|---|---|---|---|",
        f"| as stated (seeds, calibration fit, kernel costs) | {s['covered']} of {s['figures']} | "
        f"**{100 * s['coverage']:.0f} %** | {100 * s['overall_coverage']:.0f} % of {s['overall_figures']} | "
        f"{100 * s['family_coverage']:.0f} % | {100 * s['across_coverage']:.0f} % |",
        f"| with a model-error factor, σ learnt leave one run out ({min(sig):.2f}–{max(sig):.2f} in log) | "
        f"{s['covered_me']} of {s['figures']} | **{100 * s['coverage_me']:.0f} %** | "
        f"{100 * s['overall_coverage_me']:.0f} % of {s['overall_figures']} | {100 * s['family_coverage_me']:.0f} % | "
        f"{100 * s['across_coverage_me']:.0f} % |", "",
        f"Median width of the stated interval: {100 * s['median_width']:.0f} % of its lower bound; median "
        f"|error| of the predicted mean: {100 * s['median_abs_error']:.0f} %. Over every out-of-sample figure of "
        f"every pair, σ = {s['pooled_sigma']:.2f}: the model error the bundled profiles of the users' server "
        f"state (`meta.model_error`), which `--worlds` applies by default.", "",
        "| fitted on | predicted | class | stat | observed | predicted [stated 90 %] | with model error |",
        "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {SHORT[r['fitted_on']]} | {SHORT[r['run']]} | {r['group']} | {r['stat']} | "
                     f"{r['observed']:.1f} | {r['mean']:.1f} [{r['low']:.1f}–{r['high']:.1f}] "
                     f"{'✓' if r['covered'] else '✗'} | [{r['low_me']:.1f}–{r['high_me']:.1f}] "
                     f"{'✓' if r['covered_me'] else '✗'} |")
    return "\n".join(lines)


def write_profiles(sigma: float, coverage: float) -> list[Path]:
    """State ``sigma`` as ``meta.model_error`` in the shipped profiles of the users' server
    (:data:`grounded_calibration.SHIPPED`: composed, the host cost per kernel calibrated on
    one run, as every profile this benchmark scores), the files otherwise unchanged."""
    from grounded_calibration import ROOT, SHIPPED

    paths = []
    for name in SHIPPED.values():
        path = ROOT / "profiles" / f"{name}.json"
        data = json.loads(path.read_text())
        data["meta"]["model_error"] = {
            "sigma": round(sigma, 3),
            "source": "benchmarks/uncertainty_coverage.py: root mean square of log(predicted / observed) call "
                      "latency p50 and p90, overall and per composition class, over every pair of the users' six "
                      "real runs (host cost calibrated on one, the other predicted); learnt leave one run out, such "
                      f"a width held {100 * coverage:.0f} % of the figures in their 90 % intervals "
                      "(docs/uncertainty.md)"}
        path.write_text(json.dumps(data, indent=1) + "\n")
        paths.append(path)
    return paths


#: the first cell of this benchmark's row in the README's headline figures
README_ROW = "coverage of the stated 90 % intervals"


def readme_row(s: dict[str, Any]) -> str:
    return (f"| {README_ROW} (`--worlds`): engine host cost calibrated on one of the users' real runs, every other "
            f"run predicted | {s['figures']} out-of-sample p50/p90 call latencies: **{100 * s['coverage']:.0f} %** "
            f"inside the interval as stated (seeds, the fit's spread, kernel costs); "
            f"**{100 * s['coverage_me']:.0f} %** with a model-error factor learnt leave one run out "
            f"(`--model-error`, σ {min(s['sigma']):.2f}–{max(s['sigma']):.2f}) | `benchmarks/uncertainty_coverage.py`, "
            f"[docs/uncertainty.md](docs/uncertainty.md) |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write-docs", action="store_true", help="write the tables into docs/uncertainty.md")
    parser.add_argument("--write-profiles", action="store_true",
                        help="state the pooled model error in the shipped profiles of the users' server")
    parser.add_argument("--quick", action="store_true", help="one cheap fit (4q-50), two predictions, 4 worlds")
    parser.add_argument("--worlds", type=int, default=WORLDS)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    if not REQUEST.exists():
        sys.stderr.write(f"the real runs are not at {REQUEST}\n")
        return 2
    if args.quick:
        result = study(min(args.worlds, 4), 1, ["4B_4queues_nothinking"],
                       ["4B_4queues_nothinking_longmmlu", "4B_fw_5_b10"], {"screen": 4, "starts": 1})
    else:
        result = study(args.worlds, args.jobs)
    text = markdown(result)
    s = summary(result)
    print(json.dumps({**{k: v for k, v in result.items()}, "summary": s}, indent=1) if args.json else text)
    if not args.json:
        print(f"\ncoverage of the stated {100 * LEVEL:.0f} % intervals: {100 * s['coverage']:.0f} % "
              f"({s['covered']} of {s['figures']}); with model error (leave one run out): {100 * s['coverage_me']:.0f} %")
    if args.write_docs and not args.quick:
        from docs_tables import write_generated, write_row

        write_generated("uncertainty-coverage", text, page="uncertainty.md")
        write_row(README_ROW, readme_row(s), page="README.md")
    if args.write_profiles and not args.quick:
        for path in write_profiles(s["pooled_sigma"], s["coverage_me"]):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
