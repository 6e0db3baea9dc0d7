"""Grounded profiles: execution styles in the composition, the engine's host costs on top of
the kernels, profiles composed for a named GPU, and the interpreter-lock share they compute."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import make_trace, run, timeline
from typer.testing import CliRunner

from simulator.cli import app
from simulator.errors import ProfileError
from simulator.hardware import load_gpu
from simulator.hardware.compose import Pass, decode_step, forward, prefill, uncached_pass
from simulator.hardware.engines import ENGINES, get_engine
from simulator.hardware.grounded import BOUNDS, GpuTask, grounded_profile
from simulator.harness.presets import get_preset
from simulator.profile import load_profile, profile_from_dict
from simulator.profile.kinds import BatchShape
from simulator.profile.overhead import EngineOverhead


@pytest.fixture(scope="module")
def a100():
    return load_gpu("a100-sxm")


# -- execution styles ---------------------------------------------------------------------

@pytest.mark.parametrize("model, per_layer", [("qwen3-4b", 61), ("llama-3.1-8b", 45)])
def test_hf_eager_counts_the_kernels_its_modules_launch(a100, model, per_layer):
    # per layer: 2 RMSNorms of 8 kernels, q/k/v/o/gate/up/down GEMMs, RoPE 2 x 5, cache cat 2,
    # repeat_kv 2, SDPA 3, transpose, SiLU and mul, 2 residual adds (+ q/k norms for Qwen3)
    shape = get_preset(model)
    one = forward(a100, shape, Pass(1, 1, 100, False, 1, False), "hf-eager")
    two = forward(a100, shape, Pass(1, 1, 100, False, 1, True), "hf-eager")
    head = 1 + 14 + 8 + 1 + 1   # embedding, preamble, final norm, LM head, fp32 logits
    assert one.kernels == shape.layers * per_layer + head
    assert two.kernels - one.kernels == 17 + 12   # sampling processors and bookkeeping


@pytest.mark.parametrize("model", ["qwen3-0.6b", "qwen3-4b", "llama-3.1-8b"])
def test_eager_steps_cost_more_than_fused_ones_and_respect_the_floor(a100, model):
    shape = get_preset(model)
    for rows in (1, 8, 30):
        for context in (100, 800):
            eager = decode_step(a100, shape, [context] * rows, "hf-eager")
            fused = decode_step(a100, shape, [context] * rows)
            assert eager.seconds > fused.seconds
            assert eager.seconds >= eager.floor_seconds
            assert eager.seconds == pytest.approx(sum(eager.parts.values()))
            assert eager.kernels > 4 * fused.kernels


def test_the_eager_cache_copy_streams_the_whole_cache_every_step(a100):
    # torch.cat reads the old cache and writes the new one: 2 (K, V) x 2 bytes x rows x
    # KV width x (old + new length) per layer, at the effective bandwidth
    shape = get_preset("qwen3-4b")
    kv = shape.kv_heads * shape.head_dim
    short = decode_step(a100, shape, [100] * 4, "hf-eager").parts["cache copy"]
    long = decode_step(a100, shape, [1000] * 4, "hf-eager").parts["cache copy"]
    extra_bytes = shape.layers * 2 * 2 * 4 * kv * 2 * 900
    assert long - short == pytest.approx(extra_bytes / a100.effective_bandwidth)
    assert decode_step(a100, shape, [100] * 32, "hf-eager").parts["cache copy"] > short
    assert "cache copy" not in decode_step(a100, shape, [100] * 4).parts   # paged in place


def test_a_pass_without_cache_runs_the_lm_head_at_every_position(a100):
    shape = get_preset("qwen3-4b")
    cost = uncached_pass(a100, shape, 4, 300)
    assert cost.parts["lm_head"] == pytest.approx(a100.gemm(4 * 300, shape.vocab, shape.hidden).seconds)
    assert "cache copy" not in cost.parts
    assert uncached_pass(a100, shape, 8, 300).seconds > 1.5 * cost.seconds
    assert cost.seconds > prefill(a100, shape, [300] * 4, "hf-eager").seconds   # every position's logits


# -- the engine's host costs --------------------------------------------------------------

def test_host_time_overlaps_or_adds_to_the_kernels():
    e = EngineOverhead("e", launch_s=1e-5, step_s=1e-3, row_s=1e-4, overlap=True, kernels={"step": 100})
    assert e.host("step", 10) == pytest.approx(1e-3 + 100e-5 + 10e-4)
    assert e.combine(0.005, 0.003) == 0.005 and e.combine(0.001, 0.003) == 0.003
    serial = EngineOverhead("e", step_s=1e-3, overlap=False)
    assert serial.combine(0.005, serial.host("step")) == pytest.approx(0.006)


def iteration_profile(engine: dict | None, finished_rows: str = "stay") -> dict:
    service = {"kind": "iteration", "step": {"base": 0.01, "per_row": 0.002, "per_context_token": 0.0},
               "finished_rows": finished_rows}
    if engine is not None:
        service["engine"] = engine
    return {"tasks": {"a": {"resource": "gpu", "prompt_tokens": 10, "max_tokens": 4, "service": service}}}


def test_a_static_batch_takes_the_longer_of_host_and_kernels_in_each_iteration():
    engine = {"name": "e", "overlap": True, "launch_s": 0.0, "step_s": 0.015, "row_s": 0.0,
              "interpreter_share": 0.5, "kernels": {"step": 10, "prefill": 10}}
    service = profile_from_dict(iteration_profile(engine)).tasks["a"].service
    # 1 row: kernels 0.012 s < host 0.015 s each iteration; 4 rows: kernels 0.018 > 0.015
    assert service.mean(BatchShape(1, 10, 4, (4,))) == pytest.approx(4 * 0.015)
    assert service.mean(BatchShape(4, 10, 4, (4,) * 4)) == pytest.approx(4 * 0.018)
    # the lock is held for the interpreter share of the host time
    assert service.host_fraction(BatchShape(1, 10, 4, (4,))) == pytest.approx(0.5)
    assert service.host_fraction(BatchShape(4, 10, 4, (4,) * 4)) == pytest.approx(0.5 * 0.015 / 0.018)
    assert profile_from_dict(iteration_profile(None)).tasks["a"].service.host_fraction(BatchShape(1, 10, 4)) is None


def test_an_engine_block_is_checked_field_by_field():
    for bad, field in [({"launch_s": -1}, "service.engine.launch_s"), ({"overlap": "yes"}, "service.engine.overlap"),
                       ({"interpreter_share": 2}, "service.engine.interpreter_share"),
                       ({"kernels": {"decode": 3}}, "service.engine.kernels.decode"),
                       ({"speed": 1}, "service.engine.speed")]:
        with pytest.raises(ProfileError) as err:
            profile_from_dict(iteration_profile({"name": "e", **bad}), "p.json")
        assert field in str(err.value) and "p.json" in str(err.value)


def test_spec_decode_passes_take_the_engine_host_time():
    costs = {op: {"form": form, "coef": coef} for op, form, coef in [
        ("prefill_target", "prefill", [0.0, 0.0, 0.0]), ("prefill_draft", "prefill", [0.0, 0.0, 0.0]),
        ("draft_step", "step", [0.001, 0.0, 0.0]), ("verify", "step", [0.004, 0.0, 0.0]),
        ("iteration", "iteration", [0.0, 0.0])]}
    engine = {"name": "e", "overlap": True, "launch_s": 1e-5, "step_s": 0.0, "row_s": 0.001,
              "kernels": {"draft": 200, "verify": 300}}
    spec = {"kind": "spec_decode", "costs": costs, "acceptance": 0.0, "lookahead": 2, "kv_cache": False,
            "engine": engine}
    service = profile_from_dict({"tasks": {"a": {"service": spec}}}).tasks["a"].service
    # acceptance 0: one token per round, 5 rounds for 5 tokens; a round is 2 draft passes of
    # max(0.001, 0.002), one verify of max(0.004, 0.003) and 3 rows x 0.001
    t = service.sample(BatchShape(3, 10, 5, (5, 5, 5)), np.random.default_rng(0))
    assert t == pytest.approx(5 * (2 * 0.002 + 0.004 + 0.003))


# -- profiles composed for a named GPU ----------------------------------------------------

@pytest.fixture(scope="module")
def users_profile(a100):
    base = load_profile("qwen3-4b-nospec-start").to_dict()
    return grounded_profile(base, a100, get_engine("hf-eager"), get_preset("qwen3-4b"),
                            tasks=[GpuTask("mmlu", 250, 50, 30), GpuTask("infobench", 350, 512, 8)])


def test_a_grounded_profile_loads_and_says_where_every_number_comes_from(users_profile):
    profile = profile_from_dict(users_profile)
    assert profile.tasks["graph"].resource == "cpu"        # the base profile's CPU task is kept
    for task in ("mmlu", "infobench"):
        service = users_profile["tasks"][task]["service"]
        assert service["kind"] == "iteration" and service["finished_rows"] == "stay"
        engine = service["engine"]
        assert set(engine["provenance"]) >= {"launch_s", "step_s", "row_s", "interpreter_share", "kernels"}
        meta = users_profile["meta"]["grounded"]["tasks"][task]
        assert meta["fit"]["decode"]["max"] < 0.05        # the linear step form holds on the grid
        assert sum(meta["provenance"].values()) == pytest.approx(1.0, abs=1e-3)
    assert {p["path"] for p in users_profile["meta"]["calibrate"]} == {"service.engine.launch_s"}


def test_the_host_share_of_a_batch_is_an_output(a100, users_profile):
    # an eager step of one row is host-bound; a graph engine's host adds nothing by default
    for task in ("mmlu", "infobench"):
        share = users_profile["meta"]["grounded"]["tasks"][task]["host_share"]
        assert share["1 rows"] == pytest.approx(1.0)
        assert 0 < min(share.values()) <= 1
    graphs = grounded_profile(load_profile("qwen3-4b-nospec-start").to_dict(), a100, get_engine("cuda-graph"),
                              get_preset("qwen3-4b"), tasks=[GpuTask("mmlu", 250, 50, 30)])
    assert set(graphs["meta"]["grounded"]["tasks"]["mmlu"]["host_share"].values()) == {0.0}


def test_calibration_of_a_grounded_profile_frees_only_the_engine(a100, users_profile):
    from simulator.calibrate import _with_values, free_parameters

    assert [p.name for p in free_parameters(users_profile, "p")] == ["engine.launch_s"]
    base = load_profile("qwen3-4b-nospec-start").to_dict()
    every = grounded_profile(base, a100, get_engine("hf-eager"), get_preset("qwen3-4b"),
                             tasks=[GpuTask("mmlu", 250, 50, 30), GpuTask("infobench", 350, 512, 8)], free=list(BOUNDS))
    params = free_parameters(every, "p")
    changed = _with_values(every, params, np.array([5e-5, 2e-3, 1e-4, 0.7]))
    for task in ("mmlu", "infobench"):
        assert changed["tasks"][task]["service"]["engine"]["launch_s"] == 5e-5      # tied across tasks
        assert changed["tasks"][task]["service"]["engine"]["interpreter_share"] == 0.7
        assert changed["tasks"][task]["service"]["step"] == every["tasks"][task]["service"]["step"]


def test_the_fitted_step_reproduces_the_composition(a100, users_profile):
    step = users_profile["tasks"]["mmlu"]["service"]["step"]
    composed = decode_step(a100, get_preset("qwen3-4b"), [280] * 12, "hf-eager").seconds
    fitted = step["base"] + step["per_row"] * 12 + step["per_context_token"] * 12 * 280
    assert fitted == pytest.approx(composed, rel=0.05)


def test_a_speculative_task_without_cache_prices_whole_sequences(a100):
    base = load_profile("qwen3-4b-specdec-start").to_dict()
    data = grounded_profile(base, a100, get_engine("hf-eager"), get_preset("qwen3-4b"), get_preset("qwen3-0.6b"),
                            tasks=[GpuTask("infobench", 350, 512, 10, True)], kv_cache=False, acceptance=0.02)
    service = profile_from_dict(data).tasks["infobench"].service
    assert service.kind == "spec_decode" and not service.kv_cache
    verify = service.costs["verify"]
    assert float(verify(4, 600, 600)) == pytest.approx(uncached_pass(a100, get_preset("qwen3-4b"), 4, 600).seconds,
                                                       rel=0.05)
    assert set(service.engine.kernels) == {"draft", "verify"}


def test_batches_on_two_gpus_slow_each_other_by_the_share_the_engine_computes():
    engine = {"name": "e", "overlap": True, "step_s": 0.01, "interpreter_share": 1.0, "kernels": {"step": 0}}
    data = iteration_profile(engine)
    trace = make_trace([(0, ["a"]), (0, ["a"])])
    # host-bound iterations (0.012 s of kernels < ... no: 0.01 + 0.002 = 0.012 > host 0.01),
    # so each batch of 4 iterations takes 0.048 s alone and holds the lock 0.04 of them
    alone = timeline(run(trace, profile_from_dict(data), gpus=2, topology="direct", dispatch="round-robin"))
    locked = timeline(run(trace, profile_from_dict(data), gpus=2, topology="direct", dispatch="round-robin",
                          host_lock=True))
    assert [t for _, t in alone] == [pytest.approx(0.048)] * 2
    f = 0.01 / 0.012
    from simulator.model.resources import host_slowdown
    assert [t for _, t in locked] == [pytest.approx(0.048 * host_slowdown(2, f))] * 2
    data["tasks"]["a"]["service"]["engine"]["interpreter_share"] = 0.0
    assert timeline(run(trace, profile_from_dict(data), gpus=2, topology="direct", dispatch="round-robin",
                        host_lock=True)) == alone


# -- the command --------------------------------------------------------------------------

def test_profile_composes_for_a_named_gpu(tmp_path):
    out = tmp_path / "p.json"
    result = CliRunner().invoke(app, ["profile", "--gpu", "h100-sxm", "--model", "qwen3-8b", "--draft", "qwen3-0.6b",
                                      "--spec-task", "infobench", "--engine", "cuda-graph", "-o", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["tasks"]["infobench"]["service"]["kind"] == "spec_decode"
    assert data["tasks"]["mmlu"]["service"]["kind"] == "iteration"
    assert data["meta"]["grounded"]["engine"] == "cuda-graph"
    # under graphs there is no launch cost to fit: calibration frees the per-step host cost
    assert [p["name"] for p in data["meta"]["calibrate"]] == ["engine.step_s"]
    profile_from_dict(data)


@pytest.mark.parametrize("args, field", [
    (["--gpu", "b200", "--model", "qwen3-4b"], "gpu"),
    (["--gpu", "a100-sxm"], "--model"),
    (["--gpu", "a100-sxm", "--model", "qwen3-4b", "--engine", "lmdeploy"], "engine"),
    (["--gpu", "a100-sxm", "--model", "qwen3-4b", "--spec-task", "infobench"], "--spec-task"),
    (["--gpu", "a100-sxm", "--model", "qwen3-4b", "--draft", "qwen3-0.6b", "--spec-task", "graph"], "--spec-task"),
])
def test_profile_refuses_bad_input_in_one_line(tmp_path, args, field):
    result = CliRunner().invoke(app, ["profile", *args, "-o", str(tmp_path / "p.json")])
    assert result.exit_code == 2
    assert "Traceback" not in result.output and field in result.output
    assert not (tmp_path / "p.json").exists()


def test_every_engine_states_the_source_of_each_default():
    for engine in ENGINES.values():
        assert set(engine.sources) == set(engine.defaults)
        assert all(len(text) > 20 for text in engine.sources.values())


# -- calibrating the engine alone -----------------------------------------------------------

def test_a_value_is_identified_only_when_its_error_and_its_spread_over_fits_are_small():
    import pandas as pd

    from simulator.calibrate import CalibrationResult, identified

    result = CalibrationResult(
        profile={}, values={"a": 1.0, "b": 1.0, "c": 1.0}, relative_se={"a": 0.1, "b": 0.9, "c": 0.1},
        correlation=np.eye(3), errors=pd.DataFrame(), cost=0.0, evaluations=0,
        ensemble_values=[{"a": 1.0, "b": 1.0, "c": 1.0}, {"a": 1.5, "b": 1.0, "c": 5.0}])
    assert identified(result) == {"a": True, "b": False, "c": False}


REQUEST = (Path(__file__).resolve().parents[2] / "shared" / "traces" / "real" / "lminference" / "EEElisa@dfb2bf8"
           / "mingqia2_3" / "request")


@pytest.mark.skipif(not REQUEST.exists(), reason=f"the users' real runs are not at {REQUEST}")
def test_calibrating_a_grounded_profile_moves_only_the_engine_and_says_what_the_run_pins(tmp_path, users_profile):
    start = tmp_path / "start.json"
    start.write_text(json.dumps(users_profile))
    out = tmp_path / "fitted.json"
    result = CliRunner().invoke(app, [
        "calibrate", str(REQUEST / "batch_results_4B_4queues_nothinking"), "-s", "lminference-4queues",
        "--start", str(start), "-o", str(out), "--screen", "4", "--starts", "2", "--max-evaluations", "6",
        "--seeds", "1"])
    assert result.exit_code == 0, result.output
    assert "identified" in result.output and "engine.launch_s" in result.output
    fitted = json.loads(out.read_text())
    for task in ("mmlu", "infobench"):
        before, after = users_profile["tasks"][task]["service"], fitted["tasks"][task]["service"]
        assert after["step"] == before["step"]                     # kernel costs fixed
        assert after["engine"]["launch_s"] == fitted["meta"]["fit"]["values"]["engine.launch_s"]


def test_a_hugging_face_config_gives_the_preset_it_describes(tmp_path):
    from simulator.errors import UnknownPreset
    from simulator.harness.presets import load_shape

    qwen = get_preset("qwen3-4b")
    config = {"model_type": "qwen3", "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
              "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
              "tie_word_embeddings": True, "rope_theta": 1000000, "rms_norm_eps": 1e-6}
    path = tmp_path / "Qwen3-4B" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(config))
    shape = load_shape(path)
    assert (shape.name, shape.parameters()) == ("Qwen3-4B", qwen.parameters())
    assert {k: v for k, v in shape.to_dict().items() if k not in ("name", "source")} == \
        {k: v for k, v in qwen.to_dict().items() if k not in ("name", "source")}
    out = tmp_path / "p.json"
    result = CliRunner().invoke(app, ["profile", "--gpu", "a100-sxm", "--model", str(path), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["meta"]["grounded"]["model"] == "Qwen3-4B"
    path.write_text(json.dumps({**config, "model_type": "mamba"}))
    with pytest.raises(UnknownPreset, match="model_type"):
        load_shape(path)
    path.write_text(json.dumps({**config, "hidden_size": "wide"}))
    result = CliRunner().invoke(app, ["profile", "--gpu", "a100-sxm", "--model", str(path), "-o", str(out), "--force"])
    assert result.exit_code == 2 and "hidden_size" in result.output and "Traceback" not in result.output
