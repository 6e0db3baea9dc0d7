"""BurstGPT CSV traces, both published layouts, columns found by name.

``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`` (release 1) and
``Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type``
(release 3). ``Timestamp`` is seconds (an integer or a float). The task is the ``Model``
(``ChatGPT``, ``GPT-4``) unless ``--task`` / ``--task-map`` say otherwise. Failed requests
(``Response tokens`` 0) are flagged in ``meta`` and excluded unless ``--include-failed``.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from simulator.errors import SimctlWarning, TraceError
from simulator.trace.formats._requests import (
    DEFAULT_OPTIONS,
    TRACE_IMPORTERS,
    Importer,
    ImportOptions,
    bad_rows,
    build,
    read_csv_columns,
    read_csv_table,
)
from simulator.trace.formats.azure import tokens, valid_counts
from simulator.trace.model import Trace

if TYPE_CHECKING:
    pass

REQUIRED = ("Timestamp", "Model", "Request tokens", "Response tokens")


def looks_like(header: str) -> bool:
    names = [c.strip() for c in header.split(",")]
    return all(c in names for c in REQUIRED)


def read_burstgpt(path: str | Path, options: ImportOptions = DEFAULT_OPTIONS) -> Trace:
    import pandas as pd

    path = Path(path)
    fast = read_csv_columns(path, {"Timestamp": "float", "Model": "text", "Request tokens": "int",
                                   "Response tokens": "int"})
    if (fast is not None and np.all(np.isfinite(fast["Timestamp"])) and fast["Timestamp"].min() >= 0
            and valid_counts(fast["Request tokens"]) and valid_counts(fast["Response tokens"])):
        return _trace(path, fast["Timestamp"], fast["Request tokens"], fast["Response tokens"], fast["Model"],
                      np.arange(len(fast["Timestamp"])) + 2, np.ones(len(fast["Timestamp"]), dtype=bool), options)
    frame = read_csv_table(path)
    frame.columns = [c.strip() for c in frame.columns]
    missing = [c for c in REQUIRED if c not in frame.columns]
    if missing:
        raise TraceError(path, "line 1", missing[0], "missing column (BurstGPT needs "
                         f"{', '.join(REQUIRED)})")
    lines = np.arange(len(frame)) + 2
    t = pd.to_numeric(frame["Timestamp"], errors="coerce").to_numpy(dtype=float)
    bad_time = ~np.isfinite(t) | (t < 0)
    prompt, bad_prompt = tokens(frame, "Request tokens")
    output, bad_output = tokens(frame, "Response tokens")
    model = frame["Model"].to_numpy(dtype=object)
    bad_model = np.array([not m.strip() for m in model], dtype=bool)
    keep = bad_rows(path, lines, bad_time | bad_prompt | bad_output | bad_model, [
        (bad_time, "Timestamp", "must be a number of seconds >= 0"),
        (bad_prompt, "Request tokens", "must be an integer >= 0"),
        (bad_output, "Response tokens", "must be an integer >= 0"),
        (bad_model, "Model", "is empty"),
    ], options)
    return _trace(path, t, prompt, output, model, lines, keep, options)


def _trace(path: Path, t: np.ndarray, prompt: np.ndarray, output: np.ndarray,
           model: np.ndarray | tuple[tuple[str, ...], np.ndarray], lines: np.ndarray, keep: np.ndarray,
           options: ImportOptions) -> Trace:
    """The trace of the rows ``keep`` names, failed requests left out unless asked for."""
    failed = keep & (output == 0)
    meta = {"format": "burstgpt", "failed_requests": int(failed.sum()),
            "failed_included": options.include_failed}
    if not options.include_failed:
        keep &= ~failed
        if failed.any():
            warnings.warn(SimctlWarning(f"{path}: left out {int(failed.sum())} failed request(s) "
                                        "(0 response tokens); --include-failed keeps them"), stacklevel=3)
    tasks = (model[0], model[1][keep]) if isinstance(model, tuple) else model[keep]
    return build(path, t[keep], prompt[keep], np.maximum(output[keep], 1), tasks, lines[keep], meta, options)


TRACE_IMPORTERS.register("burstgpt")(Importer(looks_like, read_burstgpt))
