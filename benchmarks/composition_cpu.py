"""The composition method checked on the CPU: per-op tables the harness measures, passes
composed from them, the same passes timed end to end.

1. The op tables of this CPU (fp32, torch pinned to one thread) for the presets' shapes
   (:func:`simulator.harness.optable.measure_op_tables`, grid from ``OpGrid.for_shapes``).
2. Composed with the ``harness`` style (:mod:`simulator.hardware.compose`): decode steps of
   each preset at several batches and contexts; speculative rounds of the target with the
   draft at lookaheads k, batches and contexts (``speculative_round``).
3. The same, timed end to end with the harness: a decode step is ``plain_generate``'s loop
   body (softmax, sample, ``Decoder.forward`` of one token per row at that context, the
   cache position advanced); a speculative round is steps 1-4 of ``SpecDecoder.generate``'s
   loop (``SpecDecoder.iteration``) with injected acceptance, no CUDA graphs.
4. Relative error composed ÷ measured − 1: median and max of its absolute value per pass.

Nothing is fitted to the end-to-end timings. Timings move with the machine's load, so they
are measured here and never asserted in a test (tests run ``--quick`` for structure only).

    python benchmarks/composition_cpu.py [--quick] [--json] [--write-docs] [--tables DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))


class Setup(NamedTuple):
    """What to compare: presets, batches, contexts, lookaheads, repeats."""

    target: str = "llama-160m"
    draft: str = "llama-68m"
    batches: tuple[int, ...] = (1, 2, 4, 8)
    contexts: tuple[int, ...] = (64, 256)
    round_batches: tuple[int, ...] = (1, 4, 8)
    lookaheads: tuple[int, ...] = (2, 3)
    alpha: float = 0.7
    repeats: int = 9
    round_repeats: int = 5
    warmup: int = 2
    grid_contexts: tuple[int, ...] = (16, 32, 64, 128, 192, 256, 384, 512)
    grid_prompts: tuple[int, ...] = (16, 64, 256)
    table_timing: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def quick(cls) -> Setup:
        return cls(target="tiny", draft="tiny", batches=(1, 2), contexts=(16,), round_batches=(2,), lookaheads=(2,),
                   repeats=3, round_repeats=2, warmup=1, grid_contexts=(8, 16, 32), grid_prompts=(8,),
                   table_timing=(("repeats", 3), ("warmup", 1), ("point_seconds", 0.02),
                                 ("rotate_bytes", 4 << 20), ("elementwise_numel", (16, 1024, 65536))))


def _filled_cache(model, batch: int, max_len: int):
    import torch

    cache = model.new_cache(batch, max_len)
    # written pages, as after a prefill (a fresh zeroed tensor can map one shared zero page,
    # which would make reading the cache look free)
    cache.k.copy_(torch.randn_like(cache.k) * 0.1)
    cache.v.copy_(torch.randn_like(cache.v) * 0.1)
    return cache


def measure_decode(model, batch: int, context: int, warmup: int, repeats: int) -> float:
    """Median seconds of one ``plain_generate`` step at ``context`` cached tokens per row, on
    the model's device (eager: no CUDA graphs)."""
    import torch

    from simulator.harness.specdec import sample
    from simulator.harness.timing import time_call

    dev = model.device
    cache = _filled_cache(model, batch, context + 1)
    gen = torch.Generator(device=dev).manual_seed(0)
    logits = torch.randn(batch, model.shape.vocab, device=dev, dtype=model.dtype)

    def step() -> None:
        probs = torch.softmax(logits.float(), -1)
        tok = sample(probs, gen)
        model(tok[:, None], cache)[:, -1]
        cache.pos.add_(1)

    return time_call(step, dev, warmup, repeats, setup=lambda: cache.pos.fill_(context)).median


def measure_round(target, draft, batch: int, context: int, k: int, alpha: float, warmup: int, repeats: int) -> float:
    """Median seconds of one speculative iteration at ``context`` cached tokens per row, on
    the models' device (eager: no CUDA graphs)."""
    import torch

    from simulator.harness.specdec import Acceptance, RoundState, SpecDecoder, StepRunner
    from simulator.harness.timing import time_call

    dev = target.device
    s_max = context + k + 2
    sd = SpecDecoder(target, draft, k, acceptance=Acceptance.inject(alpha), graphs=False, view_step=1, seed=0)
    t_step = StepRunner(target, _filled_cache(target, batch, s_max), graphs=False)
    d_step = StepRunner(draft, _filled_cache(draft, batch, s_max), graphs=False)
    view = context + k + 1              # SpecDecoder's view with view_step 1: the longest row + k + 1
    g = torch.Generator().manual_seed(1)
    prev, cur = (torch.randint(0, target.shape.vocab, (batch,), generator=g).to(dev) for _ in range(2))
    state: list[RoundState] = []

    def reset() -> None:
        sd.generator.manual_seed(0)
        state[:] = [RoundState(pos=torch.full((batch,), context, device=dev), prev=prev.clone(), cur=cur.clone(),
                               out=torch.zeros(batch, 64, dtype=torch.long, device=dev),
                               generated=torch.ones(batch, dtype=torch.long, device=dev),
                               active=torch.ones(batch, dtype=torch.bool, device=dev),
                               finish=torch.full((batch,), -1, device=dev),
                               max_new=torch.full((batch,), 1000, device=dev), rows=torch.arange(batch, device=dev))]

    def one_iteration() -> None:
        sd.iteration(t_step, d_step, state[0], k, view)
        bool(state[0].active.any())   # generate's one sync per iteration

    return time_call(one_iteration, dev, warmup, repeats, setup=reset).median


def run(setup: Setup, tables: Path | None = None) -> dict:
    """Measure (or reuse) the op tables, compose every point, time every point end to end
    before and after the tables are measured, compare (module docstring)."""
    import torch

    from simulator.hardware import load_gpu
    from simulator.hardware.compose import decode_step, speculative_round
    from simulator.harness.decoder import Decoder
    from simulator.harness.optable import OpGrid, measure_op_tables
    from simulator.harness.presets import get_preset

    torch.set_num_threads(1)
    target_shape, draft_shape = get_preset(setup.target), get_preset(setup.draft)
    # the draft's passes and the target's, in a round's order
    shapes = [target_shape] if setup.target == setup.draft else [draft_shape, target_shape]
    grid = OpGrid.for_shapes(shapes, batches=sorted(set(setup.batches) | set(setup.round_batches)),
                             contexts=setup.grid_contexts, lookaheads=setup.lookaheads,
                             prompt_tokens=setup.grid_prompts, **dict(setup.table_timing))
    max_len = max(setup.contexts) + max(setup.lookaheads) + 4
    models = {name: Decoder(get_preset(name), "cpu", torch.float32, seed=i, max_len=max_len)
              for i, name in enumerate(dict.fromkeys([setup.draft, setup.target]))}
    target, draft = models[setup.target], models[setup.draft]
    points: list[dict] = []
    for name in models:
        points += [{"pass": "decode step", "model": name, "batch": b, "context": c, "lookahead": None}
                   for b in setup.batches for c in setup.contexts]
    points += [{"pass": "speculative round", "model": f"{setup.target} + {setup.draft}", "batch": b, "context": c,
                "lookahead": k} for k in setup.lookaheads for b in setup.round_batches for c in setup.contexts]

    def measure_all() -> list[float]:
        out = []
        for p in points:
            if p["pass"] == "decode step":
                out.append(measure_decode(models[p["model"]], p["batch"], p["context"], setup.warmup, setup.repeats))
            else:
                out.append(measure_round(target, draft, p["batch"], p["context"], p["lookahead"], setup.alpha,
                                         setup.warmup, setup.round_repeats))
        return out

    # The shared machine drifts over minutes: timing every point before and after the tables
    # and averaging cancels a steady drift to first order.
    before = measure_all()
    with tempfile.TemporaryDirectory() as tmp:
        folder = tables or Path(tmp) / "optable"
        start = time.perf_counter()
        if tables is None or not (tables / "optable.json").exists():
            measure_op_tables("cpu", torch.float32, grid, folder)
        table_seconds = time.perf_counter() - start
        gpu = load_gpu(folder)
        spec = dict(gpu.spec)
        after = measure_all()
        for p, b, a in zip(points, before, after, strict=True):
            if p["pass"] == "decode step":
                composed = decode_step(gpu, models[p["model"]].shape, [p["context"]] * p["batch"], "harness")
            else:
                composed = speculative_round(gpu, target.shape, draft.shape, [p["context"]] * p["batch"],
                                             p["lookahead"], "harness")
            p.update(composed_s=composed.seconds, measured_s=(a + b) / 2, measured_before_s=b, measured_after_s=a,
                     kernels=composed.kernels, by_tag=dict(composed.by_tag))
            p["error"] = p["composed_s"] / p["measured_s"] - 1
    summary = {}
    for kind in ("decode step", "speculative round"):
        errors = [p["error"] for p in points if p["pass"] == kind]
        summary[kind] = {"points": len(errors), "median_abs_error": statistics.median(abs(e) for e in errors),
                         "max_abs_error": max(abs(e) for e in errors), "median_error": statistics.median(errors)}
    drift = statistics.median(p["measured_after_s"] / p["measured_before_s"] - 1 for p in points)
    return {"device": spec["device"], "torch": spec["torch"], "threads": spec["threads"], "dtype": spec["dtype"],
            "target": setup.target, "draft": setup.draft, "table_seconds": table_seconds,
            "table_points": grid.points(), "bandwidth_bytes_per_s": spec["memory_bandwidth_bytes_per_s"],
            "drift": drift, "summary": summary, "rows": points}


def markdown(r: dict) -> str:
    s = r["summary"]
    head = (f"{r['device']}, torch {r['torch']}, {r['dtype']}, {r['threads']} thread; op tables measured in "
            f"{r['table_seconds']:.0f} s ({r['table_points']} points), copy bandwidth "
            f"{r['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s; end-to-end timings taken before and after the tables and "
            f"averaged (they moved by {100 * r['drift']:+.1f} % at the median in between). Composed ÷ measured − 1, "
            f"nothing fitted to the end-to-end timings (target: median < 10 %):")
    lines = [head, "",
             "| pass | models | points | median abs error | max abs error | median signed error |",
             "|---|---|---|---|---|---|"]
    models = {"decode step": f"{r['draft']}, {r['target']}" if r["draft"] != r["target"] else r["target"],
              "speculative round": f"{r['target']} + {r['draft']} drafting"}
    for kind, v in s.items():
        lines.append(f"| {kind} | {models[kind]} | {v['points']} | {100 * v['median_abs_error']:.1f} % | "
                     f"{100 * v['max_abs_error']:.1f} % | {100 * v['median_error']:+.1f} % |")
    lines += ["", "| pass | model | batch | context | k | composed ms | measured ms | error |", "|---|---|---|---|---|---|---|---|"]
    for row in r["rows"]:
        lines.append(f"| {row['pass']} | {row['model']} | {row['batch']} | {row['context']} | "
                     f"{row['lookahead'] or ''} | {1e3 * row['composed_s']:.2f} | {1e3 * row['measured_s']:.2f} | "
                     f"{100 * row['error']:+.1f} % |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny preset, a handful of points (seconds; a smoke run)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--tables", type=Path, help="reuse (or keep) the op tables in this folder")
    args = parser.parse_args(argv)
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError:
        sys.stderr.write("this benchmark needs torch (pip install torch==2.13.0)\n")
        return 2
    result = run(Setup.quick() if args.quick else Setup(), args.tables)
    print(json.dumps(result, indent=1) if args.json else markdown(result))
    if args.write_docs:
        from docs_tables import write_generated

        write_generated("composition-cpu", markdown(result), page="hardware.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
