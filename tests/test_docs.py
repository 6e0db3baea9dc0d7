"""The console examples of the README and docs/ run, and print what the pages say they print.

Each page's commands run in a fresh folder from the installed simctl (docs/runner.py); a
page whose written output differs from a fresh run fails here, and `make docs` rewrites it.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("docs_runner", Path(__file__).resolve().parents[1] / "docs" / "runner.py")
assert _spec is not None and _spec.loader is not None
runner = importlib.util.module_from_spec(_spec)
sys.modules["docs_runner"] = runner   # its dataclasses look their module up
_spec.loader.exec_module(runner)

PAGES = [p for p in runner.PAGES if runner.parse(p.read_text())]


def test_the_readme_has_examples():
    assert runner.ROOT / "README.md" in PAGES


@pytest.mark.examples
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_page_examples_run_and_print_what_the_page_shows(page):
    _, blocks = runner.run_page(page)
    for block in blocks:
        if block.mode == "skip":
            continue
        for command, expected, actual, status in zip(block.commands, block.expected, block.actual, block.status, strict=True):
            assert status == 0, f"{page.name}: $ {command} exited {status}:\n{actual}"
            if block.mode == "run":  # "no-compare" and "python" blocks: the exit status alone
                assert runner.matches(expected, actual), (
                    f"{page.name}: $ {command} prints something else now (run `make docs`):\n"
                    f"--- written ---\n{expected}--- now ---\n{actual}")


def test_wildcards_match_lines_and_text():
    assert runner.matches("a\n...\nd\n", "a\nb\nc\nd\n")
    assert runner.matches("took ... s\n", "took 1.2 s\n")
    assert not runner.matches("a\nd\n", "a\nb\nd\n")


#: A count of the suite's tests ("≈380 tests", "1,390 tests").
TEST_COUNT = re.compile(r"\d[\d,.]*\s*(?:k\s+)?tests\b", re.IGNORECASE)
#: A duration ("2 minutes", "3–4 min", "90 s").
DURATION = re.compile(r"\b\d+(?:[.,]\d+)?(?:\s*[–-]\s*\d+)?\s*(?:minutes?|min|hours?|seconds?|s)\b")
#: Words that say a sentence is about running the whole test suite (or its fast selection).
SUITE = re.compile(r"\b(?:whole|full|entire|test) suite\b|\bsuite (?:takes|runs)\b|\bfast selection\b"
                   r"|\bmake test\b|-m pytest\b", re.IGNORECASE)


def stale_suite_figures(text: str) -> list[str]:
    """The sentences of ``text`` that state how many tests the suite has or how long it runs:
    figures that go stale with every test added or machine changed, so the pages never give
    them (pytest prints both on every run)."""
    found = []
    for sentence in re.split(r"(?<=[.;:!?])\s+|\n\s*\n", text):
        flat = " ".join(sentence.split())
        if TEST_COUNT.search(flat) or (SUITE.search(flat) and DURATION.search(flat)):
            found.append(flat)
    return found


def test_stale_suite_figures_are_found():
    assert stale_suite_figures("The whole suite (≈380 tests) takes about 2 minutes on 2 cores.")
    assert stale_suite_figures("Runs the fast selection (about 1 minute on two cores, against 3–4 for it).")
    assert stale_suite_figures("There are 1,390 tests.")
    assert not stale_suite_figures("`make test` runs the whole suite. A sweep takes 2.3 s on 2 cores.")
    assert not stale_suite_figures("The benchmark takes about 5 minutes on 2 cores.")
    assert not stale_suite_figures("Its quick mode (about 25 s) runs in the suite with looser bounds.")


@pytest.mark.parametrize("page", [runner.ROOT / "README.md", *sorted((runner.ROOT / "docs").glob("*.md"))],
                         ids=lambda p: p.name)
def test_pages_state_no_test_counts_or_suite_run_times(page):
    assert stale_suite_figures(page.read_text()) == []


def test_plain_simctl_commands_run_in_process_and_shell_ones_through_a_shell():
    assert runner.in_process_argv('simctl plan example --slo "infobench.latency.p95<=170" --flush 0,2') == [
        "plan", "example", "--slo", "infobench.latency.p95<=170", "--flush", "0,2"]
    assert runner.in_process_argv("simctl observed 'sweep.json#1' --goodput ttft:150ms") == [
        "observed", "sweep.json#1", "--goodput", "ttft:150ms"]
    for shell_only in ('simctl profile --gpu h100-sxm || echo "exit status $?"', "simctl replay example > out.txt",
                       "simctl validate *.json", 'simctl validate "$HOME/t.json"', "simctl replay example  # note",
                       "python benchmarks/offline_tokenizer.py /tmp/tok"):
        assert runner.in_process_argv(shell_only) is None, shell_only
    # a plain command followed by the echo of its status: the command in process, the echo added
    assert runner.in_process_or_echo_argv('simctl profile --gpu h100-sxm || echo "exit status $?"') == [
        "profile", "--gpu", "h100-sxm"]
    for shell_only in ('simctl replay example > out.txt || echo "exit status $?"', "simctl replay example || echo hi",
                       'simctl replay example || echo "exit status $?" > out.txt', 'simctl replay example'):
        assert runner.in_process_or_echo_argv(shell_only) is None, shell_only


def test_a_command_in_process_prints_what_the_installed_one_prints(tmp_path):
    """The same argv, folder and environment: the same output and exit status (an error path,
    so that stdout, stderr and the status all matter), alone and followed by the echo of its
    status (one real process shows both: the echo prints the status it exited with)."""
    import subprocess

    env = runner._environment(tmp_path / "home")
    command = 'simctl replay missing-trace.json -c design-notes || echo "exit status $?"'
    done = subprocess.run(command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    args = runner.in_process_or_echo_argv(command)
    assert args is not None
    assert runner._run_in_process_or_echo(args, tmp_path, env) == (done.stdout + done.stderr, done.returncode)
    printed, echoed = done.stdout.rsplit("exit status ", 1)
    assert int(echoed) != 0 and done.stderr
    assert runner._run_in_process(args, tmp_path, env) == (printed + done.stderr, int(echoed))


def test_only_the_readmes_first_command_starts_the_installed_simctl(tmp_path, monkeypatch):
    """The entry point is the same on every page: the README's first command runs it as a
    real process, every other plain command (a first one elsewhere too) runs in this process."""
    import subprocess

    started = []

    def shell(command, **kwargs):
        started.append(command)
        return subprocess.CompletedProcess(command, 0, "simctl\n", "")

    monkeypatch.setattr(runner.subprocess, "run", shell)
    page = tmp_path / "page.md"
    page.write_text("```console\n$ simctl --version\n...\n$ simctl --version\n...\n```\n")
    runner.run_page(page)
    assert started == []
    monkeypatch.setattr(runner, "ENTRY_POINT_PAGE", page)
    runner.run_page(page)
    assert started == ["simctl --version"]


@pytest.mark.parametrize("source", [
    "import os, sys\nprint(os.getcwd(), os.environ['SIMCTL_HOME'], 'COLUMNS' in os.environ)\nsys.exit(3)",
    "import sys\nprint('before')\nprint('to stderr', file=sys.stderr)\nraise ValueError('the example broke')",
    "import sys\nsys.exit('a message')",
    "print('fine')",
], ids=["exit-status", "raises", "exit-message", "succeeds"])
def test_a_python_example_in_process_prints_and_exits_as_python_c_would(tmp_path, source):
    """Same folder and environment: the same output (traceback included) and exit status as
    ``python -c``; and this process's folder and environment are given back afterwards."""
    import os
    import subprocess

    env = runner._environment(tmp_path / "home")
    done = subprocess.run([sys.executable, "-c", source], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    here, environ = os.getcwd(), dict(os.environ)
    assert runner._run_python_in_process(source, tmp_path, env) == (done.stdout + done.stderr, done.returncode)
    assert (os.getcwd(), dict(os.environ)) == (here, environ)
