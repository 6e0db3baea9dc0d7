"""Hostile input to every command: no traceback, ever, and nothing the user wrote is touched.

Hypothesis draws argument lists for each command from pools of valid and hostile values
(negative, zero, NaN, infinite, overflowing and malformed numbers; missing, empty, binary,
deeply nested and wrong-kind files; outputs aimed at the command's own inputs). Whatever it
draws, the command must end with exit status 0, 1 or 2, print no traceback, raise nothing
but ``SystemExit``, and leave every input file byte-for-byte as it was. Each failure
hypothesis finds is a minimal command line to reproduce.

Values are bounded where an honest value would mean absurd work (GPU and worker counts stay
small), so every example finishes in well under a second.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fuzzing import runner
from hypothesis import HealthCheck, given, settings, strategies as st

from simulator.cli import app
from simulator.events import write_event_log
from simulator.profile import load_profile
from simulator.replay import replay
from simulator.scenario import build_scenario
from simulator.trace.formats import load_trace, save_trace
from simulator.trace.model import Trace

REPO = Path(__file__).resolve().parents[1]

NUMBERS = ["0", "1", "2", "-1", "0.5", "nan", "inf", "-inf", "1e400", "abc", "",
           "99999999999999999999999", "3.5e-9"]
LISTS = ["0,1", "1", "", ",", "1,,2", "a,b", "-1,2", "nan", "0.5,inf", "1e400"]
NAMES = ["oldest", "pickup", "shared", "split", "direct", "continuous", "round-robin", "bogus", "", "-"]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """Inputs of every kind a user might hand a command, valid and not."""
    d = tmp_path_factory.mktemp("fuzz")
    trace = d / "trace.json"
    # A dozen calls of the bundled trace: every task, and replays that take milliseconds.
    full = load_trace(REPO / "traces" / "batch_arrivals.json")
    save_trace(Trace(calls=full.calls[:12], meta=full.meta, source=full.source), trace)
    result = replay(load_trace(trace), build_scenario(path=REPO / "scenarios" / "design-notes.toml"),
                    load_profile("seed-calibrated"), seed=0)
    events = d / "events.parquet"
    write_event_log(result.log, events)
    events_csv = d / "events.csv"
    write_event_log(result.log, events_csv)
    sweep = d / "sweep.parquet"
    out = runner.invoke(app, ["sweep", str(trace), "--flush", "0,1", "-j", "1", "-o", str(sweep)])
    assert out.exit_code == 0, out.output
    made = {
        "trace": trace,
        "events": events,
        "events_csv": events_csv,
        "sweep": sweep,
        "profile": REPO / "profiles" / "seed-calibrated.json",
        "scenario": REPO / "scenarios" / "design-notes.toml",
        "missing": d / "no-such-file.json",
        "folder": d,
    }
    for name, content in {
        "empty.json": b"",
        "binary.json": bytes(range(256)) * 4,
        "list.json": b"[1, 2, 3]",
        "nested.json": b"[" * 20000 + b"]" * 20000,
        "bad.toml": b"[run\ngpus = ",
        "bad.csv": b"a,b\n1,2,3\n\xff\xfe\n",
        "nan.json": json.dumps({"format": "simctl-trace/1",
                                "calls": [{"t": "NaN", "prompts": ["mmlu"]}]}).encode(),
    }.items():
        (d / name).write_bytes(content)
        made[name.replace(".", "_")] = d / name
    return made


def _digest(paths) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in paths if p.is_file()}


def _check(args: list[str], files: dict[str, Path]) -> None:
    before = _digest(files.values())
    result = runner.invoke(app, args)
    shown = f"simctl {' '.join(args)}\n{result.output}"
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        # Re-raised as itself, so hypothesis tells distinct crashes apart by where they arose.
        result.exception.add_note(shown)
        raise result.exception
    assert result.exit_code in (0, 1, 2), shown
    assert "Traceback" not in result.output, shown
    assert _digest(files.values()) == before, f"{shown}\nmodified an input file"


def _file(files: dict[str, Path], *kinds: str) -> st.SearchStrategy[str]:
    return st.sampled_from(kinds).map(lambda k: str(files[k]))


INPUT_KINDS = ("trace", "events", "sweep", "profile", "scenario", "missing", "folder", "empty_json",
               "binary_json", "list_json", "nested_json", "bad_toml", "bad_csv", "nan_json")


def _options(draw, pool: dict[str, st.SearchStrategy[str]]) -> list[str]:
    chosen = draw(st.lists(st.sampled_from(sorted(pool)), max_size=4, unique=True))
    args: list[str] = []
    for flag in chosen:
        value = draw(pool[flag])
        args += [flag] if value is None else [flag, value]  # None: a switch such as --force
    return args


FUZZ = settings(max_examples=120, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@FUZZ
@given(data=st.data())
def test_replay_never_crashes(files, tmp_path, data):
    num = st.sampled_from(NUMBERS)
    out_target = st.sampled_from([str(tmp_path / "o.json"), str(files["profile"]), str(files["trace"]), "-"])
    pool = {
        "--flush": num, "--max-batch": num, "--workers": st.sampled_from(["1", "2", "0", "-1", "x"]),
        "--gpus": st.sampled_from(["1", "2", "0", "-3", "x"]), "--deadline": num, "--rate-scale": num,
        "--seed": st.sampled_from(["0", "1", "-1", "2**70", "99999999999999999999999"]),
        "--set": st.sampled_from(["tasks.infobench.flush=0.1", "run.gpus=3", "tasks.graph.topology=split",
                                  "run.gpus=0", "x=1", "tasks.mmlu.max_batch=[1]", "defaults.flush=nan", "=",
                                  "run.deadline=1e400", "tasks.infobench.flush=1e999"]),
        "--task-map": st.sampled_from(["graph=mmlu", "x", "=", "graph=", "mmlu=nope"]),
        "--policy": st.sampled_from(NAMES), "--topology": st.sampled_from(NAMES),
        "--dispatch": st.sampled_from(NAMES), "--max-tokens": num, "--acceptance": num, "--lookahead": num,
        "--queue-timeout": num, "--max-queue": num,
        "--client": st.sampled_from(["open", "closed:2", "closed:0", "closed:x", "closed:2:-1", "bogus"]),
        "--config": _file(files, "scenario", "missing", "bad_toml", "profile", "binary_json", "folder"),
        "--profile": st.one_of(st.sampled_from(["seed-calibrated", "nope", ""]),
                               _file(files, "profile", "trace", "empty_json", "binary_json", "nested_json")),
        "--json": out_target, "--events": st.sampled_from([str(tmp_path / "e.parquet"), str(tmp_path / "e.txt"),
                                                            str(files["events"])]),
        "--force": st.none(),
    }
    # Mostly the valid trace, so that the options, not the file, are what is explored.
    trace = data.draw(st.one_of(_file(files, "trace"), _file(files, "trace"), _file(files, *INPUT_KINDS)))
    _check(["replay", trace] + _options(data.draw, pool), files)


@FUZZ
@given(data=st.data())
def test_validate_and_synth_never_crash(files, tmp_path, data):
    if data.draw(st.booleans()):
        args = ["validate", data.draw(_file(files, *INPUT_KINDS))] + (["--json"] if data.draw(st.booleans()) else [])
    else:
        num = st.sampled_from(NUMBERS)
        pool = {"--duration": num, "--mean": num, "--cv": num, "--seed": st.sampled_from(["0", "-1", "x"]),
                "--arrival": st.sampled_from(["poisson", "gamma", "weibull", "nope"]),
                "--prompts-per-call": st.sampled_from(["1:1", "1:0.5,2:0.5", "0:1", "x", "1-0:1", "1:-1"]),
                "--task-mix": st.sampled_from(["mmlu:1", "mmlu:0", "a:nan", ":", ""]),
                "--prompt-tokens": st.sampled_from(["*:100", "mmlu:0", "mmlu:1e400", "x"]),
                "--format": st.sampled_from(["native", "client", "x"])}
        out = data.draw(st.sampled_from([str(tmp_path / "s.json"), str(files["trace"])]))
        args = ["synth", "-o", out, "--duration", "60"] + _options(data.draw, pool)
    _check(args, files)


@FUZZ
@given(data=st.data())
def test_sweep_and_compare_never_crash(files, tmp_path, data):
    lists = st.sampled_from(LISTS)
    if data.draw(st.booleans()):
        pool = {"--flush": lists, "--max-batch": lists, "--gpus": st.sampled_from(["1", "2", "0", "1,x"]),
                "--topology": st.sampled_from(["shared", "split,direct", "bogus", ""]),
                "--rate-scale": lists, "--seeds": st.sampled_from(["1", "0", "-1", "2"]),
                "--deadline": st.sampled_from(NUMBERS), "--metric": st.sampled_from(
                    ["overall.latency.p95", "infobench.latency.p95", "tasks.infobench.latency.p95", "nope"]),
                "--config": _file(files, "scenario", "bad_toml", "missing"),
                "--profile": st.sampled_from(["seed-calibrated", "nope"])}
        out = data.draw(st.sampled_from([str(tmp_path / "r.parquet"), str(tmp_path / "r.csv"),
                                         str(files["trace"]), str(files["sweep"])]))
        args = ["sweep", data.draw(_file(files, "trace", "missing", "binary_json", "sweep")),
                "-o", out, "-j", "1", "--flush", "0"] + _options(data.draw, pool)
    else:
        pool = {"--metric": st.sampled_from(["overall.latency.p95", "infobench.latency.p95",
                                             "tasks.infobench.latency.p95", "x", ""]),
                "--by": st.sampled_from(["flush", "flush,topology", "nope", "", "a,b,c"]),
                "--where": st.sampled_from(["flush=0", "flush=x", "x=1", "="]),
                "--plot": st.sampled_from([str(tmp_path / "c.png"), str(files["trace"])])}
        args = ["compare", data.draw(_file(files, "sweep", "events", "trace", "missing", "empty_json"))]
        args += _options(data.draw, pool)
    _check(args, files)


@FUZZ
@given(data=st.data())
def test_plan_never_crashes(files, tmp_path, data):
    slo = st.sampled_from(["infobench.latency.p95<=400", "tasks.infobench.latency.p95<=400",
                           "overall.latency.p95<=nan", "infobench.latency.p95<=inf", "infobench.latency.p95<=-1",
                           "x<=1", "infobench.latency<=3", "infobench.timed_out<=0", ""])
    pool = {"--max-gpus": st.sampled_from(["1", "2", "0", "-1", "x"]),
            "--deadline": st.sampled_from(NUMBERS), "--seeds": st.sampled_from(["1", "0", "-2"]),
            "--flush": st.sampled_from(["0.5", "0,1", "x", ""]), "--max-batch": st.sampled_from(["4", "0", "x"]),
            "--topology": st.sampled_from(["shared", "continuous", "bogus"]),
            "--task": st.sampled_from(["infobench", "graph", "nope"]),
            "--json": st.sampled_from([str(tmp_path / "p.json"), str(files["scenario"]), "-"])}
    args = ["plan", data.draw(_file(files, "trace", "missing", "sweep")), "--slo", data.draw(slo),
            "-j", "1", "--flush", "0.5", "--max-batch", "8", "--topology", "shared", "--max-gpus", "2"]
    _check(args + _options(data.draw, pool), files)


@FUZZ
@given(data=st.data())
def test_plot_and_runs_never_crash(files, tmp_path, data):
    verb = data.draw(st.sampled_from(["cdf", "timeline", "batches", "decomposition", "heatmap", "compare-runs",
                                      "observed", "import"]))
    inp = data.draw(_file(files, "events", "events_csv", "sweep", "trace", "missing", "empty_json",
                          "binary_json", "folder", "bad_csv"))
    out = data.draw(st.sampled_from([str(tmp_path / "f.png"), str(files["events"])]))
    if verb in ("cdf", "timeline", "batches", "decomposition", "heatmap"):
        args = ["plot", verb, inp, "-o", out]
    elif verb == "compare-runs":
        args = ["compare-runs", inp, data.draw(_file(files, "events", "sweep", "trace", "missing"))]
    elif verb == "observed":
        args = ["observed", inp]
    else:
        fmt = data.draw(st.sampled_from(["azure", "burstgpt", "mooncake", "servegen", "auto", "bogus"]))
        args = ["import", fmt, inp, "-o", str(tmp_path / "i.json"), "--force"]
    _check(args, files)


def test_fuzz_inputs_are_what_they_claim(files):
    """The fixture's valid inputs are valid, so the fuzz explores past the first check."""
    assert runner.invoke(app, ["validate", str(files["trace"])]).exit_code == 0
    frame = pd.read_parquet(files["sweep"])
    assert len(frame) == 2 and np.isfinite(frame["overall.latency.p95"]).all()
