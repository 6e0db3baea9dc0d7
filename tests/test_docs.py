"""The console examples of the README and docs/ run, and print what the pages say they print.

Each page's commands run in a fresh folder from the installed simctl (docs/runner.py); a
page whose written output differs from a fresh run fails here, and `make docs` rewrites it.
"""

from __future__ import annotations

import importlib.util
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
