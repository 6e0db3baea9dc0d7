"""The loop closes: serve, load, calibrate on the run, predict another configuration, load it.

Every step is the command a user runs, as a subprocess, all traffic on 127.0.0.1:

1. ``simctl synth`` draws a trace of MMLU calls (1–3 prompts each, 64 prompt tokens,
   256 output tokens, Poisson arrivals);
2. ``simctl serve -s scenarios/harness-cpu.toml --backend harness`` serves configuration A
   (flush window 0.5 s) with the real torch speculative decoder (tiny preset, CPU, one
   worker thread), and ``simctl load`` replays the trace against it into a run folder;
3. ``simctl profile --device cpu --quick`` measures the decoder alone (no server), and
   ``simctl calibrate`` fits that profile's per-pass cost (base and per row and context
   token; draft and plain decode steps tied to the verify step at their measured ratios)
   to run A;
4. ``simctl predict`` predicts configuration B (flush window 0.1 s) with the fitted profile,
   before B has run;
5. configuration B is served and loaded the same way (twice in the full mode: two real runs
   of one configuration say how much a run scatters by itself; then C, B at twice the
   arrival rate, ``simctl load --rate-scale 2``), and ``simctl predict --observed`` sets the
   prediction against each run.

It reports p50 and p90 call latency, observed and predicted, and the error
(predicted − observed) / observed: in sample (A, the fitted run), out of sample (B), and the
measured profile's own prediction of B (what profiling without the server predicts) for
contrast.

    python benchmarks/live_loop.py                 # four 60 s runs: about 6 minutes on 2 cores
    python benchmarks/live_loop.py --write-docs    # ... and the table into docs/calibration.md
    python benchmarks/live_loop.py --quick         # 4 s runs, a small fit, the bundled profile,
                                                   # client commands in-process, servers forked
                                                   # from this process: about 20 s
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from live_twin import ForkedSimctl, preload_serve, stop  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "harness-cpu.toml"
#: the profile serve is given: it names the tasks (the harness backend takes its own time)
SERVED_PROFILE = ROOT / "profiles" / "cpu__tiny__tiny.json"
TASK = "mmlu"
FLUSH_A, FLUSH_B = 0.5, 0.1
#: the arrival rate of configuration C, a multiple of the trace's (``simctl load --rate-scale``)
RATE_C = 2.0


#: The quick mode runs the client commands (synth, load, calibrate, predict) in this process
#: through typer's CliRunner: the same commands and arguments, without an interpreter start
#: and the simulator's imports per command. ``simctl serve`` is always a process of its own:
#: in the quick mode a fork of this one (:class:`~live_twin.ForkedSimctl`, torch imported once).
IN_PROCESS = False


def simctl(*args: str, check: bool = True, **kw: Any) -> subprocess.CompletedProcess:
    """Run ``simctl ARGS`` in a fresh interpreter (the command a user runs), or in this
    process where :data:`IN_PROCESS` says so."""
    if IN_PROCESS:
        from typer.testing import CliRunner

        from simulator.cli import app

        result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception
        done = subprocess.CompletedProcess(["simctl", *args], result.exit_code, result.stdout, result.stderr)
        if check and done.returncode != 0:
            raise RuntimeError(f"simctl {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return done
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), COLUMNS="200")
    done = subprocess.run([sys.executable, "-c", "from simulator.cli import main; main()", *args],
                          capture_output=True, text=True, env=env, **kw)
    if check and done.returncode != 0:
        raise RuntimeError(f"simctl {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scenario_with_flush(flush: float, folder: Path) -> Path:
    """The scenario file with the MMLU flush window set to ``flush`` (predict takes files)."""
    text = SCENARIO.read_text()
    changed, n = re.subn(r"(?m)^flush = [0-9.]+$", f"flush = {flush}", text)
    assert n == 1, "the scenario has one flush window"
    path = folder / f"harness-cpu-flush{flush}.toml"
    path.write_text(changed.replace('name = "harness-cpu"', f'name = "harness-cpu-flush{flush}"'))
    return path


def start_profile(folder: Path, measure: bool = True) -> Path:
    """A profile measured now by ``simctl profile --device cpu --quick`` (the decoder alone,
    no server), or with ``measure=False`` the one that command wrote into the repository
    (:data:`SERVED_PROFILE`), with the MMLU per-pass costs free: base and per row-token cost of
    a verify step, the draft step and the plain decode step tied at their measured ratios."""
    if measure:
        measured = folder / "cpu-tiny-measured.json"
        simctl("profile", "--device", "cpu", "--quick", "-o", str(measured))
    else:
        measured = SERVED_PROFILE
    data = json.loads(measured.read_text())
    costs = data["tasks"][TASK]["service"]["costs"]
    free = []
    for i, (name, low, high) in enumerate([("pass_base", 1e-5, 0.05), ("pass_per_row_token", 1e-9, 1e-3)]):
        verify = costs["verify"]["coef"][i]
        free.append({"name": f"{TASK}.{name}", "task": TASK, "path": f"service.costs.verify.coef.{i}",
                     "min": low, "max": high,
                     "ties": [{"path": f"service.costs.{op}.coef.{i}", "factor": costs[op]["coef"][i] / verify}
                              for op in ("draft_step", "decode")]})
    data["name"] = "cpu-tiny-start"
    data["source"] = (f"simctl profile --device cpu --quick{'' if measure else ' (the bundled ' + measured.name + ')'} "
                      f"with the MMLU per-pass costs free ({Path(__file__).name})")
    data["meta"] = {"calibrate": free, "fit_check": data.get("meta", {}).get("fit_check")}
    path = folder / "cpu-tiny-start.json"
    path.write_text(json.dumps(data, indent=1))
    return path


def serve_and_load(trace: Path, flush: float, out: Path, timeout: float, rate_scale: float = 1.0) -> dict[str, Any]:
    """Serve the scenario at ``flush`` on the harness, load ``trace`` into ``out``, stop the
    server with SIGINT; the load command's last line and how long it took."""
    import httpx

    port = free_port()
    args = ["serve", "-s", str(SCENARIO), "-p", str(SERVED_PROFILE), "--backend", "harness", "--harness-device", "cpu",
            "--set", f"tasks.{TASK}.flush={flush}", "--port", str(port)]
    log = out.parent / f"serve-{out.name}.log"
    server: subprocess.Popen | ForkedSimctl
    if IN_PROCESS:
        preload_serve()
        import torch  # noqa: F401 - the harness backend's, imported once for every fork

        import simulator.harness.specdec  # noqa: F401
        server = ForkedSimctl(args, log)
    else:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        server = subprocess.Popen([sys.executable, "-c", "from simulator.cli import main; main()", *args],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while True:
            if server.poll() is not None:
                said = server.stderr.read() if server.stderr else log.read_text() if log.exists() else ""
                raise RuntimeError(f"simctl serve exited {server.returncode}: {said}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("simctl serve did not answer /health within 120 s")
            time.sleep(0.2)
        t0 = time.monotonic()
        done = simctl("load", f"http://127.0.0.1:{port}/", str(trace), "-o", str(out), "--quiet",
                      "--timeout", str(timeout), "--rate-scale", str(rate_scale), timeout=timeout + 600)
        seconds = time.monotonic() - t0
    finally:
        if server.poll() is None:
            stop(server, timeout=60)
    return {"load": done.stdout.strip().splitlines()[-1], "seconds": seconds}


def predicted(trace: Path, scenario: Path, profile: Path, seeds: int, out: Path,
              observed: Path | None = None) -> dict[str, Any]:
    """``simctl predict``'s overall record (``--json``)."""
    args = ["predict", str(trace), "-s", str(scenario), "-p", str(profile), "--seeds", str(seeds), "--json", str(out)]
    if observed is not None:
        args += ["--observed", str(observed)]
    simctl(*args)
    return next(r for r in json.loads(out.read_text())["figures"] if r["group"] == "overall")


def run(quick: bool, seed: int, work: Path) -> dict[str, Any]:
    global IN_PROCESS
    IN_PROCESS = quick
    # the quick mode's calls are shorter (32 output tokens): the server, busy throughout a run,
    # costs CPU in proportion to the tokens it decodes
    duration, mean, max_tokens = (4.0, 0.25, 32) if quick else (60.0, 0.25, 256)
    trace = work / "trace.json"
    simctl("synth", "-o", str(trace), "--duration", str(duration), "--mean", str(mean), "--cv", "1",
           "--prompts-per-call", "1:0.5,2:0.3,3:0.2", "--task-mix", f"{TASK}:1", "--prompt-tokens", f"{TASK}:64",
           "--max-tokens", str(max_tokens), "--seed", str(seed))
    scen_a, scen_b = scenario_with_flush(FLUSH_A, work), scenario_with_flush(FLUSH_B, work)
    # the quick mode starts from the bundled measurement of the same command (measuring takes
    # longer than the rest of the quick mode); the full mode measures this machine now
    start = start_profile(work, measure=not quick)
    timeout = 120.0
    runs: dict[str, Any] = {"A": serve_and_load(trace, FLUSH_A, work / "run-a", timeout)}

    fitted = work / "fitted.json"
    screen, starts, fit_seeds = ("8", "1", "1") if quick else ("32", "4", "3")
    # (the quick fit also stops after 10 evaluations: a fitted profile, not a converged one)
    budget = ["--max-evaluations", "10"] if quick else []
    t0 = time.monotonic()
    simctl("calibrate", str(work / "run-a"), "-s", str(scen_a), "--start", str(start), "-o", str(fitted),
           "--screen", screen, "--starts", starts, "--seeds", fit_seeds, *budget)
    calibrate_s = time.monotonic() - t0
    fit = json.loads(fitted.read_text())["meta"]["fit"]
    measured_costs = json.loads(start.read_text())["tasks"][TASK]["service"]["costs"]["verify"]["coef"]
    seeds = 3 if quick else 10
    # the prediction of B, made before B runs
    blind = predicted(trace, scen_b, fitted, seeds, work / "predict-b.json")

    rows = []
    in_sample = predicted(work / "run-a" / "batch_arrivals.json", scen_a, fitted, seeds, work / "vs-a.json",
                          work / "run-a")
    rows.append({"what": "fitted run (in sample)", "config": f"flush {FLUSH_A} s", "run": "A", **_figures(in_sample)})
    # B twice (how much a run scatters by itself), then C: B at twice the arrival rate
    others = [("B", 1.0)] if quick else [("B", 1.0), ("B2", 1.0), ("C", RATE_C)]
    for name, rate in others:
        folder = work / f"run-{name.lower()}"
        runs[name] = serve_and_load(trace, FLUSH_B, folder, timeout, rate)
        # the run's arrival file holds the instants the calls were due (t / rate scale)
        arrivals = folder / "batch_arrivals.json"
        config = f"flush {FLUSH_B} s" + (f", {rate:g}× rate" if rate != 1 else "")
        vs = predicted(arrivals, scen_b, fitted, seeds, work / f"vs-{name}.json", folder)
        rows.append({"what": "predicted (out of sample)", "config": config, "run": name, **_figures(vs)})
        raw = predicted(arrivals, scen_b, start, seeds, work / f"start-vs-{name}.json", folder)
        rows.append({"what": "measured profile, not fitted", "config": config, "run": name, **_figures(raw)})
    return {
        "quick": quick, "profile_measured_now": not quick, "seed": seed,
        "duration_s": duration, "mean_gap_s": mean, "task": TASK,
        "max_tokens": max_tokens, "flush_a": FLUSH_A, "flush_b": FLUSH_B, "calls": len(json.loads(trace.read_text())["calls"]),
        "runs": runs, "calibrate_s": calibrate_s, "fit": {"values": fit["values"], "relative_se": fit["relative_se"],
                                                        "ensemble": len(fit["ensemble"]),
                                                        "measured": {f"{TASK}.pass_base": measured_costs[0],
                                                                     f"{TASK}.pass_per_row_token": measured_costs[1]}},
        "blind_prediction_b": {"p50": blind["p50"], "p90": blind["p90"]},
        "rows": rows, "python": platform.python_version(), "machine": platform.machine(),
        "cores": os.cpu_count(),
    }


def _figures(record: dict[str, Any]) -> dict[str, Any]:
    return {"calls": record["calls"], **{f"{q}_{k}": record[f"{q}_{k}"] for q in ("p50", "p90", "p99")
                                         for k in ("ref", "other", "err")}}


def table(result: dict[str, Any]) -> str:
    """The markdown table of ``result`` and the lines that say how it was measured."""
    lines = ["| run | configuration | profile | calls | p50 observed / predicted (error) "
             "| p90 observed / predicted (error) | p99 (not a target) |", "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['run']} | {r['config']} | {r['what']} | {r['calls']} | " + " | ".join(
            f"{r[f'{q}_ref']:.3f} / {r[f'{q}_other']:.3f} s ({100 * r[f'{q}_err']:+.0f} %)"
            for q in ("p50", "p90", "p99")) + " |")
    values = ", ".join(f"{k} {result['fit']['measured'][k]:.3g} s measured, {v:.3g} s fitted "
                       f"(± {100 * result['fit']['relative_se'][k]:.0f} %)" for k, v in result["fit"]["values"].items())
    observed = {r["run"]: r for r in result["rows"]}
    lines.append("")
    if "B2" in observed:
        b, b2 = observed["B"], observed["B2"]
        lines.append("Two real runs of B, same trace and server, differ by " + ", ".join(
            f"{100 * (b2[f'{q}_ref'] / b[f'{q}_ref'] - 1):+.0f} % at {q}" for q in ("p50", "p90", "p99"))
            + " (B2 against B).")
        lines.append("")
    lines.append(
        f"{result['calls']} calls of {result['task']} (1–3 prompts, 64 prompt and {result.get('max_tokens', 256)} output tokens, Poisson, "
        f"mean gap {result['mean_gap_s']} s, {result['duration_s']:.0f} s), `scenarios/harness-cpu.toml` served by "
        f"`simctl serve --backend harness` (tiny preset, CPU, one torch thread) and loaded by `simctl load`; "
        f"per-pass costs of the verify step, {values}; calibration took {result['calibrate_s']:.0f} s. "
        f"Python {result['python']} on {result['machine']}, {result['cores']} cores shared by server, load "
        f"generator and the machine's other work.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 s runs, a small fit, one run of B")
    parser.add_argument("--seed", type=int, default=0, help="the trace's seed")
    parser.add_argument("--keep", type=Path, default=None, help="keep the runs, profiles and predictions here")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--write-docs", action="store_true", help="write the table into docs/calibration.md")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="simctl-live-loop-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        result = run(args.quick, args.seed, work)
    from docs_tables import report

    return report(result, table(result), "live-loop", write_docs=args.write_docs, as_json=args.json, page="calibration.md")


if __name__ == "__main__":
    sys.exit(main())
