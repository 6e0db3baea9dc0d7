"""The tools users already run, against ``simctl serve``: do they work, and do they agree?

Run where the tools are installed (they are not simctl's dependencies)::

    python3.11 -m venv /tmp/tools && /tmp/tools/bin/pip install guidellm==0.8.1 aiperf==0.13.0 openai
    python benchmarks/tool_compat.py --tools /tmp/tools/bin [--write-docs] [--fixtures DIR]

``--tools`` is the folder holding ``guidellm``, ``aiperf`` and a ``python`` that imports
``openai`` (default: the folder of the ``guidellm`` found on PATH). No model hub is reached:
the clients' tokenizer is built offline (``benchmarks/offline_tokenizer.py``).

Each client runs against its own ``simctl serve -c design-notes --backend sleep`` (profile
``seed-calibrated``, seed 0, ``--time-scale X``, every synthetic prompt served as
``--default-task``), started fresh so its service-time streams start where a replay's do:

* **openai** (the Python client): completions and chat, streamed and not, N requests each;
  every one must succeed and its text must hold as many words as ``usage`` counts tokens.
* **GuideLLM** (synthetic data): one constant-rate benchmark, and a rate sweep of three
  constant rates in one file.
* **AIPerf** (synthetic data, chat, streamed, constant request rate).

For each GuideLLM and AIPerf benchmark:

1. every request succeeded;
2. simctl's reader of the tool's file (:func:`simulator.observed.read_observed`) gives the
   tool's own request count and the same TTFT, ITL and end-to-end latency p50/p90 as the
   tool's own summary in that file, computed from the per-request records simctl read with
   the tool's own percentile definition (within 1 %: rounding);
3. the tool's reported TTFT, ITL and latency p50/p90 are within 5 % of ``simctl replay`` of
   the same schedule: the requests' send instants and token counts, as the reader gives
   them, times the time scale, replayed through the same scenario, profile and seed, the
   replay's figures divided by the time scale.

And **``simctl load`` against GuideLLM's mock server** (``guidellm mock-server`` with a fixed
TTFT and ITL, no spread): the TTFT and ITL it records (p50) are within 5 % of the mock's
settings.

``--fixtures DIR`` keeps the sweep's and AIPerf's files of this run (``guidellm-sweep.json``,
``aiperf/``): ``tests/data/tool_fixtures/simctl-serve/`` holds one such set, which the suite
checks as this script does (:func:`check_file`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from live_twin import stop, wait_http  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SCENARIO, PROFILE, SEED = "design-notes", "seed-calibrated", 0
DEFAULT_TASK = "mmlu"
TIME_SCALE = 2.0
TOLERANCE = 0.05
READER_TOLERANCE = 0.01
FIGURES = ("ttft", "itl", "e2e")
QUANTILES = (50, 90)
PROMPT_TOKENS, OUTPUT_TOKENS = 64, 16
MOCK_TTFT_MS, MOCK_ITL_MS = 200.0, 20.0


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


@contextmanager
def simctl_serve(work: Path, name: str, time_scale: float) -> Iterator[str]:
    """``simctl serve --backend sleep`` on a free port of 127.0.0.1; yields its base URL."""
    args = [sys.executable, "-c", "from simulator.cli import main; main()", "serve", "-s", SCENARIO, "-p", PROFILE,
            "--backend", "sleep", "--time-scale", f"{time_scale:g}", "--seed", str(SEED),
            "--default-task", DEFAULT_TASK, "--host", "127.0.0.1", "--port", "0", "--grace", "5"]
    log = (work / f"serve-{name}.log").open("w")
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, text=True, env=_env(), cwd=work)
    line = proc.stdout.readline() if proc.stdout else ""
    match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
    if not match:
        stop(proc)
        raise RuntimeError(f"simctl serve did not start: {line!r} {(work / f'serve-{name}.log').read_text()[-2000:]}")
    url = f"http://127.0.0.1:{match.group(1)}"
    try:
        wait_http(url + "/health")
        yield url
    finally:
        stop(proc)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def guidellm_mock(tools: Path, work: Path) -> Iterator[str]:
    """GuideLLM's mock server with a fixed TTFT and ITL (no spread); yields its base URL."""
    port = _free_port()
    args = [str(tools / "guidellm"), "mock-server", "--host", "127.0.0.1", "--port", str(port), "--model",
            "mock-model", "--ttft-ms", f"{MOCK_TTFT_MS:g}", "--ttft-ms-std", "0", "--itl-ms", f"{MOCK_ITL_MS:g}",
            "--itl-ms-std", "0", "--output-tokens", str(OUTPUT_TOKENS), "--output-tokens-std", "0"]
    log = (work / "mock.log").open("w")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=work)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/v1/models")
        yield url
    finally:
        stop(proc)


def _run(cmd: list[str], work: Path, name: str, timeout: float = 600) -> None:
    log = work / f"{name}.log"
    with log.open("w") as out:
        code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=work, timeout=timeout).returncode
    if code != 0:
        raise RuntimeError(f"{name} exited {code}: {log.read_text()[-3000:]}")


# -- the clients -------------------------------------------------------------------------

OPENAI_SCRIPT = r"""
import json, sys
import openai
client = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="none", max_retries=0)
n = int(sys.argv[2])
out = {}
words = "the quick brown fox jumps over the lazy dog " * 4
for api in ("completions", "chat"):
    for stream in (False, True):
        ok = tokens_match = 0
        create = client.completions.create if api == "completions" else client.chat.completions.create
        for i in range(n):
            try:
                if api == "completions":
                    kw = dict(model="simctl", prompt=f"{i} {words}", max_tokens=8)
                else:
                    kw = dict(model="simctl", messages=[{"role": "user", "content": f"{i} {words}"}], max_tokens=8)
                if stream:
                    kw["stream"], kw["stream_options"] = True, {"include_usage": True}
                    text, usage = "", None
                    for chunk in create(**kw):
                        if chunk.usage is not None:
                            usage = chunk.usage
                        for c in chunk.choices:
                            text += c.text if api == "completions" else (c.delta.content or "")
                else:
                    r = create(**kw)
                    text = r.choices[0].text if api == "completions" else r.choices[0].message.content
                    usage = r.usage
                ok += 1
                tokens_match += usage is not None and len(text.split()) == usage.completion_tokens
            except Exception as exc:  # noqa: BLE001 (counted, and the first one shown)
                out.setdefault("errors", []).append(f"{api} stream={stream}: {exc!r}"[:300])
        out[f"{api}{' streamed' if stream else ''}"] = {"requests": n, "ok": ok, "tokens_match": tokens_match}
print(json.dumps(out))
"""


def openai_client(tools: Path, url: str, n: int) -> dict[str, Any]:
    out = subprocess.run([str(tools / "python"), "-c", OPENAI_SCRIPT, url, str(n)], capture_output=True, text=True,
                         timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"openai client failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout)


def guidellm(tools: Path, url: str, tokenizer: Path, work: Path, name: str, rates: list[float],
             requests: int) -> Path:
    path = work / f"{name}.json"
    cmd = [str(tools / "guidellm"), "run", "--backend", f"kind=openai_http,target={url},model=simctl",
           "--tokenizer", f"kind=huggingface_auto,model={tokenizer}",
           "--data", f"kind=synthetic_text,prompt_tokens={PROMPT_TOKENS},output_tokens={OUTPUT_TOKENS}",
           "--seed", "kind=static,value=7", "--profile", f"kind=constant,rate={rates[0]:g}",
           "--constraint", f"kind=max_requests,count={requests}",
           "--output", f"kind=json,path={path}", "--disable-console-interactive"]
    if len(rates) > 1:
        cmd += ["--override", "profile.rate", ",".join(f"{r:g}" for r in rates)]
    _run(cmd, work, name)
    return path


def aiperf(tools: Path, url: str, tokenizer: Path, work: Path, name: str, rate: float, requests: int) -> Path:
    folder = work / name
    _run([str(tools / "aiperf"), "profile", "--model", "simctl", "--url", url, "--endpoint-type", "chat",
          "--streaming", "--request-count", str(requests), "--request-rate", f"{rate:g}", "--tokenizer",
          str(tokenizer), "--prompt-input-tokens-mean", str(PROMPT_TOKENS), "--prompt-input-tokens-stddev", "0",
          "--prompt-output-tokens-mean", str(OUTPUT_TOKENS), "--prompt-output-tokens-stddev", "0",
          "--random-seed", "7", "--output-artifact-dir", str(folder), "--ui-type", "none"], work, name)
    return folder


# -- the tools' own summaries ------------------------------------------------------------

def guidellm_summaries(path: Path) -> list[dict[str, Any]]:
    """Per benchmark of a GuideLLM 0.8 file: its own request counts and p50/p90 (ms)."""
    out = []
    for b in json.loads(path.read_text())["benchmarks"]:
        m, totals = b["metrics"], b["metrics"]["request_totals"]
        row: dict[str, Any] = {"requests": int(totals["total"]), "ok": int(totals["successful"]),
                               "failed": int(totals["errored"]) + int(totals["incomplete"])}
        for fig, key, scale in (("ttft", "time_to_first_token_ms", 1.0), ("itl", "inter_token_latency_ms", 1.0),
                                ("e2e", "request_latency", 1e3)):
            pct = m[key]["successful"]["percentiles"]
            for q in QUANTILES:
                row[f"{fig}_p{q}"] = float(pct[f"p{q}"]) * scale
        out.append(row)
    return out


def aiperf_summary(folder: Path) -> dict[str, Any]:
    """An AIPerf 0.13 run's own request counts and p50/p90 (ms)."""
    d = json.loads((folder / "profile_export_aiperf.json").read_text())
    ok = int(d["request_count"]["avg"])
    failed = int(d["error_request_count"]["avg"]) if isinstance(d.get("error_request_count"), dict) else 0
    row: dict[str, Any] = {"requests": ok + failed, "ok": ok, "failed": failed}
    for fig, key in (("ttft", "time_to_first_token"), ("itl", "inter_token_latency"), ("e2e", "request_latency")):
        for q in QUANTILES:
            row[f"{fig}_p{q}"] = float(d[key][f"p{q}"])
    return row


# -- simctl's view: the reader, and a replay of the same schedule -------------------------

def _token_row(tokens: dict[str, Any]) -> dict[str, Any]:
    """Request counts and p50/p90 (ms) of a summary's token figures."""
    row = {"requests": int(tokens["requests"]), "ok": int(tokens["completed"])}
    for fig in FIGURES:
        for q in QUANTILES:
            row[f"{fig}_p{q}"] = tokens[f"{fig}_ms"][f"p{q}"]
    return row


def nearest_rank(values: np.ndarray, q: float, weights: np.ndarray | None = None) -> float:
    """GuideLLM's percentile: the first value (sorted) whose cumulative share of the weights
    reaches ``q`` % (its ITL distribution weighs each request by its inter-token gaps)."""
    order = np.argsort(values, kind="stable")
    w = np.ones(len(values)) if weights is None else np.asarray(weights, float)[order]
    cum = np.cumsum(w / w.sum())
    return float(values[order][min(int(np.searchsorted(cum, q / 100, side="left")), len(values) - 1)])


def read_by_simctl(path: str, tool: str) -> tuple[Any, dict[str, Any]]:
    """The observed run simctl reads from a tool's file, and its request counts and p50/p90
    (ms) from the per-request records simctl read, with the tool's own percentile definition
    (GuideLLM: :func:`nearest_rank`; AIPerf: linear interpolation, numpy's default), so the
    comparison checks what was read, not two definitions."""
    from simulator.observed import read_observed

    run = read_observed(path)
    req = run.requests
    ok = req[req["ok"].astype(bool)]
    sent, first, done = (ok[c].to_numpy(float) for c in ("sent_at", "first_token_at", "done_at"))
    gaps = np.maximum(ok["output_tokens"].to_numpy(float) - 1, 1)
    tpot = (done - first) / gaps
    itl = ok["itl_s"].to_numpy(float) if "itl_s" in ok else tpot
    values = {"ttft": first - sent, "itl": np.where(np.isnan(itl), tpot, itl), "e2e": done - sent}
    row: dict[str, Any] = {"requests": len(req), "ok": len(ok)}
    for fig in FIGURES:
        for q in QUANTILES:
            if tool == "guidellm":
                value = nearest_rank(values[fig], q, gaps if fig == "itl" else None)
            else:
                value = float(np.percentile(values[fig], q))
            row[f"{fig}_p{q}"] = value * 1e3
    return run, row


def replay_schedules(runs: list[tuple[Any, float]], time_scale: float) -> list[dict[str, Any]]:
    """``simctl replay`` of the requests the tool sent, every prompt the default task: each
    run's send instants and token counts, shifted by its offset (seconds after the first
    run's start: the benchmarks of a sweep hit one server one after the other, so its
    service-time streams run on from one to the next) and × ``time_scale`` (model seconds),
    in one replay; the figures of each run's requests, in the tool's own (wall) milliseconds."""
    from simulator import build_scenario, load_profile, replay
    from simulator.events import SERVED
    from simulator.metrics import TokenOptions, token_figures
    from simulator.trace.model import Call, Prompt, Trace

    calls = [Call(f"{k}/{c.id}", (offset + c.t) * time_scale,
                  tuple(Prompt(DEFAULT_TASK, p.prompt_tokens, p.max_tokens) for p in c.prompts))
             for k, (run, offset) in enumerate(runs) for c in run.trace.calls]
    result = replay(Trace(calls), build_scenario(path=SCENARIO), load_profile(PROFILE), seed=SEED)
    log = result.log
    run_of = np.array([str(log["call_id"].iloc[i]).split("/")[0] for i in range(len(log))], dtype=object)
    frame = pd.DataFrame({"sent_at": log["arrived_at"], "first_token_at": log["first_token_at"],
                          "done_at": log["done_at"], "ok": log["status"].isin(SERVED),
                          "output_tokens": log["max_tokens"], "prompt_tokens": log["prompt_tokens"]})
    rows = []
    for k in range(len(runs)):
        row = _token_row(token_figures(frame[run_of == str(k)], TokenOptions(QUANTILES)))
        rows.append({key: (v / time_scale if key.endswith(("_p50", "_p90")) else v) for key, v in row.items()})
    return rows


def guidellm_offsets(path: Path) -> list[float]:
    """Seconds from the first benchmark's first request to each benchmark's first request."""
    starts = []
    for b in json.loads(path.read_text())["benchmarks"]:
        times = [r["info"]["timings"]["request_start"] for part in ("successful", "errored", "incomplete")
                 for r in b["requests"].get(part) or [] if r["info"]["timings"].get("request_start") is not None]
        starts.append(min(times))
    return [t - starts[0] for t in starts]


def _rel(a: float, b: float) -> float:
    return (a - b) / b


def check_benchmark(client: str, name: str, own: dict[str, Any], run: Any, reader: dict[str, Any],
                    model: dict[str, Any]) -> dict[str, Any]:
    """One benchmark: the tool's own summary (``own``), simctl's reading of its file
    (``reader``) and the replay of its schedule (``model``), all in ms."""
    row: dict[str, Any] = {"client": client, "benchmark": name, "requests": own["requests"], "ok": own["ok"],
                           "reader_requests": reader["requests"], "reader_ok": reader["ok"]}
    ok = own["failed"] == 0 and own["ok"] == own["requests"] and reader["requests"] == own["requests"] \
        and reader["ok"] == own["ok"]
    worst_reader = worst_model = 0.0
    for fig in FIGURES:
        for q in QUANTILES:
            key = f"{fig}_p{q}"
            row[f"{key}_tool"], row[f"{key}_replay"] = own[key], model[key]
            worst_reader = max(worst_reader, abs(_rel(reader[key], own[key])))
            worst_model = max(worst_model, abs(_rel(own[key], model[key])))
            row[f"{key}_err"] = _rel(own[key], model[key])
    row["reader_worst"], row["replay_worst"] = worst_reader, worst_model
    row["pass"] = bool(ok and worst_reader <= READER_TOLERANCE and worst_model <= TOLERANCE)
    return row


def check_file(client: str, path: Path, tool: str, time_scale: float, label: str = "") -> list[dict[str, Any]]:
    """Every benchmark of one tool's result file (a folder for AIPerf), as
    :func:`check_benchmark` rows (``label`` names a benchmark the file does not name)."""
    if tool == "guidellm":
        owns, offsets = guidellm_summaries(path), guidellm_offsets(path)
    else:
        owns, offsets = [aiperf_summary(path)], [0.0]
    several = len(owns) > 1
    read = [read_by_simctl(f"{path}#{k}" if several else str(path), tool) for k in range(len(owns))]
    models = replay_schedules([(run, offset) for (run, _), offset in zip(read, offsets, strict=True)], time_scale)
    return [check_benchmark(client, run.meta.get("benchmark_label") or label or f"benchmark {k}", own, run, reader, model)
            for k, (own, (run, reader), model) in enumerate(zip(owns, read, models, strict=True))]


RAW_CLIENT = r"""
import json, sys, time
import httpx
url, n, tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ttft, itl = [], []
with httpx.Client(timeout=60) as client:
    for i in range(n):
        body = {"model": "mock-model", "max_tokens": tokens, "stream": True,
                "messages": [{"role": "user", "content": f"question {i}"}]}
        times, t0 = [], time.perf_counter()
        with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
            for line in r.iter_lines():
                if '"content"' in line:
                    times.append(time.perf_counter())
        ttft.append(times[0] - t0)
        itl.append((times[-1] - times[0]) / (len(times) - 1))
ttft.sort(); itl.sort()
print(json.dumps({"ttft_p50_ms": 1e3 * ttft[n // 2], "itl_p50_ms": 1e3 * itl[n // 2]}))
"""


def load_against_mock(tools: Path, work: Path, calls: int) -> dict[str, Any]:
    """``simctl load`` (chat, streamed) of ``calls`` one-prompt calls at 5/s against the mock,
    and, for reference, what a bare streaming client (httpx, one request at a time) measures
    on the same mock: the mock's own overhead over its settings."""
    from simulator.live.load import LoadOptions, run_load
    from simulator.metrics import TokenOptions
    from simulator.observed import read_observed
    from simulator.trace.model import Call, Prompt, Trace

    trace = Trace([Call(str(i), 0.2 * i, (Prompt("chat", 8, OUTPUT_TOKENS, f"question {i}"),))
                   for i in range(calls)])
    folder = work / "load-mock"
    with guidellm_mock(tools, work) as url:
        run_load(trace, LoadOptions(url=url, api="chat", model="mock-model"), folder, handle_sigint=False)
        bare = subprocess.run([str(tools / "python"), "-c", RAW_CLIENT, url, "20", str(OUTPUT_TOKENS)],
                              capture_output=True, text=True, timeout=300)
    raw = json.loads(bare.stdout) if bare.returncode == 0 else {}
    run = read_observed(str(folder))
    tok = run.figures(TokenOptions(QUANTILES))["tokens"]["overall"]
    ttft, itl = tok["ttft_ms"]["p50"], tok["itl_ms"]["p50"]
    errs = (_rel(ttft, MOCK_TTFT_MS), _rel(itl, MOCK_ITL_MS))
    return {"calls": calls, "ok": int(tok["completed"]), "ttft_p50_ms": ttft, "itl_p50_ms": itl,
            "ttft_err": errs[0], "itl_err": errs[1], "bare_client": raw,
            "pass": bool(tok["completed"] == calls and max(map(abs, errs)) <= TOLERANCE)}


def run(tools: Path, time_scale: float, requests: int, fixtures: Path | None) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="simctl-tool-compat-"))
    tokenizer = work / "tokenizer"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "offline_tokenizer.py"), str(tokenizer)], check=True,
                   capture_output=True, env=_env())
    rows: list[dict[str, Any]] = []
    result: dict[str, Any] = {"time_scale": time_scale, "default_task": DEFAULT_TASK, "requests": requests,
                              "versions": _versions(tools)}
    with simctl_serve(work, "openai", time_scale) as url:
        result["openai"] = openai_client(tools, url, 8)
    with simctl_serve(work, "guidellm", time_scale) as url:
        single = guidellm(tools, url, tokenizer, work, "guidellm-constant", [1.0], requests)
    rows += check_file("GuideLLM", single, "guidellm", time_scale)
    with simctl_serve(work, "guidellm-sweep", time_scale) as url:
        sweep = guidellm(tools, url, tokenizer, work, "guidellm-sweep", [0.25, 0.5, 1.0], max(10, requests // 2))
    rows += check_file("GuideLLM sweep", sweep, "guidellm", time_scale)
    with simctl_serve(work, "aiperf", time_scale) as url:
        folder = aiperf(tools, url, tokenizer, work, "aiperf", 1.0, requests)
    rows += check_file("AIPerf", folder, "aiperf", time_scale, "rate 1/s")
    result["benchmarks"] = rows
    result["load_against_mock"] = load_against_mock(tools, work, requests)
    openai_ok = all(v["ok"] == v["requests"] == v["tokens_match"] for k, v in result["openai"].items() if k != "errors")
    result["pass"] = bool(openai_ok and all(r["pass"] for r in rows) and result["load_against_mock"]["pass"])
    if fixtures is not None:
        fixtures.mkdir(parents=True, exist_ok=True)
        shutil.copy(sweep, fixtures / "guidellm-sweep.json")
        dest = fixtures / "aiperf"
        dest.mkdir(exist_ok=True)
        for name in ("profile_export.jsonl", "profile_export_aiperf.json", "profile_export_aiperf.csv"):
            shutil.copy(folder / name, dest / name)
    shutil.rmtree(work, ignore_errors=True)
    return result


def _versions(tools: Path) -> dict[str, str]:
    script = ("import importlib.metadata as m; print(' '.join(f'{p}=={m.version(p)}' "
              "for p in ('guidellm', 'aiperf', 'openai')))")
    out = subprocess.run([str(tools / "python"), "-c", script], capture_output=True, text=True)
    return dict(item.split("==") for item in out.stdout.split()) if out.returncode == 0 else {}


def table(result: dict[str, Any]) -> str:
    v = result["versions"]
    lines = [f"`python benchmarks/tool_compat.py` (GuideLLM {v.get('guidellm', '?')}, AIPerf {v.get('aiperf', '?')}, "
             f"openai {v.get('openai', '?')}) against `simctl serve -c {SCENARIO} --backend sleep --time-scale "
             f"{result['time_scale']:g} --default-task {result['default_task']}`. Tool figures in the tools' own "
             f"milliseconds; replay: `simctl replay` of the same schedule, divided by the time scale. "
             f"Pass: every request succeeded, simctl's reader within {100 * READER_TOLERANCE:g} % of the tool's "
             f"own summary, the tool within {100 * TOLERANCE:g} % of the replay.", "",
             "| client | requests (ok) | succeeded |", "|---|---|---|"]
    for name, o in result["openai"].items():
        if name != "errors":
            lines.append(f"| openai {name} | {o['requests']} ({o['ok']}) | "
                         f"{'yes' if o['ok'] == o['requests'] else 'no'}; words = usage tokens in {o['tokens_match']} |")
    lines += ["", "| client | benchmark | requests (ok) | reader: requests (ok), worst | TTFT p50 / p90 (tool, replay) "
              "| ITL p50 / p90 | latency p50 / p90 | worst vs replay | pass |", "|---|---|---|---|---|---|---|---|---|"]
    for r in result["benchmarks"]:
        cells = []
        for fig in FIGURES:
            cells.append(" / ".join(f"{r[f'{fig}_p{q}_tool']:,.1f} ({r[f'{fig}_p{q}_replay']:,.1f})" for q in QUANTILES))
        lines.append(f"| {r['client']} | {r['benchmark']} | {r['requests']} ({r['ok']}) | {r['reader_requests']} "
                     f"({r['reader_ok']}), {100 * r['reader_worst']:.2f} % | {' | '.join(cells)} | "
                     f"{100 * r['replay_worst']:.1f} % | {'yes' if r['pass'] else 'no'} |")
    m = result["load_against_mock"]
    lines += ["", f"`simctl load` (chat, streamed) of {m['calls']} calls against `guidellm mock-server --ttft-ms "
              f"{MOCK_TTFT_MS:g} --itl-ms {MOCK_ITL_MS:g}` (no spread): {m['ok']} ok; TTFT p50 {m['ttft_p50_ms']:.1f} ms "
              f"({100 * m['ttft_err']:+.1f} %), ITL p50 {m['itl_p50_ms']:.2f} ms ({100 * m['itl_err']:+.1f} %); "
              f"{'pass' if m['pass'] else 'FAIL'}. A bare streaming client (httpx, one request at a time) on the "
              f"same mock: TTFT p50 {m['bare_client'].get('ttft_p50_ms', float('nan')):.1f} ms, ITL p50 "
              f"{m['bare_client'].get('itl_p50_ms', float('nan')):.2f} ms (the mock's own overhead).", "",
              f"Overall: {'pass' if result['pass'] else 'FAIL'}."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tools", type=Path, help="folder with guidellm, aiperf and a python that has openai")
    parser.add_argument("--time-scale", type=float, default=TIME_SCALE)
    parser.add_argument("--requests", type=int, default=40, help="requests per benchmark")
    parser.add_argument("--fixtures", type=Path, help="keep the tools' result files in this folder")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args(argv)
    tools = args.tools
    if tools is None:
        found = shutil.which("guidellm")
        if found is None:
            parser.error("no guidellm on PATH: install the tools (see the docstring) and give --tools")
        tools = Path(found).parent
    for exe in ("guidellm", "aiperf", "python"):
        if not (tools / exe).exists():
            parser.error(f"{tools / exe} not found")
    result = run(tools, args.time_scale, args.requests, args.fixtures)
    print(json.dumps(result, indent=2) if args.json else table(result))
    if args.write_docs:
        from docs_tables import write_generated

        write_generated("tool-compat", table(result), page="tools.md")
    return 0 if result["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
