"""What the GPU runs committed under ``benchmarks/data/gpu_run/`` say: every measured pass
beside its composition, recomposed here from the op tables each run measured.

Each folder holds a run's ``comparison.csv`` (the measured passes), its ``manifest.json`` and
the ``optable/`` folder measured on the same machine. This script recomposes every row with
today's composition (:func:`gpu_run.compose`: simctl's eager decoder as the longer of the
host's and the device's sums, transformers' eager steps through the ``hf-eager`` engine,
graph replays as the device's kernels) and, for graph replays, also from the shipped tables
of the same GPU (NVIDIA's aiconfigurator measurements, style ``hf-eager``), then prints one
summary table per run; ``--write-docs`` puts them in docs/profiles-and-harness.md.

    python benchmarks/gpu_run_report.py [--json] [--write-docs]
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import gpu_run  # noqa: E402

RUNS = HERE / "data" / "gpu_run"
#: the shipped table set of each device a run names
SHIPPED = {"NVIDIA H200": "h200-sxm", "NVIDIA H100 80GB HBM3": "h100-sxm"}


def read_rows(folder: Path) -> list[dict[str, Any]]:
    """The measured passes of a run folder, typed as :func:`gpu_run.compose` takes them."""
    with (folder / "comparison.csv").open() as fh:
        return [{"pass": r["pass"], "implementation": r["implementation"], "graphs": r["graphs"] == "True",
                 "model": r["model"], "batch": int(r["batch"]), "context": int(r["context"]),
                 "lookahead": int(r["lookahead"]) if r["lookahead"] else None, "style": r["style"],
                 "measured_s": float(r["measured_s"])} for r in csv.DictReader(fh)]


def shipped_graph_errors(rows: list[dict[str, Any]], device: str) -> list[float]:
    """measured ÷ composed − 1 of the graph-replayed rows, composed from the shipped tables of
    ``device`` (empty where none ships)."""
    from simulator.hardware import load_gpu
    from simulator.hardware.compose import decode_step
    from simulator.harness.presets import get_preset

    if device not in SHIPPED:
        return []
    tables = load_gpu(SHIPPED[device])
    return [r["measured_s"] / decode_step(tables, get_preset(r["model"]), [r["context"]] * r["batch"],
                                          r["style"]).seconds - 1
            for r in rows if r["graphs"]]


def report(folder: Path) -> dict[str, Any]:
    """One run: its device and timing, and per pass kind the errors of its composition."""
    manifest = json.loads((folder / "manifest.json").read_text())
    spec = json.loads((folder / "optable" / "optable.json").read_text())
    rows = read_rows(folder)
    gpu_run.compose(rows, gpu_run.Plan(), folder / "optable")
    groups = [{**s, "composed_as": gpu_run.COMPOSED_AS[(s["implementation"], s["graphs"])],
               "tables": "this run's"} for s in gpu_run.summary(rows)]
    shipped = shipped_graph_errors(rows, manifest["device"])
    if shipped:
        groups.append({"pass": "decode step", "implementation": "transformers", "graphs": True,
                       "points": len(shipped), "median_abs_error": statistics.median(abs(e) for e in shipped),
                       "max_abs_error": max(abs(e) for e in shipped), "median_error": statistics.median(shipped),
                       "composed_as": "graph: device only", "tables": f"shipped {SHIPPED[manifest['device']]}"})
    eager = [r for r in rows if not r["graphs"] and r["pass"] == "decode step"]
    from simulator.hardware import load_gpu

    tables = load_gpu(folder / "optable")   # read once: every eager row counts its kernels on it
    return {"run": folder.name, "device": manifest["device"], "torch": manifest["torch"],
            "timing": spec.get("timing", "events around each op (before split timing)"),
            "host_view_us": 1e6 * spec["host"]["view_s"], "host_module_us": 1e6 * spec["host"]["module_s"],
            "eager_us_per_kernel": statistics.median(1e6 * r["measured_s"] / _kernels(r, tables) for r in eager),
            "groups": groups}


def _kernels(row: dict[str, Any], tables) -> int:
    """Kernels one measured decode step launches, as the composition of ``tables`` (a
    :func:`~simulator.hardware.load_gpu` of the run's op tables) counts them."""
    from simulator.hardware.compose import decode_step
    from simulator.harness.presets import get_preset

    return decode_step(tables, get_preset(row["model"]), [row["context"]] * row["batch"], row["style"]).kernels


def table(reports: list[dict[str, Any]]) -> str:
    lines = []
    for rep in reports:
        lines += [f"**{rep['run']}** ({rep['device']}, torch {rep['torch']}; op tables timed: {rep['timing']}; "
                  f"host per view op {rep['host_view_us']:.1f} µs, per module call {rep['host_module_us']:.1f} µs; "
                  f"eager decode steps measured at {rep['eager_us_per_kernel']:.1f} µs per kernel launched, median):",
                  "", "| pass | implementation | graphs | composed as | tables | points | median abs error | "
                  "max abs error | median error |", "|---|---|---|---|---|---|---|---|---|"]
        for g in rep["groups"]:
            lines.append(f"| {g['pass']} | {g['implementation']} | {'yes' if g['graphs'] else 'no'} | "
                         f"{g['composed_as']} | {g['tables']} | {g['points']} | {100 * g['median_abs_error']:.1f} % | "
                         f"{100 * g['max_abs_error']:.1f} % | {100 * g['median_error']:+.1f} % |")
        lines.append("")
    return "\n".join(lines)


README_ROW = "the composition checked on an NVIDIA H200"


def readme_row(reports: list[dict[str, Any]]) -> str:
    """The README's headline row: the latest split-timed run, and the first run's errors."""
    def error(rep: dict[str, Any], implementation: str, graphs: bool, tables: str = "this run's",
              kind: str = "decode step") -> str:
        found = [g for g in rep["groups"] if (g["pass"], g["implementation"], g["graphs"]) == (kind, implementation, graphs)
                 and g["tables"].startswith(tables)]
        return f"{100 * found[0]['median_abs_error']:.1f} %"
    split = [r for r in reports if r["timing"] == "split"][-1]
    first = [r for r in reports if r["timing"] != "split"][0]
    before = sorted(g["median_abs_error"] for g in first["groups"] if g["tables"] == "this run's"
                    and (g["implementation"], g["graphs"]) in (("simctl", False), ("transformers", True)))
    return (f"| {README_ROW} (the prepared GPU run): op tables the harness measured on the card price the passes it "
            f"times there, nothing fitted | transformers decode steps replayed from CUDA graphs: median \\|error\\| "
            f"{error(split, 'transformers', True)} from the card's tables, {error(split, 'transformers', True, 'shipped')} "
            f"from the shipped H200 tables; eager steps through the `hf-eager` engine {error(split, 'transformers', False)}; "
            f"simctl's eager decoder {error(split, 'simctl', False)}, speculative rounds "
            f"{error(split, 'simctl', False, kind='speculative round')} (before op tables timed the device apart from the "
            f"host, the decoder and the graph replays: {100 * before[0]:.0f}–{100 * before[-1]:.0f} %); eager steps host-bound at "
            f"{split['eager_us_per_kernel']:.0f} µs a kernel | `benchmarks/gpu_run.py`, `benchmarks/gpu_run_report.py`, "
            f"[docs/profiles-and-harness.md](docs/profiles-and-harness.md#what-the-runs-on-an-nvidia-h200-measured) |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--write-docs", action="store_true", help="write the tables into docs/profiles-and-harness.md")
    args = parser.parse_args(argv)
    reports = [report(folder) for folder in sorted(RUNS.iterdir()) if (folder / "comparison.csv").is_file()]
    if args.json:
        print(json.dumps(reports, indent=1))
    else:
        print(table(reports))
    if args.write_docs:
        from docs_tables import write_generated, write_row

        print(f"wrote {write_generated('gpu-runs', table(reports), page='profiles-and-harness.md')}")
        print(f"wrote {write_row(README_ROW, readme_row(reports), page='README.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
