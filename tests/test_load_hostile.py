"""``simctl load`` against hostile servers: every answer checked field by field, a failed
call recorded with its reason, and a run folder that reads whatever the server does or
however the run ends (``tests/hostile_load.py`` generates the servers).

No test depends on timing: the answers are immediate or never come (a stall fails at the
timeout, whatever the machine's speed), and the run killed part-way is killed at a moment
the test waits for (a call finished, another held by the server)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

pytest.importorskip("httpx")

import hostile_load  # noqa: E402
from hostile_load import Behaviour, HostileServer  # noqa: E402
from live_server import FakeServer  # noqa: E402

from simulator.cli import app  # noqa: E402
from simulator.live import LoadOptions, run_load  # noqa: E402
from simulator.observed import read_observed  # noqa: E402
from simulator.trace.formats import save_trace  # noqa: E402
from simulator.trace.model import Call, Prompt, Trace  # noqa: E402

runner = CliRunner()


def test_hostile_servers_are_failed_calls_never_a_broken_run():
    seen: list[str] = []
    tried, handled = hostile_load.CLASSES["hostile servers for load"](
        24, lambda behaviour, found: seen.append(f"{behaviour}: {found}"))
    assert tried == 24
    assert tried == handled, "\n".join(seen)


def _sse(*events: object, done: bool = True) -> bytes:
    body = b"".join(b"data: " + (e if isinstance(e, bytes) else json.dumps(e).encode()) + b"\n\n" for e in events)
    return body + (b"data: [DONE]\n\n" if done else b"")


GOOD_EVENT = {"choices": [{"index": 0, "text": "tok ", "finish_reason": "length"}]}

# (api, the answer's body, the reason the call fails with)
ANSWERS = {
    "index a list": ("batch", {"choices": [{"index": [1], "text": "a"}]}, "answer: choices[0].index is not an integer"),
    "NaN index, text not a string": ("batch", b'{"choices": [{"index": NaN, "text": 5}]}',
                                     "answer: choices[0].index is not an integer (got NaN)"),
    "text not a string": ("batch", {"choices": [{"index": 0, "text": 5}]}, "answer: choices[0].text is not a string"),
    "index past the prompts": ("batch", {"choices": [{"index": 3, "text": "a"}]},
                               "answer: choices[0].index is 3; the call has one prompt"),
    "two choices for one prompt": ("batch", {"choices": [{"text": "a"}, {"text": "b"}]}, "answer: 2 choices; the call has one prompt"),
    "fractional prompt tokens": ("batch", {"choices": [{"text": "a"}], "usage": {"prompt_tokens": 2.5}},
                                 "answer: usage.prompt_tokens is not an integer (got 2.5)"),
    "huge completion tokens": ("batch", {"choices": [{"text": "a"}], "usage": {"completion_tokens": 2**70}},
                               "answer: usage.completion_tokens is 1180591620717411303424, not a count"),
    "their server's error": ("batch", {"error": "Already borrowed", "traceback": "..."}, "server error: Already borrowed"),
    "streamed choices a number": ("completions", _sse({"choices": 5}), "answer: event 1: choices is not a list"),
    "streamed prompt tokens 'many'": ("completions", _sse(GOOD_EVENT, {"choices": [], "usage": {"prompt_tokens": "many"}}),
                                      "answer: event 2: usage.prompt_tokens is not an integer"),
    "streamed fractional prompt tokens": ("chat", _sse({"choices": [], "usage": {"prompt_tokens": 1.5}}),
                                          "answer: event 1: usage.prompt_tokens is not an integer"),
    "streamed negative tokens": ("completions", _sse(GOOD_EVENT, {"choices": [], "usage": {"completion_tokens": -1}}),
                                 "answer: event 2: usage.completion_tokens is -1, not a count"),
    "stream without [DONE]": ("completions", _sse(GOOD_EVENT, done=False), "ended before data: [DONE]"),
    "stream not framed as events": ("completions", b'{"choices": []}\n', "not server-sent events"),
    "event not JSON": ("completions", _sse(b"{oops"), "answer: event 1 is not JSON"),
}


@pytest.mark.parametrize("case", list(ANSWERS))
def test_invalid_answers_fail_their_call_with_the_field_named(tmp_path, case):
    """Each of these once crashed the run or counted as a success: now the call fails, its
    reason names the field, and the rest of the run (here a second, valid call) is kept."""
    api, body, reason = ANSWERS[case]
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    trace = Trace((Call("0", 0.0, (Prompt("mmlu", 10, 4, "bad"),)), Call("1", 0.0, (Prompt("mmlu", 10, 4, "good"),))))
    # the bad prompt gets the body above, the good one a valid answer
    with HostileServer(lambda texts: Behaviour(api=api, raw=raw if texts == ["bad"] else None)) as server:
        result = run_load(trace, LoadOptions(url=server.url, api=api, model="m"), tmp_path / "run")
    recs = {r["batch_id"]: r for r in result.summary["results"]}
    assert reason in recs[0]["error"], recs[0]["error"]
    assert recs[1]["error"] is None and result.summary["successful_batches"] == 1
    requests = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    assert requests["status"].tolist() == ["error", "ok"] and reason in requests["error"][0]
    assert requests["prompt_tokens"].dtype == "Int64"
    assert list(read_observed(tmp_path / "run").calls["ok"]) == [False, True]


def test_cli_names_the_reasons_calls_failed(tmp_path):
    trace_file = tmp_path / "trace.json"
    save_trace(Trace((Call("0", 0.0, (Prompt("mmlu", 10, 4, "a"), Prompt("mmlu", 10, 4, "b"))),)), trace_file)
    with HostileServer() as server:
        server.behaviour = Behaviour(api="batch", fault=("index", 0, [1]))
        got = runner.invoke(app, ["load", server.url, str(trace_file), "-o", str(tmp_path / "run"), "-q"])
    assert got.exit_code == 0, got.output
    assert "1 calls, 0 succeeded, 1 failed" in got.stdout
    assert "failed 1 × answer: choices[0].index is not an integer (got [1])" in got.stdout


def _snapshot(tmp_path: Path, trace: Trace, ready) -> tuple[Path, Path]:
    """Run ``trace`` against the fake server, saving after every call; copy the folder once
    ``ready(summary, server)`` (what a kill then would leave), then stop the run. (The run
    folder, the copy.)"""
    folder, snapshot = tmp_path / "run", tmp_path / "snapshot"
    stop = threading.Event()
    with FakeServer() as server:
        worker = threading.Thread(target=run_load, args=(trace, LoadOptions(url=server.url, timeout=60), folder),
                                  kwargs={"stop": stop, "checkpoint_s": 0.0})
        worker.start()
        try:
            deadline = time.monotonic() + 60
            while True:
                path = folder / "simulation_summary.json"
                if path.exists() and ready(json.loads(path.read_text()), server):
                    break
                assert time.monotonic() < deadline
                time.sleep(0.02)
            shutil.copytree(folder, snapshot)
        finally:
            stop.set()
            worker.join(60)
    return folder, snapshot


def test_the_folder_reads_while_the_run_goes_on(tmp_path):
    """Saved as calls finish: a copy of the folder taken while a call is still in flight is a
    run simctl observed reads, the finished call in it."""
    trace = Trace((Call("0", 0.0, (Prompt("mmlu", 10, 4, "q"),)), Call("1", 0.0, (Prompt("mmlu", 10, 4, "[stall]"),))))
    folder, snapshot = _snapshot(tmp_path, trace, lambda summary, server: summary["results"] and len(server.received) >= 2)
    summary = json.loads((snapshot / "simulation_summary.json").read_text())
    assert summary["in_progress"] and summary["abandoned"] == [1] and summary["total_batches"] == 2
    assert list(read_observed(snapshot).calls["ok"]) == [True, False]
    requests = pd.read_parquet(snapshot / "requests.parquet")
    assert requests["status"].tolist() == ["ok", "interrupted"]
    shown = runner.invoke(app, ["observed", str(snapshot)])
    assert shown.exit_code == 0, shown.output
    final = json.loads((folder / "simulation_summary.json").read_text())
    assert final["interrupted"] and not final["in_progress"]


def test_the_folder_reads_before_any_call_finished(tmp_path):
    trace = Trace((Call("0", 0.0, (Prompt("mmlu", 10, 4, "[stall]"),)),))
    _, snapshot = _snapshot(tmp_path, trace, lambda summary, server: len(server.received) >= 1)
    summary = json.loads((snapshot / "simulation_summary.json").read_text())
    assert summary["results"] == [] and summary["in_progress"]
    shown = runner.invoke(app, ["observed", str(snapshot)])
    assert shown.exit_code == 0, shown.output
    assert list(read_observed(snapshot).calls["ok"]) == [False]


def test_a_run_killed_part_way_leaves_a_folder_that_reads(tmp_path):
    trace_file = tmp_path / "trace.json"
    save_trace(Trace((Call("0", 0.0, (Prompt("mmlu", 10, 4, "q"),)), Call("1", 0.0, (Prompt("mmlu", 10, 4, "[stall]"),)))),
               trace_file)
    folder = tmp_path / "run"
    with FakeServer() as server:
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
        proc = subprocess.Popen([sys.executable, "-c", "from simulator.cli import main; main()", "load", server.url,
                                 str(trace_file), "-o", str(folder), "--timeout", "60", "-q"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        try:
            deadline = time.monotonic() + 60
            while not (folder / "batch_0000.json").exists() or len(server.received) < 2:
                assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
                time.sleep(0.02)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=60)
    shown = runner.invoke(app, ["observed", str(folder)])
    assert shown.exit_code == 0, shown.output
    assert list(read_observed(folder).calls["ok"]) == [True, False]
    assert not list(folder.glob(".*.part"))
