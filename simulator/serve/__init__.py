"""``simctl serve``: the modeled server run for real, with real timers and concurrency.

:mod:`simulator.serve.runtime` runs a scenario's router, queues, workers, continuous
engines, dispatch rules, GPU locks and queue limits on asyncio, deciding with the simulator's
own policy, dispatch and continuous-batching classes; :mod:`simulator.serve.backends` serves batches (``sleep`` on the profile's times,
``harness`` on the torch decoder, ``openai`` on real engines); :mod:`simulator.serve.app` is
the HTTP layer (FastAPI): the users' batch endpoint, OpenAI-compatible completions,
Prometheus metrics, behind :mod:`simulator.serve.guard`'s limits (API key, body size, read
timeout, JSON nesting, requests in flight). Needs the ``serve`` extra (fastapi, uvicorn, prometheus-client), which
only :mod:`simulator.serve.app` imports.
"""

from simulator.serve.backends import BACKENDS, Backend, HarnessBackend, OpenAIBackend, SleepBackend, backend_from_spec
from simulator.serve.runtime import Clock, PromptFailed, PromptJob, Runtime, ServeBatch, first_gpu_task

__all__ = [
    "BACKENDS",
    "Backend",
    "Clock",
    "HarnessBackend",
    "OpenAIBackend",
    "PromptFailed",
    "PromptJob",
    "Runtime",
    "ServeBatch",
    "SleepBackend",
    "backend_from_spec",
    "first_gpu_task",
]
