"""Does the server run for real behave as the model says? The live twin, per topology.

For each of the topologies ``shared`` (the design-notes scenario as written), ``split``,
``direct`` and ``continuous`` (both GPU tasks, infobench and mmlu, set to it; graph stays
on the CPU, ``direct``), the bundled trace (``traces/batch_arrivals.json``, 118 calls) is

* replayed by the model (``simulator.replay``, the default engine), and
* sent in real time by ``simctl load`` (:func:`simulator.live.load.run_load`, open loop, the
  users' batch endpoint) to ``simctl serve --backend sleep`` started as a process on
  127.0.0.1 (a free port; stopped with SIGINT), same scenario, profile (seed-calibrated)
  and seed, both at ``--time-scale X``.

Per-call latency in model seconds: the load run's ``request_duration`` (wall seconds from
the call's send to its answer) times the time scale, against the replay's call latency
(the call's last prompt done minus its arrival). Mean batch size per task: the server's
Prometheus histogram ``simctl_batch_size`` (sum / count), against the replay's summary
(for ``continuous``, a batch is an engine's admission: the prompts prefilled together for
the first time, as the event log has it). Pass: p50, p90, p99 within 5 % and the mean
batch size within 2 %.

    python benchmarks/live_twin.py                 # the whole trace at --time-scale 20 (~6 min)
    python benchmarks/live_twin.py --write-docs    # ... and its table into docs/benchmarks.md
    python benchmarks/live_twin.py --quick         # the first 20 calls at --time-scale 100, each
                                                   # server a fork of this process (no fresh interpreter)
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
ROOT = Path(__file__).resolve().parent.parent
TOPOLOGIES = ("shared", "split", "direct", "continuous")
GPU_TASKS = ("infobench", "mmlu")
TASKS = ("graph", "infobench", "mmlu")
QUANTILES = (50, 90, 99)
LATENCY_TOL = 0.05
BATCH_TOL = 0.02


def overrides(topology: str) -> dict[str, str]:
    """``--set`` overrides that put the GPU tasks of design-notes on ``topology``."""
    if topology == "shared":
        return {}
    return {f"tasks.{t}.topology": topology for t in GPU_TASKS}


def simulated(trace: Any, topology: str, seed: int) -> dict[str, Any]:
    """The replay's per-call latencies (model seconds) and mean batch size per task."""
    from simulator import build_scenario, load_profile, replay

    scenario = build_scenario(path="design-notes", overrides=overrides(topology))
    result = replay(trace, scenario, load_profile("seed-calibrated"), seed=seed)
    log = result.log
    calls = log.groupby("call_index").agg(done=("done_at", "max"), arrived=("arrived_at", "min"))
    latency = (calls["done"] - calls["arrived"]).to_numpy(float)
    batches = {t: result.summary["tasks"][t]["mean_batch_size"] for t in TASKS if t in result.summary["tasks"]}
    return {"latency": latency, "batch": batches}


class ForkedSimctl:
    """``simctl ARGS`` in a child forked from this process: a process of its own (its event
    loop, signal handlers, sockets and exit status are its own; it is stopped with SIGINT as a
    fresh one is) that skips the interpreter's start-up and the imports this process has made
    already. The quick modes' servers: their figures are a check that every step runs, and a
    fresh interpreter per server would cost more than the rest of the quick run.

    The part of :class:`subprocess.Popen` the callers use: ``pid``, ``returncode``, ``poll``,
    ``wait``, ``send_signal``, ``kill``; ``stdout`` is a pipe from the child's standard
    output, its standard error goes to ``stderr_path``. ``setup``, if given, runs in the child
    just before the command (its folder, environment, limits or stdout, as a shell sets them
    for a program it starts)."""

    def __init__(self, args: list[str], stderr_path: Path, setup: Callable[[], None] | None = None) -> None:
        read, write = os.pipe()
        err = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # nothing buffered here is written twice by the child
        pid = os.fork()
        if pid == 0:  # the child: never returns into the caller's code
            code = 1
            try:
                os.close(read)
                os.dup2(write, 1)
                os.dup2(err, 2)
                sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - the child's for its life
                sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
                signal.signal(signal.SIGINT, signal.default_int_handler)
                if setup is not None:
                    setup()
                sys.argv = ["simctl", *args]
                from simulator.cli import main

                main()
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except BaseException:  # noqa: BLE001 - said on the child's standard error, then its exit status
                import traceback

                traceback.print_exc()
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)  # no atexit handler or finaliser of the parent's runs here
        os.close(write)
        os.close(err)
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self.stdout = open(read, encoding="utf-8")  # noqa: SIM115 - closed by wait()
        self.stderr = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
                self.stdout.close()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(0.02)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def preload_serve() -> None:
    """Import what ``simctl serve`` imports as it starts, here, once: each server forked
    from this process (:class:`ForkedSimctl`) then starts with them imported."""
    import uvicorn  # noqa: F401

    import simulator.cli.serve  # noqa: F401
    import simulator.serve.app  # noqa: F401
    import simulator.serve.backends  # noqa: F401


def _serve(topology: str, time_scale: float, seed: int, log_path: Path,
           fork: bool = False) -> tuple[subprocess.Popen | ForkedSimctl, str]:
    """``simctl serve`` as a process on a free port of 127.0.0.1; (process, base URL).
    ``fork``: a fork of this process (:class:`ForkedSimctl`), not a fresh interpreter."""
    args = [sys.executable, "-c", "from simulator.cli import main; main()", "serve", "-s", "design-notes",
            "-p", "seed-calibrated", "--backend", "sleep", "--time-scale", f"{time_scale:g}", "--seed", str(seed),
            "--host", "127.0.0.1", "--port", "0", "--grace", "5",
            # the stall guard is no part of the model (a direct infobench batch under processor
            # sharing runs for thousands of model seconds)
            "--batch-timeout", "1000000"]
    for key, value in overrides(topology).items():
        args += ["--set", f"{key}={value}"]
    proc: subprocess.Popen | ForkedSimctl
    if fork:
        preload_serve()
        proc = ForkedSimctl(args[3:], log_path)
    else:
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        err = log_path.open("w")
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, text=True, env=env, cwd=log_path.parent)
    line = proc.stdout.readline() if proc.stdout else ""
    match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
    if not match:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"simctl serve did not start: {line!r} {log_path.read_text()[-2000:]}")
    return proc, f"http://127.0.0.1:{match.group(1)}"


def wait_http(url: str, seconds: float = 30.0) -> None:
    """Wait until ``url`` answers GET with a status below 500 (a server is up)."""
    import httpx

    deadline = time.monotonic() + seconds
    while True:
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not answer in {seconds:g} s")
        time.sleep(0.1)


def stop(proc: subprocess.Popen | ForkedSimctl, timeout: float = 30.0) -> None:
    """Stop a server as Ctrl-C would (it finishes what it serves), killing it after ``timeout`` s."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _batch_means(metrics: str) -> dict[str, float]:
    sums = dict(re.findall(r'^simctl_batch_size_sum\{task="(\w+)"\} (\S+)$', metrics, re.M))
    counts = dict(re.findall(r'^simctl_batch_size_count\{task="(\w+)"\} (\S+)$', metrics, re.M))
    return {t: float(sums[t]) / float(counts[t]) for t in sums if float(counts.get(t, 0)) > 0}


def served(trace: Any, topology: str, time_scale: float, seed: int, work: Path, fork: bool = False) -> dict[str, Any]:
    """The live run's per-call latencies (model seconds), mean batch size per task, and
    how late calls were sent (wall seconds); ``fork``: the server a fork of this process."""
    import httpx

    from simulator.live.load import LoadOptions, run_load

    proc, url = _serve(topology, time_scale, seed, work / f"serve-{topology}.log", fork)
    try:
        wait_http(url + "/health")
        result = run_load(trace, LoadOptions(url=url + "/", time_scale=time_scale), work / f"run-{topology}",
                          handle_sigint=False)
        metrics = httpx.get(url + "/metrics", timeout=10).text
    finally:
        stop(proc)
    records = result.summary["results"]
    failed = [r for r in records if r["error"] is not None or not (r["response"] or {}).get("choices")]
    latency = np.array([r["request_duration"] for r in records], float) * time_scale
    send_lag = np.array([r["actual_send_time"] - r["scheduled_arrival_time"] for r in records], float)
    return {"latency": latency, "batch": _batch_means(metrics), "failed": len(failed), "calls": len(records),
            "send_lag_ms_max": float(send_lag.max() * 1000) if send_lag.size else 0.0}


def compare(topology: str, model: dict[str, Any], live: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {"topology": topology, "calls": live["calls"], "failed": live["failed"],
                           "send_lag_ms_max": live["send_lag_ms_max"]}
    ok = live["failed"] == 0 and live["calls"] == len(model["latency"])
    for q in QUANTILES:
        m, s = float(np.percentile(model["latency"], q)), float(np.percentile(live["latency"], q))
        row[f"p{q}_model"], row[f"p{q}_served"] = m, s
        row[f"p{q}_err"] = (s - m) / m
        ok &= abs(row[f"p{q}_err"]) <= LATENCY_TOL
    for task in TASKS:
        m, s = model["batch"].get(task), live["batch"].get(task)
        row[f"batch_{task}_model"], row[f"batch_{task}_served"] = m, s
        err = None if m is None or s is None else (s - m) / m
        row[f"batch_{task}_err"] = err
        ok &= err is not None and abs(err) <= BATCH_TOL
    row["pass"] = bool(ok)
    return row


def run(time_scale: float, calls: int | None, seed: int, topologies: tuple[str, ...],
        fork: bool = False) -> dict[str, Any]:
    """``fork``: each server a fork of this process (:class:`ForkedSimctl`; the quick mode),
    not a fresh interpreter."""
    from simulator import load_trace
    from simulator.trace.model import Trace

    trace = load_trace(str(ROOT / "traces" / "batch_arrivals.json"))
    if calls is not None:
        trace = Trace(tuple(trace.calls[:calls]), source=trace.source)
    rows = []
    with tempfile.TemporaryDirectory(prefix="simctl-live-twin-") as tmp:
        for topology in topologies:
            started = time.monotonic()
            model = simulated(trace, topology, seed)
            live = served(trace, topology, time_scale, seed, Path(tmp), fork)
            row = compare(topology, model, live)
            row["wall_s"] = time.monotonic() - started
            rows.append(row)
    return {"time_scale": time_scale, "calls": len(trace.calls), "prompts": sum(len(c.prompts) for c in trace.calls),
            "seed": seed, "rows": rows, "load_average": os.getloadavg()[0],
            "python": sys.version.split()[0]}


def table(result: dict[str, Any]) -> str:
    def pct(x: float | None) -> str:
        return "–" if x is None else f"{x:+.1%}"

    lines = ["| GPU tasks on | p50 model → served | p90 | p99 | mean batch infobench | mmlu | graph | within 5 % / 2 % |",
             "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lat = [f"{r[f'p{q}_model']:.1f} → {r[f'p{q}_served']:.1f} s ({pct(r[f'p{q}_err'])})" for q in QUANTILES]
        bat = []
        for t in ("infobench", "mmlu", "graph"):
            m, s = r[f"batch_{t}_model"], r[f"batch_{t}_served"]
            bat.append("–" if m is None or s is None else f"{m:.2f} → {s:.2f} ({pct(r[f'batch_{t}_err'])})")
        lines.append(f"| {r['topology']} | " + " | ".join(lat + bat) + f" | {'yes' if r['pass'] else '**no**'} |")
    lines.append("")
    lines.append(f"Bundled trace ({result['calls']} calls, {result['prompts']} prompts), design-notes scenario, "
                 f"seed-calibrated profile, seed {result['seed']}; `simctl load` against `simctl serve --backend sleep` "
                 f"at `--time-scale {result['time_scale']:g}` (latencies in model seconds: wall seconds × "
                 f"{result['time_scale']:g}); load average {result['load_average']:.2f} at the end; "
                 f"Python {result['python']}.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--time-scale", type=float, default=None, help="model seconds per wall second (default 20; "
                        "--quick: 100)")
    parser.add_argument("--calls", type=int, default=None, help="the trace's first N calls (default all; --quick: 20)")
    parser.add_argument("--topologies", default=",".join(TOPOLOGIES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="the first 20 calls at --time-scale 100")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write-docs", action="store_true", help="write the table into docs/benchmarks.md")
    args = parser.parse_args(argv)
    time_scale = args.time_scale if args.time_scale is not None else (100.0 if args.quick else 20.0)
    calls = args.calls if args.calls is not None else (20 if args.quick else None)
    topologies = tuple(t for t in args.topologies.split(",") if t)
    unknown = set(topologies) - set(TOPOLOGIES)
    if unknown:
        parser.error(f"unknown topologies {sorted(unknown)}; valid: {', '.join(TOPOLOGIES)}")
    result = run(time_scale, calls, args.seed, topologies, fork=args.quick)
    from docs_tables import report

    return report(result, table(result), "live-twin", write_docs=args.write_docs, as_json=args.json)


if __name__ == "__main__":
    raise SystemExit(main())
