"""Other load generators' results, read as observed runs.

Users already measure servers with ``vllm bench serve``, GuideLLM and AIPerf. Each module
here reads one tool's per-request results (one file, plus its line in :data:`FORMATS`); the
registry tells the files apart and :func:`read_result_file` turns one into an
:class:`~simulator.observed.ObservedRun` (through :func:`~simulator.observed.read_observed`) whose calls are the tool's requests (one prompt
each), with the trace they make (``ObservedRun.trace``: arrival instants from the requests'
start times, prompt and output tokens), so ``simctl observed``, ``compare-runs`` and
``calibrate`` take these files wherever they take a results folder.

A file may hold several benchmarks (a GuideLLM rate sweep; ``vllm bench serve
--append-result``): ``FILE#K`` names its benchmark ``K`` (0-based, in file order) wherever a
run is taken, and :func:`read_result_runs` reads them all, one run each. A command that
needs one run refuses such a file without ``#K``, listing its benchmarks.

Adding a format: a module with ``looks_like(path, head) -> bool`` (``head``: the first
4 KiB of the file, as text) and ``read(path) -> list[Benchmark]`` (every benchmark in the
file, in order), and its line below. A reader that meets a layout it does not know raises
:class:`~simulator.errors.ObservedError` naming what it expected, never a run of failures.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from simulator import inputs
from simulator.errors import ObservedError
from simulator.observed_formats import aiperf, guidellm, vllm_bench
from simulator.observed_formats._common import Benchmark, ResultFormat, ToolRun, build_run

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
_SELECTOR = re.compile(r"^(?P<file>.+)#(?P<index>\d+)$")


def split_selector(path: str | Path) -> tuple[Path, int | None]:
    """``(file, K)`` of ``FILE#K`` (benchmark ``K`` of a file of several), else ``(path,
    None)``. A name that exists as given is never split, so a file whose name holds ``#``
    reads as itself."""
    p = Path(path)
    if p.exists():
        return p, None
    m = _SELECTOR.match(str(path))
    if m and Path(m["file"]).is_file():
        return Path(m["file"]), int(m["index"])
    return p, None


def detect(path: str | Path) -> tuple[str, Path] | None:
    """(format name, file) of another tool's results at ``path`` (a file, ``FILE#K``, or a
    folder holding one), or ``None``."""
    p, _ = split_selector(path)
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


def _listing(benchmarks: list[Benchmark]) -> str:
    """``#0 label (n requests); #1 ...``: a file's benchmarks, for an error that asks for one."""
    return "; ".join(" ".join(x for x in (f"#{k}", b.label, f"({len(b.requests)} requests)") if x)
                     for k, b in enumerate(benchmarks))


def _read(path: str | Path) -> tuple[str, Path, int | None, list[Benchmark]] | None:
    """(format, file, K of ``FILE#K`` or ``None``, every benchmark of the file)."""
    found = detect(path)
    if found is None:
        return None
    name, file = found
    _, index = split_selector(path)
    benchmarks = FORMATS[name].read(file)
    if not benchmarks:
        raise ObservedError(file, None, None, f"a {name} result with no benchmarks")
    if index is not None and index >= len(benchmarks):
        raise ObservedError(file, None, None, f"has no benchmark #{index}: it holds {len(benchmarks)} "
                            f"(#0 to #{len(benchmarks) - 1}): {_listing(benchmarks)}")
    return name, file, index, benchmarks


def _runs(found: tuple[str, Path, int | None, list[Benchmark]], timeout: float,
          compositions: Compositions | None) -> list[ToolRun]:
    name, file, index, benchmarks = found
    base = file.stem if file.name != "profile_export.jsonl" else file.parent.name
    numbered = len(benchmarks) > 1 or index is not None
    chosen = [(index, benchmarks[index])] if index is not None else list(enumerate(benchmarks))
    runs = []
    for k, bench in chosen:
        meta = {**bench.meta, **({"benchmark_index": k} if numbered else {}),
                **({"benchmark_label": bench.label} if bench.label else {})}
        runs.append(build_run(file, name, bench.requests, meta, timeout, compositions,
                              name=f"{base}#{k}" if numbered else base,
                              shown_path=f"{file}#{k}" if numbered else str(file)))
    return runs


def read_result_runs(path: str | Path, timeout: float,
                     compositions: Compositions | None = None) -> list[ToolRun] | None:
    """Every run in another tool's results at ``path`` (one per benchmark of the file; the
    one benchmark ``K`` of ``FILE#K``), or ``None`` if it is not such a file."""
    found = _read(path)
    return None if found is None else _runs(found, timeout, compositions)


def read_result_file(path: str | Path, timeout: float, compositions: Compositions | None = None) -> ToolRun | None:
    """The run in another tool's results at ``path``, or ``None`` if it is not one
    (:func:`simulator.observed.read_observed` makes it an observed run). A file of several
    benchmarks needs ``FILE#K``: without it this raises :class:`ObservedError` listing them."""
    found = _read(path)
    if found is None:
        return None
    _, file, index, benchmarks = found
    if index is None and len(benchmarks) > 1:
        raise ObservedError(file, None, None, f"holds {len(benchmarks)} benchmarks, an observed run is one: "
                            f"give {file}#K (K from 0): {_listing(benchmarks)}")
    return _runs(found, timeout, compositions)[0]


__all__ = ["FORMATS", "Benchmark", "ToolRun", "detect", "read_result_file", "read_result_runs", "split_selector"]
