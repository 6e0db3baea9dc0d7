"""``simctl replay``: replay a trace through a modeled serving system."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import typer
from rich import box
from rich.table import Table

from simulator.cli import app
from simulator.cli._common import (
    GENERATED,
    GOODPUT_HELP,
    PERCENTILES_HELP,
    UNITS_HELP,
    Flags,
    console,
    csv_option,
    load_flags,
    max_concurrency_option,
    num_requests_option,
    parse_task_map,
    print_table,
    print_token_figures,
    request_rate_option,
    setting_options,
    summary_csv_rows,
    token_options,
    user_errors,
    warn,
    write_json,
)
from simulator.cli._tables import print_table_fast
from simulator.cost import load_prices
from simulator.errors import ScenarioError
from simulator.events import event_log_suffix, write_event_log
from simulator.metrics import json_ready
from simulator.outputs import check_output_folder, check_writable
from simulator.profile import DEFAULT_PROFILE, load_profile
from simulator.profile.identity import describe
from simulator.replay import ReplayResult, replay
from simulator.scenario import build_scenario, parse_set
from simulator.settings import LARGEST_SEED, TASK


@app.command("replay")
@setting_options("replay")
def replay_cli(
    trace: Path = typer.Argument(..., help="Trace file (users' batch_arrivals.json, simctl-trace/1, or a production "
                                 "trace), or a bundled trace by name ('example')."),
    config: Path | None = typer.Option(None, "--config", "-c", help="Scenario: TOML file or bundled name "
                                          "('design-notes'). Flags and --set override it."),
    profile: str = typer.Option(DEFAULT_PROFILE, "--profile", "-p", help="Profile JSON file or bundled profile name."),
    flags: Flags = GENERATED,  # one option per setting (simulator.settings)
    request_rate: float | None = request_rate_option(),
    max_concurrency: int | None = max_concurrency_option(),
    num_requests: int | None = num_requests_option(),
    set_values: list[str] = typer.Option([], "--set", help="Override any scenario field: KEY=VALUE with a dotted KEY, "
                                         "e.g. tasks.infobench.flush=0.1 (repeatable; wins over flags and file)."),
    task_map: str | None = typer.Option(None, "--task-map", help="Rename the trace's tasks to the profile's: "
                                           "SOURCE=TASK,... (e.g. azure=infobench)."),
    seed: int = typer.Option(0, "--seed", min=0, max=LARGEST_SEED, help="Random seed, >= 0 (same seed, same result)."),
    prices: str | None = typer.Option(None, "--prices", help="Price table (GPU type -> $ per GPU-hour): JSON file "
                                      "or bundled name (default modal-serverless; lambda-on-demand)."),
    percentiles: str = typer.Option("50,90,99", "--percentiles", help=PERCENTILES_HELP),
    goodput: str | None = typer.Option(None, "--goodput", help=GOODPUT_HELP),
    units: str = typer.Option("ms", "--units", help=UNITS_HELP),
    json_out: str | None = typer.Option(None, "--json", help="Write the summary JSON to FILE ('-' for stdout)."),
    csv_out: str | None = csv_option(),
    events: str | None = typer.Option(None, "--events", help="Write the per-prompt event log (.parquet or .csv)."),
    plot: str | None = typer.Option(None, "--plot", help="Write the standard figures of this run into DIR."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing output files."),
    from_state: Path | None = typer.Option(None, "--from-state", help="Start from a snapshot's state (simctl "
                                           "snapshot's JSON) instead of an empty system; the trace is the rest "
                                           "(see --start). Reference engine only."),
    start: float | None = typer.Option(None, "--start", min=0, help="With --from-state: the trace's calls at or "
                                       "after this many seconds are the rest, shifted to 0 (default the "
                                       "snapshot's taken_at)."),
    state_task: str | None = typer.Option(None, "--state-task", help="With --from-state: the task of the "
                                          "snapshot's prompts whose source does not tell it (vLLM's metrics)."),
) -> None:
    """Replay TRACE through micro-batching queues, workers and GPUs.

    Prints the settings that shaped the run, then latency, throughput, batch sizes and GPU
    utilisation per task. An explicit flag overrides the scenario file for every GPU task;
    `--set` overrides one field anywhere.
    """
    with user_errors():
        from simulator.trace.formats import ImportOptions, load_trace

        if from_state is None and (start is not None or state_task is not None):
            raise ScenarioError(None, None, "start" if start is not None else "state_task",
                                "--start and --state-task apply with --from-state only")
        snapshot = None
        if from_state is not None:
            from simulator.snapshot import load_snapshot

            snapshot = load_snapshot(from_state)

        # Refuse bad outputs before doing any work: never onto an input, never twice the same.
        inputs = tuple(Path(p) for p in (trace, config, profile) if p is not None and Path(p).exists())
        named = {"--json": json_out, "--csv": csv_out, "--events": events}
        outs = [o for o in named.values() if o is not None and o != "-"]
        for i, (flag, o) in enumerate(named.items()):
            for other, p in list(named.items())[i + 1:]:
                if o and p and o != "-" and Path(o).resolve() == Path(p).resolve():
                    raise ScenarioError(None, None, None, f"{flag} and {other} name the same file")
        for out in outs:
            check_writable(out, force=force, inputs=inputs)
        if plot is not None:
            from simulator.cli.plot import STANDARD_SET

            check_output_folder(plot, STANDARD_SET, force=force, inputs=inputs)
        if events:
            event_log_suffix(events)
        tokens = token_options(percentiles, goodput, units)
        task_flags, run_flags = flags.values("task"), flags.values("run")
        overrides = parse_set(set_values)
        mapping = parse_task_map(task_map)
        loaded = load_trace(trace, options=ImportOptions(task_map=mapping)).renamed(mapping)
        rate_from = ("--rate-scale" if flags.given.get("rate_scale") is not None
                     else "--set run.rate_scale" if "run.rate_scale" in overrides else None)
        loaded, implied = load_flags(loaded, request_rate=request_rate, max_concurrency=max_concurrency,
                                     num_requests=num_requests, rate_scale_from=rate_from,
                                     client=flags.given.get("client") or overrides.get("run.client"))
        run_flags.update(implied)
        prof = load_profile(profile)
        load_prices(prices)  # a bad price table fails before the run
        missing = [t for t in loaded.tasks if t not in prof.tasks]
        if missing:
            raise ScenarioError(str(trace), None, None,
                                f"task(s) {', '.join(missing)} are not in the profile {prof.name} (it has: "
                                f"{', '.join(prof.tasks)}); map them with --task-map "
                                + ",".join(f"{t}={next(iter(prof.tasks))}" for t in missing))
        scenario = build_scenario(path=config, run=run_flags, overrides=overrides)
        if task_flags:
            # Task flags apply to the trace's GPU tasks, as sweep and plan axes do.
            from simulator.sweep import Base

            gpu_tasks = Base(loaded, prof, scenario).swept_tasks(None)
            scenario = build_scenario(path=config, run=run_flags, tasks={t: task_flags for t in gpu_tasks},
                                      overrides=overrides)
        result = replay(loaded, scenario, prof, seed=seed, prices=load_prices(prices), tokens=tokens,
                        initial_state=snapshot, start=start, state_task=state_task,
                        keep_log=bool(events or plot))  # (the summary alone needs no frame)
        for outside in result.summary["config"]["profile"]["outside_grid"]:
            warn(outside["message"])
        if events:
            assert result.log is not None
            write_event_log(result.log, events, force=force)
        if csv_out:
            from simulator.outputs import write_csv

            write_csv(summary_csv_rows(json_ready(result.summary), {"trace": str(trace), "scenario": scenario.name,
                                                                    "profile": prof.name, "seed": seed}),
                      csv_out, force=force)
        if plot:
            from simulator.cli.plot import write_standard_set

            assert result.log is not None
            written = write_standard_set(result.log, Path(plot), f"{scenario.name}, {Path(trace).name}", force=force)
            warn_paths = ", ".join(str(p) for p in written)
            if json_out != "-":
                console.print(f"wrote {warn_paths}", highlight=False)
        # (the summary is encoded only where it goes: a summary of many GPUs is large)
        if json_out and write_json(json.dumps(json_ready(result.summary), indent=2), json_out, force):
            return
        print_summary(result, source=str(trace), units=units)


def _fmt(x: Any, digits: int = 2) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        if math.isinf(x):
            return "inf"
        return f"{x:,.{digits}f}"
    return str(x)


def _waste(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f} %"


def _label(name: str) -> str:
    return f"[bold]{name}[/bold]" if name == "overall" else name


def _knobs(task: str, cfg: dict[str, Any], profile) -> list[str]:
    """The settings that shaped one task's service, as short ``name=value`` cells (never one
    its topology or its profile's kind does not read)."""
    kind = getattr(getattr(profile.tasks.get(task), "service", None), "kind", None) or ""
    ignored = {k for k, s in TASK.items() if not s.reads(cfg["topology"], kind)}
    shown = {
        "policy": cfg["policy"], "flush": f"{cfg['flush']:g} s", "max_batch": cfg["max_batch"],
        "workers": "1 per GPU" if cfg["workers"] is None else cfg["workers"], "dispatch": cfg["dispatch"],
        "max_tokens": "trace's" if cfg["max_tokens"] is None else cfg["max_tokens"],
        "max_num_seqs": cfg["max_num_seqs"], "max_batched_tokens": cfg["max_batched_tokens"],
        "kv_blocks": "profile's" if cfg["kv_blocks"] is None else cfg["kv_blocks"],
    }
    for key in ("lookahead", "acceptance", "discipline"):
        shown[key] = f"profile's ({_profile_value(task, key, profile)})" if cfg[key] is None else cfg[key]
    for key in ("max_queue", "queue_timeout", "cpu_workers"):
        if cfg.get(key) is not None:
            shown[key] = cfg[key]
    return [f"{k}={v}" for k, v in shown.items() if k not in ignored]


def _profile_value(task: str, key: str, profile) -> str:
    """The value the profile's service of ``task`` uses for ``key`` (lookahead, acceptance,
    discipline), or ``none`` where its kind has no such setting."""
    value = getattr(getattr(profile.tasks.get(task), "service", None), key, None)
    if value is None:
        return "none"
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def print_pool(r: dict[str, Any], sc: Any) -> None:
    """The replica pool's figures (:func:`simulator.metrics.replica_figures`)."""
    top = sc.max_replicas if sc.max_replicas is not None else sc.min_replicas
    pool = Table(title=f"Replica pool ({sc.autoscaler}, {sc.min_replicas}-{top} replicas of {sc.gpus} GPU(s), "
                 f"cold start {sc.replica_cold_start})", title_justify="left", box=box.SIMPLE_HEAD,
                 padding=(0, 1), pad_edge=False)
    cols = ("replicas started", "cold starts", "peak", "mean", "replica-s", "GPU-hours", "at max (s)",
            "pool wait p95", "cold-start share")
    for col in cols:
        pool.add_column(col, justify="right")
    pool.add_row(str(r["started"]), str(r["cold_starts"]), str(r["peak_replicas"]), _fmt(r["mean_replicas"]),
                 _fmt(r["replica_seconds"], 0), _fmt(r["gpu_hours"], 3), _fmt(r["time_at_max_s"], 0),
                 _fmt(r["pool_wait"]["p95"], 1), f"{100 * r['cold_start_share']:.1f} %")
    print_table(pool)


def print_summary(result: ReplayResult, source: str | None = None, units: str = "ms") -> None:
    """The run's settings, then rich tables: one row per task plus overall, then one per GPU;
    the token figures' timings in ``units`` (ms or s)."""
    s = result.summary
    sc = result.scenario
    run = [f"profile={result.profile.name}", f"scenario={sc.name}", f"gpus={sc.gpus}",
           f"sharing={sc.gpu_sharing}", f"seed={result.seed}", f"rate_scale={sc.rate_scale:g}",
           f"client={sc.client}", f"deadline={'none' if sc.deadline is None else f'{sc.deadline:g} s'}",
           f"engine={s['config'].get('engine') or sc.engine}"]
    if sc.client_timeout is not None:
        run.append(f"client_timeout={sc.client_timeout:g} s")
    if sc.autoscaler is not None:
        run.append(f"autoscaler={sc.autoscaler}")
    console.print(f"[bold]replay[/bold] {source or ''}", highlight=False)
    console.print("  " + "  ".join(run), highlight=False)
    console.print("  profile " + describe(result.profile).line(), highlight=False)
    settings = Table(title="Settings per task", title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    for col in ("task", "resource", "topology", "settings"):
        settings.add_column(col)
    for task, cfg in s["config"].get("tasks", {}).items():
        settings.add_row(task, cfg["resource"], cfg["topology"], ", ".join(_knobs(task, cfg, result.profile)))
    print_table_fast(settings, console)
    rows = [(name, s["tasks"][name]) for name in s["tasks"]] + [("overall", s["overall"])]
    counts = Table(title="Prompts per task", title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    turned_away = s["overall"]["rejected"] + s["overall"]["dropped"] > 0
    failed_calls = sc.client_timeout is not None
    for col in ("task", "prompts", "done", "timed out", *(("turned away",) if turned_away else ()),
                "calls done", *(("calls failed",) if failed_calls else ()), "mean batch", "prompts/s"):
        counts.add_column(col, justify="left" if col == "task" else "right")
    for name, r in rows:
        counts.add_row(
            _label(name), str(r["prompts"]), str(r["completed"]), str(r["timed_out"]),
            *((str(r["rejected"] + r["dropped"]),) if turned_away else ()),
            f"{r['calls_completed']}/{r['calls']}",
            *((str(r["calls"] - r["calls_completed"]),) if failed_calls else ()),
            _fmt(r["mean_batch_size"]), _fmt(r["throughput_prompts_per_s"], 3),
        )
    print_table(counts)
    if failed_calls:
        console.print(f"calls failed: not done within the client timeout ({sc.client_timeout:g} s) "
                      "or the deadline; the server still finished them", highlight=False)
    latency = Table(title="Latency per task (seconds; prompts not done count as infinitely late)",
                    title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    for col in ("task", "mean", "p50", "p90", "p95", "p99", "max", "call p95", "wait mean", "TTFT p50"):
        latency.add_column(col, justify="left" if col == "task" else "right")
    for name, r in rows:
        lat = r["latency"]
        latency.add_row(
            _label(name), *(_fmt(lat[k], 1) for k in ("mean", "p50", "p90", "p95", "p99", "max")),
            _fmt(r["call_latency"]["p95"], 1), _fmt(r["wait"]["mean"], 1),
            _fmt(r["ttft"]["p50"], 2),
        )
    print_table(latency)
    print_token_figures([(_label(name), r["tokens"]) for name, r in rows], units, what="prompts")
    padding = Table(title="Padding waste per task (static batches pad every row to the longest prompt and output; "
                    "continuous batching pads nothing)", title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1),
                    pad_edge=False)
    for col in ("task", "batches", "padded tokens", "waste", "mean per batch"):
        padding.add_column(col, justify="left" if col == "task" else "right")
    for name, r in rows:
        pad = r["padding"]
        padding.add_row(_label(name), str(pad["batches"]), f"{pad['padded_tokens']:,}", _waste(pad["waste"]),
                        _waste(pad["mean_batch_waste"]))
    print_table(padding)
    if "prefix_cache" in s:
        print_prefix_cache(s["prefix_cache"])
    if "replicas" in s:
        print_pool(s["replicas"], sc)
    gpus, listed = s["gpus"], shown_gpus(s["gpus"])
    gtable = Table(title=f"GPUs (makespan {s['makespan_s']:,.1f} s, {s['gpu_seconds']:,.0f} GPU-s busy)", title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    for col in ("gpu", "utilisation", "batches", "mean batch"):
        gtable.add_column(col, justify="right")
    for g in listed:
        gtable.add_row(str(g["id"]), f"{100 * g['utilization']:.1f} %", str(g["batches"]), _fmt(g["mean_batch_size"]))
    print_table(gtable)
    if len(listed) < len(gpus):
        mean = sum(g["utilization"] for g in gpus) / len(gpus)
        console.print(f"{len(gpus):,} GPUs, {100 * mean:.1f} % utilised on average; listed above: the "
                      f"{len(listed) // 2} least and {len(listed) - len(listed) // 2} most utilised (--json lists "
                      f"every GPU)", highlight=False)
    console.print(cost_line(s.get("cost")), highlight=False)
    if "from_state" in s:
        print_from_state(s["from_state"], s["config"].get("from_state", {}))


#: GPUs the GPU table lists one by one; a run of more lists the least and the most utilised
#: (a table of thousands of rows shows nothing a reader can take in; --json has them all).
GPU_ROWS = 32


def shown_gpus(gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The GPUs the table lists: all of them up to :data:`GPU_ROWS`, else the least and the
    most utilised half and half (ties by id), in id order."""
    if len(gpus) <= GPU_ROWS:
        return gpus
    ranked = sorted(range(len(gpus)), key=lambda i: (gpus[i]["utilization"], i))
    half = GPU_ROWS // 2
    return [gpus[i] for i in sorted(ranked[:half] + ranked[-(GPU_ROWS - half):])]


def print_from_state(f: dict[str, Any], config: dict[str, Any]) -> None:
    """The snapshot's prompts, on their own line: the tables above are the trace's calls."""
    lat = f["latency"]
    console.print(f"from state ({config.get('snapshot')}, {f['source']}; the trace from {config.get('start', 0):g} s "
                  f"on; the tables above are its calls only): {f['prompts']} prompt(s) in flight "
                  f"({f['waiting']} waiting, {f['running']} in {f['running_batches']} running batch(es)), "
                  f"{f['done']} done, latency mean {_fmt(lat['mean'], 1)} p50 {_fmt(lat['p50'], 1)} "
                  f"p90 {_fmt(lat['p90'], 1)} max {_fmt(lat['max'], 1)} s (with their ages), all done by "
                  f"{_fmt(f['cleared_at'], 1)} s", highlight=False)
    for note in f["notes"]:
        console.print(f"  {note}", highlight=False)


def print_prefix_cache(figures: dict[str, Any]) -> None:
    """The prefix cache's hit rates: per task and overall, and over the run's arrival windows."""
    table = Table(title="Prefix cache (share of admitted prompts' tokens found cached, not prefilled)",
                  title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    for col in ("task", "prompts", "with a hit", "prompt tokens", "cached", "hit rate"):
        table.add_column(col, justify="left" if col == "task" else "right")
    for name, r in [*figures["tasks"].items(), ("overall", figures)]:
        table.add_row(_label(name), str(r["prompts"]), str(r["prompts_hit"]), f"{r['prompt_tokens']:,}",
                      f"{r['cached_tokens']:,}", _waste(r["hit_rate"]))
    print_table(table)
    windows = figures["over_time"]
    if len(windows) > 1:
        rates = " ".join("–" if w["hit_rate"] is None else f"{100 * w['hit_rate']:.0f}%" for w in windows)
        width = windows[1]["t_s"] - windows[0]["t_s"]
        console.print(f"hit rate over time (arrival windows of {width:,.0f} s): {rates}", highlight=False)


def cost_line(cost: dict[str, Any] | None) -> str:
    """The summary's cost in one line: GPU type, GPU-hours provisioned, price, dollars, and
    dollars per 1,000 completed prompts (or why the dollars are unknown)."""
    if not cost:
        return "cost: –"
    hours = f"{cost['gpu_hours']:,.3f} GPU-h provisioned"
    if cost.get("usd") is None:
        return f"cost: {hours}; $ unknown: {cost.get('unknown')}"
    per_1k = "–" if cost.get("usd_per_1k_prompts") is None else f"${cost['usd_per_1k_prompts']:,.4f}"
    return (f"cost: {hours} of {cost['gpu_type']} at ${cost['usd_per_gpu_hour']:,.4f}/GPU-h "
            f"({cost['prices']}) = ${cost['usd']:,.4f}; {per_1k} per 1,000 completed prompts")
