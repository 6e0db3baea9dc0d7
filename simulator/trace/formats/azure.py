"""Azure LLM inference traces (2023 and 2024): CSV ``TIMESTAMP,ContextTokens,GeneratedTokens``.

One request per row: ``ContextTokens`` is the prompt length, ``GeneratedTokens`` the output
length (used as the request's max tokens). Timestamps are wall-clock strings, with 7
fractional digits in 2023 (``2023-11-16 18:15:46.6805900``) and fewer in 2024; both are read
by pandas' ISO-8601 parser. The task is ``azure`` unless ``--task`` says otherwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from simulator.errors import TraceError
from simulator.trace.formats._common import MAX_COUNT
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
from simulator.trace.model import Trace

if TYPE_CHECKING:
    import pandas as pd

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def looks_like(header: str) -> bool:
    return [c.strip() for c in header.split(",")][:3] == list(COLUMNS)


def tokens(frame: pd.DataFrame, column: str) -> tuple[np.ndarray, np.ndarray]:
    """Integer token counts and a mask of rows where the column is not an integer >= 0."""
    import pandas as pd

    values = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=float)
    bad = ~np.isfinite(values) | (values < 0) | (values != np.round(values)) | (values > MAX_COUNT)
    return np.where(bad, 0, values).astype(np.int64), bad


def valid_counts(counts: np.ndarray) -> bool:
    """Whether every token count is one a trace holds (else the slow reader names the row)."""
    return bool(counts.min() >= 0 and counts.max() <= MAX_COUNT)


def read_azure(path: str | Path, options: ImportOptions = DEFAULT_OPTIONS) -> Trace:
    import pandas as pd

    path = Path(path)
    fast = read_csv_columns(path, {"TIMESTAMP": "timestamp", "ContextTokens": "int", "GeneratedTokens": "int"})
    if fast is not None and valid_counts(fast["ContextTokens"]) and valid_counts(fast["GeneratedTokens"]):
        n = len(fast["TIMESTAMP"])
        return build(path, fast["TIMESTAMP"] / 1e9, fast["ContextTokens"], np.maximum(fast["GeneratedTokens"], 1),
                     (("azure",), np.zeros(n, dtype=np.int64)), np.arange(n) + 2,
                     {"format": "azure", "absolute": True}, options)
    frame = read_csv_table(path)
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise TraceError(path, "line 1", missing[0], f"missing column (the header must be {','.join(COLUMNS)})")
    lines = np.arange(len(frame)) + 2                   # line 1 is the header
    stamps = pd.to_datetime(frame["TIMESTAMP"], format="ISO8601", errors="coerce")
    bad_time = stamps.isna().to_numpy()
    prompt, bad_prompt = tokens(frame, "ContextTokens")
    output, bad_output = tokens(frame, "GeneratedTokens")
    keep = bad_rows(path, lines, bad_time | bad_prompt | bad_output, [
        (bad_time, "TIMESTAMP", "not a timestamp like 2023-11-16 18:15:46.6805900"),
        (bad_prompt, "ContextTokens", "must be an integer >= 0"),
        (bad_output, "GeneratedTokens", "must be an integer >= 0"),
    ], options)
    seconds = stamps.to_numpy("datetime64[ns]")[keep].astype(np.int64) / 1e9
    tasks = np.full(int(keep.sum()), "azure", dtype=object)
    # output lengths are max tokens: a request without output still asks for one token
    return build(path, seconds, prompt[keep], np.maximum(output[keep], 1), tasks, lines[keep],
                 {"format": "azure", "absolute": True}, options)


TRACE_IMPORTERS.register("azure")(Importer(looks_like, read_azure))
