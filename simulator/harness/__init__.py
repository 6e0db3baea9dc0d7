"""The measurement harness: real batched speculative decoding in PyTorch.

* :mod:`~simulator.harness.presets` — model shapes (published configs) with random weights;
* :mod:`~simulator.harness.decoder` — a Llama/Qwen-style decoder with a per-row static KV cache;
* :mod:`~simulator.harness.specdec` — batched speculative decoding (ragged / lockstep),
  acceptance sources, plain decoding for reference;
* :mod:`~simulator.harness.timing` — CUDA events / perf_counter, warm-up, repeats, bandwidth;
* :mod:`~simulator.harness.profiler` — the grid ``simctl profile`` measures, writing a profile;
* :mod:`~simulator.harness.fit` — per-operation cost fits and their check;
* :mod:`~simulator.harness.optable` — this device's per-op tables (GEMM, attention,
  elementwise) for the composition (``simctl profile --measure-ops``).

Needs torch (the optional extra ``harness``); never imports simpy, and nothing in replay
imports this package.
"""
