"""Every notebook runs top to bottom, and its committed outputs are the ones it produces now."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="notebook tests need nbformat/nbclient (the test extra)")
nbclient = pytest.importorskip("nbclient", reason="notebook tests need nbformat/nbclient (the test extra)")

FOLDER = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(FOLDER.glob("*.ipynb"))

_spec = importlib.util.spec_from_file_location("notebooks_execute", FOLDER / "execute.py")
assert _spec is not None and _spec.loader is not None
execute = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(execute)


def test_there_are_the_three_notebooks():
    assert [p.name for p in NOTEBOOKS] == ["capacity_planning.ipynb", "flush_window_question.ipynb",
                                           "latency_cdfs.ipynb"]


@pytest.mark.examples
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_and_matches_its_committed_outputs(path):
    committed = nbformat.read(path, as_version=4)
    fresh = execute.execute(path)
    errors = [o for c in fresh.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    assert execute.figure_count(fresh) >= 1, "every notebook shows at least one figure"
    assert execute.figure_count(committed) == execute.figure_count(fresh), (
        f"{path.name} is committed without its figures: run `make notebooks`")
    assert execute.text_outputs(committed) == execute.text_outputs(fresh), (
        f"{path.name}'s committed outputs are stale: run `make notebooks` and commit the result")
