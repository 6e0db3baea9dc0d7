"""The measurement harness on the CPU: decoder, batched speculative decoding, profiler."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

torch = pytest.importorskip("torch", reason="the harness needs torch (pip install torch==2.13.0)")

from simulator.harness.decoder import Decoder  # noqa: E402
from simulator.harness.presets import PRESETS, ModelShape  # noqa: E402
from simulator.harness.specdec import (  # noqa: E402
    Acceptance,
    SpecDecoder,
    expected_tokens_per_iteration,
    plain_generate,
)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Torch on one thread, as ``simctl profile`` measures (its ``--threads`` default): on
    models this small, more threads only spin, and what the tests check does not depend on it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


TINY = PRESETS["tiny"]
SMALL_VOCAB = dataclasses.replace(TINY, name="tiny-v16", vocab=16)


def model(shape: ModelShape = TINY, seed: int = 1) -> Decoder:
    return Decoder(shape, seed=seed, max_len=512)


def noisy_copy(m: Decoder, scale: float, seed: int = 9) -> Decoder:
    """A draft that agrees with ``m`` more or less, depending on ``scale``."""
    copy = model(m.shape, seed=1)
    copy.load_state_dict(m.state_dict())
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in copy.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return copy


# -- the decoder -----------------------------------------------------------------------


def test_presets_match_their_published_sizes():
    billions = {n: PRESETS[n].parameters() / 1e9 for n in ("qwen2.5-7b", "llama-2-7b", "qwen3-8b", "qwen3-4b")}
    assert billions["qwen2.5-7b"] == pytest.approx(7.62, abs=0.01)
    assert billions["llama-2-7b"] == pytest.approx(6.74, abs=0.01)
    assert billions["qwen3-8b"] == pytest.approx(8.19, abs=0.01)
    assert billions["qwen3-4b"] == pytest.approx(4.02, abs=0.01)
    assert PRESETS["qwen3-0.6b"].vocab == PRESETS["qwen3-8b"].vocab  # a valid draft/target pair


@pytest.mark.parametrize("shape", [TINY, dataclasses.replace(TINY, name="qwen3-like", qk_norm=True, qkv_bias=True,
                                                              tied_embeddings=True)])
def test_cached_decoding_gives_the_logits_of_a_full_forward(shape):
    """Prefill of ragged prompts, then one-token steps with a view < S_max: same logits as a
    plain causal forward of each row's own sequence (fp32; max abs difference < 1e-4)."""
    m = model(shape)
    g = torch.Generator().manual_seed(0)
    lengths = [9, 4, 7]
    seqs = [torch.randint(0, shape.vocab, (n + 6,), generator=g) for n in lengths]
    padded = torch.zeros(3, 9, dtype=torch.long)
    for b, n in enumerate(lengths):
        padded[b, :n] = seqs[b][:n]
    cache = m.new_cache(3, 64)
    first = m(padded, cache, view=16)
    cache.pos.copy_(torch.tensor(lengths))
    steps = []
    for t in range(6):
        tok = torch.stack([seqs[b][lengths[b] + t] for b in range(3)])[:, None]
        steps.append(m(tok, cache, view=16)[:, 0])
        cache.pos.add_(1)
    for b, n in enumerate(lengths):
        ref = m.full_forward(seqs[b][None])[0]
        assert (first[b, :n] - ref[:n]).abs().max() < 1e-4
        got = torch.stack([s[b] for s in steps])
        assert (got - ref[n: n + 6]).abs().max() < 1e-4


def test_weights_drawn_on_the_device_have_the_shape_and_scale_of_host_drawn_ones():
    """``init_on_device``: same parameters and buffers, weights of std 0.02, norms at one,
    the same logits for the same seed, and a working cached forward."""
    shape = dataclasses.replace(TINY, name="qwen3-like", qk_norm=True, qkv_bias=True)
    host, dev = model(shape), Decoder(shape, seed=1, max_len=512, init_on_device=True)
    assert {n: p.shape for n, p in host.named_parameters()} == {n: p.shape for n, p in dev.named_parameters()}
    assert torch.equal(host.cos, dev.cos) and torch.equal(host.sin, dev.sin)
    weights = torch.cat([p.flatten() for n, p in dev.named_parameters() if "norm" not in n])
    assert float(weights.std()) == pytest.approx(0.02, rel=0.05)
    assert all(torch.equal(p, torch.ones_like(p)) for n, p in dev.named_parameters() if "norm" in n)
    again = Decoder(shape, seed=1, max_len=512, init_on_device=True)
    tokens = torch.tensor([[3, 5, 7]])
    assert torch.equal(dev(tokens, dev.new_cache(1, 8)), again(tokens, again.new_cache(1, 8)))


# -- speculative decoding ------------------------------------------------------------


@pytest.mark.parametrize("discipline", ["ragged", "lockstep"])
@pytest.mark.parametrize("draft_kind", ["same", "noisy", "other"])
@pytest.mark.parametrize("B, k", [(1, 1), (3, 2), (5, 4)])
def test_batched_greedy_speculative_decoding_is_plain_greedy(discipline, draft_kind, B, k):
    target = model()
    draft = {"same": target, "noisy": noisy_copy(target, 0.004), "other": model(seed=2)}[draft_kind]
    g = torch.Generator().manual_seed(B * 10 + k)
    prompts = torch.randint(0, TINY.vocab, (B, 8), generator=g)
    lengths = [8 - (b % 4) for b in range(B)]
    reference = plain_generate(target, prompts, lengths, 25)
    out = SpecDecoder(target, draft, k, discipline=discipline, greedy=True, view_step=16).generate(
        prompts, lengths, 25)
    assert out.tokens == reference
    if draft_kind == "same":   # every draft accepted: k + 1 tokens per iteration
        assert out.tokens_per_iteration() > k


def test_noisy_draft_accepts_some_but_not_all():
    target = model()
    out = SpecDecoder(target, noisy_copy(target, 0.004), 3, greedy=True, view_step=16).generate(
        torch.randint(0, TINY.vocab, (4, 8)), [8] * 4, 40)
    assert 1.2 < out.tokens_per_iteration() < 3.9


def test_rows_of_different_max_tokens_finish_apart_and_stay_masked():
    target = model()
    out = SpecDecoder(target, target, 2, greedy=True, view_step=16).generate(
        torch.randint(0, TINY.vocab, (3, 6)), [6] * 3, [4, 13, 7])
    assert [len(t) for t in out.tokens] == [4, 13, 7]
    # all drafts accepted: 3 tokens an iteration after the prefill's first
    assert out.finish_iteration == [0, 3, 1]
    assert out.committed[:, 0].tolist() == [3, 0, 0, 0]


def peaked(seed: int) -> Decoder:
    """A 16-token model whose next-token distributions are far from uniform (random weights
    alone give nearly uniform ones, against which a wrong sampler would go unnoticed)."""
    m = model(SMALL_VOCAB, seed)
    with torch.no_grad():
        m.head.weight.mul_(15)
    return m


def second_token_pvalue(acceptance: Acceptance, n: int = 1500) -> float:
    """Chi-square p-value of the first speculatively decoded token (the second generated) of n
    identical rows, drafted by a different model, against its exact marginal under the target:
    sum over t1 of p(t1 | prompt) p(t2 | prompt, t1).

    1,500 rows are plenty: a sampler that skips the correction is rejected at p < 1e-300 (the
    negative control below), and one that skips it for only a fifth of the drafts (accepting
    them with probability 0.2 instead of min(1, p/q)) at p ≈ 1e-100."""
    target, draft = peaked(1), peaked(2)
    prompt = torch.tensor([[3, 1, 4, 1, 5]])
    p1 = torch.softmax(target.full_forward(prompt)[0, -1], -1)
    p2 = torch.zeros(16)
    for t1 in range(16):
        seq = torch.cat([prompt, torch.tensor([[t1]])], 1)
        p2 += p1[t1] * torch.softmax(target.full_forward(seq)[0, -1], -1)
    out = SpecDecoder(target, draft, 2, acceptance=acceptance, view_step=16, seed=3).generate(
        prompt.expand(n, -1), [5] * n, 2)
    counts = np.bincount([t[1] for t in out.tokens], minlength=16).astype(float)
    expected = p2.double().numpy() * n
    keep = expected >= 5            # pool the rare tokens into one bin
    observed, expect = counts[keep], expected[keep]
    if (~keep).any():
        observed = np.append(observed, counts[~keep].sum())
        expect = np.append(expect, expected[~keep].sum())
    return float(stats.chisquare(observed, expect * observed.sum() / expect.sum()).pvalue)


def test_speculative_sampling_reproduces_the_targets_distribution():
    assert second_token_pvalue(Acceptance("model")) > 1e-3


def test_the_distribution_test_catches_a_sampler_that_skips_the_correction():
    """Negative control: accepting every draft (no rejection, no residual) leaves the draft's
    distribution, and the same test rejects it."""
    assert second_token_pvalue(Acceptance.inject(1.0)) < 1e-6


def test_injected_acceptance_is_a_truncated_geometric():
    alpha, k = 0.7, 3
    target = model()
    # 128 rows give about 3,000 iterations of a row: an acceptance rate off by 0.05 either
    # way fails both checks (chi-square p < 1e-13, the mean 7.8 SE or more away)
    out = SpecDecoder(target, target, k, acceptance=Acceptance.inject(alpha), view_step=16, seed=5).generate(
        torch.randint(0, TINY.vocab, (128, 6)), [6] * 128, 60)
    active = out.committed > 0
    accepted = out.accepted[active].numpy()
    pmf = np.array([alpha**j * (1 - alpha) for j in range(k)] + [alpha**k])
    counts = np.bincount(accepted, minlength=k + 1)
    assert stats.chisquare(counts, pmf * counts.sum()).pvalue > 1e-3
    # ragged: each active row commits n + 1; its mean is (1 - a^(k+1)) / (1 - a) within 4 SE
    committed = out.committed[active].numpy()
    se = committed.std(ddof=1) / np.sqrt(committed.size)
    assert abs(committed.mean() - expected_tokens_per_iteration(alpha, k)) < 4 * se


def test_lockstep_advances_every_row_by_the_minimum():
    target = model()
    prompts = torch.randint(0, TINY.vocab, (8, 6))
    kw = dict(acceptance=Acceptance.inject(0.7), view_step=16, seed=4)
    lock = SpecDecoder(target, target, 3, discipline="lockstep", **kw).generate(prompts, [6] * 8, 40)
    ragged = SpecDecoder(target, target, 3, discipline="ragged", **kw).generate(prompts, [6] * 8, 40)
    for it in range(lock.iterations):
        live = lock.committed[it][lock.committed[it] > 0]
        assert live.unique().numel() == 1
        assert live[0] == lock.accepted[it][lock.committed[it] > 0].min() + 1
    assert lock.iterations > ragged.iterations


def test_per_position_vector_and_recorded_acceptance():
    target = model()
    prompts = torch.randint(0, TINY.vocab, (4, 6))
    vec = SpecDecoder(target, target, 3, acceptance=Acceptance("vector", vector=(1.0, 1.0, 0.0)),
                      view_step=16).generate(prompts, [6] * 4, 30)
    assert set(vec.accepted[vec.committed > 0].tolist()) == {2}
    table = ((0, 1, 2, 3),) * 20
    rec = SpecDecoder(target, target, 3, acceptance=Acceptance("replay", recorded=table),
                      view_step=16).generate(prompts, [6] * 4, 30)
    assert rec.accepted[0].tolist() == [0, 1, 2, 3]


def test_adaptive_lookahead_grows_on_full_acceptance_and_shrinks_otherwise():
    target = model()
    prompts = torch.randint(0, TINY.vocab, (2, 6))
    up = SpecDecoder(target, target, 1, adaptive=True, k_max=6, acceptance=Acceptance.inject(1.0),
                     view_step=16).generate(prompts, [6, 6], 40)
    assert up.lookahead[:4] == [1, 3, 5, 6]
    down = SpecDecoder(target, target, 5, adaptive=True, acceptance=Acceptance.inject(0.0),
                       view_step=16).generate(prompts, [6, 6], 12)
    assert down.lookahead[:6] == [5, 4, 3, 2, 1, 1]


# -- the profiler and the spec_decode kind ---------------------------------------------


@pytest.fixture(scope="module")
def quick_profile(tmp_path_factory):
    from typer.testing import CliRunner

    from simulator.cli import app

    path = tmp_path_factory.mktemp("profile") / "quick.json"
    # The quick grid narrowed to batches 1 and 2, 12 tokens a row and one timed repeat a
    # step: every operation and every generation kind is still measured and recorded, 16
    # generations held out (the tests below ask for what is recorded, not for how well it
    # fits, which one repeat makes noisier), at a fraction of the quick grid's cost.
    result = CliRunner().invoke(app, ["profile", "--device", "cpu", "--quick", "--batch", "1,2", "--max-tokens", "12",
                                      "--repeats", "1", "-o", str(path)])
    assert result.exit_code == 0, result.stderr
    print(result.stdout)
    return path


def test_quick_profile_records_what_it_measured(quick_profile):
    """The quick CPU profile holds every operation, the held-out check and the pinned threads.
    (How well it fits depends on how busy the machine is: benchmarks/quick_profile.py measures
    that; the fitting itself is tested on injected timings below.)"""
    profile = json.loads(quick_profile.read_text())
    check = profile["meta"]["fit_check"]
    assert check["held_out"] >= 10 and check["median_ape"] is not None
    ops = {r["op"] for r in profile["meta"]["measurements"]}
    assert ops == {"prefill_target", "prefill_draft", "draft_step", "verify", "decode"}
    assert profile["tasks"]["infobench"]["service"]["kind"] == "spec_decode"
    assert profile["meta"]["torch"] == torch.__version__
    assert profile["meta"]["threads"] == 1


def _injected_measurements(noise: float, seed: int = 0):
    """Step and generation timings made from known costs (times ``1 ± noise``), as the profiler
    records them."""
    from simulator.harness.fit import GenerationRecord, predict_generation
    from simulator.harness.profiler import Measurements
    from simulator.profile.kinds.spec_decode import Cost

    rng = np.random.default_rng(seed)
    truth = {"prefill_target": Cost("prefill", (2e-3, 4e-6, 1e-9)), "prefill_draft": Cost("prefill", (1e-3, 1e-6, 2e-10)),
             "draft_step": Cost("step", (1e-3, 2e-6, 1e-9)), "verify": Cost("step", (3e-3, 6e-6, 3e-9)),
             "decode": Cost("step", (2.5e-3, 5e-6, 2e-9)), "iteration": Cost("iteration", (4e-4, 1e-4))}
    m = Measurements()
    jitter = lambda: 1 + noise * rng.uniform(-1, 1)  # noqa: E731
    for op in ("prefill_target", "prefill_draft"):
        for b in (1, 2, 4, 8):
            for p in (32, 128, 512):
                m.rows.append({"op": op, "batch": b, "prompt_tokens": p, "median_s": float(truth[op](b, p)) * jitter()})
    for op in ("draft_step", "verify", "decode"):
        for b in (1, 2, 4, 8):
            for t in (1, 2, 4):
                for v in (64, 256, 1024):
                    m.rows.append({"op": op, "batch": b, "tokens": t, "view": v,
                                   "median_s": float(truth[op](b, t, v)) * jitter()})
    for i in range(24):
        b, p = (1, 2, 4, 8)[i % 4], (32, 128, 512)[i % 3]
        ks = [int(k) for k in rng.integers(1, 5, size=20)]
        views = [p + 8 * j for j in range(20)]
        g = GenerationRecord(b, p, ks, views, 0.0)
        m.generations.append({"batch": b, "prompt_tokens": p, "lookahead_per_iteration": ks, "views": views,
                              "median_s": predict_generation(truth, g) * jitter()})
    return m


@pytest.mark.parametrize("noise, median_limit", [(0.0, 1e-6), (0.02, 0.03)])
def test_fitted_costs_predict_held_out_generations_of_injected_timings(noise, median_limit):
    from simulator.harness.profiler import fit_costs

    _, check = fit_costs(_injected_measurements(noise))
    assert check["held_out"] == 12
    assert check["median_ape"] < median_limit and check["max_ape"] < max(4 * median_limit, 1e-6)


def test_a_failed_held_out_check_warns_and_strict_exits_nonzero():
    from simulator.cli.profile import held_out_missed

    assert held_out_missed({"held_out": 12, "median_ape": 0.02, "max_ape": 0.1}) == ""
    assert "median 99 %" in held_out_missed({"held_out": 12, "median_ape": 0.99, "max_ape": 3.0})


def test_default_profile_path_is_per_user_and_never_a_bundled_name(tmp_path, monkeypatch):
    from simulator.cli.profile import default_profile_path

    monkeypatch.setenv("SIMCTL_HOME", str(tmp_path))
    assert default_profile_path("h100__qwen3-8b__qwen3-0.6b") == tmp_path / "profiles" / "h100__qwen3-8b__qwen3-0.6b.json"
    assert default_profile_path("cpu__tiny__tiny") == tmp_path / "profiles" / "cpu__tiny__tiny-measured.json"


def test_profile_makes_its_default_folder_on_first_use(tmp_path, monkeypatch, quick_profile):
    """With a fresh home, the default profile folder does not exist yet: ``simctl profile``
    makes it (``$XDG_DATA_HOME/simctl/profiles``) and writes there; a folder the user names
    with ``-o`` is never made. (Where the profile goes is the point here: the measuring is
    the quick profile's, measured once for the module.)"""
    from typer.testing import CliRunner

    from simulator.cli import app
    from simulator.harness import profiler

    measured = json.loads(quick_profile.read_text())
    monkeypatch.setattr(profiler, "run_profile", lambda grid, dev, progress=None: json.loads(json.dumps(measured)))

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.delenv("SIMCTL_HOME", raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / "data"))
    runner = CliRunner()
    missing = tmp_path / "not-made" / "p.json"
    refused = runner.invoke(app, ["profile", "--device", "cpu", "--quick", "-o", str(missing)])
    assert refused.exit_code == 2 and "does not exist" in refused.stderr
    assert not missing.parent.exists()
    result = runner.invoke(app, ["profile", "--device", "cpu", "--quick"])
    assert result.exit_code == 0, result.stderr
    written = home / "data" / "simctl" / "profiles" / "cpu__tiny__tiny-measured.json"
    assert json.loads(written.read_text())["name"], result.stdout


def test_default_profile_folder_without_xdg_is_under_home(tmp_path, monkeypatch):
    from simulator.cli.profile import default_profile_path

    monkeypatch.delenv("SIMCTL_HOME", raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_profile_path("x") == tmp_path / ".local" / "share" / "simctl" / "profiles" / "x.json"
    assert (tmp_path / ".local" / "share" / "simctl" / "profiles").is_dir()


def test_quick_profile_replays(quick_profile):
    from typer.testing import CliRunner

    from simulator.cli import app

    trace = Path(__file__).resolve().parent.parent / "traces" / "batch_arrivals.json"
    runner = CliRunner()
    base = runner.invoke(app, ["replay", str(trace), "--profile", str(quick_profile), "--json", "-"])
    assert base.exit_code == 0, base.stderr
    slow = runner.invoke(app, ["replay", str(trace), "--profile", str(quick_profile), "--json", "-",
                               "--acceptance", "0.05"])
    a, b = json.loads(base.stdout), json.loads(slow.stdout)
    # Same lookahead (3), fewer accepted drafts: more iterations for the same tokens.
    assert b["config"]["tasks"]["infobench"]["acceptance"] == 0.05
    assert b["tasks"]["infobench"]["service"]["mean"] > 1.1 * a["tasks"]["infobench"]["service"]["mean"]


def test_profile_refuses_to_overwrite(quick_profile):
    from typer.testing import CliRunner

    from simulator.cli import app

    before = quick_profile.read_text()
    result = CliRunner().invoke(app, ["profile", "--device", "cpu", "--quick", "-o", str(quick_profile)])
    assert result.exit_code == 2 and "--force" in result.stderr
    assert quick_profile.read_text() == before


@pytest.mark.slow
def test_harness_never_imports_simpy_and_replay_never_imports_torch():
    # One fresh interpreter for both: replay first (no torch), then the harness on top. Where
    # replay leaves simpy out too, simpy still missing after the harness is imported means
    # the harness does not import it; where replay takes simpy in, the harness is checked
    # in an interpreter of its own.
    check = ("import sys, simulator, simulator.replay, simulator.cli.replay; "
             "assert 'torch' not in sys.modules, 'replay imported torch'; "
             "replay_took_simpy = 'simpy' in sys.modules; "
             "import simulator.harness.profiler, simulator.harness.specdec, simulator.profile; "
             "assert 'torch' in sys.modules; "
             "assert replay_took_simpy or 'simpy' not in sys.modules, 'harness imported simpy'; "
             # a decoder laid out on the meta device and drawn on its own (a GPU profile's)
             # loads none of torch's compiler: seconds of CPU a process for nothing
             "from simulator.harness.decoder import Decoder; from simulator.harness.presets import get_preset; "
             "Decoder(get_preset('tiny'), 'cpu', init_on_device=True); "
             "assert 'torch._dynamo' not in sys.modules, 'building a decoder imported torch._dynamo'; "
             "sys.exit(3 if replay_took_simpy else 0)")
    returncode = subprocess.run([sys.executable, "-c", check]).returncode
    assert returncode in (0, 3), "the check failed in its interpreter (its assertion is printed above)"
    if returncode == 0:
        return
    check = ("import sys, simulator.harness.profiler, simulator.harness.specdec; "
             "assert 'simpy' not in sys.modules, 'harness imported simpy'; "
             "import simulator.replay, simulator.profile; "
             "assert 'torch' in sys.modules")
    subprocess.run([sys.executable, "-c", check], check=True)


def test_out_of_memory_is_recorded_and_larger_batches_are_skipped(monkeypatch):
    """A grid point that runs out of GPU memory is recorded, every larger batch of that
    operation is skipped, and the rest of the grid still runs (simulated OOM on the CPU)."""
    from simulator.harness import profiler

    real = profiler.time_call

    def flaky(fn, device, *args, **kwargs):
        frame = sys._getframe(1)
        B = frame.f_locals.get("B")
        if B is not None and B >= 2 and "model" in frame.f_locals and frame.f_code.co_name in ("prefill", "single_step"):
            raise torch.cuda.OutOfMemoryError("simulated")
        return real(fn, device, *args, **kwargs)

    monkeypatch.setattr(profiler, "time_call", flaky)
    grid = dataclasses.replace(profiler.Grid.quick(), batch=(1, 2, 4), prompt_tokens=(16,), lookahead=(1,),
                               acceptance=(0.5,), disciplines=("ragged",), repeats=1)
    profile = profiler.run_profile(grid, torch.device("cpu"))
    errors = profile["meta"]["errors"]
    prefill = [e for e in errors if e["op"] == "prefill_target"]
    assert [(e["batch"], e["error"].split(":")[0]) for e in prefill][:2] == [(2, "CUDA out of memory"), (4, "skipped")]
    measured = {(r["op"], r["batch"]) for r in profile["meta"]["measurements"]}
    assert ("prefill_target", 1) in measured and ("prefill_target", 2) not in measured
    assert len(profile["meta"]["generations"]) == 3   # generations were not affected
