"""The random streams of a run, named once for both engines.

One ``dispatch`` stream per run, one ``cold start`` stream (a replica pool's measured cold
starts), and one ``service`` stream per task keyed by the task's
name, so that changing one task's setup does not reshuffle another task's service times
and the two engines draw the same numbers from the same streams.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

import numpy as np


def task_key(task: str) -> int:
    """A stable integer for a task name (Python's ``hash`` is salted per process)."""
    return int.from_bytes(hashlib.sha256(task.encode()).digest()[:4], "little")


def service_stream(seed: int, task: str) -> np.random.Generator:
    """The service stream of ``task`` in a run of ``seed``."""
    return np.random.default_rng([seed, 1, task_key(task)])


def dispatch_stream(seed: int) -> np.random.Generator:
    """The dispatch stream of a run of ``seed`` (random dispatch rules draw from it)."""
    return np.random.default_rng(_dispatch_seed(seed))


@lru_cache(maxsize=64)
def _dispatch_seed(seed: int) -> np.random.SeedSequence:
    """The seed sequence of ``seed``'s dispatch stream, spawned once per seed: a sweep runs
    thousands of configurations on a few seeds, and spawning was half of a new stream's
    cost. (A generator reads its seed sequence's state and never changes it.)"""
    return np.random.SeedSequence(seed).spawn(1)[0]


def cold_start_stream(seed: int) -> np.random.Generator:
    """The cold-start stream of a run of ``seed`` (a replica pool draws measured cold starts)."""
    return np.random.default_rng([seed, 2])
