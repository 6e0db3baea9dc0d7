"""Execute the notebooks in place, so the committed copies show their current outputs.

    python notebooks/execute.py            # every notebook in this folder
    python notebooks/execute.py NAME.ipynb # one

The test suite executes the same notebooks afresh and compares their text outputs with the
committed ones (:func:`text_outputs`), so a committed figure or number cannot go stale: a
change that moves a result fails the suite until the notebooks are executed again.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbclient
import nbformat

HERE = Path(__file__).resolve().parent

# Object addresses differ from run to run and say nothing about the result.
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def execute(path: Path) -> nbformat.NotebookNode:
    """The notebook at ``path`` executed top to bottom in its own folder (not written)."""
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    return nb


def text_outputs(nb: nbformat.NotebookNode) -> list[list[str]]:
    """Per code cell, the text it printed and the plain-text value it returned, normalised.

    Figures are left out (their bytes vary with the renderer); their presence is checked by
    :func:`figure_count`.
    """
    cells = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        texts = []
        for out in cell.get("outputs", []):
            if out.output_type == "stream" and out.get("name") == "stdout":
                texts.append(out.text)
            elif out.output_type == "execute_result":
                texts.append(out.get("data", {}).get("text/plain", ""))
            elif out.output_type == "error":
                texts.append(f"error: {out.ename}: {out.evalue}")
        cells.append([_ADDRESS.sub("", t).rstrip() for t in texts])
    return cells


def figure_count(nb: nbformat.NotebookNode) -> int:
    """How many PNG figures the notebook's outputs hold."""
    return sum(1 for cell in nb.cells if cell.cell_type == "code" for out in cell.get("outputs", [])
               if out.output_type == "display_data" and "image/png" in out.get("data", {}))


def main(names: list[str]) -> None:
    paths = [HERE / n for n in names] if names else sorted(HERE.glob("*.ipynb"))
    for path in paths:
        nb = execute(path)
        nbformat.write(nb, path)
        print(f"executed {path.name}: {figure_count(nb)} figure(s)")


if __name__ == "__main__":
    main(sys.argv[1:])
