"""Observed runs: what a real system did with a trace, per call, in the same terms as replay.

The users' load-testing client writes a results folder per run::

    batch_results_RUN/
      batch_0000.json ...          one per call that got an HTTP response
      simulation_summary.json      every call, failures included (optional)

Each record: ``batch_id, batch_size, scheduled_arrival_time, actual_send_time,
request_duration, completion_time, status_code, prompt_idxs, response, error`` (seconds
from the start of the run). Rules, as the client and server behave:

* a call **succeeded** only if its ``batch_NNNN.json`` exists and its ``response`` has
  ``choices`` (the server returns HTTP 200 with ``{"error": ...}`` on an exception); a call
  with no file (a timeout or a 500) or with an error body **failed**;
* a successful call's latency is its ``request_duration``; a failed call's is censored at
  the client's timeout: the run's own (``simctl load`` writes its ``timeout_s`` in the
  summary's ``load`` settings), else 600 s (the users' client);
* a run of ``simctl load --time-scale X`` ran X times faster than the trace's clock (its
  server compressed the same way), so every instant and duration it wrote, and its
  timeout, is multiplied by X: the figures are in the trace's (model) seconds, comparable
  with a replay of the trace; rates are divided by X. ``time_scale`` says what was done;
* the arrival file (``batch_arrivals.json``, the client format) gives each call's tasks.

A successful call's response also holds each prompt's generated text (``choices[i].text``,
in prompt order). :attr:`ObservedRun.prompts` keeps its length: the answer is the text
after the chat template's ``</think>`` (the server decodes the whole sequence), else after
an echoed prompt, else the whole text. :func:`with_observed_lengths` turns those lengths into
each prompt's output tokens in the trace — the workload's own lengths, measured, for
servers that stop at end of sequence. Characters become tokens at
:data:`CHARS_PER_TOKEN` (no tokenizer is needed; for English text a BPE vocabulary of
~150k averages about 4 characters per token), so a length is an estimate within ~20 %.

:func:`call_figures` turns any per-call table (observed, or simulated via
:func:`simulated_calls`) into the same figures: call latency statistics overall, per task
(calls containing it) and per composition class, over successful calls and censored.

Token figures (:func:`simulator.metrics.token_figures`: TTFT, ITL, TPOT, end-to-end latency,
token throughputs, goodput) come from the per-request table where the run has one:
``requests.parquet`` of ``simctl load`` (a request per prompt, its ``itls_s`` the streamed
gaps), or another tool's per-request ``ttft_s`` (and ``itl_s`` where its reader gives one).
The users' client records calls only: such a run has no token figures.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simulator.errors import ObservedError
from simulator.metrics import (
    TokenOptions,
    call_figures,
    client_calls as simulated_calls,
    composition_labels,
    token_figures,
)
from simulator.scenario import Compositions
from simulator.trace.model import Trace

CLIENT_TIMEOUT = 600.0
CHARS_PER_TOKEN = 4.0
SUMMARY_FILE = "simulation_summary.json"
_BATCH_FILE = re.compile(r"^batch_(\d+)\.json$")


@dataclass(frozen=True)
class ObservedRun:
    """One observed run: ``calls`` has one row per call of the trace (see :func:`read_observed`)."""

    name: str
    path: str
    calls: pd.DataFrame
    timeout: float = CLIENT_TIMEOUT
    meta: dict = field(default_factory=dict)
    #: one row per prompt of a successful call: call_id, prompt_index, task, answer_chars
    prompts: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(
        columns=["call_id", "prompt_index", "task", "answer_chars"]))
    #: the calls as the run sent them, where the results hold them (another load
    #: generator's results, which come with no arrival file); else ``None``
    trace: Trace | None = None
    #: the run's ``--time-scale``: its instants and durations here are already multiplied by it
    time_scale: float = 1.0
    #: one row per request in :func:`simulator.metrics.token_figures`' terms (model seconds;
    #: ``task`` too), where the run recorded requests; else ``None``
    requests: pd.DataFrame | None = None

    def figures(self, tokens: TokenOptions | None = None) -> dict[str, Any]:
        """The call figures (:func:`simulator.metrics.call_figures`), the ``time_scale``, and
        ``tokens``: the token figures overall and per task (``None`` without requests)."""
        figures = call_figures(self.calls, self.timeout)
        figures["time_scale"] = self.time_scale
        figures["tokens"] = None
        if self.requests is not None:
            figures["tokens"] = {"overall": token_figures(self.requests, tokens)}
            span = figures["tokens"]["overall"]["span_s"]
            for task in sorted(self.requests["task"].unique()):
                figures["tokens"][str(task)] = token_figures(self.requests[self.requests["task"] == task], tokens,
                                                             span=span)
        return figures

    def classified(self, compositions: Compositions) -> ObservedRun:
        """The same run with its calls classed by ``compositions`` (a scenario's rules)."""
        sets = self.calls["tasks"].str.split("+").map(frozenset)
        return replace(self, calls=self.calls.assign(composition=sets.map(compositions.classify)))


def _read_json(path: Path) -> Any:
    from simulator import inputs

    return inputs.read_json(path, ObservedError, "JSON file")


def _number(record: dict, key: str, path: Path, index: int | None) -> float | None:
    value = record.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ObservedError(path, index, key, f"must be a number of seconds, got {value!r}")
    return float(value)


def _succeeded(record: dict) -> bool:
    response = record.get("response")
    return (record.get("status_code") == 200 and isinstance(response, dict)
            and isinstance(response.get("choices"), list) and not record.get("error"))


def find_arrivals(folder: Path) -> Path | None:
    """The arrival file of a results folder, if there: in the folder itself (a run of
    ``simctl load``), else next to it (``../batch_arrivals.json``, the users' client)."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    for candidate in (folder / "batch_arrivals.json", folder.parent / "batch_arrivals.json"):
        if candidate.exists():
            return candidate
    return None


#: what a run may be, for the error on a file that is none of them
_EXPECTED = ("a results folder of the load-testing client, or the results of vllm bench serve (--save-result "
             "--save-detailed JSON), GuideLLM (benchmarks.json) or AIPerf (profile_export.jsonl)")


def _tool_run(other: Any, timeout: float) -> ObservedRun:
    return ObservedRun(name=other.name, path=other.path, calls=other.calls, timeout=timeout,
                       meta=other.meta, trace=other.trace, requests=_tool_requests(other.calls, other.trace))


def read_observed_runs(path: str | Path, arrivals: str | Path | Trace | None = None,
                       timeout: float | None = None, compositions: Compositions | None = None) -> list[ObservedRun]:
    """Every run at ``path``: one per benchmark of another tool's file that holds several
    (a GuideLLM sweep; ``FILE#K`` reads benchmark ``K`` alone), else the one run
    :func:`read_observed` reads."""
    from simulator.observed_formats import read_result_runs

    tool_timeout = CLIENT_TIMEOUT if timeout is None else timeout
    runs = read_result_runs(path, tool_timeout, compositions or Compositions())
    if runs is not None:
        return [_tool_run(run, tool_timeout) for run in runs]
    return [read_observed(path, arrivals, timeout, compositions)]


def read_observed(folder: str | Path, arrivals: str | Path | Trace | None = None,
                  timeout: float | None = None, compositions: Compositions | None = None) -> ObservedRun:
    """Read a results folder of the users' client (or of ``simctl load``); ``arrivals`` (the
    trace the run replayed, default ``batch_arrivals.json`` in the folder or beside it) gives
    each call's tasks and arrival instant; ``compositions`` (a scenario's rules) classes the
    calls. ``folder`` may also be another load generator's results (vllm bench serve,
    GuideLLM, AIPerf: :mod:`simulator.observed_formats`), which carry their own calls; one
    benchmark of a file of several is ``FILE#K``.

    ``timeout`` (seconds of the run's clock, as ``simctl load --timeout``) censors failed
    calls; ``None``: the run's own timeout, else :data:`CLIENT_TIMEOUT`. A time-scaled run
    is read in model seconds (module docstring)."""
    compositions = compositions or Compositions()
    from simulator.observed_formats import read_result_file
    from simulator.trace.formats import load_trace

    tool_timeout = CLIENT_TIMEOUT if timeout is None else timeout
    other = read_result_file(folder, tool_timeout, compositions)  # another load generator's results
    if other is not None:
        return _tool_run(other, tool_timeout)
    folder = Path(folder)
    if folder.is_file():
        raise ObservedError(folder, None, None, f"not results this reads: expected {_EXPECTED}")
    if not folder.is_dir():
        raise ObservedError(folder, None, None, "not a folder of observed results")
    has_results = (folder / SUMMARY_FILE).exists() or any(_BATCH_FILE.match(p.name) for p in folder.iterdir())
    if not has_results:
        runs = sorted(p.name for p in folder.iterdir() if p.is_dir() and (
            (p / SUMMARY_FILE).exists() or any(_BATCH_FILE.match(q.name) for q in p.iterdir())))
        held = " (it holds batch_arrivals.json: the arrival file, not a run)" if (folder / "batch_arrivals.json").exists() else ""
        raise ObservedError(folder, None, None, f"no results of a run here: no {SUMMARY_FILE} and no "
                            f"batch_NNNN.json files{held}; "
                            + (f"give one of its results folders: {', '.join(runs[:4])}" if runs else
                               "give the folder the load-testing client wrote its results into"))
    if arrivals is None:
        arrivals = find_arrivals(folder)
        if arrivals is None:
            raise ObservedError(folder, None, None, f"no arrival file {folder.parent / 'batch_arrivals.json'} beside "
                                "the results; give the file the run replayed with --arrivals")
    trace = arrivals if isinstance(arrivals, Trace) else load_trace(arrivals)
    by_id = {c.id: i for i, c in enumerate(trace.calls)}

    # call id -> (file, record, index of the record in the file; None: the whole file)
    files: dict[str, tuple[Path, dict, int | None]] = {}
    for path in sorted(folder.iterdir()):
        m = _BATCH_FILE.match(path.name)
        if not m:
            continue
        record = _read_json(path)
        if not isinstance(record, dict):
            raise ObservedError(path, None, None, "must be a JSON object (one call's result)")
        call_id = str(record.get("batch_id", int(m.group(1))))
        if call_id not in by_id:
            raise ObservedError(path, None, "batch_id", f"call {call_id} is not in the arrival file {trace.source}")
        files[call_id] = (path, record, None)
    summary_path = folder / SUMMARY_FILE
    summary: dict[str, tuple[Path, dict, int | None]] = {}
    time_scale, own_timeout = 1.0, None
    if summary_path.exists():
        data = _read_json(summary_path)
        time_scale, own_timeout = _load_settings(data, summary_path)
        results = data.get("results") if isinstance(data, dict) else None
        if not isinstance(results, list):
            raise ObservedError(summary_path, None, "results", "must be a list of per-call records")
        total = data.get("total_batches")
        if isinstance(total, int) and total != len(trace):
            raise ObservedError(summary_path, None, "total_batches",
                                f"the run has {total} calls but the arrival file {trace.source} has {len(trace)}; "
                                f"give the arrival file this run replayed (--arrivals)")
        for index, record in enumerate(results):
            if not isinstance(record, dict) or "batch_id" not in record:
                raise ObservedError(summary_path, index, "batch_id", "each result needs a batch_id")
            call_id = str(record["batch_id"])
            if call_id not in by_id:
                raise ObservedError(summary_path, index, "batch_id", f"call {call_id} is not in the arrival file {trace.source}")
            summary[call_id] = (summary_path, record, index)
    if not files and not summary_path.exists():  # a summary of no calls is a run none of whose calls finished
        raise ObservedError(folder, None, None, f"no batch_NNNN.json files and no {SUMMARY_FILE}")

    for call_id, source in list(files.items()) + list(summary.items()):
        size = source[1].get("batch_size")
        expected = len(trace.calls[by_id[call_id]].prompts)
        if size is not None and size != expected:
            raise ObservedError(source[0], source[2], "batch_size",
                                f"call {call_id} has {size} prompts here but {expected} in the arrival file "
                                f"{trace.source}; give the arrival file this run replayed (--arrivals)")

    rows, prompt_rows = [], []
    for ci, call in enumerate(trace.calls):
        tasks = frozenset(p.task for p in call.prompts)
        row: dict[str, Any] = {
            "call_id": call.id, "call_index": ci, "arrived_at": call.t, "prompts": len(call.prompts),
            "tasks": "+".join(sorted(tasks)), "composition": compositions.classify(tasks),
            "sent_at": np.nan, "duration_s": np.nan, "done_at": np.nan, "status_code": pd.NA,
            "ok": False, "error": "",
        }
        found = files.get(call.id) or summary.get(call.id)
        if found is not None:
            path, record, where = found
            sent = _number(record, "actual_send_time", path, where)
            row["sent_at"] = np.nan if sent is None else sent
            duration = _number(record, "request_duration", path, where)
            row["duration_s"] = np.nan if duration is None else duration
            done = _number(record, "completion_time", path, where)
            row["done_at"] = np.nan if done is None else done
            row["status_code"] = record.get("status_code") if record.get("status_code") is not None else pd.NA
            scheduled = _number(record, "scheduled_arrival_time", path, where)
            if scheduled is not None:
                row["arrived_at"] = scheduled
            if call.id in files:
                rec = files[call.id][1]
                row["ok"] = _succeeded(rec)
                if row["ok"]:
                    prompt_rows += _answers(call, rec["response"]["choices"], path)
                if not row["ok"]:
                    body = rec.get("response")
                    err = rec.get("error") or (body.get("error") if isinstance(body, dict) else None)
                    row["error"] = str(err or "no choices in the response")
            else:
                row["error"] = str(record.get("error") or "no result file")
        else:
            row["error"] = "no result"
        rows.append(row)
    calls = pd.DataFrame(rows)
    # the run's clock in model seconds (module docstring), its timeout too
    for col in ("arrived_at", "sent_at", "duration_s", "done_at"):
        calls[col] = calls[col].astype(float) * time_scale
    limit = (timeout if timeout is not None else own_timeout if own_timeout is not None else CLIENT_TIMEOUT) * time_scale
    calls["latency_s"] = np.where(calls["ok"], calls["duration_s"], np.nan)
    calls["latency_censored_s"] = np.where(calls["ok"], np.minimum(calls["duration_s"], limit), limit)
    meta = {"files": len(files), "summary": summary_path.exists(), "arrivals": trace.source}
    prompts = pd.DataFrame(prompt_rows, columns=["call_id", "prompt_index", "task", "answer_chars"])
    return ObservedRun(name=folder.name.removeprefix("batch_results_"), path=str(folder), calls=calls,
                       timeout=limit, meta=meta, prompts=prompts, time_scale=time_scale,
                       requests=_load_requests(folder, time_scale))


def _load_settings(data: Any, path: Path) -> tuple[float, float | None]:
    """``(time_scale, timeout_s)`` of a ``simctl load`` summary's ``load`` settings (``(1,
    None)`` for the users' client, which writes none)."""
    load = data.get("load") if isinstance(data, dict) else None
    if not isinstance(load, dict):
        return 1.0, None
    scale, timeout = load.get("time_scale", 1.0), load.get("timeout_s")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise ObservedError(path, None, "load.time_scale", f"must be a positive number, got {scale!r}")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not math.isfinite(timeout) or timeout <= 0):
        raise ObservedError(path, None, "load.timeout_s", f"must be a positive number of seconds, got {timeout!r}")
    return float(scale), None if timeout is None else float(timeout)


def _load_requests(folder: Path, time_scale: float) -> pd.DataFrame | None:
    """The per-request table of a ``simctl load`` run (``requests.parquet``) in
    :func:`simulator.metrics.token_figures`' terms and model seconds; ``None`` without one."""
    from simulator import inputs

    path = folder / "requests.parquet"
    if not path.exists():
        return None
    table = inputs.read_parquet(path, ObservedError, "request log").to_pandas()
    needed = ("task", "sent_at", "first_token_at", "done_at", "status", "prompt_tokens", "output_tokens")
    missing = [c for c in needed if c not in table.columns]
    if missing:
        raise ObservedError(path, None, missing[0], "not a request log of simctl load: no such column")
    gaps = table["itls_s"] if "itls_s" in table else pd.Series([None] * len(table))
    itl = [float(np.mean(g)) if g is not None and len(g) else np.nan for g in gaps]
    return pd.DataFrame({
        "task": table["task"].astype(str),
        **{c: table[c].astype(float) * time_scale for c in ("sent_at", "first_token_at", "done_at")},
        "ok": (table["status"] == "ok").to_numpy(bool),
        "output_tokens": pd.to_numeric(table["output_tokens"], errors="coerce").astype(float),
        "prompt_tokens": pd.to_numeric(table["prompt_tokens"], errors="coerce").astype(float),
        "itl_s": np.asarray(itl, dtype=float) * time_scale,
    })


def _tool_requests(calls: pd.DataFrame, trace: Trace) -> pd.DataFrame | None:
    """Another tool's per-request table (one prompt per call): its ``ttft_s`` (and ``itl_s``
    where the reader gives one), tokens from the calls it sent; ``None`` without ``ttft_s``."""
    if "ttft_s" not in calls:
        return None
    prompts = {c.id: c.prompts[0] for c in trace.calls}
    sent = calls["sent_at"].to_numpy(float)
    return pd.DataFrame({
        "task": calls["tasks"].astype(str).to_numpy(),
        "sent_at": sent,
        "first_token_at": sent + pd.to_numeric(calls["ttft_s"], errors="coerce").to_numpy(float),
        "done_at": calls["done_at"].to_numpy(float),
        "ok": calls["ok"].to_numpy(bool),
        "output_tokens": [np.nan if prompts[i].max_tokens is None else prompts[i].max_tokens for i in calls["call_id"]],
        "prompt_tokens": [np.nan if prompts[i].prompt_tokens is None else prompts[i].prompt_tokens
                          for i in calls["call_id"]],
        "itl_s": pd.to_numeric(calls["itl_s"], errors="coerce").to_numpy(float) if "itl_s" in calls else np.nan,
    })


def answer_of(choice: Any) -> str | None:
    """The generated answer in one response choice (module docstring), or ``None``."""
    if not isinstance(choice, dict) or not isinstance(choice.get("text"), str):
        return None
    text = choice["text"]
    if "</think>" in text:
        return text.split("</think>", 1)[1].strip()
    prompt = choice.get("prompt")
    if isinstance(prompt, str) and prompt and text.startswith(prompt):
        return text[len(prompt):].strip()
    return text.strip()


def _answers(call, choices: list, path: Path) -> list[tuple[str, int, str, int]]:
    """(call_id, prompt index, task, answer characters) for each choice of a call; choices
    come back in prompt order (their ``index``)."""
    out = []
    for position, choice in enumerate(choices):
        index = choice.get("index", position) if isinstance(choice, dict) else position
        answer = answer_of(choice)
        if answer is None or not isinstance(index, int) or not 0 <= index < len(call.prompts):
            continue
        out.append((call.id, index, call.prompts[index].task, len(answer)))
    return out


def with_observed_lengths(trace: Trace, observed: ObservedRun, tasks: tuple[str, ...] | list[str],
                          chars_per_token: float = CHARS_PER_TOKEN) -> Trace:
    """``trace`` with the prompts of ``tasks`` given the output length they had in
    ``observed`` (as ``max_tokens``: a model that generates to max tokens then generates
    what the real server generated; the scenario's cap still applies). Prompts the run did
    not answer keep their value. Only tasks whose answer is the generation itself make
    sense here (not a task whose server returns an extracted letter, or a CPU task)."""
    from dataclasses import replace

    wanted = set(tasks)
    unknown = wanted - {p.task for c in trace.calls for p in c.prompts}
    if unknown:
        raise ObservedError(observed.path, None, "tasks", f"the trace has no prompts of task {sorted(unknown)[0]!r}")
    lengths = {(r.call_id, r.prompt_index): max(1, math.ceil(r.answer_chars / chars_per_token))
               for r in observed.prompts.itertuples() if r.task in wanted}
    calls = []
    for call in trace.calls:
        prompts = tuple(replace(p, max_tokens=lengths[(call.id, i)]) if (call.id, i) in lengths else p
                        for i, p in enumerate(call.prompts))
        calls.append(replace(call, prompts=prompts))
    meta = dict(trace.meta)
    meta["output_lengths"] = {"run": observed.path, "tasks": sorted(wanted), "prompts": len(lengths),
                              "chars_per_token": chars_per_token}
    return Trace(calls=tuple(calls), meta=meta, source=trace.source, prefix_block_tokens=trace.prefix_block_tokens)


def observed_to_json(run: ObservedRun, tokens: TokenOptions | None = None) -> dict[str, Any]:
    """The run as JSON: its figures (token figures by ``tokens``) and its per-call table
    (what ``compare-runs`` reads), in model seconds; ``timeout_s`` is where failed calls
    are censored, ``time_scale`` what the run's clock was multiplied by."""
    cols = ["call_id", "call_index", "arrived_at", "sent_at", "duration_s", "done_at", "status_code",
            "ok", "error", "latency_s", "latency_censored_s", "prompts", "tasks", "composition"]
    records = json.loads(run.calls[cols].to_json(orient="records"))
    return {"format": "simctl-observed/1", "name": run.name, "path": run.path, "timeout_s": run.timeout,
            "time_scale": run.time_scale, "meta": run.meta, "figures": run.figures(tokens), "calls": records}


def read_run(path: str | Path, timeout: float | None = None, arrivals: str | Path | None = None,
             compositions: Compositions | None = None) -> tuple[str, pd.DataFrame]:
    """A per-call table from any run: an observed results folder, an observed-run JSON
    (``simctl observed --json``) or a simulated event log (.parquet/.csv); its calls classed
    by ``compositions``. ``timeout``: as in :func:`read_observed` (``None``: a folder's own,
    else :data:`CLIENT_TIMEOUT`); a results folder is read in model seconds."""
    from simulator.observed_formats import read_result_file

    p = Path(path)
    if p.is_dir():
        run = read_observed(p, arrivals, timeout, compositions)
        return run.name, run.calls
    limit = CLIENT_TIMEOUT if timeout is None else timeout
    other = read_result_file(p, limit, compositions)  # also FILE#K, one benchmark of a file of several
    if other is not None:
        return other.name, other.calls
    if not p.exists():
        raise ObservedError(p, None, None, "no such file or folder")
    if p.suffix.lower() in (".parquet", ".csv"):
        from simulator.events import read_event_log

        return p.stem, simulated_calls(read_event_log(p), limit, compositions)
    data = _read_json(p)
    if not isinstance(data, dict) or data.get("format") != "simctl-observed/1" or not isinstance(data.get("calls"), list):
        raise ObservedError(p, None, "format", "expected a results folder, an event log (.parquet/.csv), "
                            "a simctl-observed/1 JSON from `simctl observed --json` or the results of "
                            "vllm bench serve, GuideLLM or AIPerf")
    calls = pd.DataFrame(data["calls"])
    for col in ("latency_s", "latency_censored_s", "arrived_at"):
        calls[col] = pd.to_numeric(calls[col], errors="coerce")
    calls["call_id"] = calls["call_id"].astype(str)
    sets = calls["tasks"].astype(str).str.split("+").map(frozenset)
    calls["composition"] = sets.map((compositions or Compositions()).classify)
    return str(data.get("name", p.stem)), calls


def compare_calls(reference: pd.DataFrame, other: pd.DataFrame) -> pd.DataFrame:
    """Per composition class and overall: p50/p90/p99/mean of censored call latency in each
    run, and the relative error ``(other − reference) / reference``."""
    rows = []
    labels = composition_labels(pd.concat([reference["composition"], other["composition"]]))
    groups = [("overall", None)] + [(c, c) for c in labels]
    for label, comp in groups:
        a = reference if comp is None else reference[reference["composition"] == comp]
        b = other if comp is None else other[other["composition"] == comp]
        if a.empty and b.empty:
            continue
        xa, xb = a["latency_censored_s"].to_numpy(float), b["latency_censored_s"].to_numpy(float)
        row: dict[str, Any] = {"group": label, "calls": len(a)}
        for stat in ("p50", "p90", "p99", "mean"):
            va = float(np.mean(xa)) if stat == "mean" else float(np.percentile(xa, int(stat[1:]))) if xa.size else np.nan
            vb = float(np.mean(xb)) if stat == "mean" else float(np.percentile(xb, int(stat[1:]))) if xb.size else np.nan
            row[f"{stat}_ref"], row[f"{stat}_other"] = va, vb
            row[f"{stat}_err"] = (vb - va) / va if va else np.nan
        rows.append(row)
    return pd.DataFrame(rows)
