"""Other load generators' results, read as observed runs.

Users already measure servers with ``vllm bench serve``, GuideLLM and AIPerf. Each module
here reads one tool's per-request results (one file, plus its line in :data:`FORMATS`); the
registry tells the files apart and :func:`read_result_file` turns one into an
:class:`~simulator.observed.ObservedRun` (through :func:`~simulator.observed.read_observed`) whose calls are the tool's requests (one prompt
each), with the trace they make (``ObservedRun.trace``: arrival instants from the requests'
start times, prompt and output tokens), so ``simctl observed``, ``compare-runs`` and
``calibrate`` take these files wherever they take a results folder.

Adding a format: a module with ``looks_like(path, head) -> bool`` (``head``: the first
4 KiB of the file, as text) and ``read(path) -> (requests, meta)``, and its line below.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from simulator import inputs
from simulator.observed_formats import aiperf, guidellm, vllm_bench
from simulator.observed_formats._common import ResultFormat, ToolRun, build_run

if TYPE_CHECKING:
    from simulator.scenario import Compositions

#: name -> the format's reader, tried in this order
FORMATS: dict[str, ResultFormat] = {
    "vllm-bench": ResultFormat("vllm-bench", vllm_bench.looks_like, vllm_bench.read),
    "guidellm": ResultFormat("guidellm", guidellm.looks_like, guidellm.read),
    "aiperf": ResultFormat("aiperf", aiperf.looks_like, aiperf.read),
}
#: the per-request file of a tool's results folder (AIPerf's artifact directory)
_FOLDER_FILES = ("profile_export.jsonl",)


def detect(path: str | Path) -> tuple[str, Path] | None:
    """(format name, file) of another tool's results at ``path`` (a file, or a folder holding
    one), or ``None``."""
    p = Path(path)
    if p.is_dir():
        found = [p / name for name in _FOLDER_FILES if (p / name).is_file()]
        if not found:
            return None
        p = found[0]
    if not p.is_file():
        return None
    head = inputs.read_head(p)
    if head is None:
        return None
    for name, fmt in FORMATS.items():
        if fmt.looks_like(p, head):
            return name, p
    return None


def read_result_file(path: str | Path, timeout: float, compositions: Compositions | None = None) -> ToolRun | None:
    """The run in another tool's results at ``path``, or ``None`` if it is not one
    (:func:`simulator.observed.read_observed` makes it an observed run)."""
    found = detect(path)
    if found is None:
        return None
    name, file = found
    requests, meta = FORMATS[name].read(file)
    return build_run(file, name, requests, meta, timeout, compositions)


__all__ = ["FORMATS", "ToolRun", "detect", "read_result_file"]
