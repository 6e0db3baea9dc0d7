"""Suite-wide hooks: the run ends by saying how much CPU time it cost.

CPU time, not wall time, is the suite's cost figure: on a shared machine wall time measures
the neighbours as much as the tests, while user + system CPU seconds of the pytest process
and of the subprocesses it waited for (commands, wheel builds, notebook kernels, servers) are
nearly the same on every run. The figure is reported, never asserted.
"""

from __future__ import annotations

import resource

import pytest


def cpu_seconds() -> tuple[float, float]:
    """User + system CPU seconds of this process, and of its children that have been waited for."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def cpu_time_line(own: float, children: float) -> str:
    return f"suite CPU time: {own + children:.0f} s (pytest {own:.0f} s, subprocesses {children:.0f} s)"


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    terminalreporter.write_line(cpu_time_line(*cpu_seconds()))
