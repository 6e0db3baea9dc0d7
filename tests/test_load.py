"""``simctl load`` and its library: a trace replayed against a fake server on 127.0.0.1.

No test depends on how fast the machine is: times are checked as bounds that hold however
slow it runs (a call is never sent before it is due; a closed loop's call never before its
predecessor ended), concurrency by the fake server's ``[hold=N]`` (it answers once N requests
are in), the gaps between streamed tokens on a clock the test sets, traces are tiny and
compressed with a large time scale, and every request is bounded by a timeout: short enough
that a stalled request costs a few seconds of waiting (no CPU), long enough that no answered
request meets it however busy the machine.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

pytest.importorskip("httpx")

from helpers import assert_one_line_error  # noqa: E402
from live_server import FakeServer  # noqa: E402

from simulator.cli import app  # noqa: E402
from simulator.live import LoadOptions, run_load  # noqa: E402
from simulator.live.runfolder import REQUEST_COLUMNS  # noqa: E402
from simulator.observed import read_observed, read_run  # noqa: E402
from simulator.trace.formats import save_trace  # noqa: E402
from simulator.trace.model import Call, Prompt, Trace  # noqa: E402

DATA = Path(__file__).parent / "data" / "loadgen"
#: the client timeout of the runs with a stalling request: the stall is what meets it, while
#: the fake server's other answers come within milliseconds (a margin of seconds for load)
TIMEOUT = 3.0
runner = CliRunner()


def trace_of(*calls: tuple[float, list[str | tuple[str, str]]]) -> Trace:
    """Calls of (t, prompts); a prompt is a task, or (task, text) to steer the fake server."""
    out = []
    for i, (t, prompts) in enumerate(calls):
        out.append(Call(str(i), t, tuple(Prompt(p, 10, 20) if isinstance(p, str) else Prompt(p[0], 10, 20, p[1])
                                         for p in prompts)))
    return Trace(tuple(out))


def records(folder: Path) -> dict[int, dict]:
    return {json.loads(p.read_text())["batch_id"]: json.loads(p.read_text()) for p in folder.glob("batch_*.json")
            if p.name != "batch_arrivals.json"}


def test_batch_run_folder_reads_as_an_observed_run(tmp_path):
    trace = trace_of((0.0, ["mmlu", "graph"]), (1.0, ["infobench"]), (2.0, ["mmlu"]))
    with FakeServer(delay=0.01) as server:
        result = run_load(trace, LoadOptions(url=server.url, time_scale=50), tmp_path / "run")
        bodies = [b for _, _, b in server.received]
    folder = tmp_path / "run"
    assert sorted(p.name for p in folder.iterdir()) == [
        "batch_0000.json", "batch_0001.json", "batch_0002.json", "batch_arrivals.json", "requests.parquet",
        "simulation_summary.json"]
    # exactly the users' client's body: the texts (invented ones classify back to their task)
    assert all(set(b) == {"prompt", "max_tokens"} and b["max_tokens"] == 20 for b in bodies)
    assert any("multiple choice question" in t.lower() for b in bodies for t in b["prompt"])
    rec = records(folder)[0]
    assert set(rec) == {"batch_id", "batch_size", "scheduled_arrival_time", "actual_send_time", "request_duration",
                        "completion_time", "status_code", "prompt_idxs", "response", "error"}
    assert rec["status_code"] == 200 and rec["prompt_idxs"] == [0, 1] and rec["error"] is None
    summary = json.loads((folder / "simulation_summary.json").read_text())
    assert summary["total_batches"] == 3 and summary["successful_batches"] == 3 and not summary["interrupted"]
    assert summary == json.loads(json.dumps(result.summary, default=str))
    run = read_observed(folder)
    assert run.calls["ok"].all() and list(run.calls["tasks"]) == ["graph+mmlu", "infobench", "mmlu"]
    assert len(run.prompts) == 4  # every answer read back
    requests = pd.read_parquet(folder / "requests.parquet")
    assert tuple(requests.columns) == REQUEST_COLUMNS and len(requests) == 4
    assert (requests["status"] == "ok").all() and (requests["http_status"] == 200).all()
    # compare-runs reads it too
    name, calls = read_run(folder)
    assert len(calls) == 3


def test_time_and_rate_scale_set_when_calls_are_due(tmp_path):
    trace = trace_of((0.0, ["mmlu"]), (4.0, ["mmlu"]), (8.0, ["mmlu"]))
    start = time.monotonic()
    with FakeServer() as server:
        run_load(trace, LoadOptions(url=server.url, time_scale=20, rate_scale=2), tmp_path / "run")
    elapsed = time.monotonic() - start
    recs = records(tmp_path / "run")
    assert [recs[i]["scheduled_arrival_time"] for i in range(3)] == pytest.approx([0.0, 0.1, 0.2])
    assert all(recs[i]["actual_send_time"] >= recs[i]["scheduled_arrival_time"] for i in range(3))
    assert elapsed >= 0.2
    run = read_observed(tmp_path / "run")  # the arrival file holds the instants as run,
    # read back in model seconds (the run's clock × time_scale): the rate-scaled trace's instants
    assert run.time_scale == 20
    assert list(run.calls["arrived_at"]) == pytest.approx([0.0, 2.0, 4.0])


def test_open_loop_never_waits_and_closed_loop_keeps_n_outstanding(tmp_path):
    # open loop: the server answers only once all four calls have arrived, so all four are
    # in flight at once however slow the machine (a client that waited would stall 30 s)
    with FakeServer() as server:
        run_load(trace_of(*((0.0, [("mmlu", "[hold=4] q")]) for _ in range(4))), LoadOptions(url=server.url),
                 tmp_path / "open")
        assert server.max_in_flight == 4
    trace = trace_of(*((0.0, [("mmlu", "[delay=0.3] q")]) for _ in range(4)))
    with FakeServer() as server:
        run_load(trace, LoadOptions(url=server.url, client="closed:1"), tmp_path / "closed")
        assert server.max_in_flight == 1
    recs = records(tmp_path / "closed")
    for i in range(3):
        assert recs[i + 1]["actual_send_time"] >= recs[i]["completion_time"]
        assert recs[i + 1]["scheduled_arrival_time"] >= recs[i]["completion_time"]
    assert read_observed(tmp_path / "closed").calls["ok"].all()


def test_failures_are_recorded_not_hung(tmp_path):
    trace = trace_of((0.0, [("mmlu", "[500]")]), (0.0, [("mmlu", "[error]")]), (0.0, [("mmlu", "[drop]")]),
                     (0.0, [("mmlu", "[stall]")]), (0.0, ["graph"]))
    start = time.monotonic()
    with FakeServer() as server:
        result = run_load(trace, LoadOptions(url=server.url, timeout=TIMEOUT), tmp_path / "run")
    assert time.monotonic() - start < 20
    recs = records(tmp_path / "run")
    assert recs[0]["status_code"] == 500 and "HTTP 500" in recs[0]["error"]
    assert recs[1]["status_code"] == 200 and recs[1]["response"]["error"] == "Already borrowed"
    assert recs[2]["status_code"] is None and "connection dropped" in recs[2]["error"]
    assert recs[3]["status_code"] is None and "timeout" in recs[3]["error"] and f"{TIMEOUT:g} s" in recs[3]["error"]
    assert result.summary["failed_batches"] == 4 and result.summary["successful_batches"] == 1
    run = read_observed(tmp_path / "run")
    assert list(run.calls["ok"]) == [False, False, False, False, True]
    assert "Already borrowed" in run.calls["error"][1]
    statuses = pd.read_parquet(tmp_path / "run" / "requests.parquet")["status"].tolist()
    assert statuses == ["error", "error", "error", "timeout", "ok"]


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_streamed_openai_apis_measure_ttft_and_itl(tmp_path, api):
    trace = trace_of((0.0, ["mmlu", "infobench"]), (0.5, [("mmlu", "[500]")]))
    with FakeServer(tokens=3, itl=0.02) as server:
        run_load(trace, LoadOptions(url=server.url, api=api, model="m", time_scale=10), tmp_path / "run")
        paths = {p for _, p, _ in server.received}
        bodies = [b for _, _, b in server.received]
    assert paths == {f"/v1/{'chat/' if api == 'chat' else ''}completions"}
    assert all(b["stream"] is True and b["model"] == "m" for b in bodies)
    requests = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    ok = requests[requests["status"] == "ok"]
    assert len(ok) == 2 and (ok["output_tokens"] == 3).all()
    assert (ok["first_token_at"] > ok["sent_at"]).all() and (ok["done_at"] >= ok["first_token_at"]).all()
    # the gaps between a prompt's token events (their sizes are the client's timing: see
    # test_itls_are_the_gaps_between_token_events_on_the_clock for them on a given clock)
    assert all(len(x) == 2 and min(x) >= 0 for x in ok["itls_s"])
    assert all(d >= f + sum(x) - 1e-9 for f, d, x in zip(ok["first_token_at"], ok["done_at"], ok["itls_s"], strict=True))
    run = read_observed(tmp_path / "run")
    assert list(run.calls["ok"]) == [True, False] and len(run.prompts) == 2
    assert "HTTP 500" in run.calls["error"][1]


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_itls_are_the_gaps_between_token_events_on_the_clock(api):
    """A streamed prompt's time to first token and gaps between token events, on the clock it
    is given (here one the stream sets as each event comes: no real timing)."""
    import httpx

    from simulator.live.apis import send_stream

    now = [0.0]

    def event(i: int) -> bytes:
        choice = {"index": 0, "delta": {"content": f"tok{i} "}} if api == "chat" else {"index": 0, "text": f"tok{i} "}
        return f"data: {json.dumps({'choices': [choice]})}\n\n".encode()

    async def stream():
        for i, at in enumerate((0.5, 0.52, 0.57)):
            now[0] = at
            yield event(i)
        now[0] = 0.6
        yield b'data: {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}}\n\ndata: [DONE]\n\n'

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=stream())

    async def main():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await send_stream(client, "http://fake/v1/completions", api, "m", "q", 3, 5.0, lambda: now[0])
    out = asyncio.run(main())
    assert out.status == "ok" and out.text == "tok0 tok1 tok2 " and out.output_tokens == 3
    assert (out.sent_at, out.first_token_at, out.done_at) == (0.0, 0.5, 0.6)
    assert out.itls == pytest.approx([0.02, 0.05])


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_streamed_calls_that_drop_or_stall_are_failed_calls(tmp_path, api):
    """A streamed prompt whose connection drops or which stalls past the timeout fails its
    call (another prompt of the call may succeed); the run goes on and is recorded."""
    trace = trace_of((0.0, ["mmlu", ("mmlu", "[drop]")]), (0.0, [("mmlu", "[stall]")]), (0.0, ["graph"]))
    start = time.monotonic()
    with FakeServer(tokens=2, itl=0.01) as server:
        result = run_load(trace, LoadOptions(url=server.url, api=api, model="m", timeout=TIMEOUT),
                          tmp_path / "run")
    assert time.monotonic() - start < 20
    assert result.summary["successful_batches"] == 1 and result.summary["failed_batches"] == 2
    recs = records(tmp_path / "run")
    assert recs[0]["response"] is None and "connection dropped" in recs[0]["error"]
    assert recs[1]["response"] is None and "timeout" in recs[1]["error"]
    requests = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    assert requests["status"].tolist() == ["ok", "error", "timeout", "ok"]
    assert list(read_observed(tmp_path / "run").calls["ok"]) == [False, False, True]


def test_cli_writes_the_run_and_observed_reads_it(tmp_path):
    trace_file = tmp_path / "trace.json"
    save_trace(trace_of((0.0, ["mmlu"]), (1.0, ["infobench"])), trace_file)
    with FakeServer() as server:
        result = runner.invoke(app, ["load", server.url, str(trace_file), "-o", str(tmp_path / "run"),
                                     "--time-scale", "100", "--quiet"])
    assert result.exit_code == 0, result.output
    assert "2 calls, 2 succeeded, 0 failed" in result.stdout
    shown = runner.invoke(app, ["observed", str(tmp_path / "run")])
    assert shown.exit_code == 0, shown.output
    assert "overall" in shown.stdout


def test_cli_benchmark_flags_are_the_trace_and_settings_they_stand_for(tmp_path):
    """--num-requests sends the first N calls; --max-concurrency N is --client closed:N;
    --request-rate R scales the rate to R calls/s (here 3 calls over 2 s: 1.5 calls/s)."""
    trace_file = tmp_path / "trace.json"
    save_trace(trace_of((0.5, ["mmlu"]), (1.0, ["infobench"]), (2.0, ["mmlu"]), (3.0, ["mmlu"])), trace_file)
    with FakeServer() as server:
        result = runner.invoke(app, ["load", server.url, str(trace_file), "-o", str(tmp_path / "run"), "-q",
                                     "--time-scale", "100", "--num-requests", "3", "--max-concurrency", "2",
                                     "--request-rate", "3"])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "run" / "simulation_summary.json").read_text())
    assert summary["total_batches"] == 3
    settings = summary["load"]
    assert settings["client"] == "closed:2" and settings["rate_scale"] == pytest.approx(2.0)


def test_cli_benchmark_flag_conflicts(tmp_path):
    trace_file = tmp_path / "trace.json"
    save_trace(trace_of((0.0, ["mmlu"]), (1.0, ["mmlu"])), trace_file)
    out = str(tmp_path / "run")
    base = ["load", "http://127.0.0.1:1", str(trace_file), "-o", out]
    assert_one_line_error(runner.invoke(app, [*base, "--request-rate", "2", "--rate-scale", "2"]),
                          "--request-rate", "--rate-scale")
    assert_one_line_error(runner.invoke(app, [*base, "--request-rate", "0"]), "--request-rate", "> 0")
    assert_one_line_error(runner.invoke(app, [*base, "--max-concurrency", "2", "--client", "open"]),
                          "--max-concurrency", "--client open")
    assert_one_line_error(runner.invoke(app, [*base, "--num-requests", "3"]), "--num-requests", "2 calls")
    assert not Path(out).exists()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cli_errors(tmp_path, monkeypatch):
    trace_file = tmp_path / "trace.json"
    save_trace(trace_of((0.0, ["mmlu"])), trace_file)
    out = str(tmp_path / "run")
    assert_one_line_error(runner.invoke(app, ["load", "ftp://x", str(trace_file), "-o", out]), "http")
    assert_one_line_error(runner.invoke(app, ["load", "http://", str(trace_file), "-o", out]), "http://")
    port = _closed_port()
    assert_one_line_error(runner.invoke(app, ["load", f"http://127.0.0.1:{port}", str(trace_file), "-o", out]),
                          f"127.0.0.1:{port}", "cannot connect")
    assert not Path(out).exists()  # nothing written for a server that is not there
    assert_one_line_error(runner.invoke(app, ["load", "http://127.0.0.1:1", str(trace_file), "-o", out,
                                              "--api", "chat"]), "--model")
    assert_one_line_error(runner.invoke(app, ["load", "http://127.0.0.1:1", str(trace_file), "-o", out,
                                              "--client", "closed:0"]), "--client")
    assert_one_line_error(runner.invoke(app, ["load", "http://127.0.0.1:1", str(trace_file), "-o", out,
                                              "--time-scale", "0"]), "--time-scale")
    assert_one_line_error(runner.invoke(app, ["load", "http://127.0.0.1:1", str(trace_file), "-o",
                                              str(tmp_path)]), "folder of the trace")
    assert_one_line_error(runner.invoke(app, ["load", "http://127.0.0.1:1", str(trace_file), "-o",
                                              str(tmp_path), "--force"]), "folder of the trace")
    (tmp_path / "old").mkdir()
    with FakeServer() as server:
        assert_one_line_error(runner.invoke(app, ["load", server.url, str(trace_file), "-o", str(tmp_path / "old")]),
                              "exists", "--force")
        done = runner.invoke(app, ["load", server.url, str(trace_file), "-o", str(tmp_path / "old"), "--force", "-q"])
        assert done.exit_code == 0, done.output
    assert_one_line_error(runner.invoke(app, ["load", "http://127.0.0.1:1", str(tmp_path / "nope.json"), "-o", out]),
                          "nope.json")
    monkeypatch.setitem(sys.modules, "httpx", None)
    assert_one_line_error(runner.invoke(app, ["load", "http://127.0.0.1:1", str(trace_file), "-o", out]),
                          "simctl-llm[live]")


def test_ctrl_c_keeps_the_finished_calls(tmp_path):
    trace_file = tmp_path / "trace.json"
    save_trace(trace_of((0.0, ["mmlu"]), (0.0, [("mmlu", "[stall]")]), (500.0, ["mmlu"])), trace_file)
    folder = tmp_path / "run"
    with FakeServer() as server:
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
        proc = subprocess.Popen([sys.executable, "-c", "from simulator.cli import main; main()", "load", server.url, str(trace_file),
                                 "-o", str(folder), "--timeout", "60", "--quiet"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            deadline = time.monotonic() + 60
            while not (folder / "batch_0000.json").exists() or len(server.received) < 2:
                assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
                time.sleep(0.05)
            proc.send_signal(signal.SIGINT)
            stdout, stderr = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 130, (stdout, stderr)
    assert "kept 1 finished call" in stderr and "1 in flight abandoned, 1 not sent" in stderr
    assert "Traceback" not in stderr
    summary = json.loads((folder / "simulation_summary.json").read_text())
    assert summary["interrupted"] and summary["abandoned"] == [1] and summary["not_sent"] == [2]
    run = read_observed(folder)
    assert list(run.calls["call_id"]) == ["0"] and run.calls["ok"].all()
    requests = pd.read_parquet(folder / "requests.parquet")
    assert requests["status"].tolist() == ["ok", "interrupted"]


# -- other load generators' results ------------------------------------------------------


def test_vllm_bench_result_reads_as_a_run():
    run = read_observed(DATA / "vllm_bench.json")
    assert run.meta["format"] == "vllm-bench" and len(run.calls) == 4
    assert list(run.calls["ok"]) == [True, True, True, False]
    assert list(run.calls["arrived_at"]) == pytest.approx([0.0, 0.5, 1.0, 1.5])
    assert run.calls["latency_s"][0] == pytest.approx(0.14)  # ttft + sum of itls
    assert run.calls["error"][3] == "Bad Request"
    assert run.trace is not None and [c.prompts[0].prompt_tokens for c in run.trace.calls] == [200, 200, 200, 180]


def test_vllm_bench_without_start_times_warns():
    from simulator.errors import SimctlWarning

    with pytest.warns(SimctlWarning, match="no request start times"):
        run = read_observed(DATA / "vllm_bench_no_starts.json")
    assert (run.calls["arrived_at"] == 0).all()


def test_guidellm_report_reads_as_a_run():
    run = read_observed(DATA / "guidellm.json")
    assert run.meta["format"] == "guidellm"
    assert list(run.calls["call_id"]) == ["r0", "r1", "r2"]
    assert list(run.calls["tasks"]) == ["mmlu", "infobench", "infobench"]  # classified from the prompt text
    assert list(run.calls["ok"]) == [True, True, False]
    assert list(run.calls["latency_s"][:2]) == pytest.approx([0.8, 1.5])
    assert "HTTP 500" in run.calls["error"][2]


def test_aiperf_export_reads_as_a_run():
    for path in (DATA / "aiperf" / "profile_export.jsonl", DATA / "aiperf"):
        run = read_observed(path)
        assert run.meta["format"] == "aiperf"
        assert list(run.calls["arrived_at"]) == pytest.approx([0.0, 1.0, 2.0])
        assert list(run.calls["latency_s"][:2]) == pytest.approx([0.5, 0.3])
        assert not run.calls["ok"][2] and "RequestCancellationError" in run.calls["error"][2]


def test_cli_reads_other_tools_results():
    shown = runner.invoke(app, ["observed", str(DATA / "aiperf" / "profile_export.jsonl")])
    assert shown.exit_code == 0, shown.output
    compared = runner.invoke(app, ["compare-runs", str(DATA / "guidellm.json"), str(DATA / "vllm_bench.json")])
    assert compared.exit_code == 0, compared.output
    assert "overall" in compared.stdout
