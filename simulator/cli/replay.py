"""``simctl replay``: replay a trace through a modeled serving system."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import typer
from rich import box
from rich.table import Table

from simulator.cli import app
from simulator.cli._common import console, user_errors, warn
from simulator.model import DISPATCH_RULES, GPU_SHARING, POLICIES, TOPOLOGIES
from simulator.outputs import check_writable, open_output
from simulator.profile import DEFAULT_PROFILE, load_profile
from simulator.replay import ReplayResult, replay
from simulator.errors import ScenarioError
from simulator.events import event_log_suffix, write_event_log
from simulator.metrics import json_ready
from simulator.scenario import build_scenario


def _names(registry) -> str:
    return ", ".join(registry.names())


@app.command("replay")
def replay_cli(
    trace: Path = typer.Argument(..., help="Trace file (users' batch_arrivals.json or simctl-trace/1)."),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="TOML scenario file (per-task settings)."),
    profile: str = typer.Option(DEFAULT_PROFILE, "--profile", "-p", help="Profile JSON file or bundled profile name."),
    flush: Optional[float] = typer.Option(None, "--flush", help="Flush window in seconds (0 = no waiting), all tasks."),
    max_batch: Optional[int] = typer.Option(None, "--max-batch", help="Max prompts per batch, all tasks."),
    policy: Optional[str] = typer.Option(None, "--policy", help=f"When a queue releases a batch: {_names(POLICIES)}."),
    topology: Optional[str] = typer.Option(None, "--topology", help=f"Queue topology, all tasks: {_names(TOPOLOGIES)}."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Workers per shared queue (default: one per GPU)."),
    dispatch: Optional[str] = typer.Option(None, "--dispatch", help=f"Dispatch rule to queues/GPUs: {_names(DISPATCH_RULES)}."),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", help="Cap on every prompt's max tokens."),
    lookahead: Optional[int] = typer.Option(None, "--lookahead", help="Drafts per speculative iteration (spec_decode profiles), all tasks."),
    acceptance: Optional[float] = typer.Option(None, "--acceptance", help="Draft acceptance rate alpha (spec_decode profiles), all tasks."),
    discipline: Optional[str] = typer.Option(None, "--discipline", help="Speculative batch discipline: ragged or lockstep (spec_decode profiles)."),
    max_num_seqs: Optional[int] = typer.Option(None, "--max-num-seqs", help="Rows in a running batch (continuous topology; default 256)."),
    max_batched_tokens: Optional[int] = typer.Option(None, "--max-batched-tokens", help="Token budget per iteration (continuous; default 8192)."),
    kv_blocks: Optional[int] = typer.Option(None, "--kv-blocks", help="KV-cache blocks per engine (continuous; default: the profile's, else unlimited)."),
    block_size: Optional[int] = typer.Option(None, "--block-size", help="Tokens per KV-cache block (continuous; default 16)."),
    max_queue: Optional[int] = typer.Option(None, "--max-queue", help="Waiting prompts a queue holds; more are rejected."),
    queue_timeout: Optional[float] = typer.Option(None, "--queue-timeout", help="Seconds a prompt may wait in a queue."),
    timeout_action: Optional[str] = typer.Option(None, "--timeout-action", help="At the queue timeout: drop the prompt, or send it anyway (drop, send)."),
    client: Optional[str] = typer.Option(None, "--client", help="open (replay arrival times) or closed:N[:THINK] (N calls outstanding)."),
    gpus: Optional[int] = typer.Option(None, "--gpus", help="Number of GPUs (default 2)."),
    gpu_sharing: Optional[str] = typer.Option(None, "--gpu-sharing", help=f"How concurrent batches share a GPU: {_names(GPU_SHARING)}."),
    deadline: Optional[float] = typer.Option(None, "--deadline", help="Seconds from trace start; prompts not done by then time out."),
    rate_scale: Optional[float] = typer.Option(None, "--rate-scale", help="Scale the arrival rate (inter-arrival times / X)."),
    seed: int = typer.Option(0, "--seed", help="Random seed (same seed, same result)."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write the summary JSON to FILE ('-' for stdout)."),
    events: Optional[str] = typer.Option(None, "--events", help="Write the per-prompt event log (.parquet or .csv)."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write the standard figures of this run into DIR."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing output files."),
) -> None:
    """Replay TRACE through micro-batching queues, workers and GPUs.

    Prints latency, throughput, batch sizes and GPU utilisation per task.
    """
    with user_errors():
        from simulator.trace.formats import load_trace

        # Refuse bad outputs before doing any work.
        for out in (json_out, events):
            if out and out != "-":
                check_writable(out, force=force, inputs=(trace,))
        if events:
            event_log_suffix(events)
        task_defaults = dict(policy=policy, topology=topology, flush=flush, max_batch=max_batch,
                             workers=workers, dispatch=dispatch, max_tokens=max_tokens,
                             lookahead=lookahead, acceptance=acceptance, discipline=discipline,
                             max_num_seqs=max_num_seqs, max_batched_tokens=max_batched_tokens,
                             kv_blocks=kv_blocks, block_size=block_size, max_queue=max_queue,
                             queue_timeout=queue_timeout, timeout_action=timeout_action)
        scenario = _scenario_from_options(
            config, task_defaults,
            dict(gpus=gpus, gpu_sharing=gpu_sharing, deadline=deadline, rate_scale=rate_scale, client=client),
        )
        loaded = load_trace(trace)
        prof = load_profile(profile)
        for name, value in task_defaults.items():
            shadowed = [t for t in loaded.tasks if value is not None and name in scenario.tasks.get(t, {})]
            if shadowed:
                warn(f"--{name.replace('_', '-')} is overridden by the scenario for task(s) {', '.join(shadowed)}")
        result = replay(loaded, scenario, prof, seed=seed)
        if events:
            write_event_log(result.log, events, force=force)
        if plot:
            from simulator.cli.plot import write_standard_set

            written = write_standard_set(result.log, plot, f"{scenario.name}, {Path(trace).name}", force=force)
            warn_paths = ", ".join(str(p) for p in written)
            if json_out != "-":
                console.print(f"wrote {warn_paths}", highlight=False)
        if json_out == "-":
            sys.stdout.write(json.dumps(json_ready(result.summary), indent=2) + "\n")
            return
        if json_out:
            with open_output(json_out, force=force) as fh:
                json.dump(json_ready(result.summary), fh, indent=2)
        print_summary(result)


def _scenario_from_options(config: Optional[Path], defaults: dict, run: dict):
    """The scenario; an invalid option value is reported by its flag (``--max-batch: ...``)."""
    try:
        return build_scenario(path=config, defaults=defaults, run=run)
    except ScenarioError as exc:
        if exc.path is None and exc.record == "option" and exc.field:
            raise ScenarioError(None, None, None, f"--{exc.field.replace('_', '-')}: {exc.message}") from None
        raise


def _fmt(x: Any, digits: int = 2) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:,.{digits}f}"
    return str(x)


def _label(name: str) -> str:
    return f"[bold]{name}[/bold]" if name == "overall" else name


def print_summary(result: ReplayResult) -> None:
    """Rich tables: one row per task plus overall, then one row per GPU."""
    s = result.summary
    sc = result.scenario
    console.print(
        f"[bold]replay[/bold] {sc.name} profile={result.profile.name} gpus={sc.gpus} "
        f"sharing={sc.gpu_sharing} seed={result.seed} rate_scale={sc.rate_scale:g}"
        + (f" client={sc.client}" if sc.client != "open" else "")
        + (f" deadline={sc.deadline:g}s" if sc.deadline else "")
    )
    rows = [(name, s["tasks"][name]) for name in s["tasks"]] + [("overall", s["overall"])]
    # Two narrow tables rather than one wide one, so an 80-column terminal shows every figure.
    counts = Table(title="Prompts per task", title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    turned_away = s["overall"]["rejected"] + s["overall"]["dropped"] > 0
    for col in ("task", "prompts", "done", "timed out", *(("turned away",) if turned_away else ()),
                "calls done", "mean batch", "prompts/s"):
        counts.add_column(col, justify="left" if col == "task" else "right")
    for name, r in rows:
        counts.add_row(
            _label(name), str(r["prompts"]), str(r["completed"]), str(r["timed_out"]),
            *((str(r["rejected"] + r["dropped"]),) if turned_away else ()),
            f"{r['calls_completed']}/{r['calls']}", _fmt(r["mean_batch_size"]),
            _fmt(r["throughput_prompts_per_s"], 3),
        )
    console.print(counts)
    latency = Table(title="Latency per task (seconds)", title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    for col in ("task", "mean", "p50", "p95", "p99", "max", "call p95", "wait", "TTFT p50"):
        latency.add_column(col, justify="left" if col == "task" else "right")
    for name, r in rows:
        lat = r["latency"]
        latency.add_row(
            _label(name), *(_fmt(lat[k], 1) for k in ("mean", "p50", "p95", "p99", "max")),
            _fmt(r["call_latency"]["p95"], 1), _fmt(r["wait"]["mean"], 1),
            _fmt(r["ttft"]["p50"], 2),
        )
    console.print(latency)
    gtable = Table(title=f"GPUs (makespan {s['makespan_s']:,.1f} s, {s['gpu_seconds']:,.0f} GPU-s busy)", title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    for col in ("gpu", "utilisation", "batches", "mean batch"):
        gtable.add_column(col, justify="right")
    for g in s["gpus"]:
        gtable.add_row(str(g["id"]), f"{100 * g['utilization']:.1f} %", str(g["batches"]), _fmt(g["mean_batch_size"]))
    console.print(gtable)
