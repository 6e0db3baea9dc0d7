"""The suite's own cost report (``tests/conftest.py``): ``--cpu-durations N`` lists the N
tests that cost the most CPU time, most first, their own and their subprocesses' apart."""

from __future__ import annotations

from conftest import cpu_durations_lines, cpu_time_line


def test_the_costliest_tests_come_first_and_only_as_many_as_asked():
    costs = [("t.py::cheap", 0.5, 0.0), ("t.py::child", 0.1, 2.0), ("t.py::own", 1.5, 0.0)]
    lines = cpu_durations_lines(costs, 2)
    assert [line.split()[-1] for line in lines] == ["t.py::child", "t.py::own"]  # 2.1 s, then 1.5 s
    assert lines[0].split()[:4] == ["2.10", "s", "(0.10", "+"]
    assert cpu_durations_lines(costs, 10)[-1].endswith("t.py::cheap")


def test_the_suite_figure_adds_its_parts():
    assert cpu_time_line(200.4, 70.2) == "suite CPU time: 271 s (pytest 200 s, subprocesses 70 s)"
