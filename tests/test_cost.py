"""Cost of a run (price tables, provisioned GPU-hours) and the planner's cheapest search."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from helpers import assert_one_line_error, make_trace
from hypothesis import given, settings, strategies as st
from typer.testing import CliRunner

from simulator.cli import app
from simulator.cost import (
    PriceError,
    gpu_type,
    load_prices,
    price_table,
    provisioned_gpu_seconds,
)
from simulator.plan import PlanError, cheapest, pareto_front, parse_slo
from simulator.profile import load_profile, profile_from_dict
from simulator.replay import replay
from simulator.scenario import build_scenario
from simulator.sweep import Base

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "traces" / "batch_arrivals.json"
runner = CliRunner()


def fixed(name: str, gpu: str | None, seconds: float):
    meta = {"gpu": gpu} if gpu else {}
    return profile_from_dict({"name": name, "meta": meta, "tasks": {"x": {"resource": "gpu", "service": {
        "kind": "distribution", "dist": "deterministic", "mean": seconds}}}})


#: One prompt a second for 30 s.
STEADY = make_trace([(float(i), ["x"]) for i in range(30)])
PRICES = price_table({"gpus": {"fast-gpu": {"usd_per_gpu_hour": 3.0}, "slow-gpu": {"usd_per_gpu_hour": 2.0}}})
NO_BATCHING = {"flush": (0.0,), "topology": ("shared",), "max_batch": (1,)}


# -- price tables -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["modal-serverless", "lambda-on-demand"])
def test_bundled_price_tables_price_the_profiles_gpu_types_with_their_sources(name):
    table = load_prices(name)
    profile_types = {gpu_type(load_profile(p.stem)) for p in (ROOT / "profiles").glob("*.json")} - {None}
    assert profile_types == {"a100-sxm", "h100-sxm"} and profile_types <= set(table.prices)
    for price in table.prices.values():
        assert math.isfinite(price.usd_per_gpu_hour) and price.usd_per_gpu_hour > 0
        assert price.source.startswith("https://") and price.offering and len(price.read_on) == 10


def test_the_default_table_is_the_users_serverless_platform():
    assert load_prices().name == "modal-serverless"


@pytest.mark.parametrize("content, needles", [
    ('{"gpus": {"h100-sxm": {"usd_per_gpu_hour": -1}}}', ["h100-sxm", "usd_per_gpu_hour", "positive finite"]),
    ('{"gpus": {"h100-sxm": {"usd_per_gpu_hour": Infinity}}}', ["h100-sxm", "usd_per_gpu_hour", "positive finite"]),
    ('{"gpus": {"h100-sxm": {"usd_per_gpu_hour": "3"}}}', ["h100-sxm", "usd_per_gpu_hour", "number"]),
    ('{"gpus": {"h100-sxm": {"usd_per_gpu_hour": 3, "per": "hour"}}}', ["h100-sxm", "field 'per'", "unknown"]),
    ('{"gpus": {}}', ["field 'gpus'"]),
    ('{"gpus": {"h100-sxm": 3}}', ["h100-sxm", "must be an object"]),
    ('{"currency": "EUR", "gpus": {"h100-sxm": {"usd_per_gpu_hour": 3}}}', ["currency", "USD"]),
    ('[1, 2]', ["must be a JSON object"]),
    ('{"gpus": ', ["not valid JSON"]),
])
def test_a_bad_price_file_is_one_line_naming_file_record_and_field(tmp_path, content, needles):
    bad = tmp_path / "prices.json"
    bad.write_text(content)
    with pytest.raises(PriceError):
        load_prices(bad)
    result = runner.invoke(app, ["replay", str(TRACE), "--prices", str(bad)])
    assert_one_line_error(result, str(bad), *needles)
    result = runner.invoke(app, ["plan", str(TRACE), "--slo", "infobench.latency.p95<=170", "--prices", str(bad)])
    assert_one_line_error(result, str(bad), *needles)


def test_an_unknown_price_table_name_lists_the_bundled_ones():
    assert_one_line_error(runner.invoke(app, ["replay", str(TRACE), "--prices", "azure"]),
                          "azure", "modal-serverless", "lambda-on-demand")


# -- the summary's cost --------------------------------------------------------------------


def test_cost_is_gpus_times_the_span_times_the_price():
    """3 GPUs, one 1-s prompt a second from t=0 to t=29: the run spans 0 .. 30 s."""
    scenario = build_scenario(run={"gpus": 3})
    result = replay(STEADY, scenario, fixed("fast", "fast-gpu", 1.0), prices=PRICES)
    cost = result.summary["cost"]
    assert provisioned_gpu_seconds(result.summary, scenario) == pytest.approx(90.0)
    assert cost["gpu_type"] == "fast-gpu" and cost["usd_per_gpu_hour"] == 3.0
    assert cost["gpu_hours"] == pytest.approx(90.0 / 3600)
    assert cost["usd"] == pytest.approx(90.0 / 3600 * 3.0)
    assert cost["usd_per_1k_prompts"] == pytest.approx(1000 * 90.0 / 3600 * 3.0 / 30)
    assert cost["unknown"] is None


def test_cost_without_a_gpu_type_or_a_price_is_unknown_with_the_reason():
    no_type = replay(STEADY, build_scenario(), fixed("hand", None, 1.0), prices=PRICES).summary["cost"]
    assert no_type["usd"] is None and no_type["gpu_hours"] > 0 and "names no GPU type" in no_type["unknown"]
    unpriced = replay(STEADY, build_scenario(), fixed("b", "b200", 1.0), prices=PRICES).summary["cost"]
    assert unpriced["usd"] is None and "no price for GPU type 'b200'" in unpriced["unknown"]


def test_replay_prints_and_writes_the_cost(tmp_path):
    out = tmp_path / "s.json"
    result = runner.invoke(app, ["replay", str(TRACE), "-p", "h100-sxm-llama-3.1-8b-cuda-graph",
                                 "--prices", "lambda-on-demand", "--json", str(out)])
    assert result.exit_code == 0, result.output
    cost = json.loads(out.read_text())["cost"]
    assert cost["gpu_type"] == "h100-sxm" and cost["usd_per_gpu_hour"] == 3.99 and cost["prices"] == "lambda-on-demand"
    assert "h100-sxm at $3.9900/GPU-h (lambda-on-demand)" in " ".join(result.stdout.split())


# -- the cheapest plan ----------------------------------------------------------------------


def test_the_cheaper_gpu_per_hour_loses_when_it_needs_more_of_them():
    """One 1-s prompt a second, SLO latency max <= 3 s, no batching. The fast GPU (1 s, $3/h)
    keeps up alone: latency 1 s, span 30 s, cost 1 x 30/3600 x 3 = $0.025. The slow GPU (2.5 s,
    $2/h) needs 3 (with 2 the queue grows by 1 prompt every 5 s and the 30th waits far past 3 s):
    span 29 + 2.5 s, cost 3 x 31.5/3600 x 2 = $0.0525. Two fast GPUs cost at least
    2 x 29/3600 x 3 = $0.048 > $0.025, so larger counts of the fast GPU are not replayed."""
    bases = [Base(STEADY, fixed("slow", "slow-gpu", 2.5), build_scenario()),
             Base(STEADY, fixed("fast", "fast-gpu", 1.0), build_scenario())]
    result = cheapest(bases, [parse_slo("x.latency.max<=3", ["x"])], PRICES, NO_BATCHING, max_gpus=4, workers=1)
    assert result.met and (result.gpu_type, result.gpus) == ("fast-gpu", 1)
    assert result.figures["cost.usd"] == pytest.approx(0.025)
    slow = {p["gpus"]: p for p in result.points if p["gpu_type"] == "slow-gpu"}
    assert slow[3]["met"] and slow[3]["usd"] == pytest.approx(3 * 31.5 / 3600 * 2)
    assert not slow[2]["met"]
    assert [s["fewest_gpus"] for s in result.search] == [3, 1]
    # the cheapest point, and nothing else, is on the front: it has the least cost and ratio 1/3
    assert [result.points[i]["usd"] for i in result.front] == [pytest.approx(0.025)]
    doc = result.to_dict()
    assert doc["objective"] == "cheapest" and doc["pareto_front"][0]["slo_ratio"] == pytest.approx(1 / 3)


def _dominated(i: int, pts: list[tuple[float, float]]) -> bool:
    xi, yi = pts[i]
    return any(xj <= xi and yj <= yi and (xj < xi or yj < yi) for xj, yj in pts)


coordinate = st.one_of(st.integers(0, 6).map(float), st.just(math.inf))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(coordinate, coordinate), max_size=25))
def test_the_pareto_front_is_the_set_of_non_dominated_points(pts):
    assert pareto_front(pts) == [i for i in range(len(pts)) if not _dominated(i, pts)]


def test_plan_cli_searches_gpu_types_for_the_cheapest_and_plots_the_front(tmp_path):
    """One model (Qwen3-8B with a Qwen3-0.6B draft) composed for two GPU types."""
    composed = []
    for gpu in ("a100-sxm", "h100-sxm"):
        composed.append(tmp_path / f"{gpu}-qwen3-8b.json")
        made = runner.invoke(app, ["profile", "--gpu", gpu, "--model", "qwen3-8b", "--draft", "qwen3-0.6b",
                                   "--engine", "cuda-graph", "-o", str(composed[-1])])
        assert made.exit_code == 0, made.output
    args = ["plan", str(TRACE), "-p", str(composed[0]), "-p", str(composed[1]),
            "--slo", "infobench.latency.p95<=170", "--flush", "0", "--topology", "shared", "--max-batch", "10",
            "--max-gpus", "2", "-j", "1"]
    out, plot = tmp_path / "plan.json", tmp_path / "front.png"
    result = runner.invoke(app, args + ["--json", str(out), "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["objective"] == "cheapest" and doc["met"] and doc["price"]["prices"] == "modal-serverless"
    assert plot.stat().st_size > 0 and "Pareto front" in result.stdout
    front = doc["pareto_front"]
    assert front and all(a["usd"] <= b["usd"] for a, b in zip(front, front[1:], strict=False))
    met = [p for p in front if p["met"]]
    assert min(p["usd"] for p in met) == pytest.approx(doc["figures"]["cost.usd"])
    # an existing plot is not overwritten without --force
    again = runner.invoke(app, args + ["--plot", str(plot)])
    assert_one_line_error(again, str(plot), "--force")


def test_fewest_gpus_is_the_answer_for_a_profile_without_a_price(tmp_path):
    """The bundled hand-calibrated profile names no GPU type: auto plans for the fewest GPUs,
    exactly as --objective fewest-gpus does (the document has no cheapest fields)."""
    args = ["plan", str(TRACE), "--slo", "infobench.latency.p95<=170", "--flush", "0", "--topology", "shared",
            "--max-batch", "10", "--max-gpus", "3", "-j", "1", "--json", "-"]
    auto = json.loads(runner.invoke(app, args).stdout)
    fewest = json.loads(runner.invoke(app, args + ["--objective", "fewest-gpus"]).stdout)
    assert auto == fewest and "objective" not in auto and auto["met"]
    assert auto["figures"]["cost.usd"] is None and auto["figures"]["cost.gpu_hours"] > 0


def test_plan_cli_error_paths():
    base = ["plan", str(TRACE), "--max-gpus", "1"]
    assert_one_line_error(runner.invoke(app, base + ["--slo", "infobench.latency.p95<=170", "--objective", "cheapest"]),
                          "seed-calibrated", "names no GPU type")
    assert_one_line_error(runner.invoke(app, base + ["-p", "h100-sxm-llama-3.1-8b-cuda-graph",
                                                     "--slo", "infobench.latncy.p95<=170"]),
                          "infobench.latncy.p95", "no such figure")
    assert_one_line_error(runner.invoke(app, base + ["--slo", "infobench.latency.p95<=170", "--objective", "money"]),
                          "--objective", "cheapest")
    assert_one_line_error(runner.invoke(app, base + ["--slo", "infobench.latency.p95<=170", "--objective",
                                                     "fewest-gpus", "-p", "seed-calibrated",
                                                     "-p", "h100-sxm-llama-3.1-8b-cuda-graph"]),
                          "one profile")


def test_the_docs_price_table_is_the_bundled_tables():
    import re

    from simulator.cost import prices_reference

    page = (ROOT / "docs" / "sweep-and-plan.md").read_text()
    block = re.search(r"<!-- BEGIN generated: price-tables -->\n(.*?)<!-- END generated: price-tables -->", page, re.S)
    assert block is not None and block.group(1) == prices_reference(), "run python docs/build.py docs/sweep-and-plan.md"


def test_the_cheapest_plan_scales_a_pool_to_zero_between_bursts():
    """Two bursts of 5 one-second prompts 1,000 s apart on one GPU per replica. A pool held at
    one replica pays the whole gap; a serverless pool with min 0 (cold start 10 s, scale-down
    after 20 s idle) pays two short lives and still meets latency max <= 40 s, so it is the
    cheapest; its cost is its replica-seconds at the price (the plan's floor on larger counts
    counts the fewest replicas held, 0, so it does not prune wrongly)."""
    bursts = make_trace([(float(t), ["x"]) for t in (*range(5), *range(1000, 1005))])
    pool_settings = {"autoscaler": "serverless", "max_replicas": 1, "target_inputs": 1.0,
                     "replica_cold_start": "10", "scaledown_window": 20.0}
    scenario = build_scenario(run=pool_settings)
    base = Base(bursts, fixed("fast", "fast-gpu", 1.0), scenario)
    result = cheapest([base], [parse_slo("x.latency.max<=40", ["x"])], PRICES,
                      {**NO_BATCHING, "min_replicas": (0, 1)}, max_gpus=2, workers=1)
    assert result.met and result.config["min_replicas"] == 0 and result.gpus == 1
    by_min = {p["config"]["min_replicas"]: p for p in result.points if p["gpus"] == 1}
    assert by_min[1]["met"] and by_min[1]["usd"] > 10 * by_min[0]["usd"]  # the gap, paid or not
    again = replay(bursts, build_scenario(run={**pool_settings, "min_replicas": 0, "gpus": 1},
                                          defaults={"flush": 0.0, "max_batch": 1}),
                   fixed("fast", "fast-gpu", 1.0), prices=PRICES)
    pool = again.summary["replicas"]
    assert result.figures["cost.usd"] == pytest.approx(pool["replica_seconds"] / 3600 * 3.0)
    assert pool["cold_starts"] == 2


# -- one model across GPU types ---------------------------------------------------------


def serving(name: str, gpu: str, model: str, seconds: float):
    """A fixed-time profile of ``model`` on ``gpu``, stated as ``simctl profile --gpu`` states it."""
    data = fixed(name, None, seconds).to_dict()
    data["meta"] = {"grounded": {"gpu": gpu, "backend": "b", "model": model, "draft": None, "engine": "e",
                                 "tasks": {}}}
    return profile_from_dict(data)


def test_a_cheapest_plan_refuses_profiles_of_different_models_unless_told():
    bases = [Base(STEADY, serving("small-on-slow", "slow-gpu", "qwen3-4b", 2.5), build_scenario()),
             Base(STEADY, serving("large-on-fast", "fast-gpu", "qwen3-8b", 1.0), build_scenario())]
    slos = [parse_slo("x.latency.max<=3", ["x"])]
    with pytest.raises(PlanError, match="small-on-slow serves qwen3-4b and large-on-fast serves qwen3-8b"):
        cheapest(bases, slos, PRICES, NO_BATCHING, max_gpus=4, workers=1)
    result = cheapest(bases, slos, PRICES, NO_BATCHING, max_gpus=4, workers=1, mixed_models=True)
    assert result.met and result.gpu_type == "fast-gpu"
    # one model on two GPU types is what a plan compares
    same = [Base(STEADY, serving("on-slow", "slow-gpu", "qwen3-8b", 2.5), build_scenario()), bases[1]]
    assert cheapest(same, slos, PRICES, NO_BATCHING, max_gpus=4, workers=1).gpu_type == "fast-gpu"


def test_plan_cli_refuses_mixed_models_in_one_line_and_the_flag_allows_them():
    args = ["plan", "example", "-p", "a100-sxm-qwen3-4b-hf-eager", "-p", "h100-sxm-qwen3-8b-qwen3-0.6b-cuda-graph",
            "--slo", "infobench.latency.p95<=170", "--flush", "0", "--topology", "shared", "--max-batch", "10",
            "--max-gpus", "2", "-j", "1"]
    assert_one_line_error(runner.invoke(app, args), "a100-sxm-qwen3-4b-hf-eager serves qwen3-4b",
                          "h100-sxm-qwen3-8b-qwen3-0.6b-cuda-graph serves qwen3-8b", "--mixed-models")
    result = runner.invoke(app, [*args, "--mixed-models", "--json", "-"])
    assert result.exit_code in (0, 1), result.output
    assert {p["model"] for p in json.loads(result.stdout)["profiles"]} == {"qwen3-4b", "qwen3-8b"}


def test_a_tensor_parallel_engine_pays_for_every_gpu_of_its_group(tmp_path):
    """The same run priced from a TP-4 profile costs four times the GPU-hours of a TP-1 one."""
    from simulator import load_profile
    from simulator.cost import cost_summary, gpus_per_engine, load_prices

    made = {}
    for tp in (1, 4):
        out = tmp_path / f"tp{tp}.json"
        result = runner.invoke(app, ["profile", "--gpu", "h100-sxm", "--model", "qwen3-8b", "--tp", str(tp),
                                     "-o", str(out)])
        assert result.exit_code == 0, result.output
        made[tp] = load_profile(str(out))
    assert [gpus_per_engine(made[tp]) for tp in (1, 4)] == [1, 4]
    summary = {"makespan_s": 3600.0, "overall": {"completed": 100}}
    scenario = type("S", (), {"gpus": 2})()
    one, four = (cost_summary(summary, scenario, made[tp], load_prices("modal-serverless")) for tp in (1, 4))
    assert one["gpu_hours"] == pytest.approx(2.0) and four["gpu_hours"] == pytest.approx(8.0)
    assert four["usd"] == pytest.approx(4 * one["usd"])
