"""``simctl import``: convert a production trace (Azure, BurstGPT, Mooncake, ServeGen) to simctl's format."""

from __future__ import annotations

from pathlib import Path

import typer

from simulator.cli import app
from simulator.cli._common import console, parse_task_map, user_errors
from simulator.errors import TraceError
from simulator.outputs import check_writable
from simulator.settings import LARGEST_COUNT, LARGEST_SEED
from simulator.trace.formats import FORMATS, IMPORTERS, ImportOptions, load_trace, save_trace


@app.command("import")
def import_cli(
    fmt: str = typer.Argument(..., metavar="FORMAT", help=f"One of: {', '.join(IMPORTERS)}, or auto."),
    source: Path = typer.Argument(..., help="The production trace file."),
    output: Path = typer.Option(..., "--output", "-o", help="Trace file to write."),
    task: str | None = typer.Option(None, "--task", help="Give every request this task."),
    task_map: str | None = typer.Option(None, "--task-map", help="Rename sources to tasks: SOURCE=TASK,... (BurstGPT: model names)."),
    start: float | None = typer.Option(None, "--start", help="Keep requests from this many seconds after the first."),
    end: float | None = typer.Option(None, "--end", help="Keep requests before this many seconds after the first."),
    group_gap: float | None = typer.Option(None, "--group-gap", help="Requests within this many seconds of a call's first join it."),
    max_prompts: int = typer.Option(8, "--max-prompts", min=1, max=LARGEST_COUNT, help="Most prompts per grouped call."),
    skip_bad: bool = typer.Option(False, "--skip-bad", help="Skip malformed rows (counted) instead of stopping."),
    include_failed: bool = typer.Option(False, "--include-failed", help="Keep BurstGPT's failed requests (0 response tokens)."),
    seed: int = typer.Option(0, "--seed", min=0, max=LARGEST_SEED, help="ServeGen: seed of the synthesised arrivals and lengths."),
    dataset: Path | None = typer.Option(None, "--dataset", help="ServeGen: the length-PDF JSON (default: the sibling chunk-N-dataset.json)."),
    out_format: str | None = typer.Option(None, "--format", help=f"Output format: {', '.join(FORMATS)} (default: "
                                          "parquet for a .parquet output, else native)."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing output file."),
) -> None:
    """Convert a production trace to a simctl trace (every command also reads these files directly)."""
    with user_errors():
        if fmt != "auto" and fmt not in IMPORTERS:
            raise TraceError(None, None, None, f"unknown format {fmt!r}; valid: {', '.join(IMPORTERS)}, auto")
        if out_format is None:
            out_format = "parquet" if output.suffix.lower() == ".parquet" else "native"
        if out_format not in FORMATS:
            raise TraceError(None, None, None, f"--format: unknown format {out_format!r} (expected {', '.join(FORMATS)})")
        if group_gap is not None and group_gap < 0:
            raise TraceError(None, None, None, f"--group-gap: must be >= 0, got {group_gap:g}")
        check_writable(output, force=force, inputs=(source,))
        options = ImportOptions(task=task, task_map=parse_task_map(task_map), start=start, end=end,
                                group_gap=group_gap, max_prompts=max_prompts, skip_bad=skip_bad,
                                include_failed=include_failed, seed=seed,
                                dataset=str(dataset) if dataset else None)
        trace = load_trace(source, options=options, format=None if fmt == "auto" else fmt)
        save_trace(trace, output, format=out_format, force=force)
        console.print(f"wrote {output}: {len(trace):,} calls, {trace.n_prompts:,} prompts over "
                      f"{float(trace.columns.call_t[-1]):,.1f} s (from {trace.meta.get('format')} {source})", highlight=False)
