"""``simctl plan``: the fewest GPUs and the configuration that meet latency SLOs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.table import Table

from simulator.cli import app
from simulator.cli._common import GENERATED, Flags, console, setting_options, user_errors
from simulator.metrics import json_ready
from simulator.outputs import check_writable, open_output
from simulator.plan import DEFAULT_AXES, Evaluator, group_of, load_points, parse_slo, plan
from simulator.profile import DEFAULT_PROFILE, load_profile
from simulator.scenario import build_scenario, parse_set
from simulator.settings import Setting
from simulator.sweep import Base
from simulator.trace.formats import load_trace


def _axis_help(setting: Setting) -> str:
    default = DEFAULT_AXES.get(setting.name, ())
    shown = ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in default)
    searched = f" (default {shown})" if default else ""
    return f"Values to search, comma-separated{searched}; restricts or fixes the search."


@app.command("plan")
@setting_options("plan", axis_help=_axis_help)
def plan_cli(
    trace: Path = typer.Argument(..., help="Trace file, or a bundled trace by name ('example')."),
    slo: list[str] = typer.Option(..., "--slo", help='Objective, e.g. "infobench.latency.p95<=60" (repeatable).'),
    config: Path | None = typer.Option(None, "--config", "-c", help="Base scenario: TOML file or bundled name "
                                          "(searched settings override it)."),
    profile: str = typer.Option(DEFAULT_PROFILE, "--profile", "-p", help="Profile file or bundled name."),
    task: str | None = typer.Option(None, "--task", help="Search settings of this task only "
                                       "(default: every GPU task)."),
    max_gpus: int = typer.Option(8, "--max-gpus", help="Largest GPU count to consider."),
    flags: Flags = GENERATED,  # one option per setting (simulator.settings): axes and run settings
    seeds: int = typer.Option(1, "--seeds", help="Seeds per configuration; figures are their mean."),
    set_values: list[str] = typer.Option([], "--set", help="Override any field of the base scenario: KEY=VALUE with a "
                                         "dotted KEY, e.g. tasks.graph.cpu_workers=4 (repeatable)."),
    jobs: int | None = typer.Option(None, "--jobs", "-j", help="Local processes (default: all cores)."),
    json_out: str | None = typer.Option(None, "--json", help="Write the recommendation as JSON (FILE or '-')."),
    plot: Path | None = typer.Option(None, "--plot", help="Draw the SLO figures against load (PNG)."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing output files."),
) -> None:
    """Find the fewest GPUs, and the configuration at that count, meeting every SLO.

    Exit status 1 when no configuration within --max-gpus meets them (the closest is shown).
    """
    with user_errors():
        for out in (json_out, plot):
            if out and str(out) != "-":
                check_writable(out, force=force, inputs=(trace,))
        loaded = load_trace(trace)
        slos = [parse_slo(s, loaded.tasks) for s in slo]
        axes = flags.axis_values()
        base = Base(loaded, load_profile(profile),
                    build_scenario(path=config, run=flags.values("run"), overrides=parse_set(set_values)))
        with console.status("planning") as status:
            result = plan(base, slos, axes, max_gpus=max_gpus, seeds=tuple(range(max(1, seeds))),
                          task=task, workers=jobs, progress=lambda m: status.update(f"planning: {m}"))
            if plot and result.met:
                ev = Evaluator(base, tuple(range(max(1, seeds))), task, jobs)
                from simulator import plots

                assert result.max_rate_scale is not None  # plan() finds it for a met result (find_max_rate)
                points = load_points(ev, result.config, slos, top=1.25 * result.max_rate_scale)
                plots.load_curve(points, slos, f"{result.gpus} GPU(s): " + ", ".join(
                    f"{k}={v}" for k, v in result.config.items() if k != "gpus"), path=plot)
        doc = json_ready(result.to_dict())
        if json_out == "-":
            sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        else:
            if json_out:
                with open_output(json_out, force=force) as fh:
                    json.dump(doc, fh, indent=2)
            print_plan(doc)
            if plot and result.met:
                console.print(f"wrote {plot}", highlight=False)
        if not result.met:
            raise typer.Exit(1)


def print_plan(doc: dict) -> None:
    head = "[bold green]meets every SLO[/bold green]" if doc["met"] else \
        f"[bold red]no configuration within {doc['gpus']} GPU(s) meets every SLO; closest:[/bold red]"
    console.print(f"{head} {doc['gpus']} GPU(s), " + ", ".join(
        f"{k}={v}" for k, v in doc["config"].items() if k != "gpus"))
    table = Table(title="SLOs", title_justify="left")
    for col in ("objective", "value", "met", "did not finish"):
        table.add_column(col, justify="left" if col == "objective" else "right", no_wrap=True)
    figures = doc["figures"]
    for s in doc["slos"]:
        # null in the JSON document: infinite (prompts that did not finish count as infinitely late)
        value = "inf" if s["value"] is None else f"{s['value']:.3f}"
        group = group_of(s["figure"])
        unfinished, prompts = figures.get(f"{group}.unfinished"), figures.get(f"{group}.prompts")
        late = "–" if unfinished is None or prompts is None else f"{unfinished:g} of {prompts:g}"
        table.add_row(s["slo"], value, "yes" if s["met"] else "[red]no[/red]", late)
    console.print(table)
    if doc["max_rate_scale"] is not None:
        console.print(f"sustains up to {doc['max_rate_scale']:.2f}x the trace's arrival rate within the SLOs",
                      highlight=False)
    search = ", ".join(f"{s['gpus']} GPU: {s['met']}/{s['replayed']} met" for s in doc["search"])
    console.print(f"search: {search}; {doc['replays']} replays in all", highlight=False)
