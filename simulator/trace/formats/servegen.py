"""ServeGen per-client workload descriptions: arrivals synthesised window by window.

``chunk-N-trace.csv`` (no header) has one row per window:
``window_start_s,rate_rps,cv,arrival_dist,param1,param2``; ``arrival_dist`` is ``Gamma``,
``Weibull`` or empty (rate 0). For each window with a positive rate, gaps are drawn from the
named distribution with its shape (``param1``: the Gamma or Weibull shape) and a scale set
so the mean gap is ``1 / rate`` (the window's observed rate; the published ``param2`` scale
was fitted to the gaps inside the window and does not always agree with the rate), until the
window ends. Lengths: where the sibling ``chunk-N-dataset.json`` (or ``--dataset``) exists,
each request's prompt and output tokens are drawn from the ``input_tokens`` /
``output_tokens`` PDFs of the latest 6-hour period starting at or before it (PDFs stored as
Python dict literals); otherwise the counts are left to the profile. Task ``servegen``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.special import gamma as gamma_fn

from simulator.errors import TraceError
from simulator.trace.formats._requests import DEFAULT_OPTIONS, TRACE_IMPORTERS, Importer, ImportOptions, bad_rows, build
from simulator.trace.model import Trace

DISTS = ("Gamma", "Weibull", "")


def looks_like(first_line: str) -> bool:
    parts = [p.strip() for p in first_line.split(",")]
    if len(parts) != 6 or parts[3] not in DISTS:
        return False
    try:
        [float(parts[i]) for i in (0, 1, 2)]
    except ValueError:
        return False
    return True


def _dataset(path: Path, options: ImportOptions) -> dict[float, dict[str, tuple[np.ndarray, np.ndarray]]] | None:
    given = Path(options.dataset) if options.dataset else path.with_name(path.name.replace("-trace.csv", "-dataset.json"))
    if given == path or not given.exists():
        if options.dataset:
            raise TraceError(given, None, None, "no such file (the ServeGen dataset of length PDFs)")
        return None
    import json

    raw = json.loads(given.read_text())
    out = {}
    for start, pdfs in raw.items():
        entry = {}
        for key in ("input_tokens", "output_tokens"):
            try:
                pdf = ast.literal_eval(pdfs[key]) if isinstance(pdfs[key], str) else pdfs[key]
            except (KeyError, ValueError, SyntaxError):
                raise TraceError(given, f"period {start}", key, "missing or not a {length: probability} dict") from None
            values = np.array([float(k) for k in pdf], dtype=float)
            probs = np.array([float(v) for v in pdf.values()], dtype=float)
            if values.size and probs.sum() > 0:
                entry[key] = (values, probs / probs.sum())
        # A period without traffic has empty PDFs: the previous period's lengths carry on.
        if len(entry) == 2:
            out[float(start)] = entry
    return out or None


def read_servegen(path: str | Path, options: ImportOptions = DEFAULT_OPTIONS) -> Trace:
    path = Path(path)
    frame = pd.read_csv(path, header=None, dtype=str, keep_default_na=False,
                        names=["start", "rate", "cv", "dist", "p1", "p2"])
    lines = np.arange(len(frame)) + 1
    start = pd.to_numeric(frame["start"], errors="coerce").to_numpy(float)
    rate = pd.to_numeric(frame["rate"], errors="coerce").to_numpy(float)
    shape = pd.to_numeric(frame["p1"], errors="coerce").to_numpy(float)
    dist = frame["dist"].str.strip().to_numpy(object)
    bad_start = ~np.isfinite(start) | (start < 0)
    bad_rate = ~np.isfinite(rate) | (rate < 0)
    bad_dist = np.array([d not in DISTS for d in dist]) | ((rate > 0) & np.array([d == "" for d in dist]))
    bad_shape = (rate > 0) & (~np.isfinite(shape) | (shape <= 0))
    keep = bad_rows(path, lines, bad_start | bad_rate | bad_dist | bad_shape, [
        (bad_start, "window_start_s", "must be a number of seconds >= 0"),
        (bad_rate, "rate_rps", "must be a number >= 0"),
        (bad_dist, "arrival_dist", "must be Gamma or Weibull (empty only when the rate is 0)"),
        (bad_shape, "param1", "must be a shape > 0"),
    ], options)
    start, rate, shape, dist = start[keep], rate[keep], shape[keep], dist[keep]
    window = float(np.median(np.diff(np.sort(start)))) if start.size > 1 else 600.0
    rng = np.random.default_rng(options.seed)
    times, origin_lines = [], []
    for s, r, k, d, ln in zip(start, rate, shape, dist, lines[keep], strict=True):
        if r <= 0:
            continue
        mean = 1.0 / r
        t = s
        while True:
            if d == "Gamma":
                gap = rng.gamma(k, mean / k)
            else:
                gap = rng.weibull(k) * mean / gamma_fn(1 + 1 / k)
            t += gap
            if t >= s + window:
                break
            times.append(t)
            origin_lines.append(ln)
    if not times:
        raise TraceError(path, None, None, "every window has rate 0: no arrivals to synthesise")
    t = np.array(times)
    pdfs = _dataset(path, options)
    prompt = output = None
    if pdfs:
        periods = np.array(sorted(pdfs))
        which = periods[np.maximum(np.searchsorted(periods, t, side="right") - 1, 0)]
        prompt = np.zeros(t.size, dtype=np.int64)
        output = np.zeros(t.size, dtype=np.int64)
        for p in periods:
            idx = np.flatnonzero(which == p)
            for key, arr in (("input_tokens", prompt), ("output_tokens", output)):
                values, probs = pdfs[p][key]
                arr[idx] = np.maximum(np.rint(rng.choice(values, size=idx.size, p=probs)), 1)
    meta = {"format": "servegen", "synthesised": True, "seed": options.seed, "window_s": window,
            "lengths": "dataset PDFs" if pdfs else "profile defaults"}
    if t.min() > 0:
        meta["first_arrival_s"] = float(t.min())  # before the shift to 0
    return build(path, t, prompt, output, np.full(t.size, "servegen", dtype=object),
                 np.array(origin_lines), meta, options)


TRACE_IMPORTERS.register("servegen")(Importer(looks_like, read_servegen))
