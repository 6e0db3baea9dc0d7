"""Does a replay that starts from a live server's snapshot predict the rest of the run?

``simctl serve --backend sleep`` (design-notes scenario, seed-calibrated profile, a process
on 127.0.0.1 as in ``live_twin.py``) is driven with the bundled trace by ``simctl load``
(:func:`simulator.live.load.run_load`, open loop, real time at ``--time-scale X``). Midway,
at an instant halfway between two calls, a thread takes a snapshot of the server with
:func:`simulator.snapshot.take_snapshot` (its ``GET /state``: the prompts waiting, the
batches running and how long they have run). The rest of the trace (the calls at or after
that instant, shifted to 0) is then replayed from the snapshot (``simulator.replay`` with
``initial_state=``, the reference engine), over ``--seeds`` seeds pooled, and compared with
what the server did with those same calls: call latency p50 and p90 (model seconds: the
load run's wall seconds times the time scale) of the calls that arrived after the
snapshot, predicted against observed. Target: within 5 %.

The server draws its service times from the same profile but the replay cannot know which
draws the server made after the snapshot, so the comparison is of distributions: the
replay pools ``--seeds`` runs, and the benchmark pools ``--server-seeds`` live runs (a
server seed each): one live run's p90 of some 60 calls moves by ±10 % from seed to seed. It
also replays the rest from an empty system: what a replay that ignores the state predicts.

    python benchmarks/snapshot_replay.py                 # the whole trace at --time-scale 20, 10 live runs (~12 min)
    python benchmarks/snapshot_replay.py --write-docs    # ... and its table into docs/snapshots.md
    python benchmarks/snapshot_replay.py --quick         # the first 40 calls at --time-scale 100, the
                                                         # server a fork of this process
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
ROOT = Path(__file__).resolve().parent.parent
QUANTILES = (50, 90)
TOLERANCE = 0.05


def split_instant(trace: Any, share: float = 0.5) -> float:
    """An instant about ``share`` of the way through ``trace``, halfway between two calls (so
    a snapshot a few milliseconds late still splits the calls the same way)."""
    t = np.array([c.t for c in trace.calls], float)
    i = max(1, min(len(t) - 1, int(np.searchsorted(t, t[0] + share * (t[-1] - t[0])))))
    return float((t[i - 1] + t[i]) / 2)


def live(trace: Any, at: float, time_scale: float, seed: int, work: Path, fork: bool) -> dict[str, Any]:
    """The live run, its snapshot taken ``at`` trace seconds into it: the snapshot and each
    call's (scheduled arrival, latency), model seconds."""
    from live_twin import _serve, stop, wait_http

    from simulator.live.load import LoadOptions, run_load
    from simulator.snapshot import take_snapshot

    proc, url = _serve("shared", time_scale, seed, work / "serve.log", fork)
    taken: dict[str, Any] = {}
    try:
        wait_http(url + "/health")
        began = threading.Event()

        def snapshot() -> None:
            began.wait()
            t0 = taken["t0"]
            time.sleep(max(at / time_scale - (time.monotonic() - t0), 0.0))
            try:
                taken["wall_s"] = time.monotonic() - t0
                taken["snapshot"] = take_snapshot(url)
            except Exception as exc:  # noqa: BLE001 - reported by the main thread
                taken["error"] = exc

        thread = threading.Thread(target=snapshot, daemon=True)
        thread.start()

        def progress(_: Any) -> None:
            if "t0" not in taken:  # the first call is being sent: the run's clock has started
                taken["t0"] = time.monotonic() - trace.calls[0].t / time_scale
                began.set()

        result = run_load(trace, LoadOptions(url=url + "/", time_scale=time_scale), work / "run",
                          handle_sigint=False, on_progress=progress)
        thread.join(timeout=60)
    finally:
        stop(proc)
    if "error" in taken:
        raise taken["error"]
    records = result.summary["results"]
    failed = [r for r in records if r["error"] is not None or not (r["response"] or {}).get("choices")]
    return {"snapshot": taken["snapshot"], "snapshot_lag_s": taken["wall_s"] * time_scale - at,
            "arrival": np.array([r["scheduled_arrival_time"] for r in records], float) * time_scale,
            "latency": np.array([r["request_duration"] for r in records], float) * time_scale,
            "failed": len(failed)}


def predicted(trace: Any, snapshot: Any, at: float, seeds: int) -> dict[str, Any]:
    """The replay of the rest of ``trace`` from ``snapshot``: the new calls' latencies,
    pooled over ``seeds`` seeds, and the snapshot's own prompts' figures (seed 0)."""
    from simulator import build_scenario, load_profile, replay

    scenario, profile = build_scenario(path="design-notes"), load_profile("seed-calibrated")
    pooled, in_flight = [], None
    for seed in range(seeds):
        result = replay(trace, scenario, profile, seed=seed, initial_state=snapshot, start=at)
        log = result.log[~result.log["from_state"]]
        calls = log.groupby("call_id").agg(done=("done_at", "max"), arrived=("arrived_at", "min"))
        pooled.append((calls["done"] - calls["arrived"]).to_numpy(float))
        if in_flight is None:
            in_flight = result.summary["from_state"]
    return {"latency": np.concatenate(pooled), "calls": len(pooled[0]), "from_state": in_flight}


def run(time_scale: float, calls: int | None, server_seeds: int, seeds: int, fork: bool,
        save_snapshot: str | None = None) -> dict[str, Any]:
    """One live run per server seed (its snapshot, the rest replayed from it over ``seeds``
    seeds), the served and predicted latencies of the calls after the snapshot pooled over
    the runs; per run its own figures. ``save_snapshot``: the first run's snapshot is written
    there."""
    from simulator import build_scenario, load_profile, load_trace, replay
    from simulator.snapshot import save_snapshot as save
    from simulator.trace.model import Trace

    trace = load_trace(str(ROOT / "traces" / "batch_arrivals.json"))
    if calls is not None:
        trace = Trace(tuple(trace.calls[:calls]), source=trace.source)
    at = split_instant(trace)
    started = time.monotonic()
    runs, served_all, model_all = [], [], []
    for server_seed in range(server_seeds):
        with tempfile.TemporaryDirectory(prefix="simctl-snapshot-replay-") as tmp:
            observed = live(trace, at, time_scale, server_seed, Path(tmp), fork)
        snapshot = observed["snapshot"]
        if save_snapshot is not None and server_seed == 0:
            save(snapshot, save_snapshot, force=True)
        model = predicted(trace, snapshot, at, seeds)
        rest = observed["latency"][observed["arrival"] >= at]
        served_all.append(rest)
        model_all.append(model["latency"])
        f = model["from_state"]
        runs.append({"server_seed": server_seed, "calls_after": int(rest.size), "calls_replayed": model["calls"],
                     "failed": observed["failed"], "snapshot_lag_s": observed["snapshot_lag_s"],
                     "waiting": snapshot.waiting_prompts, "running": snapshot.running_prompts,
                     "running_batches": len(snapshot.running), "in_flight_latency_p50": f["latency"]["p50"],
                     "in_flight_cleared_at": f["cleared_at"],
                     **{f"p{q}_served": float(np.percentile(rest, q)) for q in QUANTILES},
                     **{f"p{q}_model": float(np.percentile(model["latency"], q)) for q in QUANTILES}})
    # the same rest replayed from an empty system: what ignoring the state would predict
    scenario, profile = build_scenario(path="design-notes"), load_profile("seed-calibrated")
    empty = []
    for seed in range(seeds):
        log = replay(trace.after(at), scenario, profile, seed=seed).log
        calls_ = log.groupby("call_id").agg(done=("done_at", "max"), arrived=("arrived_at", "min"))
        empty.append((calls_["done"] - calls_["arrived"]).to_numpy(float))
    served, model_l, empty_l = np.concatenate(served_all), np.concatenate(model_all), np.concatenate(empty)
    row: dict[str, Any] = {}
    ok = all(r["failed"] == 0 and r["calls_replayed"] == r["calls_after"] for r in runs)
    for q in QUANTILES:
        m, s, e = (float(np.percentile(x, q)) for x in (model_l, served, empty_l))
        row[f"p{q}_model"], row[f"p{q}_served"], row[f"p{q}_empty"] = m, s, e
        row[f"p{q}_err"], row[f"p{q}_empty_err"] = (m - s) / s, (e - s) / s
        ok &= abs(row[f"p{q}_err"]) <= TOLERANCE
    row["pass"] = bool(ok)
    return {"time_scale": time_scale, "calls": len(trace.calls), "server_seeds": server_seeds, "seeds": seeds,
            "at": at, "calls_after": int(served.size), "row": row, "runs": runs,
            "wall_s": time.monotonic() - started, "load_average": os.getloadavg()[0],
            "python": sys.version.split()[0]}


def table(result: dict[str, Any]) -> str:
    r = result["row"]
    lines = ["| calls after the snapshot | p50 served → predicted | p90 served → predicted | within 5 % | "
             "from an empty system instead: p50 | p90 |",
             "|---|---|---|---|---|---|"]
    cells = [f"{r[f'p{q}_served']:.1f} → {r[f'p{q}_model']:.1f} s ({r[f'p{q}_err']:+.1%})" for q in QUANTILES]
    empty = [f"{r[f'p{q}_empty']:.1f} s ({r[f'p{q}_empty_err']:+.1%})" for q in QUANTILES]
    lines.append(f"| {result['calls_after']} | " + " | ".join(cells) + f" | {'yes' if r['pass'] else '**no**'} | "
                 + " | ".join(empty) + " |")
    lines += ["", "| server seed | waiting | running (batches) | p50 served → predicted | p90 served → predicted | "
              "snapshot's prompts: latency p50, all done after |", "|---|---|---|---|---|---|"]
    for run_ in result["runs"]:
        lat = [f"{run_[f'p{q}_served']:.1f} → {run_[f'p{q}_model']:.1f} s" for q in QUANTILES]
        lines.append(f"| {run_['server_seed']} | {run_['waiting']} | {run_['running']} ({run_['running_batches']}) | "
                     + " | ".join(lat) + f" | {_num(run_['in_flight_latency_p50'])} s, "
                     f"{_num(run_['in_flight_cleared_at'])} s |")
    lag = max(abs(run_["snapshot_lag_s"]) for run_ in result["runs"])
    lines.append("")
    lines.append(f"Bundled trace ({result['calls']} calls), design-notes scenario, seed-calibrated profile; "
                 f"`simctl serve --backend sleep` (server seeds 0–{result['server_seeds'] - 1}, one live run each) "
                 f"driven by `simctl load` at `--time-scale {result['time_scale']:g}`, its `/state` snapshot taken "
                 f"{result['at']:.1f} s into the trace (at most {lag * 1000:.0f} ms model time off). Served: the "
                 f"calls arriving after the snapshot, pooled over the runs. Predicted: the rest of the trace "
                 f"replayed from each run's snapshot, {result['seeds']} seeds each, pooled. Load average "
                 f"{result['load_average']:.2f}; Python {result['python']}.")
    return "\n".join(lines)


def _num(x: float | None) -> str:
    return "–" if x is None else f"{x:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--time-scale", type=float, default=None, help="model seconds per wall second (default 20; "
                        "--quick: 100)")
    parser.add_argument("--calls", type=int, default=None, help="the trace's first N calls (default all; --quick: 40)")
    parser.add_argument("--server-seeds", type=int, default=None, help="live runs, one per server seed "
                        "(default 10; --quick: 1)")
    parser.add_argument("--seeds", type=int, default=None, help="replay seeds pooled per run (default 20; --quick: 5)")
    parser.add_argument("--save-snapshot", default=None, help="write the first run's snapshot to FILE")
    parser.add_argument("--quick", action="store_true", help="the first 40 calls at --time-scale 100")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write-docs", action="store_true", help="write the table into docs/snapshots.md")
    args = parser.parse_args(argv)
    time_scale = args.time_scale if args.time_scale is not None else (100.0 if args.quick else 20.0)
    calls = args.calls if args.calls is not None else (40 if args.quick else None)
    seeds = args.seeds if args.seeds is not None else (5 if args.quick else 20)
    server_seeds = args.server_seeds if args.server_seeds is not None else (1 if args.quick else 10)
    result = run(time_scale, calls, server_seeds, seeds, fork=args.quick, save_snapshot=args.save_snapshot)
    from docs_tables import report

    return report(result, table(result), "snapshot-replay", write_docs=args.write_docs, as_json=args.json,
                  page="snapshots.md")


if __name__ == "__main__":
    raise SystemExit(main())
