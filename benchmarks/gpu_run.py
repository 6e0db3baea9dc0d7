"""The prepared GPU run: op tables, measured passes and their composition, in one command.

On one GPU, within a time budget (default 480 s), into one folder (``--out``, default
``gpu-run/``):

1. **op tables** — the harness's per-op tables (:func:`simulator.harness.optable.measure_op_tables`,
   what ``simctl profile --measure-ops`` runs) for the shapes of qwen3-4b, qwen3-0.6b and
   llama-3.1-8b (random weights; bf16 on a GPU, fp32 on a CPU), over a grid covering the
   passes below;
2. **simctl decoder** — decode steps at several batches and contexts for each of the three
   models, and whole speculative rounds (qwen3-4b verifying qwen3-0.6b's drafts, lookahead 3)
   at a couple of batches, timed end to end with :mod:`simulator.harness` (eager; the
   functions of ``benchmarks/composition_cpu.py``);
3. **transformers** — the same decode steps with Hugging Face model classes built from a
   config filled from simctl's :class:`~simulator.harness.presets.ModelShape` (random
   weights, nothing downloaded): eager with a ``DynamicCache``, and the forward replayed from
   a CUDA graph over a ``StaticCache`` (GPU only); each step samples as ``generate`` does
   (temperature, top-k, top-p, softmax, multinomial). Skipped with a note where
   ``transformers`` is not importable;
4. **profile** — a small ``simctl profile`` grid (:func:`simulator.harness.profiler.run_profile`)
   of qwen3-4b with qwen3-0.6b, written as the profile JSON ``simctl profile --gpu 0`` writes.

Then, always: ``comparison.csv`` and ``comparison.md``, one row per measured pass with its
seconds composed from the op tables just measured (:mod:`simulator.hardware.compose`, style
``harness`` for the simctl decoder, ``hf-eager`` for the transformers rows; each pass as it runs,
:func:`compose`) and the relative
error ``measured ÷ composed − 1``; ``optable.tar`` (the op-table folder, for
``load_gpu``); ``manifest.json`` (device, versions, elapsed seconds and status of every
stage, what was skipped and why). Five files at most, one folder level.

Every stage has a deadline (a share of the budget; time a stage leaves unused passes on); a
stage past its deadline stops, the points it did not reach are listed as skipped, and the
later stages still run if time is left. Nothing here imports simpy (the GPU machine lacks it).

    bash benchmarks/gpu_run.sh --out gpu-run                  # on a GPU
    python benchmarks/gpu_run.py --device cpu --quick --out /tmp/gpu-run   # a rehearsal on a CPU
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import inspect
import io
import json
import platform
import statistics
import sys
import tarfile
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

#: the budget counts from here: the imports and the CUDA context are part of the 8 minutes
STARTED = time.perf_counter()
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

FORMAT = "simctl-gpu-run/1"
#: Stages in order, each with the fraction of the budget by which it must end (cumulative);
#: what remains after the last is for writing the outputs.
STAGES = (("op tables", 0.30), ("simctl decoder", 0.52), ("transformers", 0.78), ("profile", 0.94))


class Plan(NamedTuple):
    """What to measure: the pair and the plain model, the points, the repeats, the op grid
    and the profile's grid (fields of :class:`simulator.harness.profiler.Grid`)."""

    target: str = "qwen3-4b"
    draft: str = "qwen3-0.6b"
    plain: str = "llama-3.1-8b"
    batches: tuple[int, ...] = (1, 4, 16)
    contexts: tuple[int, ...] = (256, 1024)
    round_batches: tuple[int, ...] = (1, 8)
    lookahead: int = 3
    alpha: float = 0.7
    warmup: int = 3
    repeats: int = 10
    round_repeats: int = 6
    grid_contexts: tuple[int, ...] = (128, 256, 512, 1024, 2048)
    grid_prompts: tuple[int, ...] = (128,)
    #: the op tables' repeats: split timing waits behind a sleep kernel for every repeat, and
    #: the grid's default (15 repeats, 0.3 s a point) ran past the stage's share of a 170 s
    #: budget on an H200, where these (31.5 s for the whole grid) did not
    table_timing: tuple[tuple[str, Any], ...] = (("repeats", 5), ("point_seconds", 0.05))
    profile: tuple[tuple[str, Any], ...] = (
        ("batch", (1, 4)), ("lookahead", (3,)), ("acceptance", (0.7,)), ("prompt_tokens", (128, 512)),
        ("max_tokens", 64), ("disciplines", ("ragged",)), ("repeats", 3), ("warmup", 1), ("view_step", 128))

    @classmethod
    def quick(cls) -> Plan:
        """Tiny shapes and a tiny grid: a CPU rehearsal of every stage in seconds. Every pass
        and op is timed once, after one untimed call: a rehearsal checks that every stage
        runs and composes, not what its timings say."""
        return cls(target="tiny", draft="tiny", plain="llama-68m", batches=(1, 2), contexts=(16,),
                   round_batches=(2,), lookahead=2, warmup=1, repeats=1, round_repeats=1,
                   grid_contexts=(8, 16, 32), grid_prompts=(8,),
                   # two elementwise sizes: the fewest its fit of a fixed and a per-byte cost takes
                   table_timing=(("repeats", 1), ("min_repeats", 1), ("warmup", 0), ("point_seconds", 0.02),
                                 ("rotate_bytes", 1 << 20), ("elementwise_numel", (16, 4096))),
                   profile=(("batch", (1, 2)), ("lookahead", (2,)), ("acceptance", (0.7,)),
                            ("prompt_tokens", (8, 16)), ("max_tokens", 8), ("disciplines", ("ragged",)),
                            ("repeats", 1), ("warmup", 1), ("view_step", 8)))

    def models(self) -> list[str]:
        """The distinct models, draft first (a round's order), then the target, then the plain one."""
        return list(dict.fromkeys([self.draft, self.target, self.plain]))


class OverBudget(Exception):
    """A stage ran past its deadline."""


@dataclass
class Stage:
    """One stage's record in the manifest."""

    name: str
    deadline_s: float
    status: str = "not run"
    elapsed_s: float = 0.0
    notes: list[str] = field(default_factory=list)


@dataclass
class Run:
    """Where the run stands: its clock, its stages, its rows and what it skipped."""

    budget_s: float
    started: float = STARTED
    stages: list[Stage] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def skip(self, stage: str, what: str, reason: str) -> None:
        self.skipped.append({"stage": stage, "what": what, "reason": reason})
        print(f"  skipped {what}: {reason}", flush=True)


def say(text: str) -> None:
    print(text, flush=True)


def stage(run: Run, name: str, share: float, body: Callable[[Stage, Callable[[], None]], None]) -> Stage:
    """Run ``body(record, check)`` as stage ``name``, which must end by ``share`` of the
    budget; ``check()`` raises :class:`OverBudget` past that. A stage whose deadline has
    already passed is skipped; one that stops early is ``stopped``; an error is recorded."""
    deadline = share * run.budget_s
    record = Stage(name, deadline)
    run.stages.append(record)
    start = run.elapsed()
    if start >= deadline:
        record.status = "skipped"
        run.skip(name, "the whole stage", f"the budget was spent ({start:.0f} s of {deadline:.0f} s it may end by)")
        say(f"[{name}] skipped at {start:.1f} s")
        return record

    def check() -> None:
        if run.elapsed() > deadline:
            raise OverBudget(f"past its deadline of {deadline:.0f} s into the run")

    say(f"[{name}] started at {start:.1f} s (must end by {deadline:.0f} s)")
    record.status = "done"
    try:
        body(record, check)
    except OverBudget as exc:
        record.status = "stopped"
        run.skip(name, "the rest of the stage", str(exc))
    except Exception as exc:   # a failed stage is a result too; the later ones still run
        record.status = "failed"
        record.notes.append("".join(traceback.format_exc(limit=-6))[-4000:])
        run.skip(name, "the rest of the stage", f"{type(exc).__name__}: {exc}")
    record.elapsed_s = run.elapsed() - start
    say(f"[{name}] {record.status} in {record.elapsed_s:.1f} s")
    return record


def _free(dev) -> None:
    """Hand a dropped model's GPU memory back before the next one is built. Only a GPU's
    caching allocator needs the push: on a host the memory goes back with the tensors' last
    references, and a forced collector pass costs a fifth of a second once transformers is
    imported."""
    import gc

    import torch

    if dev.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()


def _oom_errors() -> tuple[type[BaseException], ...]:
    import torch

    return (torch.cuda.OutOfMemoryError,)


# -- stage 1: op tables -------------------------------------------------------------------------


def op_grid(plan: Plan):
    """The op grid covering every pass this run composes."""
    from simulator.harness.optable import OpGrid
    from simulator.harness.presets import get_preset

    shapes = [get_preset(name) for name in plan.models()]
    batches = sorted(set(plan.batches) | set(plan.round_batches))
    return OpGrid.for_shapes(shapes, batches=batches, contexts=plan.grid_contexts, lookaheads=(plan.lookahead,),
                             prompt_tokens=plan.grid_prompts, **dict(plan.table_timing))


def measure_tables(plan: Plan, dev, dtype, folder: Path, record: Stage, check: Callable[[], None]) -> None:
    from simulator.harness.optable import measure_op_tables

    grid = op_grid(plan)
    record.notes.append(f"{grid.points()} points: {len(grid.gemm)} GEMMs, {len(grid.decode_attention)} decode, "
                        f"{len(grid.verify_attention)} verify and {len(grid.prefill_attention)} prefill attention "
                        f"points for {', '.join(grid.shapes)}")
    count = [0]

    def tick(_description: str) -> None:
        count[0] += 1
        check()

    spec = measure_op_tables(dev, dtype, grid, folder, tick)
    record.notes.append(f"copy bandwidth {spec['memory_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s, "
                        f"peak GEMM {spec['flops_per_s'] / 1e12:.2f} TFLOP/s")


# -- stage 2: the simctl decoder ----------------------------------------------------------------


def build_decoder(name: str, dev, dtype, max_len: int, seed: int):
    from simulator.harness.decoder import Decoder
    from simulator.harness.presets import get_preset

    return Decoder(get_preset(name), dev, dtype, seed=seed, max_len=max_len, init_on_device=True)


def measure_simctl(plan: Plan, run: Run, dev, dtype, record: Stage, check: Callable[[], None]) -> None:
    from composition_cpu import measure_decode, measure_round

    max_len = max(plan.contexts) + plan.lookahead + 4
    pair = list(dict.fromkeys([plan.draft, plan.target]))
    groups = [pair] + ([[plan.plain]] if plan.plain not in pair else [])
    for group in groups:
        check()
        models = {name: build_decoder(name, dev, dtype, max_len, seed=i) for i, name in enumerate(group)}
        points: list[dict[str, Any]] = [
            {"pass": "decode step", "model": name, "batch": b, "context": c, "lookahead": None}
            for name in group for b in plan.batches for c in plan.contexts]
        if plan.target in models:
            points += [{"pass": "speculative round", "model": f"{plan.target} + {plan.draft}", "batch": b,
                        "context": c, "lookahead": plan.lookahead}
                       for b in plan.round_batches for c in plan.contexts]
        for i, p in enumerate(points):
            if run.elapsed() > record.deadline_s:
                left = points[i:]
                run.skip(record.name, f"{len(left)} simctl passes ({', '.join(sorted({q['model'] for q in left}))})",
                         "past the stage's deadline")
                break
            try:
                if p["pass"] == "decode step":
                    seconds = measure_decode(models[p["model"]], p["batch"], p["context"], plan.warmup, plan.repeats)
                else:
                    seconds = measure_round(models[plan.target], models[plan.draft], p["batch"], p["context"],
                                            plan.lookahead, plan.alpha, plan.warmup, plan.round_repeats)
            except _oom_errors():
                run.skip(record.name, f"{p['pass']} {p['model']} B={p['batch']} context={p['context']}",
                         "out of GPU memory")
                _free(dev)
                continue
            run.rows.append({**p, "implementation": "simctl", "graphs": False, "style": "harness",
                             "measured_s": seconds})
        del models
        _free(dev)


# -- stage 3: transformers ------------------------------------------------------------------------


def hf_config(shape, max_len: int):
    """A ``transformers`` config of ``shape``: Qwen3 (q/k norms), Qwen2 (q/k/v biases) or Llama."""
    import transformers

    kind = "Qwen3Config" if shape.qk_norm else "Qwen2Config" if shape.qkv_bias else "LlamaConfig"
    kwargs: dict[str, Any] = dict(
        vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim, tie_word_embeddings=shape.tied_embeddings, rms_norm_eps=shape.norm_eps,
        rope_theta=shape.rope_theta, max_position_embeddings=max_len)
    if kind == "LlamaConfig":
        kwargs["attention_bias"] = shape.qkv_bias
    return getattr(transformers, kind)(**kwargs)


def build_hf(shape, dev, dtype, max_len: int):
    """A ``transformers`` causal LM of ``shape`` with random weights, built on ``dev`` (SDPA attention)."""
    import torch
    from transformers import AutoModelForCausalLM

    config = hf_config(shape, max_len)
    with torch.device(dev):
        # built in the default dtype and cast: the keyword naming the dtype differs across versions
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    return model.to(dtype=dtype).eval()


def _static_cache(config, batch: int, length: int, dev, dtype):
    """A ``StaticCache`` of ``length`` positions, whichever constructor this version has."""
    from transformers import StaticCache

    params = inspect.signature(StaticCache.__init__).parameters
    kwargs: dict[str, Any] = {"config": config, "max_cache_len": length}
    for name, value in (("max_batch_size", batch), ("device", dev), ("dtype", dtype)):
        if name in params:
            kwargs[name] = value
    return StaticCache(**kwargs)


def hf_decode(model, batch: int, context: int, graphs: bool, warmup: int, repeats: int) -> float:
    """Median seconds of one decode step of a ``transformers`` model at ``context`` cached
    tokens per row, sampling as ``generate`` does. Eager: a ``DynamicCache`` cropped back to
    ``context`` before each step (untimed). Graphs: the forward over a ``StaticCache`` of
    ``context + 1`` positions captured once and replayed (each replay rewrites position
    ``context``), the sampling eager after it."""
    import torch
    from transformers import (
        DynamicCache,
        LogitsProcessorList,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    from simulator.harness.timing import time_call

    dev, config = model.device, model.config
    kv_heads = config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    ids = torch.randint(0, config.vocab_size, (batch, 1), device=dev)
    position = torch.tensor([context], device=dev)
    processors = LogitsProcessorList([TemperatureLogitsWarper(0.7), TopKLogitsWarper(50), TopPLogitsWarper(0.9)])

    def sample(logits: torch.Tensor) -> torch.Tensor:
        scores = processors(ids, logits[:, -1, :].float())
        return torch.multinomial(torch.softmax(scores, -1), 1)

    # newer versions name the cache argument ``cache`` (``past_key_values`` is deprecated there)
    keyword = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def forward(cache) -> torch.Tensor:
        return model(input_ids=ids, cache_position=position, use_cache=True, **{keyword: cache}).logits

    with torch.inference_mode():
        if not graphs:
            cache = DynamicCache()
            for layer in range(config.num_hidden_layers):
                size = (batch, kv_heads, context, head_dim)
                cache.update(torch.randn(size, device=dev, dtype=model.dtype) * 0.1,
                             torch.randn(size, device=dev, dtype=model.dtype) * 0.1, layer)

            def crop() -> None:
                # crop(-n) drops the last n positions (a positive length is refused by newer versions)
                extra = cache.get_seq_length() - context
                if extra > 0:
                    cache.crop(-extra)
            return time_call(lambda: sample(forward(cache)), dev, warmup, repeats, setup=crop).median
        static = _static_cache(config, batch, context + 1, dev, model.dtype)
        forward(static)                     # allocates a lazily built cache
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                forward(static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = forward(static)

        def step() -> None:
            graph.replay()
            sample(out)
        return time_call(step, dev, warmup, repeats).median


def measure_transformers(plan: Plan, run: Run, dev, dtype, record: Stage, check: Callable[[], None]) -> None:
    import transformers

    from simulator.harness.presets import get_preset

    record.notes.append(f"transformers {transformers.__version__}")
    variants = [False, True] if dev.type == "cuda" else [False]
    if dev.type != "cuda":
        run.skip(record.name, "the CUDA-graph variant", f"CUDA graphs need a GPU (this run is on {dev.type})")
    max_len = max(plan.contexts) + 8
    # the target and the plain model first: the draft's steps matter least
    for name in dict.fromkeys([plan.target, plan.plain, plan.draft]):
        check()
        shape = get_preset(name)
        model = build_hf(shape, dev, dtype, max_len)
        record.notes.append(f"{name}: {type(model).__name__} of {sum(p.numel() for p in model.parameters())} "
                            f"parameters (the preset: {shape.parameters()})")
        for graphs in variants:
            points = [(b, c) for b in plan.batches for c in plan.contexts]
            for i, (b, c) in enumerate(points):
                if run.elapsed() > record.deadline_s:
                    run.skip(record.name, f"{len(points) - i} transformers steps of {name} "
                             f"({'graphs' if graphs else 'eager'})", "past the stage's deadline")
                    break
                try:
                    seconds = hf_decode(model, b, c, graphs, plan.warmup, plan.repeats)
                except _oom_errors():
                    run.skip(record.name, f"transformers {name} B={b} context={c}", "out of GPU memory")
                    _free(dev)
                    continue
                except Exception as exc:   # a version whose cache cannot be captured: the eager rows stand
                    if not graphs:
                        raise
                    run.skip(record.name, f"the CUDA-graph steps of {name}",
                             f"capture failed: {type(exc).__name__}: {str(exc)[:300]}")
                    break
                run.rows.append({"pass": "decode step", "model": name, "batch": b, "context": c, "lookahead": None,
                                 "implementation": "transformers", "graphs": graphs, "style": "hf-eager",
                                 "measured_s": seconds})
        del model
        _free(dev)


# -- stage 4: the profile -------------------------------------------------------------------------


def measure_profile(plan: Plan, dev, out: Path, record: Stage, check: Callable[[], None]) -> Path:
    import torch

    from simulator.harness.profiler import Grid, run_profile

    grid = Grid(target=plan.target, draft=plan.draft, **dict(plan.profile))
    record.notes.append(f"{grid.points()} points: {grid.target} with {grid.draft}, batches {list(grid.batch)}, "
                        f"prompts {list(grid.prompt_tokens)}, lookahead {list(grid.lookahead)}")
    profile = run_profile(grid, dev, lambda _description: check())
    profile["meta"]["threads"] = torch.get_num_threads()
    path = out / f"{profile['name']}.json"
    path.write_text(json.dumps(profile, indent=1) + "\n")
    check_ = profile["meta"]["fit_check"]
    record.notes.append(f"wrote {path.name}; fitted costs vs {check_['held_out']} held-out generations: median "
                        f"error {100 * check_['median_ape']:.1f} %")
    return path


# -- composition and outputs ----------------------------------------------------------------------


#: How each row's measured pass runs, and so what of the composition it is compared with
COMPOSED_AS = {
    ("simctl", False): "eager: max(host, device)",
    ("transformers", False): "engine hf-eager: max(host model, device)",
    ("transformers", True): "graph: device only",
}


def compose(rows: list[dict[str, Any]], plan: Plan, tables: Path | None) -> None:
    """``composed_s`` and ``error`` (measured ÷ composed − 1) of every row, from the op tables
    in ``tables`` (None: the op tables were not measured; both stay empty), as the row's pass
    runs (:data:`COMPOSED_AS`): simctl's eager decoder as the longer of the host's issuing
    and the device's kernels (:attr:`StepCost.eager_seconds`; on a CPU one synchronous sum);
    transformers' eager steps through the ``hf-eager`` engine that replays the users' server
    (its host model per kernel, step and row, overlapping the device's kernels:
    :mod:`simulator.profile.overhead`); graph-replayed steps as the device's kernels alone.
    ``composed_host_s`` and ``composed_device_s`` keep the two sides."""
    from simulator.hardware import load_gpu
    from simulator.hardware.compose import decode_step, speculative_round
    from simulator.hardware.engines import get_engine
    from simulator.harness.presets import get_preset
    from simulator.profile.overhead import PARAMETERS, EngineOverhead

    gpu = load_gpu(tables) if tables is not None else None
    engine = get_engine("hf-eager")
    for row in rows:
        row["composed_s"] = row["error"] = row["composed_host_s"] = row["composed_device_s"] = None
        row["composed_as"] = COMPOSED_AS[(row["implementation"], row["graphs"])]
        if gpu is None:
            continue
        context = [row["context"]] * row["batch"]
        if row["pass"] == "decode step":
            cost = decode_step(gpu, get_preset(row["model"]), context, row["style"])
        else:
            cost = speculative_round(gpu, get_preset(plan.target), get_preset(plan.draft), context,
                                     row["lookahead"], row["style"])
        device, host = cost.seconds, cost.host_seconds
        if row["implementation"] == "transformers" and not row["graphs"]:
            overhead = EngineOverhead(engine.name, overlap=engine.overlap, kernels={"step": cost.kernels},
                                      **{k: engine.defaults[k] for k in PARAMETERS})
            host = float(overhead.host("step", row["batch"]))
            composed = float(overhead.combine(device, host))
        elif row["graphs"]:
            composed = device
        else:
            composed = cost.eager_seconds
        row.update(composed_s=composed, composed_host_s=host, composed_device_s=device,
                   error=row["measured_s"] / composed - 1)


COLUMNS = ["pass", "implementation", "graphs", "model", "batch", "context", "lookahead", "style", "measured_s",
           "composed_as", "composed_s", "composed_host_s", "composed_device_s", "error"]


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if row.get(k) is None else row[k]) for k in COLUMNS})


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median and max absolute error per pass, implementation and graphs."""
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        if r["error"] is not None:
            groups.setdefault((r["pass"], r["implementation"], r["graphs"]), []).append(r["error"])
    return [{"pass": p, "implementation": impl, "graphs": graphs, "points": len(errors),
             "median_abs_error": statistics.median(abs(e) for e in errors),
             "max_abs_error": max(abs(e) for e in errors), "median_error": statistics.median(errors)}
            for (p, impl, graphs), errors in groups.items()]


def markdown(manifest: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    lines = [f"{manifest['device']}, torch {manifest['torch']}, {manifest['dtype']}; measured ÷ composed − 1 "
             f"(composed from the op tables this run measured, nothing fitted to the passes; each pass as it runs: "
             f"simctl's eager decoder as the longer of the host's issuing and the device's kernels, "
             f"transformers' eager steps through the hf-eager engine's host model, graph replays as the "
             f"device's kernels alone).", ""]
    summ = summary(rows)
    if summ:
        lines += ["| pass | implementation | graphs | points | median abs error | max abs error | median error |",
                  "|---|---|---|---|---|---|---|"]
        for s in summ:
            lines.append(f"| {s['pass']} | {s['implementation']} | {'yes' if s['graphs'] else 'no'} | {s['points']} | "
                         f"{100 * s['median_abs_error']:.1f} % | {100 * s['max_abs_error']:.1f} % | "
                         f"{100 * s['median_error']:+.1f} % |")
        lines.append("")
    lines += ["| pass | implementation | graphs | model | batch | context | k | style | measured ms | composed ms | "
              "host ms | device ms | error |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def ms(value: float | None) -> str:
        return "" if value is None else f"{1e3 * value:.3f}"
    for r in rows:
        error = "" if r["error"] is None else f"{100 * r['error']:+.1f} %"
        lines.append(f"| {r['pass']} | {r['implementation']} | {'yes' if r['graphs'] else 'no'} | {r['model']} | "
                     f"{r['batch']} | {r['context']} | {r['lookahead'] or ''} | {r['style']} | "
                     f"{1e3 * r['measured_s']:.3f} | {ms(r['composed_s'])} | {ms(r['composed_host_s'])} | "
                     f"{ms(r['composed_device_s'])} | {error} |")
    if manifest["skipped"]:
        lines += ["", "Skipped:", ""] + [f"- {s['stage']}: {s['what']} ({s['reason']})" for s in manifest["skipped"]]
    return "\n".join(lines) + "\n"


def pack(folder: Path, archive: Path) -> None:
    """``folder``'s files into ``archive`` under ``optable/`` (``tar -xf`` it, then ``load_gpu(".../optable")``)."""
    with tarfile.open(archive, "w") as tar:
        for path in sorted(folder.iterdir()):
            tar.add(path, arcname=f"optable/{path.name}")


# -- the run --------------------------------------------------------------------------------------


def run_all(plan: Plan, device: str, out: Path, budget_s: float, quick: bool) -> dict[str, Any]:
    """Every stage (module docstring) on ``device`` into ``out``; returns the manifest."""
    import torch

    from simulator.harness.profiler import device_name, resolve_device

    dev = resolve_device(None, device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    if dev.type == "cpu":
        torch.set_num_threads(1)   # as the CPU tables are measured: other work moves the timings less
    run = Run(budget_s)
    out.mkdir(parents=True, exist_ok=True)
    say(f"{device_name(dev)}, torch {torch.__version__}, {str(dtype).removeprefix('torch.')}; budget {budget_s:.0f} s; "
        f"writing {out}")
    files: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        tables = Path(tmp) / "optable"
        (name1, share1), (name2, share2), (name3, share3), (name4, share4) = STAGES
        first = stage(run, name1, share1, lambda rec, check: measure_tables(plan, dev, dtype, tables, rec, check))
        _free(dev)
        stage(run, name2, share2, lambda rec, check: measure_simctl(plan, run, dev, dtype, rec, check))
        _free(dev)
        try:
            import transformers  # noqa: F401
        except ImportError as exc:
            run.stages.append(Stage(name3, share3 * budget_s, "skipped"))
            run.skip(name3, "the whole stage", f"transformers is not importable ({exc})")
            say(f"[{name3}] skipped: transformers is not importable")
        else:
            stage(run, name3, share3, lambda rec, check: measure_transformers(plan, run, dev, dtype, rec, check))
            _free(dev)
        written: list[Path] = []
        stage(run, name4, share4, lambda rec, check: written.append(measure_profile(plan, dev, out, rec, check)))
        files += [p.name for p in written]
        have_tables = first.status == "done" and (tables / "optable.json").exists()
        compose(run.rows, plan, tables if have_tables else None)
        if have_tables:
            pack(tables, out / "optable.tar")
            files.append("optable.tar")
        else:
            run.skip("composition", "composed seconds of every row", "the op tables were not measured")
    manifest = {
        "format": FORMAT,
        "device": device_name(dev),
        "device_type": dev.type,
        "dtype": str(dtype).removeprefix("torch."),
        "torch": torch.__version__,
        "cuda": torch.version.cuda if dev.type == "cuda" else None,
        "transformers": _version("transformers"),
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "quick": quick,
        "budget_s": budget_s,
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "plan": plan._asdict(),
        "stages": [asdict(s) for s in run.stages],
        "skipped": run.skipped,
        "rows": len(run.rows),
        "summary": summary(run.rows),
        "files": sorted(files + ["comparison.csv", "comparison.md", "manifest.json"]),
        "simpy_imported": "simpy" in sys.modules,
    }
    write_csv(run.rows, out / "comparison.csv")
    (out / "comparison.md").write_text(markdown(manifest, run.rows))
    manifest["elapsed_s"] = run.elapsed()
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, default=str) + "\n")
    return manifest


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except ImportError:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    parser.add_argument("--quick", action="store_true", help="tiny shapes and a tiny grid (a rehearsal in seconds)")
    parser.add_argument("--out", type=Path, default=Path("gpu-run"), help="the output folder (default gpu-run/)")
    parser.add_argument("--budget-s", type=float, default=480.0, help="seconds the whole run may take (default 480)")
    args = parser.parse_args(argv)
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError:
        sys.stderr.write("this run needs torch\n")
        return 2
    from simulator.errors import SimctlError

    try:
        manifest = run_all(Plan.quick() if args.quick else Plan(), args.device, args.out, args.budget_s, args.quick)
    except SimctlError as exc:
        sys.stderr.write(f"{exc}\n")
        return 2
    buffer = io.StringIO()
    for s in manifest["stages"]:
        buffer.write(f"  {s['name']}: {s['status']}, {s['elapsed_s']:.1f} s\n")
    say(f"done in {manifest['elapsed_s']:.1f} s ({manifest['rows']} rows); stages:\n{buffer.getvalue().rstrip()}\n"
        f"wrote {', '.join(manifest['files'])} to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
