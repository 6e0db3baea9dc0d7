"""Inputs a hostile user might hand simctl, each once a traceback, a hang or a silent wrong
result: now one ``error:`` line naming the file, record and field, exit 2, and the input
untouched."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from helpers import assert_one_line_error
from typer.testing import CliRunner

from simulator.cli import app

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "traces" / "batch_arrivals.json"
PROFILE = json.loads((ROOT / "profiles" / "seed-calibrated.json").read_text())
runner = CliRunner()


def profile_with(change) -> str:
    profile = json.loads(json.dumps(PROFILE))
    change(profile)
    return json.dumps(profile)


def first_task(profile: dict) -> dict:
    return profile["tasks"][next(iter(profile["tasks"]))]


# (file name, content, command after the file's path is substituted for {f}, needles)
CASES = {
    "mooncake NaN time": (
        "m.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 5}\n'
                   '{"timestamp": NaN, "input_length": 10, "output_length": 5}\n',
        ["import", "mooncake", "{f}", "-o", "{out}"], ["m.jsonl", "line 2", "'timestamp'", "NaN"]),
    "mooncake token count past 64 bits": (
        "m.jsonl", '{"timestamp": 0, "input_length": 1e30, "output_length": 5}\n',
        ["import", "mooncake", "{f}", "-o", "{out}"], ["line 1", "'input_length'"]),
    "azure token count past 64 bits": (
        "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,1e30,5\n",
        ["import", "azure", "{f}", "-o", "{out}"], ["a.csv", "line 2", "'ContextTokens'"]),
    "burstgpt token count past 64 bits": (
        "b.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                 "5,ChatGPT,1e30,10,20,Conversation log\n",
        ["import", "burstgpt", "{f}", "-o", "{out}"], ["b.csv", "line 2", "'Request tokens'"]),
    "CSV row with more fields than the header (first row)": (
        "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,10,5,99\n",
        ["import", "azure", "{f}", "-o", "{out}"], ["a.csv", "line 2", "has 4 fields; the header has 3"]),
    "CSV row with more fields than the header (later row)": (
        "b.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                 "5,ChatGPT,10,10,20,Conversation log\n6,ChatGPT,10,10,20,Conversation log,x\n",
        ["import", "burstgpt", "{f}", "-o", "{out}"], ["b.csv", "line 3", "has 7 fields; the header has 6"]),
    "trace that is not UTF-8 (the fast reader gives way to the reporting one)": (
        "t.json", b"\xe9", ["replay", "{f}"], ["t.json", "not a UTF-8 text file"]),
    "profile default token count past 32 bits": (
        "p.json", profile_with(lambda p: first_task(p).update(max_tokens=10**25)),
        ["replay", str(TRACE), "--profile", "{f}"], ["p.json", "'max_tokens'", "2,147,483,647", "26 digits"]),
    "trace time past any float": (
        "t.json", json.dumps({"calls": [{"t": 10**400, "prompts": ["mmlu"]}]}),
        ["replay", "{f}"], ["t.json", "record 0", "'t'", "too large"]),
    "ISO time before year 1 in UTC": (
        "t.json", json.dumps({"calls": [{"t": "0001-01-01T00:00:00+05:00", "prompts": ["mmlu"]}]}),
        ["replay", "{f}"], ["record 0", "'t'", "out of the range"]),
    "token count of 2^63": (
        "t.json", json.dumps({"calls": [{"t": 0, "prompts": [{"task": "mmlu", "max_tokens": 2**63}]}]}),
        ["replay", "{f}"], ["record 0", "prompts[0].max_tokens", "too large"]),
    "profile meta not an object": (
        "p.json", profile_with(lambda p: p.update(meta=5)),
        ["sweep", str(TRACE), "--flush", "0.1,0.2", "--profile", "{f}", "--out", "{out}.parquet"],
        ["p.json", "'meta'", "must be an object"]),
    "profile kind a list": (
        "p.json", profile_with(lambda p: first_task(p)["service"].update(kind=["x"])),
        ["replay", str(TRACE), "--profile", "{f}"], ["p.json", "'service.kind'", "name of a kind"]),
    "GPUs past any serving system": (
        None, None, ["replay", str(TRACE), "--set", "run.gpus=9223372036854775807"], ["'gpus'", "[1, 100,000]"]),
    "workers past any serving system": (
        None, None, ["replay", str(TRACE), "--set", "tasks.infobench.workers=1000000000000000000"],
        ["'workers'", "[1, 1,000,000]"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_hostile_input_gets_one_line_and_is_left_untouched(tmp_path, case):
    name, content, command, needles = CASES[case]
    path = tmp_path / (name or "unused")
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    before = hashlib.sha256(path.read_bytes()).hexdigest() if content is not None else None
    out = tmp_path / "out.json"
    args = [a.replace("{f}", str(path)).replace("{out}", str(out)) for a in command]
    assert_one_line_error(runner.invoke(app, args), *needles)
    if before is not None:
        assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    assert not out.exists() and not Path(f"{out}.parquet").exists()


# -- sweep --cluster: a bad address, nothing listening, a listener that never answers ----

@pytest.mark.parametrize("address, words", [
    ("nonsense", "must be a scheduler address like tcp://HOST:8786"),
    ("tcp://host:99999", "must be a scheduler address"),
    ("tcp://:8786", "must be a scheduler address"),
    ("http://host:8786", "not a Dask scheduler address"),
])
def test_a_bad_cluster_address_is_one_line_before_any_work(tmp_path, address, words):
    out = tmp_path / "s.parquet"
    result = runner.invoke(app, ["sweep", str(TRACE), "--flush", "0.1,0.2", "--out", str(out), "--cluster", address])
    assert_one_line_error(result, "--cluster", words)
    assert not out.exists()


def test_an_unreachable_or_silent_scheduler_fails_fast(tmp_path):
    import socket
    import threading
    import time

    pytest.importorskip("distributed")
    from simulator.errors import SweepError
    from simulator.sweep import connect

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    with pytest.raises(SweepError, match="cannot reach the scheduler"):
        connect(f"tcp://127.0.0.1:{closed}", timeout=1.0)

    silent = socket.socket()  # accepts connections, never speaks
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)
    stop = threading.Event()
    threading.Thread(target=stop.wait, daemon=True).start()
    try:
        t0 = time.monotonic()
        with pytest.raises(SweepError, match="no Dask scheduler answered"):
            connect(f"tcp://127.0.0.1:{silent.getsockname()[1]}", timeout=1.0)
        assert time.monotonic() - t0 < 60  # bounded: the timeout plus a grace, not minutes
    finally:
        stop.set()
        silent.close()


# -- sweep: Ctrl-C keeps every finished row, says so, and the same command resumes ----------

#: Seconds each replay of a sweep run as a process of its own takes beyond its work (a sleep:
#: no CPU). The sweep is then still running, its workers busy, for seconds after its first
#: rows, whenever the test (late, on a loaded machine) sends its signal; its rows are those of
#: an unpaced sweep.
PACE_S = 0.2


def paced_sweep() -> None:
    """Set up in the sweep's process before the command: each replay paced by :data:`PACE_S`
    (the pool's workers are forks of it and inherit the pace)."""
    import time

    from simulator import sweep

    replay = sweep.run_job

    def paced(*args, **kwargs):
        row = replay(*args, **kwargs)
        time.sleep(PACE_S)
        return row

    sweep.run_job = paced


def sweep_process(args: list[str], folder: Path):
    """``simctl ARGS`` as a process of its own (a fork of this one: ``hostile_outputs``),
    replays paced (:func:`paced_sweep`); the process and its stderr file."""
    from hostile_outputs import start_simctl

    return start_simctl(args, folder, preexec=paced_sweep)


def test_an_interrupted_sweep_says_what_it_kept_and_resumes_to_the_same_rows(tmp_path):
    import signal
    import time

    import pandas as pd
    from hostile_outputs import finish

    out = tmp_path / "s.parquet"
    # 36 replays on two workers, each paced (PACE_S): seven seconds at least, of which the
    # 34 left when the second row lands keep the sweep going for seconds
    args = ["sweep", str(TRACE), "-c", "design-notes", "--flush", ",".join(str(f / 10) for f in range(12)),
            "--seeds", "3", "--jobs", "2", "--out", str(out)]
    # The Ctrl-C goes to a real process; the resumed run and the uninterrupted one run in this
    # process (what they find and do is the point, not how a process starts).
    sweep, stderr = sweep_process(args, tmp_path)
    journal = tmp_path / "s.parquet.journal"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and sweep.poll() is None:
        if journal.exists() and sum(line.startswith("[") for line in journal.read_text().splitlines()) >= 2:  # two rows
            break
        time.sleep(0.05)
    sweep.send_signal(signal.SIGINT)
    got = finish(sweep, stderr)
    err = got.stderr
    if got.returncode == 0:
        pytest.skip("the sweep finished before it could be interrupted")
    assert got.returncode == 130, err
    assert "Traceback" not in err and "run the same command to resume" in err, err
    kept = len(pd.read_parquet(out))
    assert kept >= 2 and f"{kept} of 36 rows kept in {out}" in err
    assert not journal.exists()

    resumed = runner.invoke(app, args)
    assert resumed.exit_code == 0, resumed.output
    assert f"{36 - kept} replays run, {kept} already in the file skipped" in " ".join(resumed.stdout.split())
    whole = tmp_path / "whole.parquet"
    assert runner.invoke(app, [*args[:-1], str(whole)]).exit_code == 0
    key = ["config_key", "seed"]
    pd.testing.assert_frame_equal(pd.read_parquet(out).sort_values(key).reset_index(drop=True),
                                  pd.read_parquet(whole).sort_values(key).reset_index(drop=True))


def test_a_killed_sweep_leaves_no_worker_behind(tmp_path):
    import os
    import signal
    import time

    # 30 replays on two workers, each paced (PACE_S): the workers are busy for three seconds
    # at least after they start
    sweep, stderr = sweep_process(["sweep", str(TRACE), "-c", "design-notes", "--flush",
                                   ",".join(str(f / 10) for f in range(30)), "--jobs", "2", "--out",
                                   str(tmp_path / "s.parquet")], tmp_path)

    def children() -> list[int]:
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    fields = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if int(fields[1]) == sweep.pid:
                    found.append(int(entry))
        return found

    deadline = time.monotonic() + 120
    workers: list[int] = []
    while time.monotonic() < deadline and sweep.poll() is None and len(workers) < 2:
        workers = children()
        time.sleep(0.05)
    if sweep.poll() is not None:
        pytest.skip("the sweep finished before its workers could be seen")
    sweep.send_signal(signal.SIGKILL)
    # (its stdout is left unread: a worker that outlived it would hold that pipe open)
    assert sweep.wait(120) == -signal.SIGKILL
    stderr.unlink()

    def alive(pid: int) -> bool:
        try:
            return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    until = time.monotonic() + 15
    while time.monotonic() < until and any(alive(w) for w in workers):
        time.sleep(0.1)
    assert not [w for w in workers if alive(w)], "workers outlived the killed sweep"


def test_a_write_killed_midway_leaves_a_part_file_the_next_write_removes(tmp_path):
    import signal
    import subprocess
    import sys

    from simulator.outputs import open_output

    out = tmp_path / "summary.json"
    writer = subprocess.Popen([sys.executable, "-c", (
        "import time, sys\n"
        "from simulator.outputs import open_output\n"
        f"with open_output({str(out)!r}) as fh:\n"
        "    fh.write('partial'); fh.flush(); print('writing', flush=True); time.sleep(60)\n")],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None and writer.stdout.readline().strip() == "writing"
    live = [p for p in tmp_path.iterdir() if p.name.endswith(".part")]
    assert len(live) == 1 and f".{writer.pid}." in live[0].name
    # a write of another output, or of this one while its writer lives, leaves the part alone
    with open_output(tmp_path / "other.json") as fh:
        fh.write("x")
    assert live[0].exists()
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    assert live[0].exists() and not out.exists()  # killed midway: no output, a part left
    with open_output(out) as fh:
        fh.write("{}")
    assert out.read_text() == "{}" and not live[0].exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.json", "summary.json"]


def test_compare_never_overwrites_a_plot_without_force_nor_its_input(tmp_path):
    results = tmp_path / "s.parquet"
    assert runner.invoke(app, ["sweep", str(TRACE), "--flush", "0.1,0.2", "--out", str(results)]).exit_code == 0
    plot = tmp_path / "plot.png"
    plot.write_text("mine")
    assert_one_line_error(runner.invoke(app, ["compare", str(results), "--plot", str(plot)]), "plot.png", "--force")
    assert plot.read_text() == "mine"
    before = results.read_bytes()
    assert_one_line_error(runner.invoke(app, ["compare", str(results), "--plot", str(results), "--force"]),
                          "overwrite an input")
    assert results.read_bytes() == before
    assert runner.invoke(app, ["compare", str(results), "--plot", str(plot), "--force"]).exit_code == 0
    assert plot.read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("rows, dataset, needles", [
    ("0,1e9,1,Gamma,1,1\n600,1,1,Gamma,1,1\n", None, ["line 1", "'rate_rps'", "at most 50,000,000"]),
    ("0,1,1,Gamma,1,1\n1e12,1,1,Gamma,1,1\n", None, ["'rate_rps'", "at most 50,000,000"]),
    ("0,1,1,Weibull,1e-9,1\n600,1,1,Gamma,1,1\n", None, ["line 1", "'param1'", "shape in [0.01, 1000]"]),
    ("0,1,1,Gamma,1e-300,1\n600,1,1,Gamma,1,1\n", None, ["line 1", "'param1'"]),
    ("0,1,1,Gamma,1,1\n600,1,1,Gamma,1,1\n", {"0": {"input_tokens": "{10: -0.5, 20: 1.5}", "output_tokens": "{5: 1}"}},
     ["period 0", "'input_tokens'", "probabilities must be finite and >= 0"]),
    ("0,1,1,Gamma,1,1\n600,1,1,Gamma,1,1\n", [1, 2], ["must be an object of periods"]),
    ("0,1,1,Gamma,1,1\n600,1,1,Gamma,1,1\n", {"0": {"input_tokens": "[1, 2]", "output_tokens": "{5: 1}"}},
     ["period 0", "'input_tokens'", "{length: probability} dict"]),
])
def test_servegen_files_asking_the_impossible_are_refused_up_front(tmp_path, rows, dataset, needles):
    trace = tmp_path / "chunk-1-trace.csv"
    trace.write_text(rows)
    if dataset is not None:
        (tmp_path / "chunk-1-dataset.json").write_text(json.dumps(dataset))
    out = tmp_path / "out.json"
    assert_one_line_error(runner.invoke(app, ["import", "servegen", str(trace), "-o", str(out)]), *needles)
    assert not out.exists()


# -- what the options fuzz found at 400 cases, each pinned -----------------------------------

def _int_options() -> list[tuple[str, object]]:
    """``(command, option)`` for every integer option, the commands the fuzz skips included."""
    import typing

    from fuzzing import commands

    from simulator.cli import _load

    def integer(p) -> bool:
        annotation = p.type_descriptor.annotation
        return p.param_type_name == "option" and int in (annotation, *typing.get_args(annotation))

    every = {**commands(), **{name: _load(name) for name in ("serve", "load", "profile")}}
    return [(words, p) for words, command in every.items() for p in command.params if integer(p)]  # type: ignore[attr-defined]


def test_every_integer_option_is_range_checked_up_front():
    """A huge ``--seeds`` reached ``range()`` and ``len()``: ``OverflowError: int too large to
    convert to C ssize_t``; a huge ``--jobs`` forked that many processes. Every integer option
    that is not a setting (settings carry their own range) now has a click range."""
    from simulator.settings import SETTINGS

    flags = {s.flag for s in SETTINGS}
    unbounded = [f"{words} {p.opts[0]}" for words, p in _int_options()  # type: ignore[attr-defined]
                 if p.opts[0] not in flags and (p.min is None or p.max is None)]  # type: ignore[attr-defined]
    assert not unbounded
    assert len(_int_options()) >= 15


@pytest.mark.parametrize("args, option", [
    (["sweep", str(TRACE), "--out", "{d}/r.parquet", "--seeds", "9" * 30], "--seeds"),
    (["sweep", str(TRACE), "--out", "{d}/r.parquet", "--jobs", "9223372036854775808"], "--jobs"),
    (["plan", str(TRACE), "--slo", "infobench.latency.p95<=400", "--seeds", "9" * 30], "--seeds"),
    (["plan", str(TRACE), "--slo", "infobench.latency.p95<=400", "--max-gpus", "9" * 30], "--max-gpus"),
    (["predict", str(TRACE), "--seeds", "9" * 30], "--seeds"),
    (["replay", str(TRACE), "--seed", "9223372036854775808", "--json", "{d}/r.json"], "--seed"),
    (["synth", "-o", "{d}/s.json", "--seed", "9" * 30], "--seed"),
    (["calibrate", "{d}", "--scenario", "x.toml", "-o", "{d}/f.json", "--screen", "9" * 30], "--screen"),
])
def test_a_huge_integer_option_is_one_line_naming_it(tmp_path, args, option):
    args = [a.replace("{d}", str(tmp_path)) for a in args]
    assert_one_line_error(runner.invoke(app, args), f"'{option}")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("option", ["--max-tokens", "--prompt-tokens"])
def test_synth_refuses_token_counts_a_trace_cannot_hold(tmp_path, option):
    """A fixed token count past 64 bits overflowed numpy (``OverflowError: ... C long``)."""
    out = tmp_path / "s.json"
    for value in ("9" * 30, "9223372036854775808", "2147483648"):
        assert_one_line_error(runner.invoke(app, ["synth", "-o", str(out), "--duration", "60", option, value]),
                              option, "at most 2,147,483,647")
    assert not out.exists()


def _outputs(d: Path) -> list[list[str]]:
    """A command line per output option, each ending in the option (its value appended)."""
    from fuzzing import workspace

    f = workspace()
    return [
        ["replay", str(TRACE), "--json"], ["replay", str(TRACE), "--events"], ["replay", str(TRACE), "--plot"],
        ["sweep", str(TRACE), "--flush", "0", "-j", "1", "--out"],
        ["synth", "--duration", "60", "-o"],
        ["import", "azure", str(f["azure_csv"]), "-o"],
        ["compare", str(f["sweep"]), "--by", "flush,max_batch", "--where", "topology=shared", "--plot"],
        ["plot", "cdf", str(f["events"]), "-o"],
        ["plan", str(TRACE), "--slo", "infobench.latency.p95<=400", "-j", "1", "--flush", "0.5", "--max-batch", "8",
         "--topology", "shared", "--max-gpus", "2", "--json"],
        ["predict", str(TRACE), "--seeds", "1", "--json"],
        ["observed", str(ROOT / "tests" / "data" / "loadgen" / "vllm_bench.json"), "--json"],
        ["compare-runs", str(ROOT / "tests" / "data" / "loadgen" / "vllm_bench.json"),
         str(ROOT / "tests" / "data" / "loadgen" / "guidellm.json"), "--json"],
        ["compare-runs", str(ROOT / "tests" / "data" / "loadgen" / "vllm_bench.json"),
         str(ROOT / "tests" / "data" / "loadgen" / "guidellm.json"), "--plot"],
    ]


@pytest.mark.parametrize("name, needle", [(".", "is a folder"), ("FOLDER", "is a folder"), ("", "blank"),
                                          (" ", "blank"), ("sub/ ", "blank"), ("..", "is a folder")])
def test_an_output_named_a_folder_or_blank_is_one_line_and_nothing_written(tmp_path, monkeypatch, name, needle):
    """``--json .`` failed in ``os.replace`` (EBUSY) and left a ``.part`` file; ``--plot ' '``
    made a file called ' ' then failed on it (``FileExistsError``)."""
    run = tmp_path / "run"
    (run / "sub").mkdir(parents=True)
    (run / "FOLDER").mkdir()
    monkeypatch.chdir(run)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    for args in _outputs(run):
        if args[-1] == "--plot" and args[0] in ("replay", "compare-runs") and needle != "blank":
            continue  # a folder of figures: an existing folder is where they go
        for force in ([], ["--force"]):
            result = runner.invoke(app, [*args, name, *force])
            assert_one_line_error(result)
            # typer reads "" given to a Path option as ".": that one is refused as a folder
            assert needle in result.stderr or (name == "" and "is a folder" in result.stderr), result.stderr
            assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before, args


def test_a_folder_of_figures_that_is_a_file_is_one_line_before_any_work(tmp_path):
    taken = tmp_path / "figures"
    taken.write_text("mine")
    for args in (["replay", str(TRACE), "--plot", str(taken)],
                 ["compare-runs", str(ROOT / "tests" / "data" / "loadgen" / "vllm_bench.json"),
                  str(ROOT / "tests" / "data" / "loadgen" / "guidellm.json"), "--plot", str(taken)]):
        assert_one_line_error(runner.invoke(app, args), "is a file, not a folder")
    assert taken.read_text() == "mine" and sorted(tmp_path.iterdir()) == [taken]


def test_a_failed_write_never_leaves_a_part_file(tmp_path, monkeypatch):
    """Whatever fails (the data, the rename), the temporary file goes and the target stays."""
    import os

    from simulator.errors import OutputError
    from simulator.outputs import open_output

    target = tmp_path / "out.json"
    target.write_text("mine")
    with pytest.raises(ValueError), open_output(target, force=True) as fh:
        fh.write("half")
        raise ValueError("the data failed")

    def refuse(src, dst):
        raise OSError(16, "Device or resource busy")

    monkeypatch.setattr(os, "replace", refuse)
    # (the system's refusal is one line naming the output, not its temporary file)
    with pytest.raises(OutputError, match=r"out\.json: cannot write: Device or resource busy; nothing was written"), \
            open_output(target, force=True) as fh:
        fh.write("whole")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"] and target.read_text() == "mine"


def test_an_output_that_is_a_symbolic_link_is_written_through(tmp_path):
    """A write replaced the link itself by a file; the file it points to is written now,
    the link stays (as a shell's ``>`` does)."""
    (tmp_path / "real").mkdir()
    link = tmp_path / "s.json"
    link.symlink_to(tmp_path / "real" / "trace.json")  # dangling until written
    assert runner.invoke(app, ["synth", "-o", str(link), "--duration", "60"]).exit_code == 0
    assert link.is_symlink() and (tmp_path / "real" / "trace.json").read_bytes().startswith(b"{")
    assert_one_line_error(runner.invoke(app, ["synth", "-o", str(link), "--duration", "60"]), "--force")
    assert runner.invoke(app, ["synth", "-o", str(link), "--duration", "60", "--force"]).exit_code == 0
    assert link.is_symlink() and not [p for p in tmp_path.rglob("*.part")]


def test_a_sweep_refused_at_its_first_run_writes_no_results_file(tmp_path):
    """A pool setting without an autoscaler was refused by the first replay, after the
    results file was opened: exit 2 left an empty results file."""
    out = tmp_path / "r.parquet"
    assert_one_line_error(runner.invoke(app, ["sweep", str(TRACE), "--flush", "0,0.5", "-j", "1", "--out", str(out),
                                              "--scale-interval", "9" * 30]), "'scale_interval'", "autoscaler")
    assert list(tmp_path.iterdir()) == []


def test_plot_load_with_a_blank_group_is_one_line(tmp_path):
    from fuzzing import workspace

    assert_one_line_error(runner.invoke(app, ["plot", "load", str(workspace()["load"]), "-o", str(tmp_path / "l.png"),
                                              "--group", ""]), "--group", "not an axis")


def test_ctrl_c_anywhere_in_a_command_says_so_in_one_line(monkeypatch, tmp_path):
    """Typer turns a Ctrl-C outside the part of a command that reports it (loading the
    trace, printing the table) into exit 130 with nothing said."""
    import simulator.cli.sweep as sweep_cli

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep_cli, "load_trace", interrupted)
    result = runner.invoke(app, ["sweep", str(TRACE), "--flush", "0", "--out", str(tmp_path / "r.parquet")])
    assert result.exit_code == 130
    assert result.stderr.strip().splitlines() == [
        "interrupted; every file written is complete, none half-written; run the same command again to finish"]
    assert list(tmp_path.iterdir()) == []


def test_a_figure_named_for_another_format_or_a_name_too_long_is_one_line(tmp_path):
    """``compare --plot x.json`` reached matplotlib (``ValueError: Format 'json' is not
    supported``); a name past the system's limit raised ``OSError: File name too long``."""
    from fuzzing import workspace

    sweep = str(workspace()["sweep"])
    where = ["--by", "flush,max_batch", "--where", "topology=shared"]
    assert_one_line_error(runner.invoke(app, ["compare", sweep, *where, "--plot", str(tmp_path / "x.json")]),
                          "a figure must end in .png")
    long = "9" * 5000
    result = runner.invoke(app, ["replay", str(TRACE), "--config", long])
    assert_one_line_error(result, "File name too long", "(5,000 characters)")
    assert list(tmp_path.iterdir()) == []


def test_a_ctrl_c_while_the_kernel_loads_is_held_not_lost():
    """llvmlite runs Python inside a C callback as the compiled kernel loads; a Ctrl-C there
    printed a traceback and was lost (the sweep went on and exited 0). It is held and raised
    once the kernel returns."""
    import signal

    from simulator.interrupts import sigint_deferred

    reached = False
    with pytest.raises(KeyboardInterrupt), sigint_deferred():
        # raised in this thread, synchronously: a process-wide kill may be taken by another
        # thread and reach Python's handler only after the block ends
        signal.raise_signal(signal.SIGINT)
        reached = True
    assert reached and signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_ctrl_c_swallowed_inside_a_library_still_stops_the_command():
    """A ``KeyboardInterrupt`` raised where it cannot propagate (here a ``__del__``; in
    calibrate, scipy's Sobol set-up, a Cython function that calls numpy) went to Python's
    "Exception ignored" printout and the command went on. The command line delivers it
    again: it stops the work, and nothing is printed."""
    import subprocess
    import sys

    code = ("from simulator.interrupts import carry_lost_interrupts\n"
            "carry_lost_interrupts()\n"
            "class Swallowed:\n"
            "    def __del__(self):\n"
            "        raise KeyboardInterrupt\n"
            "try:\n"
            "    Swallowed()\n"
            "    while True:  # the work that would go on for ever; the run's timeout guards it\n"
            "        pass\n"
            "except KeyboardInterrupt:\n"
            "    print('stopped')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, "stopped", "")
