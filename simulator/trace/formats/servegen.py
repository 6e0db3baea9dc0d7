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
import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from simulator import inputs
from simulator.errors import TraceError
from simulator.trace.formats._common import MAX_COUNT
from simulator.trace.formats._requests import DEFAULT_OPTIONS, TRACE_IMPORTERS, Importer, ImportOptions, bad_rows, build
from simulator.trace.model import Trace

if TYPE_CHECKING:
    pass

DISTS = ("Gamma", "Weibull", "")


#: The arrival shapes a window may give: outside, a Weibull's mean (Gamma(1 + 1/k)) overflows
#: or draws underflow to gaps of zero, and a window never ends.
MIN_SHAPE, MAX_SHAPE = 0.01, 1000.0
#: The most requests a file may ask for in all.
MAX_REQUESTS = 50_000_000


def _window_arrivals(rng: np.random.Generator, start: float, end: float, mean: float, shape: float,
                     dist: str) -> np.ndarray:
    """Arrival instants in ``[start, end)``: gaps of mean ``mean`` from the window's Gamma or
    Weibull of ``shape``, added one after another from ``start``; drawn in blocks of about
    the window's expected count (the block's draws past the window's end are dropped)."""
    out: list[np.ndarray] = []
    t = start
    block = max(16, int(1.2 * (end - start) / mean) + 16)
    scale = mean / shape if dist == "Gamma" else mean / math.gamma(1 + 1 / shape)
    while True:
        gaps = rng.gamma(shape, scale, block) if dist == "Gamma" else rng.weibull(shape, block) * scale
        instants = t + np.cumsum(gaps)
        inside = instants < end
        if not inside.all():
            out.append(instants[:int(np.argmin(inside))])
            return np.concatenate(out)
        out.append(instants)
        t = float(instants[-1])


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
    raw = inputs.read_json(given, TraceError, "ServeGen dataset")
    if not isinstance(raw, dict):
        raise TraceError(given, None, None, "must be an object of periods ({start: {input_tokens, output_tokens}})")
    out = {}
    for start, pdfs in raw.items():
        try:
            period = float(start)
        except ValueError:
            raise TraceError(given, f"period {start!r}", None, "a period's key must be its start in seconds") from None
        if not isinstance(pdfs, dict):
            raise TraceError(given, f"period {start}", None, "must be an object with input_tokens and output_tokens")
        entry = {}
        for key in ("input_tokens", "output_tokens"):
            try:
                pdf = ast.literal_eval(pdfs[key]) if isinstance(pdfs[key], str) else pdfs[key]
                if not isinstance(pdf, dict):
                    raise ValueError
                values = np.array([float(k) for k in pdf], dtype=float)
                probs = np.array([float(v) for v in pdf.values()], dtype=float)
            except (KeyError, ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
                raise TraceError(given, f"period {start}", key, "missing or not a {length: probability} dict") from None
            if not (np.isfinite(values).all() and (values >= 0).all() and (values <= MAX_COUNT).all()):
                raise TraceError(given, f"period {start}", key, "lengths must be finite token counts >= 0")
            if not (np.isfinite(probs).all() and (probs >= 0).all()):
                raise TraceError(given, f"period {start}", key, "probabilities must be finite and >= 0")
            if values.size and probs.sum() > 0:
                entry[key] = (values, probs / probs.sum())
        # A period without traffic has empty PDFs: the previous period's lengths carry on.
        if len(entry) == 2:
            out[period] = entry
    return out or None


def read_servegen(path: str | Path, options: ImportOptions = DEFAULT_OPTIONS) -> Trace:
    import pandas as pd

    path = Path(path)
    frame = inputs.read_csv(path, TraceError, "ServeGen trace", header=None, dtype=str, keep_default_na=False,
                            names=["start", "rate", "cv", "dist", "p1", "p2"])
    lines = np.arange(len(frame)) + 1
    start = pd.to_numeric(frame["start"], errors="coerce").to_numpy(float)
    rate = pd.to_numeric(frame["rate"], errors="coerce").to_numpy(float)
    shape = pd.to_numeric(frame["p1"], errors="coerce").to_numpy(float)
    dist = frame["dist"].str.strip().to_numpy(object)
    bad_start = ~np.isfinite(start) | (start < 0)
    bad_rate = ~np.isfinite(rate) | (rate < 0)
    bad_dist = np.array([d not in DISTS for d in dist]) | ((rate > 0) & np.array([d == "" for d in dist]))
    bad_shape = (rate > 0) & (~np.isfinite(shape) | (shape < MIN_SHAPE) | (shape > MAX_SHAPE))
    keep = bad_rows(path, lines, bad_start | bad_rate | bad_dist | bad_shape, [
        (bad_start, "window_start_s", "must be a number of seconds >= 0"),
        (bad_rate, "rate_rps", "must be a number >= 0"),
        (bad_dist, "arrival_dist", "must be Gamma or Weibull (empty only when the rate is 0)"),
        (bad_shape, "param1", f"must be a shape in [{MIN_SHAPE:g}, {MAX_SHAPE:g}]"),
    ], options)
    start, rate, shape, dist = start[keep], rate[keep], shape[keep], dist[keep]
    window = float(np.median(np.diff(np.sort(start)))) if start.size > 1 else 600.0
    # Refused up front: a file asking for more requests than any trace holds (a rate of 1e9,
    # windows 1e12 s apart) would only run out of memory drawing them.
    expected = float(np.sum(rate * window))
    if not expected <= MAX_REQUESTS:
        first = int(np.flatnonzero(np.cumsum(rate * window) > MAX_REQUESTS)[0]) if np.isfinite(expected) else 0
        raise TraceError(path, f"line {int(lines[keep][first])}", "rate_rps",
                         f"asks for about {expected:.3g} requests ({window:g}-s windows); at most {MAX_REQUESTS:,}")
    rng = np.random.default_rng(options.seed)
    times, origin_lines = [], []
    for s, r, k, d, ln in zip(start, rate, shape, dist, lines[keep], strict=True):
        if r <= 0:
            continue
        arrivals = _window_arrivals(rng, s, s + window, 1.0 / r, k, d)
        times.append(arrivals)
        origin_lines.append(np.full(arrivals.size, ln))
    t = np.concatenate(times) if times else np.zeros(0)
    if not t.size:
        raise TraceError(path, None, None, "every window has rate 0: no arrivals to synthesise")
    origin = np.concatenate(origin_lines)
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
                 origin, meta, options)


TRACE_IMPORTERS.register("servegen")(Importer(looks_like, read_servegen))
