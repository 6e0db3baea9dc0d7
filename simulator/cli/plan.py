"""``simctl plan``: the cheapest (or the fewest-GPU) configuration that meets latency SLOs."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from simulator.cli import app
from simulator.cli._common import (
    GENERATED,
    GOODPUT_HELP,
    PERCENTILES_HELP,
    Flags,
    console,
    setting_options,
    token_options,
    user_errors,
    write_json,
)
from simulator.cli._tables import print_table_fast
from simulator.cost import gpu_type, load_prices
from simulator.errors import PlanError
from simulator.metrics import json_ready
from simulator.outputs import check_figure, check_writable
from simulator.plan import DEFAULT_AXES, OBJECTIVES, Evaluator, cheapest, group_of, load_points, parse_slo, plan
from simulator.profile import DEFAULT_PROFILE, load_profile
from simulator.profile.identity import ProfileIdentity, describe
from simulator.scenario import build_scenario, parse_set
from simulator.settings import LARGEST_GPUS, LARGEST_JOBS, LARGEST_SEEDS, Setting
from simulator.sweep import Base
from simulator.trace.formats import load_trace
from simulator.uncertainty import (
    DEFAULT_CONFIDENCE,
    DEFAULT_WORLDS,
    Sources,
    WorldsEvaluator,
    check_confidence,
    check_model_error,
    check_worlds,
)


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
    profile: list[str] = typer.Option([DEFAULT_PROFILE], "--profile", "-p", help="Profile file or bundled name; "
                                      "repeat it (one per GPU type) to search GPU types too."),
    objective: str = typer.Option("auto", "--objective", help="cheapest (least $ meeting every SLO, with the Pareto "
                                  "front), fewest-gpus, or auto: cheapest when every profile's GPU type has a price."),
    prices: str | None = typer.Option(None, "--prices", help="Price table (GPU type -> $ per GPU-hour): JSON file or "
                                      "bundled name (default modal-serverless; lambda-on-demand)."),
    task: str | None = typer.Option(None, "--task", help="Search settings of this task only "
                                       "(default: every GPU task)."),
    max_gpus: int = typer.Option(8, "--max-gpus", min=1, max=LARGEST_GPUS, help="Largest GPU count to consider."),
    flags: Flags = GENERATED,  # one option per setting (simulator.settings): axes and run settings
    seeds: int = typer.Option(1, "--seeds", min=1, max=LARGEST_SEEDS, help="Seeds per configuration; figures are their mean."),
    worlds: int | None = typer.Option(None, "--worlds", min=1, max=LARGEST_SEEDS, help="Judge each SLO by its probability over N worlds (each one "
                                      "seed and one draw of the profile's uncertainty: calibration fits, engine host "
                                      f"costs, kernel costs); replaces --seeds [default with --confidence: {DEFAULT_WORLDS}]."),
    confidence: float | None = typer.Option(None, "--confidence", help="Require every SLO met with this probability "
                                            f"over the worlds (0-1) [default with --worlds: {DEFAULT_CONFIDENCE}]."),
    model_error: float | None = typer.Option(None, "--model-error", help="With --worlds: scale each world's latencies "
                                             "by exp(SIGMA z), the model's own error out of sample (learn SIGMA on runs "
                                             "the profile was not fitted on; docs/uncertainty.md) [default: the SIGMA the "
                                             "profile states in meta.model_error, else 0]."),
    set_values: list[str] = typer.Option([], "--set", help="Override any field of the base scenario: KEY=VALUE with a "
                                         "dotted KEY, e.g. tasks.graph.cpu_workers=4 (repeatable)."),
    jobs: int | None = typer.Option(None, "--jobs", "-j", min=1, max=LARGEST_JOBS, help="Local processes (default: all cores; small steps run in this process)."),
    json_out: str | None = typer.Option(None, "--json", help="Write the recommendation as JSON (FILE or '-')."),
    plot: Path | None = typer.Option(None, "--plot", help="Draw the Pareto front of cost against the SLOs (cheapest), "
                                     "or the SLO figures against load (fewest-gpus) (PNG)."),
    mixed_models: bool = typer.Option(False, "--mixed-models", help="Let --objective cheapest compare profiles of "
                                      "different models (refused by default: a plan across GPU types compares one model)."),
    goodput: str | None = typer.Option(None, "--goodput", help=GOODPUT_HELP + " Bound it with --slo goodput>=0.9 "
                                       "(the share of prompts) or overall.tokens.goodput_per_s>=X."),
    percentiles: str = typer.Option("50,90,99", "--percentiles", help=PERCENTILES_HELP),
    force: bool = typer.Option(False, "--force", help="Overwrite existing output files."),
) -> None:
    """Find the cheapest configuration (GPU type, count, settings) meeting every SLO, or the fewest GPUs.

    --objective cheapest also reports the Pareto front of cost against the SLOs; auto (the
    default) plans for cost when every profile's GPU type has a price, else for GPUs.

    Exit status 1 when no configuration within --max-gpus meets them (the closest is shown).
    """
    with user_errors():
        if json_out is not None and json_out != "-":
            check_writable(json_out, force=force, inputs=(trace,))
        if plot is not None:
            check_figure(plot, force=force, inputs=(trace,))
        if objective not in OBJECTIVES:
            raise PlanError(None, None, None, f"--objective: must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
        uncertain = worlds is not None or confidence is not None
        if model_error is not None:
            check_model_error(model_error)
        if model_error and not uncertain:
            raise PlanError(None, None, "--model-error", "applies to worlds; give --worlds N (or --confidence) too")
        if uncertain:
            check_confidence(DEFAULT_CONFIDENCE if confidence is None else confidence)
            check_worlds(DEFAULT_WORLDS if worlds is None else worlds)
            if seeds > 1:
                raise PlanError(None, None, "--seeds", "--worlds replaces --seeds (each world is one seed); give one of them")
        loaded = load_trace(trace)
        tokens = token_options(percentiles, goodput, "ms")
        slos = [parse_slo(s, loaded.tasks, tokens) for s in slo]

        def evaluator_for(b: Base) -> Evaluator:
            """Replays over worlds that ask each SLO a probability (--worlds, --confidence)."""
            return WorldsEvaluator.build(b, slos, DEFAULT_WORLDS if worlds is None else worlds,
                                         confidence=DEFAULT_CONFIDENCE if confidence is None else confidence,
                                         task=task, workers=jobs,
                                         model_error=model_error)
        axes = flags.axis_values()
        table = load_prices(prices)
        profiles = [load_profile(p) for p in dict.fromkeys(profile)]
        scenario = build_scenario(path=config, run=flags.values("run"), overrides=parse_set(set_values))
        identities = {"profiles": [describe(p).to_dict() for p in profiles]}
        if objective == "auto":
            priced = all(table.get(gpu_type(p)) is not None for p in profiles)
            objective = "cheapest" if priced else "fewest-gpus"
        if objective == "cheapest":
            bases = [Base(loaded, p, scenario, table, tokens) for p in profiles]
            with console.status("planning") as status:
                found = cheapest(bases, slos, table, axes, max_gpus=max_gpus, seeds=tuple(range(max(1, seeds))),
                                 task=task, workers=jobs, progress=lambda m: status.update(f"planning: {m}"),
                                 mixed_models=mixed_models, evaluator_for=evaluator_for if uncertain else None)
            if plot:
                from simulator import plots

                plots.pareto(found.points, found.front, f"{Path(trace).name}: cost against "
                             + ", ".join(s.text for s in slos), path=plot)
            _finish(json_ready(found.to_dict() | identities), json_out, plot, force)
            if not found.met:
                raise typer.Exit(1)
            return
        if len(profiles) > 1:
            raise PlanError(None, None, "--profile", "--objective fewest-gpus plans one profile; give one --profile, "
                            "or --objective cheapest to search GPU types")
        base = Base(loaded, profiles[0], scenario, table, tokens)
        with console.status("planning") as status:
            result = plan(base, slos, axes, max_gpus=max_gpus, seeds=tuple(range(max(1, seeds))),
                          task=task, workers=jobs, progress=lambda m: status.update(f"planning: {m}"),
                          evaluator=evaluator_for(base) if uncertain else None)
            if plot and result.met:
                ev = evaluator_for(base) if uncertain else Evaluator(base, tuple(range(max(1, seeds))), task, jobs)
                from simulator import plots

                assert result.max_rate_scale is not None  # plan() finds it for a met result (find_max_rate)
                points = load_points(ev, result.config, slos, top=1.25 * result.max_rate_scale)
                plots.load_curve(points, slos, f"{result.gpus} GPU(s): " + ", ".join(
                    f"{k}={v}" for k, v in result.config.items() if k != "gpus"), path=plot)
        _finish(json_ready(result.to_dict() | identities), json_out, plot if result.met else None, force)
        if not result.met:
            raise typer.Exit(1)


def _finish(doc: dict, json_out: str | None, plot: Path | None, force: bool) -> None:
    """Write the JSON document (``-``: stdout, and nothing else) and print the plan."""
    if write_json(json.dumps(doc, indent=2), json_out, force):
        return
    print_plan(doc)
    if plot:
        console.print(f"wrote {plot}", highlight=False)


def print_plan(doc: dict) -> None:
    """The plan: each profile's identity, the recommendation, its SLOs, cost and search."""
    cheapest = doc.get("objective") == "cheapest"
    for identity in doc.get("profiles", []):
        console.print("profile " + ProfileIdentity(**identity).line(), highlight=False)
    what = f"{doc['gpus']} {doc['gpu_type']} GPU(s)" if cheapest else f"{doc['gpus']} GPU(s)"
    unc = doc.get("uncertainty")
    every = f"every SLO with p ≥ {unc['confidence']:g}" if unc else "every SLO"
    head = (f"[bold green]cheapest meeting {every}:[/bold green]" if cheapest else
            f"[bold green]meets {every}[/bold green]") if doc["met"] else \
        f"[bold red]no configuration within {doc['gpus']} GPU(s) meets {every}; closest:[/bold red]"
    console.print(f"{head} {what}, " + ", ".join(
        f"{k}={v}" for k, v in doc["config"].items() if k != "gpus"))
    table = Table(title="SLOs" + (f" over {unc['worlds']} worlds (value: their mean)" if unc else ""),
                  title_justify="left")
    columns = ("objective", "value", "90 % interval", "met", "did not finish") if unc else \
        ("objective", "value", "met", "did not finish")
    for col in columns:
        table.add_column(col, justify="left" if col == "objective" else "right", no_wrap=True)
    figures = doc["figures"]
    for s in doc["slos"]:
        # null in the JSON document: infinite (prompts that did not finish count as infinitely late)
        value = "inf" if s["value"] is None else f"{s['value']:.3f}"
        group = group_of(s["figure"])
        unfinished, prompts = figures.get(f"{group}.unfinished"), figures.get(f"{group}.prompts")
        late = "–" if unfinished is None or prompts is None else f"{unfinished:g} of {prompts:g}"
        if unc:
            low, high = ("inf" if x is None else f"{x:.3f}" for x in s["interval"])
            verdict = f"met with p = {s['p']:.2f}" if s["met"] else f"[red]missed, p = {s['p']:.2f}[/red]"
            table.add_row(s["slo"], value, f"{low}–{high}", verdict, late)
        else:
            table.add_row(s["slo"], value, "yes" if s["met"] else "[red]no[/red]", late)
    print_table_fast(table, console)
    if unc:
        both = unc["all_met"]
        console.print(f"p = (k + 1) / (n + 2), k of n = {unc['worlds']} worlds meeting the SLO (± "
                      f"{max(s['p_se'] for s in doc['slos']):.2f} at most); every SLO at once p = {both['p']:.2f}; "
                      f"the worlds vary: {Sources.from_dict(unc['sources']).describe()}", highlight=False)
    if doc.get("max_rate_scale") is not None:
        at = f" at p ≥ {unc['confidence']:g}" if unc else ""
        console.print(f"sustains up to {doc['max_rate_scale']:.2f}x the trace's arrival rate within the SLOs{at}",
                      highlight=False)
    if cheapest:
        print_cost(doc)
        return
    search = ", ".join(f"{s['gpus']} GPU: {s['met']}/{s['replayed']} met" for s in doc["search"])
    console.print(f"search: {search}; {doc['replays']} replays in all", highlight=False)


def _usd(x: float | None) -> str:
    return "–" if x is None else f"${x:,.4f}"


def print_cost(doc: dict) -> None:
    """The cost of the cheapest plan, its price's source, and the Pareto front."""
    f, price = doc["figures"], doc["price"]
    console.print(f"cost: {_usd(f.get('cost.usd'))} for the trace ({f.get('cost.gpu_hours') or 0:,.3f} GPU-h at "
                  f"{_usd(price['usd_per_gpu_hour'])}/GPU-h, {price['prices']}: {price['offering'] or 'no offering given'}"
                  f"; read {price['read_on'] or '?'}); {_usd(f.get('cost.usd_per_1k_prompts'))} per 1,000 completed prompts",
                  highlight=False)
    table = Table(title="Pareto front: cost against the SLOs (no other configuration replayed is both cheaper "
                  "and closer to its bounds)", title_justify="left")
    for col in ("GPU type", "GPUs", "settings", "$", "$/1k prompts", "SLO ratio", "met"):
        table.add_column(col, justify="left" if col in ("GPU type", "settings") else "right", no_wrap=col != "settings")
    for p in doc["pareto_front"]:
        ratio = "inf" if p["slo_ratio"] is None else f"{p['slo_ratio']:.3f}"
        per = p.get("gpus_per_engine", 1)
        table.add_row(p["gpu_type"], str(p["gpus"]) if per == 1 else f"{p['gpus']} × TP {per}", ", ".join(f"{k}={v}" for k, v in p["config"].items()),
                      _usd(p["usd"]), _usd(p["usd_per_1k_prompts"]), ratio, "yes" if p["met"] else "no")
    print_table_fast(table, console)
    search = "; ".join(f"{s['gpu_type']}: fewest {s['fewest_gpus'] or '–'} GPU(s), counts replayed "
                       + ",".join(str(g) for g in s["counts"]) for s in doc["search"])
    console.print(f"search: {search}; {doc['configurations_replayed']} configurations, {doc['replays']} replays in all",
                  highlight=False)
