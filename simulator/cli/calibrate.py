"""``simctl calibrate``: fit a profile to an observed run and write it."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich import box
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from simulator import inputs
from simulator.calibrate import SCREEN, STARTS
from simulator.cli import app
from simulator.cli._common import console, user_errors
from simulator.cli._tables import print_table_fast
from simulator.errors import ObservedError, ProfileError
from simulator.observed import CLIENT_TIMEOUT, find_arrivals, read_observed
from simulator.outputs import check_writable, open_output
from simulator.profile import resolve_profile_path
from simulator.scenario import build_scenario
from simulator.settings import LARGEST_COUNT, LARGEST_SEEDS


@app.command("calibrate")
def calibrate_cli(
    run: Path = typer.Argument(..., help="Observed results folder (batch_NNNN.json, simulation_summary.json)."),
    scenario: Path = typer.Option(..., "--scenario", "-s", help="Scenario file of the server that produced the run."),
    start: str = typer.Option(..., "--start", help="Starting profile (file or bundled name) whose meta.calibrate lists the free parameters."),
    out: Path = typer.Option(..., "--out", "-o", help="Where to write the fitted profile (JSON)."),
    arrivals: Path | None = typer.Option(None, "--arrivals", help="The arrival file the run replayed (default: ../batch_arrivals.json)."),
    seeds: int = typer.Option(3, "--seeds", min=1, max=LARGEST_SEEDS, help="Seeds averaged per evaluation (the same at every step)."),
    max_evaluations: int = typer.Option(120, "--max-evaluations", min=1, max=LARGEST_COUNT, help="Budget of objective evaluations per local fit."),
    objective: str = typer.Option("both", "--objective", help="calls (per-call latencies), quantiles (p10..p95 per composition) or both."),
    screen: int = typer.Option(SCREEN, "--screen", min=0, max=LARGEST_COUNT, help="Quasi-random points tried before the local fits (0: start where the profile says)."),
    starts: int = typer.Option(STARTS, "--starts", min=1, max=LARGEST_SEEDS, help="Local fits, from the best screened points (the best basin is "
                               "often not the best screened point's: fewer may miss it)."),
    also: list[Path] | None = typer.Option(None, "--also", help="Another observed run of the same hardware to fit jointly (repeat; pair each with --also-scenario)."),
    also_scenario: list[Path] | None = typer.Option(None, "--also-scenario", help="The scenario of each --also run, in order."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing output file."),
) -> None:
    """Fit the free parameters of a profile so that simulated call latencies match RUN's.

    Prints the fitted values with their relative standard errors, the range of each value
    over the fits the run cannot tell apart, and the fit's error per call composition.
    With --arrivals pointing at a trace from `simctl observed --write-trace`, prompts
    generate what the real server generated.
    """
    with user_errors():
        from simulator.calibrate import OBJECTIVES, calibrate, identified, predict_ensemble
        from simulator.profile import profile_from_dict
        from simulator.trace.formats import load_trace

        also, also_scenario = list(also or []), list(also_scenario or [])
        if len(also) != len(also_scenario):
            raise ObservedError(also[0] if also else also_scenario[0], None, "--also-scenario",
                                f"give one --also-scenario per --also run ({len(also)} runs, {len(also_scenario)} scenarios)")
        if objective not in OBJECTIVES:
            raise ObservedError(None, None, "--objective", f"must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
        check_writable(out, force=force, inputs=(run, scenario, *also, *also_scenario))
        start_path = resolve_profile_path(start)
        start_data = inputs.read_json(start_path, ProfileError, "profile JSON file")
        if not isinstance(start_data, dict):
            raise ProfileError(start_path, None, None, "a profile is a JSON object")
        arrivals_path = arrivals or find_arrivals(run)
        trace = load_trace(arrivals_path) if arrivals_path else None
        scen = build_scenario(path=scenario)
        observed = read_observed(run, trace, CLIENT_TIMEOUT, scen.compositions)
        trace = observed.trace if observed.trace is not None else trace  # another tool's results carry theirs
        assert trace is not None  # read_observed has refused a run without an arrival file
        # The joint runs replay the same workload.
        joint = [(read_observed(d, trace, CLIENT_TIMEOUT), trace, build_scenario(path=sp))
                 for d, sp in zip(also, also_scenario, strict=True)]
        with Progress(SpinnerColumn(), TextColumn("calibrating: {task.fields[info]}"), TimeElapsedColumn(),
                      console=console, transient=True) as bar:
            job = bar.add_task("fit", total=None, info="starting")
            result = calibrate(observed, trace, scen, start_data, tuple(range(seeds)), max_evaluations,
                               progress=lambda i, e: bar.update(job, info=f"evaluation {i}, mean |log error| {e:.3f}"),
                               where=str(start_path), objective=objective, screen=screen, starts=starts, also=joint)
        fitted = dict(result.profile)
        fitted["name"] = out.stem
        fitted["source"] = (f"Calibrated by `simctl calibrate` on the observed run {observed.path} with scenario "
                            f"{scenario} from {start_path.name} ({result.evaluations} evaluations, {seeds} seeds). "
                            f"Started from: {start_data.get('source', '')}")
        # the same system as the start (its describes), now answering for the run it was fitted to
        fitted["answers"] = (f"What the system it describes does with traffic like the observed run {observed.name}: "
                             f"its costs fitted to that run's latencies (scenario {Path(scenario).name})")
        fitted.setdefault("meta", {})["fit"] = {
            "run": observed.name, "scenario": str(scenario), "also": [str(d) for d in also],
            "objective": objective, "screen": screen, "starts": starts, "values": result.values,
            "relative_se": result.relative_se, "cost": result.cost, "evaluations": result.evaluations,
            "ensemble": result.ensemble_values}
        with open_output(out, force=force) as fh:
            json.dump(fitted, fh, indent=1)
            fh.write("\n")
        pinned = identified(result)
        table = Table(title=f"fitted parameters (written to {out})", title_justify="left", box=box.SIMPLE_HEAD)
        for col in ("parameter", "value", "± (relative)", f"range over {len(result.ensemble)} fits", "identified"):
            table.add_column(col, justify="left" if col == "parameter" else "right")
        for name, value in result.values.items():
            values = [v[name] for v in result.ensemble_values]
            table.add_row(name, f"{value:.4g}", f"{100 * result.relative_se[name]:.0f} %",
                          f"{min(values):.3g} – {max(values):.3g}", "yes" if pinned[name] else "no")
        print_table_fast(table, console)
        if not all(pinned.values()):
            console.print("a value not identified is one the run's calls cannot pin down (it trades against "
                          "another, or the calls hardly see it): trust predictions only as far as the range below",
                          highlight=False)
        # what the fits the run cannot tell apart predict for this run: the spread is the
        # uncertainty a prediction of another configuration inherits
        spread = predict_ensemble(observed, trace, scen, [profile_from_dict(p) for p in result.ensemble])
        err = Table(title="fit error, (simulated − observed) / observed [range over the equally good fits]",
                    title_justify="left", box=box.SIMPLE_HEAD)
        for col in ("calls", "n", "p50", "p90", "mean"):
            err.add_column(col, justify="left" if col == "calls" else "right")
        for _, r in spread.iterrows():
            err.add_row(r["group"], str(r["calls"]), *(
                f"{100 * r[f'{s}_err']:+.0f} % [{100 * (r[f'{s}_low'] / r[f'{s}_ref'] - 1):+.0f}, "
                f"{100 * (r[f'{s}_high'] / r[f'{s}_ref'] - 1):+.0f}]" for s in ("p50", "p90", "mean")))
        print_table_fast(err, console)
