"""Suite-wide hooks: the run ends by saying how much CPU time it cost.

CPU time, not wall time, is the suite's cost figure: on a shared machine wall time measures
the neighbours as much as the tests, while user + system CPU seconds of the pytest process
and of the subprocesses it waited for (commands, wheel builds, notebook kernels, servers) are
nearly the same on every run. The figure is reported, never asserted.
"""

from __future__ import annotations

import gc
import resource

import pytest


def cpu_seconds() -> tuple[float, float]:
    """User + system CPU seconds of this process, and of its children that have been waited for."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def cpu_time_line(own: float, children: float) -> str:
    return f"suite CPU time: {own + children:.0f} s (pytest {own:.0f} s, subprocesses {children:.0f} s)"


def pytest_collection_finish(session: pytest.Session) -> None:
    """Once every test module is imported, their objects and the libraries' (simctl, numpy,
    pandas, hypothesis ...) are frozen out of the cyclic collector's reach, and it runs on
    every 10,000 new objects instead of 700: the tests make millions of short-lived objects,
    and each collection walked the whole imported heap again (a tenth of the pytest process's
    CPU time over the model, metrics and CLI tests, by the collector's own callbacks). No test
    relies on when a cycle is collected: files, processes and servers are closed explicitly."""
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cpu-durations", type=int, default=0, metavar="N",
                     help="list the N tests that cost the most CPU time (their own and their waited-for "
                          "subprocesses'): --durations, in the suite's cost figure")


#: (test id, own CPU-s, subprocesses' CPU-s) of each test run, where --cpu-durations asks.
_COSTS: list[tuple[str, float, float]] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    if not item.config.getoption("cpu_durations"):
        yield
        return
    before = cpu_seconds()
    yield
    after = cpu_seconds()
    _COSTS.append((item.nodeid, after[0] - before[0], after[1] - before[1]))


def cpu_durations_lines(costs: list[tuple[str, float, float]], n: int) -> list[str]:
    """The ``n`` costliest tests, most first: CPU seconds in all, then own + subprocesses'.
    (A subprocess counts where it was waited for: one a test leaves running counts later.)"""
    top = sorted(costs, key=lambda c: c[1] + c[2], reverse=True)[:n]
    return [f"{own + children:7.2f} s ({own:.2f} + {children:.2f})  {nodeid}" for nodeid, own, children in top]


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    n = terminalreporter.config.getoption("cpu_durations")
    if n and _COSTS:
        terminalreporter.write_sep("=", f"{min(n, len(_COSTS))} costliest tests, CPU time (own + subprocesses)")
        for line in cpu_durations_lines(_COSTS, n):
            terminalreporter.write_line(line)
    terminalreporter.write_line(cpu_time_line(*cpu_seconds()))
