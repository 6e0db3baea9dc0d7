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
from jupyter_client.manager import KernelManager

HERE = Path(__file__).resolve().parent

# Object addresses differ from run to run and say nothing about the result.
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def start_kernel(folder: Path) -> KernelManager:
    """A Python kernel running in ``folder``, for :func:`execute` to run several notebooks in
    (the caller shuts it down)."""
    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(folder))
    return km


def _empty_namespace(km: KernelManager) -> None:
    """Forget every name the kernel's previous notebook defined (``%reset -f``): the next one
    runs top to bottom as in a new kernel, only without importing the libraries again."""
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        reply = kc.execute_interactive("%reset -f", timeout=60)
        assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        kc.stop_channels()


def execute(path: Path, km: KernelManager | None = None) -> nbformat.NotebookNode:
    """The notebook at ``path`` executed top to bottom in its own folder (not written): in a
    new kernel, or in ``km``'s (:func:`start_kernel` in the notebook's folder) with its
    namespace emptied first."""
    nb = nbformat.read(path, as_version=4)
    if km is not None:
        _empty_namespace(km)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3", km=km,
                                     resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute()
    finally:
        if km is not None and client.kc is not None:  # a kernel it does not own keeps running
            client.kc.stop_channels()
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
        texts: list[str] = []
        stdout = False  # whether texts[-1] is printed text
        for out in cell.get("outputs", []):
            if out.output_type == "stream" and out.get("name") == "stdout":
                # How printed text is cut into stream outputs follows the kernel's flushes,
                # which depend on timing: consecutive ones are one text.
                if stdout:
                    texts[-1] += out.text
                else:
                    texts.append(out.text)
                stdout = True
            elif out.output_type == "execute_result":
                texts.append(out.get("data", {}).get("text/plain", ""))
                stdout = False
            elif out.output_type == "error":
                texts.append(f"error: {out.ename}: {out.evalue}")
                stdout = False
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
