"""The run folder ``simctl load`` writes: the folder format ``simctl observed`` reads.

::

    RUN_DIR/
      batch_arrivals.json       the calls as sent (simctl-trace/1): ids, scheduled instants,
                                tasks, the texts sent; ``read_observed`` finds it here
      batch_0000.json ...       one per finished call, written (atomically) when it finishes
      simulation_summary.json   every finished call's record, the run's counts and settings
      requests.parquet          one row per prompt request (see :data:`REQUEST_COLUMNS`)

The summary and request log are written (atomically) before the first call, again as calls
finish and at the end, so the folder reads as a run at any moment (a kill leaves one).

Each call's record has the fields of the users' client: ``batch_id, batch_size,
scheduled_arrival_time, actual_send_time, request_duration, completion_time, status_code,
prompt_idxs, response, error`` (seconds from the start of the run). Unlike their client,
a call that got no HTTP response (a timeout, a dropped connection) gets its file too
(``status_code: null`` and the error), so a run stopped part-way keeps every finished call.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pandas as pd

from simulator.errors import LoadError
from simulator.observed import SUMMARY_FILE
from simulator.outputs import check_output_name, open_output
from simulator.trace.formats import save_trace
from simulator.trace.model import Trace

ARRIVALS_FILE = "batch_arrivals.json"
REQUESTS_FILE = "requests.parquet"
#: The per-request log: one row per prompt request sent. Instants are seconds from the
#: start of the run (``NaN``: did not happen); ``status`` is ok, error, timeout or
#: interrupted (still in flight when the run stopped); ``itls_s`` the gaps between
#: streamed tokens (empty for the batch API, which does not stream).
REQUEST_COLUMNS = ("call_id", "prompt_index", "task", "scheduled_at", "sent_at", "first_token_at",
                   "done_at", "status", "http_status", "error", "prompt_tokens", "output_tokens", "itls_s")
_OURS = (ARRIVALS_FILE, SUMMARY_FILE, REQUESTS_FILE)


def batch_file(batch_id: int) -> str:
    """The file name of one call's record (``batch_0007.json``)."""
    return f"batch_{batch_id:04d}.json"


class RunFolder:
    """Where one load run goes: refused if it exists (unless ``force``, which clears the files
    an earlier run wrote there), if it is the trace's own folder or holds the trace."""

    def __init__(self, path: str | Path, force: bool = False, trace_path: str | Path | None = None) -> None:
        check_output_name(path, "folder")
        self.path = Path(path)
        self.force = force
        if self.path.exists() and not self.path.is_dir():
            raise LoadError(self.path, None, None, "exists and is not a folder")
        if trace_path is not None and Path(trace_path).exists():
            trace_dir = Path(trace_path).resolve().parent
            target = self.path.resolve()
            if target == trace_dir or target in trace_dir.parents:
                raise LoadError(self.path, None, None, f"would write into the folder of the trace {trace_path}; "
                                "give a new folder for the run")
        if self.path.exists() and not force:
            raise LoadError(self.path, None, None, "exists; give a new folder, or --force to replace its run")
        if not self.path.parent.exists():
            raise LoadError(self.path, None, None, f"folder {self.path.parent} does not exist")

    def create(self) -> None:
        """Make the folder (clearing an earlier run's files from it, with ``force``)."""
        self.path.mkdir(exist_ok=True)
        for old in self.path.iterdir():
            if old.name in _OURS or (old.name.startswith("batch_") and old.suffix == ".json"):
                with contextlib.suppress(OSError):
                    old.unlink()

    def write_arrivals(self, trace: Trace) -> None:
        save_trace(trace, self.path / ARRIVALS_FILE, force=True)

    def write_call(self, record: dict[str, Any]) -> None:
        self._json(batch_file(int(record["batch_id"])), record)

    def write_summary(self, summary: dict[str, Any]) -> None:
        self._json(SUMMARY_FILE, summary)

    def write_requests(self, requests: pd.DataFrame) -> None:
        with open_output(self.path / REQUESTS_FILE, "wb", force=True) as fh:
            requests.to_parquet(fh, index=False)

    def _json(self, name: str, data: Any) -> None:
        with open_output(self.path / name, force=True) as fh:
            json.dump(data, fh, indent=2, default=str)
