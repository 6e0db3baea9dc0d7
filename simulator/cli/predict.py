"""``simctl predict``: what a profile predicts for a trace, per call composition, over seeds;
with ``--observed``, against a real run."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import typer
from rich import box
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from simulator.cli import app
from simulator.cli._common import (
    PERCENTILES_HELP,
    TIMING_LABELS,
    UNITS_HELP,
    console,
    print_table,
    token_options,
    user_errors,
)
from simulator.errors import ObservedError, ProfileError, ScenarioError, TraceError
from simulator.outputs import check_writable, open_output
from simulator.profile import DEFAULT_PROFILE
from simulator.settings import LARGEST_SEEDS

#: the format tag of ``--json`` files
FORMAT = "simctl-predict/1"


@app.command("predict")
def predict_cli(
    trace: Path = typer.Argument(..., help="Trace to simulate (any format replay reads), or a bundled trace by name ('example')."),
    scenario: Path | None = typer.Option(None, "--scenario", "-s", "--config", "-c",
                                            help="Scenario: TOML file or bundled name ('design-notes') [default: built-in settings]."),
    profile: str = typer.Option(DEFAULT_PROFILE, "--profile", "-p", help="Profile JSON file or bundled profile name."),
    seeds: int | None = typer.Option(None, "--seeds", min=1, max=LARGEST_SEEDS, help="Simulated runs (seeds 0..N-1), each one whole run; figures are averaged over them [default: 10]."),
    worlds: int | None = typer.Option(None, "--worlds", min=1, max=LARGEST_SEEDS, help="Give each figure a 90 % interval over N worlds, each one "
                                      "whole run with its own seed and its own draw of the profile's uncertainty "
                                      "(calibration fits, engine host costs, kernel costs); replaces --seeds."),
    model_error: float | None = typer.Option(None, "--model-error", help="With --worlds: scale each world's latencies "
                                             "by exp(SIGMA z), the model's own error out of sample (learn SIGMA on runs "
                                             "the profile was not fitted on; docs/uncertainty.md) [default: the SIGMA the "
                                             "profile states in meta.model_error, else 0]."),
    observed: Path | None = typer.Option(None, "--observed", help="An observed results folder (batch_NNNN.json, simulation_summary.json) "
                                            "to compare with: prints observed, predicted and the relative error."),
    arrivals: Path | None = typer.Option(None, "--arrivals", help="The arrival file the --observed run replayed (default: ../batch_arrivals.json)."),
    percentiles: str = typer.Option("50,90,99", "--percentiles", help=PERCENTILES_HELP),
    units: str = typer.Option("ms", "--units", help=UNITS_HELP),
    json_out: Path | None = typer.Option(None, "--json", help="Write the figures to FILE (JSON)."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing output file."),
) -> None:
    """Predict call latency per call composition from a profile, averaged over simulated runs.

    Each seed is one whole simulated run of TRACE: p50, p90, p99 and mean call latency
    (censored at the scenario's client timeout) are computed per run, then averaged; ±
    is their standard deviation over the runs. With --observed, the same figures of the
    real run beside them and the relative error of each, and where the run recorded requests
    (simctl load's requests.parquet, another tool's per-request TTFT) its TTFT, ITL, TPOT
    and end-to-end latency against the predicted. A time-scaled run is compared in model
    seconds, censored at its own timeout.
    """
    with user_errors():
        from simulator import bundled
        from simulator.calibrate import predict, simulate_figures
        from simulator.observed import find_arrivals, read_observed
        from simulator.profile import load_profile
        from simulator.scenario import build_scenario
        from simulator.trace.formats import load_trace

        tokens = token_options(percentiles, None, units)
        from simulator.uncertainty import check_model_error, check_worlds

        if model_error is not None:
            check_model_error(model_error)
        if worlds is not None:
            check_worlds(worlds)
            if seeds is not None:
                raise ObservedError(None, None, "--seeds", "--worlds replaces --seeds (each world is one seed); "
                                    "give one of them")
        elif model_error:
            raise ObservedError(None, None, "--model-error", "applies to worlds; give --worlds N too")
        if arrivals is not None and observed is None:
            raise ObservedError(arrivals, None, "--arrivals", "is the arrival file of an --observed run; give --observed too")
        # Refuse a bad output before any work, and never write onto an input (a bundled name
        # is its file).
        inputs = [bundled.resolve("traces", trace, TraceError), bundled.resolve("profiles", profile, ProfileError)]
        if scenario is not None:
            inputs.append(bundled.resolve("scenarios", scenario, ScenarioError))
        inputs += [p for p in (observed, arrivals) if p is not None]
        if json_out is not None:
            check_writable(json_out, force=force, inputs=tuple(inputs))
        loaded = load_trace(trace)
        prof = load_profile(profile)
        missing = [t for t in loaded.tasks if t not in prof.tasks]
        if missing:
            raise ProfileError(prof.path or str(profile), None, None,
                               f"has no task {', '.join(missing)} of the trace {trace} (it has: {', '.join(prof.tasks)})")
        scen = build_scenario(path=scenario)
        run = None
        if observed is not None:
            arrivals_path = arrivals or find_arrivals(observed)
            # (read_observed refuses a run without an arrival file, naming the file it looked for)
            # (the run's own timeout; a time-scaled run in model seconds, as the trace's replay)
            run = read_observed(observed, load_trace(arrivals_path) if arrivals_path else None,
                                None, scen.compositions)
            _check_same_calls(loaded, run, trace)
        seeds = 10 if seeds is None else seeds
        runs = seeds if worlds is None else worlds
        chosen = tuple(range(runs))
        with Progress(SpinnerColumn(), TextColumn("simulating runs"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console, transient=True) as bar:
            job = bar.add_task("seeds", total=runs)

            def advance(done: int) -> None:
                bar.update(job, completed=done)

            if worlds is not None:
                from simulator.uncertainty import predict_worlds

                figures = predict_worlds(loaded, scen, prof, worlds, observed=run, progress=advance,
                                         model_error=model_error)
            elif run is None:
                figures = simulate_figures(loaded, scen, prof, chosen, progress=advance)
            else:
                figures = predict(run, loaded, scen, prof, chosen, progress=advance, tokens=tokens)
        if json_out is not None:
            with open_output(json_out, force=force) as fh:
                json.dump(_json(figures, trace, scen.name, prof.name, chosen, run, worlds), fh, indent=1)
                fh.write("\n")
        console.print(f"[bold]predict[/bold] {trace}  profile={prof.name}  scenario={scen.name}  "
                      + (f"seeds={seeds}" if worlds is None else f"worlds={worlds}"), highlight=False)
        if worlds is not None:
            _print_worlds(figures, worlds, run.name if run is not None else None)
        elif run is None:
            _print_prediction(figures, seeds)
        else:
            _print_comparison(figures, run.name, seeds)
            _print_token_comparison(figures.attrs.get("tokens"), run.name, units)
        if json_out is not None:
            console.print(f"wrote {json_out}", highlight=False)


def _check_same_calls(trace: Any, run: Any, name: Path) -> None:
    """An observed run is compared class by class: it must be a run of TRACE's calls."""
    ours = {str(c.id): len(c.prompts) for c in trace.calls}
    theirs = dict(zip(run.calls["call_id"].astype(str), run.calls["prompts"].astype(int), strict=True))
    if ours.keys() != theirs.keys():
        odd = min(ours.keys() ^ theirs.keys())
        raise ObservedError(run.path, None, None,
                            f"the run's calls are not the calls of {name} (call {odd} is in one, not the other); "
                            "give the trace the run replayed, or its --arrivals")
    wrong = next((c for c in ours if ours[c] != theirs[c]), None)
    if wrong is not None:
        raise ObservedError(run.path, None, None,
                            f"call {wrong} has {theirs[wrong]} prompts in the run but {ours[wrong]} in {name}")


def _json(figures: Any, trace: Path, scenario: str, profile: str, seeds: tuple[int, ...], run: Any,
          worlds: int | None = None) -> dict[str, Any]:
    """The ``--json`` document: the library's table as one record per group (an infinite
    figure, a call turned away with no timeout to censor it, is ``null``); with ``--worlds``,
    each figure's interval (``p50_low``, ``p50_high``) and ``uncertainty``: the worlds, the
    level and what varied between them."""
    from simulator.metrics import json_ready

    records = [{k: v.item() if hasattr(v, "item") else v for k, v in row.items()}   # numpy scalars: plain
               for row in figures.to_dict(orient="records")]
    extra = {} if worlds is None else {"uncertainty": {"worlds": worlds, "level": figures.attrs["level"],
                                                       "sources": figures.attrs["sources"].to_dict()}}
    return json_ready({"format": FORMAT, "trace": str(trace), "scenario": scenario, "profile": profile,
                       "seeds": list(seeds), "observed": None if run is None else {"run": run.name, "path": run.path},
                       "figures": records, **_token_json(figures), **extra})


def _token_json(figures: Any) -> dict[str, Any]:
    """The token comparison's records (``tokens``, values in ms), where there is one."""
    table = figures.attrs.get("tokens")
    if table is None:
        return {}
    return {"tokens": [{k: v.item() if hasattr(v, "item") else v for k, v in row.items()}
                       for row in table.to_dict(orient="records")]}


def _cell(value: float, sd: float | None = None) -> str:
    """``value`` (± ``sd``) in seconds: one decimal, two below 10 s (graph calls take ~0.1 s)."""
    if math.isinf(value):
        return "inf"
    if math.isnan(value):
        return "–"
    digits = 1 if abs(value) >= 10 else 2
    text = f"{value:,.{digits}f}"
    return text if sd is None or math.isnan(sd) else f"{text} ± {sd:,.{digits}f}"


def _bound(value: float) -> str:
    """An interval's bound: whole seconds from 10 s (the interval says how far, not to the tenth)."""
    return _cell(value) if math.isinf(value) or math.isnan(value) or abs(value) < 10 else f"{value:,.0f}"


def _label(group: str) -> str:
    return f"[bold]{group}[/bold]" if group == "overall" else group


def _print_prediction(figures: Any, seeds: int) -> None:
    table = Table(title=f"Call latency predicted (seconds; mean ± sd over {seeds} whole runs)", title_justify="left",
                  box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    for col in ("class", "calls", "unfinished", "p50", "p90", "p99", "mean"):
        table.add_column(col, justify="left" if col == "class" else "right")
    for _, r in figures.iterrows():
        table.add_row(_label(r["group"]), str(int(r["calls"])), f"{r['unfinished']:g}",
                      *(_cell(r[s], r[f"{s}_sd"]) for s in ("p50", "p90", "p99", "mean")))
    print_table(table)
    if figures["unfinished"].max() > 0:
        console.print("unfinished: calls that failed at the client timeout or the deadline, or were turned away "
                      "(mean over runs); their latency counts at the timeout", highlight=False)


def _print_worlds(figures: Any, worlds: int, run: str | None) -> None:
    """Each figure's mean over the worlds and its 90 % interval (beside the observed run's)."""
    observed = run is not None
    title = (f"Call latency observed in {run} and predicted" if observed else "Call latency predicted") + \
        f" (seconds; mean over {worlds} worlds, and its 90 % interval)"
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    stats = ("p50", "p90", "p99", "mean")
    if observed:
        for col in ("class", "calls", "figure", "observed", "predicted", "90 % interval", "inside"):
            table.add_column(col, justify="left" if col in ("class", "figure") else "right")
        for _, r in figures.iterrows():
            for i, stat in enumerate(stats):
                table.add_row(_label(r["group"]) if i == 0 else "", str(int(r["calls"])) if i == 0 else "", stat,
                              _cell(r[f"{stat}_ref"]), _cell(r[stat]),
                              f"{_cell(r[f'{stat}_low'])}–{_cell(r[f'{stat}_high'])}",
                              "yes" if r[f"{stat}_inside"] else "no", end_section=stat == "mean")
    else:
        # (the column only where a call did not finish: the intervals need the width)
        late = bool(figures["unfinished"].max() > 0)
        for col in ("class", "calls", *(("unfinished",) if late else ()), *stats):
            table.add_column(col, justify="left" if col == "class" else "right")
        for _, r in figures.iterrows():
            table.add_row(_label(r["group"]), str(int(r["calls"])), *((f"{r['unfinished']:g}",) if late else ()),
                          *(f"{_cell(r[s])} ({_bound(r[f'{s}_low'])}–{_bound(r[f'{s}_high'])})" for s in stats))
    print_table(table)
    console.print(f"each world: one whole run, its own seed and draw of the profile's uncertainty; "
                  f"the worlds vary: {figures.attrs['sources'].describe()}", highlight=False)


def _print_comparison(errors: Any, run: str, seeds: int) -> None:
    table = Table(title=f"Call latency observed in {run} and predicted (seconds)", title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    for col in ("class", "calls", "figure", "observed", "predicted", "error"):
        table.add_column(col, justify="left" if col in ("class", "figure") else "right")
    for _, r in errors.iterrows():
        for i, stat in enumerate(("p50", "p90", "p99", "mean")):
            err = r[f"{stat}_err"]
            table.add_row(_label(r["group"]) if i == 0 else "", str(int(r["calls"])) if i == 0 else "", stat,
                          _cell(r[f"{stat}_ref"]), _cell(r[f"{stat}_other"], r[f"{stat}_sd"]),
                          "–" if math.isnan(err) else f"{100 * err:+.0f} %", end_section=stat == "mean")
    print_table(table)
    console.print(f"predicted: mean ± sd over {seeds} whole simulated runs; error: (predicted − observed) / observed",
                  highlight=False)


def _print_token_comparison(table: Any, run: str, units: str) -> None:
    """TTFT, ITL, TPOT and end-to-end latency per request, observed and predicted, in ``units``."""
    if table is None or table.empty:
        return
    scale, digits = (1.0, 1) if units == "ms" else (1e-3, 4)
    out = Table(title=f"Token timings per request observed in {run} and predicted ({units})", title_justify="left",
                box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    for col in ("figure", "stat", "observed", "predicted", "error"):
        out.add_column(col, justify="left" if col in ("figure", "stat") else "right")
    last = None
    for _, r in table.iterrows():
        name = TIMING_LABELS[r["figure"].rsplit("_", 1)[0]]
        out.add_row(name if name != last else "", r["stat"], f"{r['observed'] * scale:,.{digits}f}",
                    f"{r['predicted'] * scale:,.{digits}f} ± {r['sd'] * scale:,.{digits}f}",
                    "–" if math.isnan(r["err"]) else f"{100 * r['err']:+.0f} %")
        last = name
    print_table(out)
