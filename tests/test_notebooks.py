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


@pytest.fixture(scope="module")
def kernel():
    """One kernel for the module's notebooks: each runs in it with an emptied namespace
    (execute.execute), so the kernel's start and the libraries' imports are paid once."""
    km = execute.start_kernel(FOLDER)
    yield km
    km.shutdown_kernel(now=True)


def test_a_notebook_does_not_see_the_names_of_the_one_before(kernel, tmp_path):
    first, second = tmp_path / "first.ipynb", tmp_path / "second.ipynb"
    for path, source in ((first, "defined_before = 1"), (second, "print(defined_before)")):
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell(source)]
        nbformat.write(nb, path)
    execute.execute(first, kernel)
    with pytest.raises(nbclient.exceptions.CellExecutionError, match="NameError"):
        execute.execute(second, kernel)


@pytest.mark.examples
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_and_matches_its_committed_outputs(path, kernel):
    committed = nbformat.read(path, as_version=4)
    fresh = execute.execute(path, kernel)
    errors = [o for c in fresh.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    assert execute.figure_count(fresh) >= 1, "every notebook shows at least one figure"
    assert execute.figure_count(committed) == execute.figure_count(fresh), (
        f"{path.name} is committed without its figures: run `make notebooks`")
    assert execute.text_outputs(committed) == execute.text_outputs(fresh), (
        f"{path.name}'s committed outputs are stale: run `make notebooks` and commit the result")
