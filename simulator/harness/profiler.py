"""``simctl profile``: sweep the harness over a grid, fit per-operation costs, write a profile.

Measured, for a target/draft pair on one device:

* ``prefill_target`` / ``prefill_draft``: a forward over B prompts of P tokens;
* ``draft_step`` (T = 1 and the 2-token first step), ``verify`` (T = k + 1) and ``decode``
  (plain target step, T = 1), each over batch B at context lengths around the grid's
  prompts and outputs;
* whole batched generations (B, P, max tokens, k, injected acceptance alpha, discipline),
  with the iterations, the lookahead and cache view of each, tokens per iteration and the
  iteration each row finished.

On a GPU it first measures copy bandwidth and records for every step its memory floor
(weights plus KV cache read, over that bandwidth) and measured/floor; a step below its
floor is an error in the measurement and is reported. Costs are fitted per operation
(:mod:`simulator.harness.fit`) and checked on held-out generations. A point that runs out of
GPU memory is recorded and every larger batch of that operation is skipped.
"""

from __future__ import annotations

import datetime as _dt
import platform
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from simulator.errors import HarnessError
from simulator.harness.decoder import Decoder
from simulator.harness.fit import (
    Cost,
    GenerationRecord,
    check_generations,
    fit_cost,
    fit_iteration_overhead,
)
from simulator.harness.presets import ModelShape, get_preset
from simulator.harness.specdec import Acceptance, SpecDecoder, StepRunner, _bucket
from simulator.harness.timing import Timing, measure_bandwidth, synchronize, time_call

OOM_ERRORS: tuple[type[BaseException], ...] = (torch.cuda.OutOfMemoryError,)


@dataclass(frozen=True)
class Grid:
    """What to measure. ``quick()`` is the small CPU grid on ``tiny``."""

    target: str = "qwen2.5-7b"
    draft: str = "qwen2.5-0.5b"
    batch: tuple[int, ...] = (1, 2, 4, 8, 16)
    lookahead: tuple[int, ...] = (1, 3, 5)
    acceptance: tuple[float, ...] = (0.5, 0.7, 0.9)
    prompt_tokens: tuple[int, ...] = (128, 512, 2048)
    max_tokens: int = 512
    disciplines: tuple[str, ...] = ("ragged", "lockstep")
    repeats: int = 5
    warmup: int = 2
    generation_repeats: int = 1
    graphs: bool = True
    compile: bool = False
    view_step: int = 256
    seed: int = 0

    @classmethod
    def quick(cls) -> Grid:
        return cls(target="tiny", draft="tiny", batch=(1, 2, 4), lookahead=(1, 3),
                   acceptance=(0.5, 0.8), prompt_tokens=(16, 64), max_tokens=24, repeats=3,
                   warmup=1, view_step=16)

    def contexts(self) -> list[int]:
        """Context lengths the steps are timed at: each prompt, and halfway and all the way out."""
        out = set()
        for p in self.prompt_tokens:
            out |= {p, p + self.max_tokens // 2, p + self.max_tokens}
        return sorted(out)

    def points(self) -> int:
        """How many measurements the grid makes (for the progress bar)."""
        B, P, C, K = len(self.batch), len(self.prompt_tokens), len(self.contexts()), len(self.lookahead)
        gens = B * P * K * len(self.acceptance) * len(self.disciplines)
        return 2 * B * P + B * C * (3 + K) + gens


def resolve_device(gpu: int | None = None, device: str | None = None) -> torch.device:
    """``--gpu N`` or ``--device cpu|cuda[:N]`` → a torch device; :class:`HarnessError` if absent."""
    if gpu is not None and device not in (None, "cuda", f"cuda:{gpu}"):
        raise HarnessError(None, None, None, f"--gpu {gpu} and --device {device} disagree; give one of them")
    name = f"cuda:{gpu}" if gpu is not None else (device or "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise HarnessError(None, None, None, f"unknown device {name!r} (use cpu, cuda or cuda:N)") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise HarnessError(None, None, None, f"no CUDA GPU is available here (asked for {name}); use --device cpu")
        index = dev.index or 0
        if index >= torch.cuda.device_count():
            raise HarnessError(None, None, None, f"no such GPU: {name} (this machine has {torch.cuda.device_count()})")
        dev = torch.device("cuda", index)
    elif dev.type != "cpu":
        raise HarnessError(None, None, None, f"unsupported device {name!r} (use cpu or cuda:N)")
    return dev


def device_name(dev: torch.device) -> str:
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"CPU ({platform.processor() or platform.machine()})"


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-")


def default_output(dev: torch.device, grid: Grid) -> str:
    """``profiles/<device>__<target>__<draft>.json``."""
    dev_slug = "cpu" if dev.type == "cpu" else slug(device_name(dev))
    return f"profiles/{dev_slug}__{grid.target}__{grid.draft}.json"


@dataclass
class Measurements:
    rows: list[dict[str, Any]] = field(default_factory=list)
    generations: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    oom_from: dict[str, int] = field(default_factory=dict)   # op -> smallest batch that ran out of memory

    def skip(self, op: str, batch: int) -> bool:
        return op in self.oom_from and batch >= self.oom_from[op]


def run_profile(grid: Grid, dev: torch.device,
                progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Measure ``grid`` on ``dev``; return the profile (``simctl-profile/1``, kind ``spec_decode``)."""
    target_shape, draft_shape = get_preset(grid.target), get_preset(grid.draft)
    if target_shape.vocab != draft_shape.vocab:
        raise HarnessError(None, None, None, f"target {grid.target} (vocab {target_shape.vocab}) and draft "
                           f"{grid.draft} (vocab {draft_shape.vocab}) must share a vocabulary")
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    tick = progress or (lambda _desc: None)
    s_needed = max(grid.prompt_tokens) + grid.max_tokens + 4 * (max(grid.lookahead) + 1)
    try:
        # on a GPU the weights are drawn there (seconds, not minutes of host sampling)
        on_gpu = dev.type == "cuda"
        target = Decoder(target_shape, dev, dtype, seed=grid.seed, max_len=s_needed, init_on_device=on_gpu)
        draft = Decoder(draft_shape, dev, dtype, seed=grid.seed + 1, max_len=s_needed, init_on_device=on_gpu)
    except OOM_ERRORS:
        raise HarnessError(None, None, None, f"the models do not fit on {device_name(dev)}: out of memory loading "
                           f"{grid.target} and {grid.draft}") from None
    if grid.compile:
        # Optional: compiled forwards (Inductor). CUDA graphs stay the default on a GPU.
        for model in (target, draft):
            # this instance's forward only; mypy does not model assigning to a method
            model.forward = torch.compile(model.forward, dynamic=False)  # type: ignore[method-assign]
    bandwidth = measure_bandwidth(dev) if dev.type == "cuda" else None
    m = Measurements()
    generator = torch.Generator(device="cpu").manual_seed(grid.seed)

    def tokens(B: int, T: int) -> torch.Tensor:
        return torch.randint(0, target_shape.vocab, (B, T), generator=generator).to(dev)

    def measure(op: str, B: int, params: dict[str, Any], run: Callable[[], Timing],
                floor_bytes: int | None = None) -> None:
        tick(f"{op} B={B} " + " ".join(f"{k}={v}" for k, v in params.items()))
        if m.skip(op, B):
            m.errors.append({"op": op, "batch": B, **params, "error": "skipped: a smaller batch ran out of memory"})
            return
        try:
            timing = run()
        except OOM_ERRORS:
            m.oom_from[op] = min(B, m.oom_from.get(op, B))
            m.errors.append({"op": op, "batch": B, **params, "error": "CUDA out of memory"})
            torch.cuda.empty_cache()
            return
        row = {"op": op, "batch": B, **params, **timing.to_dict()}
        if bandwidth and floor_bytes:
            floor = floor_bytes / bandwidth
            row.update(floor_bytes=floor_bytes, floor_s=floor, ratio_to_floor=timing.median / floor)
            if timing.median < floor:
                m.errors.append({"op": op, "batch": B, **params,
                                 "error": f"faster than its memory floor ({timing.median:.3g} s < {floor:.3g} s): "
                                          "the measurement is wrong"})
        m.rows.append(row)

    kv_target = target_shape.kv_bytes_per_token(torch.finfo(dtype).bits // 8)
    kv_draft = draft_shape.kv_bytes_per_token(torch.finfo(dtype).bits // 8)

    # 1. prefill
    for model, op, kv in ((target, "prefill_target", kv_target), (draft, "prefill_draft", kv_draft)):
        for B in grid.batch:
            for P in grid.prompt_tokens:
                def prefill(model: Decoder = model, B: int = B, P: int = P) -> Timing:
                    cache = model.new_cache(B, P + 1)
                    toks = tokens(B, P)
                    view = _bucket(P, grid.view_step, P + 1)
                    return time_call(lambda: model(toks, cache, view), dev, grid.warmup, grid.repeats)
                measure(op, B, {"prompt_tokens": P}, prefill, model.weight_bytes() + B * P * kv)

    # 2. single steps at fixed contexts (through CUDA graphs on a GPU, as in generation)
    k_max = max(grid.lookahead)
    step_ops = [("draft_step", draft, kv_draft, 1), ("draft_step", draft, kv_draft, 2),
                ("decode", target, kv_target, 1)] + [("verify", target, kv_target, k + 1) for k in grid.lookahead]
    for B in grid.batch:
        for ctx in grid.contexts():
            for op, model, kv, T in step_ops:
                def single_step(model: Decoder = model, B: int = B, ctx: int = ctx, T: int = T) -> Timing:
                    s_max = ctx + 2 * (k_max + 1)
                    cache = model.new_cache(B, s_max)
                    cache.pos.fill_(ctx)
                    view = _bucket(ctx + T, grid.view_step, s_max)
                    step = StepRunner(model, cache, grid.graphs)
                    toks = tokens(B, T)
                    return time_call(lambda: step(toks, view), dev, grid.warmup, grid.repeats)
                view = _bucket(ctx + T, grid.view_step, ctx + 2 * (k_max + 1))
                measure(op, B, {"context": ctx, "tokens": T, "view": view}, single_step,
                        model.weight_bytes() + B * view * kv)

    # 3. whole generations with injected acceptance
    for B in grid.batch:
        for P in grid.prompt_tokens:
            prompts = tokens(B, P)
            for k in grid.lookahead:
                for alpha in grid.acceptance:
                    for disc in grid.disciplines:
                        tick(f"generation B={B} P={P} k={k} alpha={alpha} {disc}")
                        if m.skip("generation", B):
                            m.errors.append({"op": "generation", "batch": B, "prompt_tokens": P, "lookahead": k,
                                             "alpha": alpha, "discipline": disc,
                                             "error": "skipped: a smaller batch ran out of memory"})
                            continue
                        sd = SpecDecoder(target, draft, k, discipline=disc, acceptance=Acceptance.inject(alpha),
                                         graphs=grid.graphs, view_step=grid.view_step, seed=grid.seed)
                        result: dict[str, Any] = {}

                        def reseed(sd: SpecDecoder = sd) -> None:
                            sd.generator.manual_seed(grid.seed)  # same draws every repeat: same iterations

                        def generate(sd: SpecDecoder = sd, result: dict[str, Any] = result,
                                     prompts: torch.Tensor = prompts, P: int = P, B: int = B) -> None:
                            result["g"] = sd.generate(prompts, [P] * B, grid.max_tokens)
                        try:
                            timing = time_call(generate, dev, warmup=1, repeats=grid.generation_repeats, setup=reseed)
                        except OOM_ERRORS:
                            m.oom_from["generation"] = min(B, m.oom_from.get("generation", B))
                            m.errors.append({"op": "generation", "batch": B, "prompt_tokens": P, "lookahead": k,
                                             "alpha": alpha, "discipline": disc, "error": "CUDA out of memory"})
                            torch.cuda.empty_cache()
                            continue
                        g = result["g"]
                        m.generations.append({
                            "batch": B, "prompt_tokens": P, "max_tokens": grid.max_tokens, "lookahead": k,
                            "alpha": alpha, "discipline": disc, **timing.to_dict(),
                            "iterations": g.iterations, "tokens_per_iteration": g.tokens_per_iteration(),
                            "finish_iteration": g.finish_iteration, "lookahead_per_iteration": g.lookahead,
                            "views": g.views,
                        })
    synchronize(dev)
    return build_profile(grid, dev, dtype, target_shape, draft_shape, bandwidth, m)


def _fit(rows: list[dict[str, Any]], op: str, form: str, keys: tuple[str, ...], notes: list[dict[str, Any]]):
    pts = [r for r in rows if r["op"] == op]
    if not pts:
        raise HarnessError(None, None, None, f"no {op} measurement succeeded: nothing to fit (see the errors above)")
    if len(pts) < 3:
        notes.append({"op": op, "batch": max(r["batch"] for r in pts),
                      "error": f"only {len(pts)} measurement(s): its 3-term cost is underdetermined"})
    return fit_cost(form, [[r[k] for r in pts] for k in keys], [r["median_s"] for r in pts])


def fit_costs(m: Measurements) -> tuple[dict[str, Cost], dict[str, Any]]:
    """Fit every operation; the iteration overhead on even-numbered generations; check on the odd."""
    costs, fit_err = {}, {}
    for op in ("prefill_target", "prefill_draft"):
        costs[op], fit_err[op] = _fit(m.rows, op, "prefill", ("batch", "prompt_tokens"), m.errors)
    for op in ("draft_step", "verify", "decode"):
        costs[op], fit_err[op] = _fit(m.rows, op, "step", ("batch", "tokens", "view"), m.errors)
    records = [GenerationRecord(g["batch"], g["prompt_tokens"], g["lookahead_per_iteration"], g["views"],
                                g["median_s"]) for g in m.generations]
    train, held_out = records[0::2], records[1::2]
    costs["iteration"] = fit_iteration_overhead(costs, train)
    check = check_generations(costs, held_out)
    check["fit_median_ape"] = fit_err
    return costs, check


def identity_texts(grid: Grid, device: str, on_gpu: bool, dtype: str, versions: str) -> dict[str, str]:
    """The ``describes`` and ``answers`` texts of a measured profile: which system it stands for
    (simctl's own eager decoder on this device, random weights) and which question it answers."""
    steps = ("draft, verify and decode steps replayed from CUDA graphs, prefills eager" if on_gpu and grid.graphs
             else "every pass eager")
    return {
        "describes": (f"No production serving engine: {grid.target} verifying {grid.draft}'s drafts (random weights, "
                      f"{dtype}) in simctl's batched speculative-decoding harness on one {device} ({versions}); "
                      f"{steps}; no paged KV cache, no fused kernels"),
        "answers": (f"What batched speculative decoding of {grid.target} with {grid.draft} costs on this "
                    f"{'GPU' if on_gpu else 'machine'} in a plain PyTorch decoder, over batch, prompt length, "
                    f"lookahead and acceptance; not what vLLM, SGLang or TensorRT-LLM would take"),
    }


def build_profile(grid: Grid, dev: torch.device, dtype: torch.dtype, target_shape: ModelShape,
                  draft_shape: ModelShape, bandwidth: float | None, m: Measurements) -> dict[str, Any]:
    costs, check = fit_costs(m)
    cost_dict = {k: v.to_dict() for k, v in costs.items()}
    name = f"{'cpu' if dev.type == 'cpu' else slug(device_name(dev))}__{grid.target}__{grid.draft}"
    spec = {"kind": "spec_decode", "costs": cost_dict, "view_step": grid.view_step,
            "acceptance": 0.3, "lookahead": 3, "discipline": "ragged"}
    floors = [r["ratio_to_floor"] for r in m.rows if "ratio_to_floor" in r]
    return {
        "format": "simctl-profile/1",
        "name": name,
        "source": (f"measured by `simctl profile` on {device_name(dev)}: {grid.target} (target) with "
                   f"{grid.draft} (draft), random weights, {str(dtype).removeprefix('torch.')}; service "
                   f"times compose the fitted per-operation costs in 'costs'. Task acceptance 0.3 and "
                   f"lookahead 3 are the design notes' figures (override per task or with --acceptance/"
                   f"--lookahead); graph is a CPU task, not measured here (as in seed-calibrated)."),
        **identity_texts(grid, device_name(dev), dev.type == "cuda", str(dtype).removeprefix("torch."),
                         f"torch {torch.__version__}" + (f", CUDA {torch.version.cuda}" if dev.type == "cuda" else "")),
        "meta": {
            "device": device_name(dev),
            "torch": torch.__version__,
            "cuda": torch.version.cuda if dev.type == "cuda" else None,
            "dtype": str(dtype).removeprefix("torch."),
            "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "target": target_shape.to_dict(),
            "draft": draft_shape.to_dict(),
            "grid": asdict(grid),
            "bandwidth_bytes_per_s": bandwidth,
            "ratio_to_floor": ({"min": min(floors), "median": sorted(floors)[len(floors) // 2], "max": max(floors)}
                               if floors else None),
            "fit_check": check,
            "errors": m.errors,
            "measurements": m.rows,
            "generations": m.generations,
        },
        "tasks": {
            "infobench": {"resource": "gpu", "prompt_tokens": 350, "max_tokens": 512,
                          "service": dict(spec)},
            "mmlu": {"resource": "gpu", "prompt_tokens": 190, "max_tokens": 8,
                     "service": dict(spec)},
            "graph": {"resource": "cpu", "prompt_tokens": 460, "max_tokens": 2048,
                      "service": {"kind": "distribution", "dist": "lognormal", "cv": 0.4,
                                  "mean": {"base": 0.0, "per_prompt": 0.1}}},
        },
    }


def with_overrides(grid: Grid, **changes: Any) -> Grid:
    """``grid`` with the given (non-None) fields replaced."""
    return replace(grid, **{k: v for k, v in changes.items() if v is not None})
