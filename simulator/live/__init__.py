"""Live runs: replay a trace against a real endpoint and record what it did, in the folder
format of observed runs (``simctl load``). Needs the ``live`` extra (httpx).

* :mod:`simulator.live.load` — :func:`run_load`: when calls are sent, stopping cleanly;
* :mod:`simulator.live.apis` — the batch endpoint and the streamed OpenAI endpoints;
* :mod:`simulator.live.runfolder` — the run folder (per-call files, summary, request log).
"""

from simulator.live.load import LoadOptions, LoadProgress, LoadResult, run_load

__all__ = ["LoadOptions", "LoadProgress", "LoadResult", "run_load"]
