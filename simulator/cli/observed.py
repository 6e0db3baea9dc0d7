"""``simctl observed`` and ``simctl compare-runs``: real runs in, figure-by-figure comparisons out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich import box
from rich.table import Table

from simulator.cli import app
from simulator.cli._common import (
    GOODPUT_HELP,
    PERCENTILES_HELP,
    UNITS_HELP,
    console,
    print_token_figures,
    token_options,
    user_errors,
    write_json,
)
from simulator.cli._tables import print_table_fast
from simulator.errors import ObservedError
from simulator.metrics import json_ready
from simulator.observed import (
    CLIENT_TIMEOUT,
    ObservedRun,
    compare_calls,
    observed_to_json,
    read_observed_runs,
    read_run,
)
from simulator.outputs import check_output_folder, check_writable


def _fmt(x: Any, digits: int = 1) -> str:
    return "–" if x is None or x != x else f"{x:,.{digits}f}"


def print_call_figures(figures: dict, title: str) -> None:
    """One row per composition class, per task (calls containing it) and overall."""
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    table.add_column("calls", justify="left")
    for col in ("n", "ok", "fail", "mean", "p50", "p90", "p99", "p50*", "p90*"):
        table.add_column(col, justify="right")
    groups = [(c, g) for c, g in figures["compositions"].items()]
    groups += [(f"with {t}", g) for t, g in figures["tasks"].items()] + [("[bold]overall[/bold]", figures["overall"])]
    for name, g in groups:
        lat, cens = g["latency"], g["latency_censored"]
        table.add_row(name, str(g["calls"]), str(g["ok"]), str(g["failed"]),
                      *(_fmt(lat[k]) for k in ("mean", "p50", "p90", "p99")),
                      _fmt(cens["p50"]), _fmt(cens["p90"]))
    print_table_fast(table, console)
    console.print("* over all calls, failed ones at the timeout", highlight=False)


def _compositions(config: Path | None):
    """The composition rules of the scenario ``config`` (none without one)."""
    from simulator.scenario import Compositions, build_scenario

    return build_scenario(path=config).compositions if config is not None else Compositions()


@app.command("observed")
def observed_cli(
    folder: Path = typer.Argument(..., help="Results folder of the load-testing client (batch_NNNN.json, simulation_summary.json), "
                                  "or another tool's results (vllm bench serve, GuideLLM, AIPerf); FILE#K: benchmark K of a file of several."),
    arrivals: Path | None = typer.Option(None, "--arrivals", help="The arrival file the run replayed (default: ../batch_arrivals.json)."),
    timeout: float | None = typer.Option(None, "--timeout", help="Client timeout (s of the run's clock): failed calls are "
                                         f"censored here [default: the run's own, else {CLIENT_TIMEOUT:g}]."),
    config: Path | None = typer.Option(None, "--config", "-c", help="Scenario (file or bundled name) whose [compositions] class the calls, e.g. lminference-fw5 [default: no classes]."),
    json_out: str | None = typer.Option(None, "--json", help="Write the figures and per-call table to FILE ('-' for stdout)."),
    lengths: str | None = typer.Option(None, "--lengths", help="Tasks (comma-separated) whose answers give each prompt's output length, for --write-trace."),
    write_trace: Path | None = typer.Option(None, "--write-trace", help="Write the arrival trace with the --lengths tasks' measured output tokens as max_tokens (simctl-trace/1)."),
    percentiles: str = typer.Option("50,90,99", "--percentiles", help=PERCENTILES_HELP),
    goodput: str | None = typer.Option(None, "--goodput", help=GOODPUT_HELP),
    units: str = typer.Option("ms", "--units", help=UNITS_HELP),
    csv_out: str | None = typer.Option(None, "--csv", help="Write the figures to FILE as CSV: one row per task, "
                                       "call composition and overall, flat columns."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing output file."),
) -> None:
    """Summarise an observed run per call composition and overall, as replay does.

    A call succeeded only if its result file exists and holds `choices`; failed calls are
    censored at the client timeout (the run's own unless given). A run of `simctl load
    --time-scale X` is shown in model seconds (its clock times X). Where the run recorded
    requests (simctl load's requests.parquet, another tool's per-request TTFT), also TTFT,
    ITL, TPOT, end-to-end latency, token throughputs and --goodput. With --lengths and --write-trace, also write the
    workload as this run generated it: each answered prompt of those tasks gets its
    answer's length in tokens (about 4 characters each) as max_tokens, for replay and
    calibrate to simulate.

    A file of several benchmarks (a GuideLLM rate sweep, an appended vllm bench file)
    shows each as a run; FILE#K reads benchmark K (from 0) alone.
    """
    with user_errors():
        if (lengths is None) != (write_trace is None):
            raise ObservedError(folder, None, "--lengths" if lengths is None else "--write-trace",
                                "--lengths and --write-trace go together")
        tokens = token_options(percentiles, goodput, units)
        if json_out is not None and json_out != "-":
            check_writable(json_out, force=force, inputs=(folder,))
        if write_trace is not None:
            check_writable(write_trace, force=force, inputs=(folder,) + ((arrivals,) if arrivals else ()))
        if csv_out is not None:
            check_writable(csv_out, force=force, inputs=(folder,))
        runs = read_observed_runs(folder, arrivals, timeout, _compositions(config))
        if len(runs) > 1 and write_trace is not None:
            raise ObservedError(folder, None, "--write-trace", f"holds {len(runs)} benchmarks; "
                                f"give one as {folder}#K to write its trace")
        run = runs[0]
        if write_trace is not None and lengths is not None:  # both or neither, as checked above
            from simulator.observed import find_arrivals, with_observed_lengths
            from simulator.trace.formats import load_trace, save_trace

            tasks = [t.strip() for t in lengths.split(",") if t.strip()]
            arrival_file = arrivals or find_arrivals(folder)
            if run.trace is not None:  # another tool's results carry their own calls
                base = run.trace
            else:
                assert arrival_file is not None  # read_observed found it, or raised
                base = load_trace(arrival_file)
            trace = with_observed_lengths(base, run, tasks)
            save_trace(trace, write_trace, force=force)
            console.print(f"wrote {write_trace}: {trace.meta['output_lengths']['prompts']} prompts of "
                          f"{', '.join(tasks)} with their measured output tokens", highlight=False)
        datas = [json_ready(observed_to_json(r, tokens)) for r in runs]
        if csv_out is not None:
            from simulator.outputs import flat_record, task_rows, write_csv

            write_csv([row for r, d in zip(runs, datas, strict=True)
                       for row in task_rows({"run": r.name, **flat_record(d["figures"])}, {"compositions": "composition"})],
                      csv_out, force=force)
        every = datas[0] if len(runs) == 1 else {"format": "simctl-observed-runs/1", "runs": datas}
        if write_json(json.dumps(every, indent=2), json_out, force):
            return
        for shown, figures in zip(runs, datas, strict=True):
            _print_run(shown, figures, units)
        if len(runs) > 1:  # a file of several benchmarks (a GuideLLM sweep): each is a run
            console.print(f"{len(runs)} benchmarks; {folder}#K reads benchmark K alone (K from 0), as "
                          "compare-runs, calibrate and predict take it", highlight=False)


def _print_run(run: ObservedRun, data: dict, units: str) -> None:
    """One observed run's tables: call latency, then its token figures where it has them."""
    label = f" ({run.meta['benchmark_label']})" if run.meta.get("benchmark_label") else ""
    scaled = f"; model s, the run's clock × {run.time_scale:g}" if run.time_scale != 1 else ""
    print_call_figures(data["figures"], f"observed {run.name}{label}: call latency (s{scaled}), failures censored at "
                                        f"{run.timeout:g} s")
    per_task = data["figures"]["tokens"]
    if per_task is None:
        console.print("no per-request records (TTFT, tokens) in this run: token figures need simctl load's "
                      "requests.parquet or another tool's per-request results", highlight=False)
    else:
        groups = [(t, f) for t, f in per_task.items() if t != "overall"] + [("[bold]overall[/bold]", per_task["overall"])]
        print_token_figures(groups, units)


@app.command("compare-runs")
def compare_runs_cli(
    reference: Path = typer.Argument(..., help="The reference run: results folder, observed JSON or event log."),
    other: Path = typer.Argument(..., help="The run to compare with it (e.g. a simulated event log)."),
    arrivals: Path | None = typer.Option(None, "--arrivals", help="Arrival file for results folders (default: ../batch_arrivals.json)."),
    timeout: float | None = typer.Option(None, "--timeout", help="Client timeout (s of the run's clock): calls over it "
                                         f"failed, censored here [default: a run's own, else {CLIENT_TIMEOUT:g}]."),
    config: Path | None = typer.Option(None, "--config", "-c", help="Scenario (file or bundled name) whose [compositions] class the calls, e.g. lminference-fw5 [default: no classes]."),
    plot_dir: str | None = typer.Option(None, "--plot", help="Write cdf.png (overlaid CDFs) and scatter.png (per call) into DIR."),
    json_out: str | None = typer.Option(None, "--json", help="Write the error table to FILE ('-' for stdout)."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing output files."),
) -> None:
    """Compare two runs call by call.

    p50/p90/p99/mean of call latency per composition and their relative error
    (other − reference) / reference."""
    with user_errors():
        if json_out is not None and json_out != "-":
            check_writable(json_out, force=force, inputs=(reference, other))
        if plot_dir is not None:
            check_output_folder(plot_dir, ("cdf.png", "scatter.png"), force=force, inputs=(reference, other))
        plot = None if plot_dir is None else Path(plot_dir)
        compositions = _compositions(config)
        name_a, calls_a = read_run(reference, timeout, arrivals, compositions)
        name_b, calls_b = read_run(other, timeout, arrivals, compositions)
        table = compare_calls(calls_a, calls_b)
        if plot:
            from simulator.plots import calls_scatter, runs_cdf

            plot.mkdir(exist_ok=True)
            runs_cdf({name_a: calls_a, name_b: calls_b}, f"Call latency: {name_b} vs {name_a}",
                     plot / "cdf.png", timeout)
            calls_scatter(calls_a, calls_b, (name_a, name_b), f"Per-call latency: {name_b} vs {name_a}",
                          plot / "scatter.png")
        if json_out and write_json(table.to_json(orient="records", indent=2), json_out, force):
            return
        shown = "each run's own timeout" if timeout is None else f"{timeout:g} s"
        out = Table(title=f"call latency (s), failures at {shown}: {name_b} against {name_a}",
                    title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
        out.add_column("calls", justify="left")
        out.add_column("n", justify="right")
        for stat in ("p50", "p90", "p99", "mean"):
            out.add_column(stat, justify="right")
        for _, r in table.iterrows():
            stats = ("p50", "p90", "p99", "mean")
            out.add_row(r["group"], str(r["calls"]), *(_fmt(r[f"{s}_ref"]) for s in stats))
            out.add_row("", "", *(_fmt(r[f"{s}_other"]) for s in stats))
            out.add_row("  error", "", *("–" if r[f"{s}_err"] != r[f"{s}_err"] else f"{100 * r[f'{s}_err']:+.0f} %"
                                         for s in stats), end_section=True)
        print_table_fast(out, console)
        console.print(f"rows per group: {name_a}, {name_b}, error = ({name_b} − {name_a}) / {name_a}", highlight=False)
