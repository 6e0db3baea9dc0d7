"""Draft acceptance in speculative decoding: how many of a row's drafted tokens the target
accepts in one step (the spec_decode kind's static batches and its continuous iterations)."""

from __future__ import annotations

import numpy as np


def draw_accepted(rng: np.random.Generator, alpha: float, k: int, size) -> np.ndarray:
    """Accepted drafts: each accepted with probability ``alpha`` until the first rejection, at most ``k``."""
    if alpha >= 1:
        return np.full(size, k)
    if alpha <= 0:
        return np.zeros(size, dtype=np.int64)
    return np.minimum(rng.geometric(1.0 - alpha, size) - 1, k)
