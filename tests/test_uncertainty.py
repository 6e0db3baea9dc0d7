"""SLO verdicts with their probability: P(met) over worlds, intervals, plans at a confidence."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from simulator.cli import app
from simulator.plan import parse_slo, plan
from simulator.profile import load_profile, profile_from_dict
from simulator.scenario import build_scenario
from simulator.sweep import Base
from simulator.uncertainty import (
    KERNEL_SIGMA,
    WorldsEvaluator,
    interval,
    probability_met,
    profile_worlds,
    sources_of,
    stated_model_error,
    verdicts,
)
from tests.helpers import assert_one_line_error, make_trace

runner = CliRunner()

#: one GPU task, exponential service of mean 1 s, nothing calibrated or composed
EXPONENTIAL = {"tasks": {"x": {"resource": "gpu", "service": {"kind": "distribution", "dist": "exponential",
                                                             "mean": 1.0}}}}
ONE_AT_A_TIME = {"flush": (0.0,), "topology": ("shared",), "max_batch": (1,)}


def test_p_from_hand_made_outcomes():
    """k of n worlds met: p = (k + 1) / (n + 2), sd sqrt(p (1 - p) / (n + 3)); intervals are
    order statistics; a figure with no value (None: infinitely late) is never met."""
    got = probability_met([True, True, False, True])
    assert (got.met, got.worlds) == (3, 4)
    assert got.p == pytest.approx(4 / 6) and got.se == pytest.approx(math.sqrt((4 / 6) * (2 / 6) / 7))
    assert probability_met([False] * 8).p == pytest.approx(1 / 10)       # never 0 from finitely many
    assert probability_met([True] * 98).p == pytest.approx(99 / 100)
    values = [float(v) for v in range(1, 22)]                                # 21 worlds: ranks 1 and 19
    assert interval(values) == (2.0, 20.0)
    assert interval([5.0, 1.0, math.nan]) == (1.0, math.inf)
    slo = parse_slo("x.latency.p95<=10", ["x"])
    outcomes = [{"tasks.x.latency.p95": v} for v in (4.0, 9.0, 12.0, None, 7.0)]
    (v,) = verdicts([slo], outcomes)
    assert (v.probability.met, v.probability.worlds) == (3, 5) and v.probability.p == pytest.approx(4 / 7)
    assert v.spread.low == 4.0 and v.spread.high == math.inf and v.spread.median == 9.0
    assert v.met_at(0.5) and not v.met_at(0.6)
    with pytest.raises(ValueError):
        probability_met([])


def test_profile_worlds_vary_what_the_profile_leaves_open():
    """A given profile has nothing to vary; a calibrated one draws its fits within their
    bounds; a composed one its engine's host costs (inside their stated intervals' reach)
    and one kernel-cost factor a world."""
    given = profile_from_dict(EXPONENTIAL)
    assert sources_of(given).describe() == "seeds"
    assert all(p is given for p in profile_worlds(given, 3))
    fitted = load_profile("qwen3-4b-specdec-fw5")
    src = sources_of(fitted)
    assert "infobench.acceptance" in src.fit and not src.engine and not src.kernels
    params = {p["name"]: p for p in fitted.meta["calibrate"]}
    worlds = profile_worlds(fitted, 12, seed=3)
    accept = [w.to_dict()["tasks"]["infobench"]["service"]["acceptance"] for w in worlds]
    assert len(set(accept)) > 1
    assert all(params["infobench.acceptance"]["min"] <= a <= params["infobench.acceptance"]["max"] for a in accept)
    assert [w.to_dict() for w in profile_worlds(fitted, 12, seed=3)] == [w.to_dict() for w in worlds]  # same seed
    composed = load_profile("h100-sxm-llama-3.1-8b-cuda-graph")
    src = sources_of(composed)
    assert src.kernels and "step_s" in src.engine and not src.fit
    base = composed.to_dict()["tasks"]
    task = next(t for t, spec in base.items() if spec["service"].get("engine"))
    draws = profile_worlds(composed, 40, seed=1)
    steps = [w.to_dict()["tasks"][task]["service"]["engine"]["step_s"] for w in draws]
    assert min(steps) >= 0 and len(set(steps)) > 1
    # one kernel factor a world: every kernel coefficient of a task scaled alike, log-sd ~ KERNEL_SIGMA
    service = base[task]["service"]
    key = "step" if "step" in service else None
    if key:
        name = next(k for k, v in service["step"].items() if v)
        factors = [w.to_dict()["tasks"][task]["service"]["step"][name] / service["step"][name] for w in draws]
        logs = [math.log(f) for f in factors]
        mean = sum(logs) / len(logs)
        sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1))
        assert 0.5 * KERNEL_SIGMA < sd < 1.6 * KERNEL_SIGMA


def test_p_matches_theory_with_no_profile_uncertainty():
    """Three one-prompt calls far apart, exponential service of mean 1 s, one GPU: no call
    waits, so latency.max is the largest of three Exp(1) draws and P(max <= b) = (1 − e^−b)³.
    With only seeds varying, the share of worlds meeting the SLO is a binomial estimate of it:
    it must fall within 4 standard errors (plus the Beta estimator's shift, at most 1/n)."""
    trace = make_trace([(0.0, ["x"]), (1000.0, ["x"]), (2000.0, ["x"])])
    base = Base(trace, profile_from_dict(EXPONENTIAL), build_scenario())
    b = -math.log(1 - 0.5 ** (1 / 3))          # P = 0.5: the largest binomial error, the hardest case
    slo = parse_slo(f"x.latency.max<={b}", ["x"])
    n = 200
    ev = WorldsEvaluator.build(base, [slo], n, confidence=0.5, workers=1)
    (v,) = ev.verdicts({"flush": 0.0, "topology": "shared", "max_batch": 1, "gpus": 1})
    theory = (1 - math.exp(-b)) ** 3
    assert abs(v.probability.p - theory) <= 4 * math.sqrt(theory * (1 - theory) / n) + 1 / n
    assert v.probability.se == pytest.approx(math.sqrt(v.probability.p * (1 - v.probability.p) / (n + 3)))


def test_confidence_changes_the_plans_choice():
    """Four one-prompt calls at once, Exp(1) service, one prompt a batch, SLO latency.max <= 6.
    One GPU serves them in turn: max ~ Gamma(4), mean 4 (within the bound: the plan on mean
    figures picks 1 GPU) but P(met) = 1 − e⁻⁶ (1 + 6 + 18 + 36) = 0.849. Four GPUs serve them
    at once: P = (1 − e⁻⁶)⁴ = 0.990. At confidence 0.93 the plan needs more than one GPU."""
    base = Base(make_trace([(0.0, ["x"])] * 4), profile_from_dict(EXPONENTIAL), build_scenario())
    slo = [parse_slo("x.latency.max<=6", ["x"])]
    by_mean = plan(base, slo, ONE_AT_A_TIME, max_gpus=4, seeds=tuple(range(20)), find_max_rate=False, workers=1)
    assert by_mean.met and by_mean.gpus == 1
    ev = WorldsEvaluator.build(base, slo, 120, confidence=0.93, workers=1)
    sure = plan(base, slo, ONE_AT_A_TIME, max_gpus=4, find_max_rate=False, evaluator=ev)
    assert sure.met and sure.gpus > 1
    doc = sure.to_dict()
    assert doc["slos"][0]["p"] >= 0.93 and doc["slos"][0]["met"] and doc["uncertainty"]["confidence"] == 0.93
    one = ev.verdicts({**sure.config, "gpus": 1})[0]
    assert one.probability.p < 0.93


def _files(tmp_path):
    trace = tmp_path / "three.json"
    trace.write_text(json.dumps([{"t": 0.0, "prompts": ["x"]}, {"t": 0.0, "prompts": ["x"]},
                                 {"t": 0.0, "prompts": ["x"]}]))
    profile = tmp_path / "exp.json"
    profile.write_text(json.dumps(EXPONENTIAL))
    return str(trace), str(profile)


def test_plan_cli_says_met_with_p_and_writes_it(tmp_path):
    trace, profile = _files(tmp_path)
    out = tmp_path / "plan.json"
    result = runner.invoke(app, ["plan", trace, "-p", profile, "--slo", "x.latency.max<=8", "--flush", "0",
                                 "--topology", "shared", "--max-batch", "1", "--max-gpus", "2", "-j", "1",
                                 "--worlds", "10", "--confidence", "0.6", "--json", str(out)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "meets every SLO with p ≥ 0.6" in text and "met with p = 0." in text and "90 % interval" in text
    doc = json.loads(out.read_text())
    row = doc["slos"][0]
    assert {"p", "p_se", "worlds", "worlds_met", "interval", "level", "median"} <= set(row)
    assert row["worlds"] == 10 and row["p"] == pytest.approx((row["worlds_met"] + 1) / 12)
    assert row["interval"][0] <= row["median"] <= row["interval"][1] and row["met"] == (row["p"] >= 0.6)
    assert doc["uncertainty"]["worlds"] == 10 and doc["uncertainty"]["sources"]["fit"] == []


def test_predict_cli_gives_intervals(tmp_path):
    trace, profile = _files(tmp_path)
    out = tmp_path / "pred.json"
    result = runner.invoke(app, ["predict", trace, "-p", profile, "--worlds", "12", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "90 % interval" in " ".join(result.stdout.split())
    doc = json.loads(out.read_text())
    overall = next(r for r in doc["figures"] if r["group"] == "overall")
    assert overall["p50_low"] <= overall["p50"] <= overall["p50_high"] and overall["p50_low"] < overall["p50_high"]
    assert doc["uncertainty"]["worlds"] == 12 and doc["uncertainty"]["level"] == 0.9


@pytest.mark.parametrize("extra, needles", [
    (["--confidence", "1.5"], ["--confidence", "between 0 and 1", "1.5"]),
    (["--confidence", "0"], ["--confidence"]),
    (["--worlds", "0"], ["--worlds", "greater than or equal to 1"]),
    (["--worlds", "5", "--seeds", "3"], ["--worlds replaces --seeds"]),
])
def test_bad_uncertainty_options_are_one_line_errors(tmp_path, extra, needles):
    trace, profile = _files(tmp_path)
    assert_one_line_error(runner.invoke(app, ["plan", trace, "-p", profile, "--slo", "x.latency.max<=5", *extra]),
                          *needles)


def test_predict_bad_worlds_is_one_line_error(tmp_path):
    trace, profile = _files(tmp_path)
    assert_one_line_error(runner.invoke(app, ["predict", trace, "-p", profile, "--worlds", "0"]), "--worlds")
    assert_one_line_error(runner.invoke(app, ["predict", trace, "-p", profile, "--worlds", "3", "--seeds", "2"]),
                          "--worlds replaces --seeds")


def test_compare_cli_judges_each_cell_against_an_slo(tmp_path):
    """One GPU serves three Exp(1) prompts in turn (max ~ Gamma(3)), three serve them at once:
    over the same seeds, a cell meets latency.max <= 5 in at most as many seeds with fewer GPUs."""
    trace, profile = _files(tmp_path)
    out = tmp_path / "s.parquet"
    swept = runner.invoke(app, ["sweep", trace, "-p", profile, "--flush", "0", "--topology", "shared",
                                "--max-batch", "1", "--gpus", "1,3", "--seeds", "12", "-j", "1", "-o", str(out)])
    assert swept.exit_code == 0, swept.output
    result = runner.invoke(app, ["compare", str(out), "-m", "x.latency.max", "--slo", "x.latency.max<=5",
                                 "--confidence", "0.5"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "P(met) over each cell's seeds" in text and "p = " in text
    assert_one_line_error(runner.invoke(app, ["compare", str(out), "-m", "x.latency.max", "--slo", "x.latency.max<=5",
                                              "--confidence", "1.5"]), "--confidence")


def test_model_error_scales_time_figures_by_each_worlds_factor(tmp_path):
    """A deterministic service (every seed the same run): with model error σ, world i's
    latencies are the run's times its factor exp(σ z_i), counts untouched, and P(met) counts
    the worlds whose factor keeps the latency within the bound."""
    from simulator.uncertainty import is_time_figure, model_error_factors

    assert is_time_figure("tasks.x.latency.p95") and is_time_figure("overall.tokens.ttft_ms.p99")
    assert is_time_figure("overall.call_latency.mean") and not is_time_figure("overall.completed")
    assert not is_time_figure("cost.usd") and not is_time_figure("overall.throughput_prompts_per_s")
    fixed = {"tasks": {"x": {"resource": "gpu", "service": {"kind": "distribution", "dist": "deterministic",
                                                           "mean": 2.0}}}}
    base = Base(make_trace([(0.0, ["x"])]), profile_from_dict(fixed), build_scenario())
    slo = parse_slo("x.latency.max<=2.2", ["x"])
    ev = WorldsEvaluator.build(base, [slo], 30, confidence=0.5, workers=1, model_error=0.2)
    config = {"gpus": 1}
    (v,) = ev.verdicts(config)
    factors = model_error_factors(30, 0.2, 0)
    assert list(v.spread.values) == pytest.approx(list(2.0 * factors))
    assert v.probability.met == int((2.0 * factors <= 2.2).sum())
    from simulator.sweep import config_key

    outcomes = ev.outcomes[config_key(config)]
    assert [w["tasks.x.completed"] for w in outcomes] == [1.0] * 30          # a count: not scaled
    trace, profile = _files(tmp_path)
    assert_one_line_error(runner.invoke(app, ["plan", trace, "-p", profile, "--slo", "x.latency.max<=5",
                                              "--model-error", "0.3"]), "--model-error", "--worlds")


def test_cheapest_plan_over_worlds_of_a_composed_profile():
    """A composed, priced profile: the cheapest plan judges by P(met) and says the worlds drew
    its engine's host costs and kernel costs."""
    result = runner.invoke(app, ["plan", "example", "-c", "design-notes", "-p", "h100-sxm-llama-3.1-8b-cuda-graph",
                                 "--slo", "infobench.latency.p95<=60", "--worlds", "3", "--confidence", "0.5",
                                 "--flush", "0.1", "--topology", "shared", "--max-batch", "10", "--max-gpus", "1",
                                 "-j", "1", "--json", "-"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["objective"] == "cheapest" and doc["met"]
    assert doc["slos"][0]["worlds"] == 3 and doc["slos"][0]["met"] == (doc["slos"][0]["p"] >= 0.5)
    sources = doc["uncertainty"]["sources"]
    assert sources["kernels"] == pytest.approx(KERNEL_SIGMA) and "step_s" in sources["engine"]


def test_a_profile_states_its_model_error_and_worlds_apply_it_unless_told_otherwise(tmp_path):
    """A profile's ``meta.model_error`` (its error out of sample, measured) widens what
    ``--worlds`` states by default; ``--model-error 0`` states the intervals given the model."""
    trace, _ = _files(tmp_path)
    stated = tmp_path / "stated.json"
    stated.write_text(json.dumps({**EXPONENTIAL, "meta": {"model_error": {"sigma": 0.5, "source": "a test"}}}))
    widths = {}
    for name, extra in (("stated", []), ("none", ["--model-error", "0"]), ("given", ["--model-error", "0.5"])):
        out = tmp_path / f"pred-{name}.json"
        result = runner.invoke(app, ["predict", trace, "-p", str(stated), "--worlds", "12", "--json", str(out), *extra])
        assert result.exit_code == 0, result.output
        doc = json.loads(out.read_text())
        overall = next(r for r in doc["figures"] if r["group"] == "overall")
        widths[name] = overall["p50_high"] / overall["p50_low"]
        assert doc["uncertainty"]["sources"]["model_error"] == (None if name == "none" else 0.5)
    assert widths["stated"] == widths["given"] > widths["none"]
    assert stated_model_error(load_profile(str(stated))) == 0.5
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**EXPONENTIAL, "meta": {"model_error": {"sigma": -1}}}))
    assert_one_line_error(runner.invoke(app, ["predict", trace, "-p", str(bad), "--worlds", "3"]),
                          "meta.model_error.sigma")


def test_the_users_server_profiles_state_the_model_error_the_coverage_benchmark_measured():
    docs = (Path(__file__).resolve().parent.parent / "docs" / "uncertainty.md").read_text()
    measured = float(re.search(r"every pair, σ = ([0-9.]+)", docs).group(1))
    for name in ("a100-sxm-qwen3-4b-hf-eager", "a100-sxm-qwen3-4b-qwen3-0.6b-hf-eager"):
        profile = load_profile(name)
        assert round(stated_model_error(profile), 2) == measured
        assert "benchmarks/uncertainty_coverage.py" in profile.meta["model_error"]["source"]
