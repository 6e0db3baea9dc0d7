"""``simctl load``: replay a trace against a live endpoint, in real time, into a run folder."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from pathlib import Path
from typing import Any

import typer

from simulator.cli import app
from simulator.cli._common import (
    console,
    interrupted,
    load_flags,
    max_concurrency_option,
    num_requests_option,
    request_rate_option,
    user_errors,
)
from simulator.errors import LoadError
from simulator.observed import CLIENT_TIMEOUT
from simulator.settings import LARGEST_COUNT, LARGEST_TOKENS


def _live() -> Any:
    """The live package, or a one-line error naming the extra to install."""
    try:
        import httpx  # noqa: F401

        import simulator.live as live
    except ModuleNotFoundError as exc:
        raise LoadError(None, None, None, f"simctl load needs the Python package '{exc.name}': "
                        "pip install 'simctl-llm[live]'") from None
    return live


def _fmt(x: float) -> str:
    return "–" if x != x else f"{x:,.2f}"


@app.command("load")
def load_cli(
    url: str = typer.Argument(..., help="The endpoint: the batch endpoint's URL (--api batch), or the server's base "
                              "URL for the OpenAI APIs (http://HOST:8000; /v1/completions is added)."),
    trace: Path = typer.Argument(..., help="Trace file (any format replay reads) or a bundled trace by name."),
    out: Path = typer.Option(..., "--out", "-o", help="The run folder to write (must not exist): batch_NNNN.json per "
                             "call, simulation_summary.json, requests.parquet, batch_arrivals.json."),
    api: str = typer.Option("batch", "--api", help="batch (the users' endpoint: one POST per call), completions or "
                            "chat (OpenAI-compatible, streamed, one request per prompt)."),
    model: str | None = typer.Option(None, "--model", help="The served model's name (needed by --api completions/chat)."),
    client: str | None = typer.Option(None, "--client", help="open (every call at its instant) or closed:N[:THINK] "
                                      "(N calls outstanding). [default: open]"),
    time_scale: float = typer.Option(1.0, "--time-scale", help="Compress time: a call at t is sent at t / X."),
    rate_scale: float | None = typer.Option(None, "--rate-scale", help="Multiply the arrival rate (as in replay). "
                                            "[default: 1]"),
    request_rate: float | None = request_rate_option(),
    max_concurrency: int | None = max_concurrency_option(),
    num_requests: int | None = num_requests_option(),
    timeout: float = typer.Option(CLIENT_TIMEOUT, "--timeout", help="Per-call timeout (s), as the users' client."),
    max_in_flight: int = typer.Option(300, "--max-in-flight", min=1, max=LARGEST_COUNT, help="Calls on the wire at once, at most "
                                      "(the users' client: 300)."),
    max_tokens: int | None = typer.Option(None, "--max-tokens", min=1, max=LARGEST_TOKENS, help="Every call's max_tokens [default: the "
                                          "trace's, else 2048]."),
    force: bool = typer.Option(False, "--force", help="Replace the run in an existing run folder."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No live progress."),
) -> None:
    """Replay TRACE against a live endpoint in real time and record what it did.

    Every call is sent at its instant (open loop, never waiting for earlier calls) or with
    N outstanding (closed loop), and measured: the run folder reads like a run of the
    users' client (`simctl observed`, `compare-runs`, `calibrate`, `predict`). An answer
    that is not valid field by field is a failed call with its reason. The summary and
    request log are saved as calls finish (every 2 s at most), so a killed run leaves a
    folder that reads; Ctrl-C stops the run and keeps every call that finished.
    """
    with user_errors():
        from rich.live import Live
        from rich.text import Text

        from simulator.trace.formats import load_trace

        live = _live()
        options = live.LoadOptions(url=url, api=api, model=model, client=client or "open", time_scale=time_scale,
                                   rate_scale=1.0 if rate_scale is None else rate_scale, timeout=timeout,
                                   max_in_flight=max_in_flight, max_tokens=max_tokens)
        options.checked()
        trace_path = trace if trace.exists() else None
        loaded, implied = load_flags(load_trace(trace), request_rate=request_rate, max_concurrency=max_concurrency,
                                     num_requests=num_requests,
                                     rate_scale_from=None if rate_scale is None else "--rate-scale", client=client)
        options = dataclasses.replace(options, **implied)

        def line(p: Any) -> Text:
            return Text(f"calls sent {p.sent}/{p.total}  done {p.done}  failed {p.failed}  in flight {p.in_flight}"
                        f"  latency p50 {_fmt(p.p50)} s  p90 {_fmt(p.p90)} s")

        display = None if quiet else Live(line(live.LoadProgress(total=len(loaded))), console=console,
                                          refresh_per_second=4, transient=False)
        try:
            if display is not None:
                display.start()
            result = live.run_load(loaded, options, out, force=force, trace_path=trace_path,
                                   on_progress=None if display is None else (lambda p: display.update(line(p))))
        except KeyboardInterrupt:  # before the run began (while connecting)
            interrupted("interrupted before the first call: nothing written")
        finally:
            if display is not None:
                display.stop()
        s = result.summary
        if result.interrupted:
            interrupted(f"interrupted: kept {s['total_batches']} finished call(s) in {result.folder} "
                        f"({len(s['abandoned'])} in flight abandoned, {len(s['not_sent'])} not sent)")
        done = [r["request_duration"] for r in s["results"] if r["status_code"] == 200 and not r["error"]
                and isinstance(r["response"], dict) and isinstance(r["response"].get("choices"), list)]
        mean = sum(done) / len(done) if done else math.nan
        console.print(f"wrote {result.folder}: {s['total_batches']} calls, {s['successful_batches']} succeeded, "
                      f"{s['failed_batches']} failed; mean call latency {_fmt(mean)} s over "
                      f"{s['actual_duration']:.1f} s", highlight=False, soft_wrap=True)
        reasons = Counter(str(r["error"]) for r in s["results"] if r["error"])
        for reason, n in reasons.most_common(3):
            console.print(f"  failed {n} × {reason}", markup=False, highlight=False, soft_wrap=True)
        if len(reasons) > 3:
            console.print(f"  ... {len(reasons) - 3} other reason(s); every call's is in {result.folder}",
                          markup=False, highlight=False, soft_wrap=True)
