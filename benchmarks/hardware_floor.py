"""How far above the physical floor is each composed decode step?

For each model and GPU, :func:`simulator.hardware.compose.decode_step` at a few batch sizes
(1,000 cached tokens per row) against the floor: the weights read once plus every row's KV
cache read once, at the spec sheet's bandwidth. A ratio below 1 would be impossible (the
suite tests that none is); around 1.3–2 is what measured kernels reach (60–90 % of spec
bandwidth on large GEMMs, fixed costs on small ones).

    python benchmarks/hardware_floor.py               # print the table
    python benchmarks/hardware_floor.py --write-docs  # and write it into docs/hardware.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

MODELS = ("qwen3-0.6b", "qwen3-4b", "qwen3-8b", "llama-3.1-8b", "qwen2.5-7b")
BATCHES = (1, 8, 32, 128)
CONTEXT = 1000


def run() -> list[dict]:
    from simulator.hardware import gpu_specs, load_gpu
    from simulator.hardware.compose import decode_step
    from simulator.harness.presets import get_preset

    rows = []
    for gpu, spec in gpu_specs().items():
        for backend in spec["backends"]:
            tables = load_gpu(gpu, backend)
            for model in MODELS:
                for batch in BATCHES:
                    cost = decode_step(tables, get_preset(model), [CONTEXT] * batch)
                    rows.append({"gpu": gpu, "backend": backend, "model": model, "batch": batch,
                                 "step_ms": 1e3 * cost.seconds, "floor_ms": 1e3 * cost.floor_seconds,
                                 "ratio": cost.seconds / cost.floor_seconds})
    return rows


def markdown(rows: list[dict]) -> str:
    lines = [f"Composed decode step ÷ floor, {CONTEXT:,} cached tokens per row (step ms in brackets):", "",
             "| GPU | backend | model | " + " | ".join(f"batch {b}" for b in BATCHES) + " |",
             "|---|---|---|" + "---|" * len(BATCHES)]
    keys = sorted({(r["gpu"], r["backend"], r["model"]) for r in rows}, key=lambda k: (k[0], k[1], MODELS.index(k[2])))
    for key in keys:
        cells = [f"{r['ratio']:.2f} ({r['step_ms']:.1f})" for r in rows if (r["gpu"], r["backend"], r["model"]) == key]
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args(argv)
    text = markdown(run())
    print(text)
    if args.write_docs:
        from docs_tables import write_generated

        write_generated("hardware-floor", text, page="hardware.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
