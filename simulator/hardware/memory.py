"""What a model deployment holds in GPU memory, and the KV cache that is left.

A serving engine takes a share of each GPU's memory (vLLM's ``gpu_memory_utilization``,
default 0.9; TensorRT-LLM's ``free_gpu_memory_fraction`` plays the same part) and fills it
with, per GPU of a tensor-parallel group:

* **weights** — the GPU's shard of the model (:meth:`ModelShape.weight_bytes`: the linear
  layers in the GEMM dtype, embeddings and norms in bf16), and of the draft model's if one
  speculates;
* **activations** — the peak of one forward pass over the engine's largest batch of tokens
  (vLLM profiles a pass of ``max_num_batched_tokens``, 8,192 by default, and keeps that
  much free): the residual stream, the normed input, q/k/v, the MLP's gate and up outputs
  (bf16), and fp32 logits for the largest number of sequences (256);
* **runtime** — the CUDA context, CUDA graphs and communication buffers outside PyTorch's
  allocator: ``RUNTIME_BYTES`` (assumed: about 1.5 GiB is what vLLM's start-up logs show on
  H100s for graphs and context together; calibrate it where it matters);
* **KV cache** — everything left: its tokens are that over the bytes one token's K and V
  take on one GPU (the target's and, with a draft, the draft's).

:func:`memory_plan` refuses, in one line with the sizes and the smallest tensor-parallel
degree that fits, a deployment whose weights and activations leave no room for a KV cache.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from simulator.errors import HardwareError
from simulator.hardware.tables import BF16, GpuTables
from simulator.harness.presets import ModelShape

#: vLLM's default share of GPU memory the engine may use
DEFAULT_UTILIZATION = 0.9
#: vLLM's default tokens per scheduled batch, and its default most sequences per batch
MAX_BATCHED_TOKENS = 8192
MAX_SEQUENCES = 256
#: CUDA context, CUDA graphs and NCCL buffers (assumed; module docstring)
RUNTIME_BYTES = 1.5 * 2**30
FP32 = 4
GB = 1e9


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per GPU of one deployment: what the engine may use and how it is spent."""

    gpu: str
    tp: int
    dtype: str
    kv_dtype: str
    memory_bytes: float
    utilization: float
    weights_bytes: float
    activation_bytes: float
    runtime_bytes: float
    kv_bytes: float
    kv_bytes_per_token: int

    @property
    def usable_bytes(self) -> float:
        return self.memory_bytes * self.utilization

    @property
    def kv_tokens(self) -> int:
        """Tokens the KV cache holds (over the whole group: every GPU holds its heads of each token)."""
        return int(self.kv_bytes // self.kv_bytes_per_token) if self.kv_bytes > 0 else 0

    def to_dict(self) -> dict:
        return asdict(self) | {"kv_tokens": self.kv_tokens, "usable_bytes": self.usable_bytes}


def activation_bytes(shape: ModelShape, tp: int = 1, tokens: int = MAX_BATCHED_TOKENS,
                     sequences: int = MAX_SEQUENCES) -> float:
    """Peak activations of one pass over ``tokens`` tokens on one of ``tp`` GPUs (module docstring)."""
    local = shape.sharded(tp)
    per_token = 2 * local.hidden + local.head_dim * (local.heads + 2 * local.kv_heads) + 2 * local.active_intermediate
    return float(BF16 * tokens * per_token + FP32 * sequences * shape.vocab)


def memory_plan(gpu: GpuTables, target: ModelShape, draft: ModelShape | None = None,
                utilization: float = DEFAULT_UTILIZATION) -> MemoryPlan:
    """The memory of ``target`` (and ``draft``) served on ``gpu``'s tensor-parallel group in its
    dtypes; :class:`HardwareError` naming the sizes and the smallest degree that fits when
    nothing is left for a KV cache."""
    if not 0 < utilization <= 1:
        raise HardwareError(None, None, "gpu_memory_utilization", f"must be in (0, 1], got {utilization!r}")
    why = _shard_error(target, draft, gpu.tp)
    if why:
        raise HardwareError(None, None, "--tp", why)
    plan = _plan(gpu, gpu.tp, target, draft, utilization)
    if plan.kv_bytes > 0:
        return plan
    models = target.name + (f" + {draft.name}" if draft else "")
    need = plan.weights_bytes + plan.activation_bytes + plan.runtime_bytes
    fits = [tp for tp in _degrees(gpu) if tp > gpu.tp and not _shard_error(target, draft, tp)
            and _plan(gpu, tp, target, draft, utilization).kv_bytes > 0]
    hint = f"the smallest tensor parallelism that fits: --tp {fits[0]}" if fits else \
        f"no tensor parallelism measured on {gpu.gpu} ({', '.join(str(t) for t in _degrees(gpu))}) fits it"
    raise HardwareError(None, None, "--tp", f"{models} does not fit {gpu.gpu} at TP {gpu.tp} in {gpu.dtype}: "
                        f"{plan.weights_bytes / GB:.1f} GB of weights + {plan.activation_bytes / GB:.1f} GB of "
                        f"activations + {plan.runtime_bytes / GB:.1f} GB runtime per GPU, "
                        f"{need / GB:.1f} GB against {plan.usable_bytes / GB:.1f} GB usable "
                        f"({utilization:g} of {plan.memory_bytes / GB:.1f} GB); {hint}")


def _degrees(gpu: GpuTables) -> list[int]:
    measured = gpu.spec.get("measured", {}).get(gpu.backend, {})
    return [1, *measured.get("allreduce_gpus", [])]


def _shard_error(target: ModelShape, draft: ModelShape | None, tp: int) -> str | None:
    """Why ``tp`` GPUs cannot split ``target`` or ``draft`` (None when they can)."""
    for model in (target, draft):
        try:
            if model is not None:
                model.sharded(tp)
        except ValueError as exc:
            return str(exc)
    return None


def _plan(gpu: GpuTables, tp: int, target: ModelShape, draft: ModelShape | None, utilization: float) -> MemoryPlan:
    dtype_bytes = gpu.dtype_bytes
    models = [target] if draft is None else [target, draft]
    weights = sum(m.weight_bytes(tp, dtype_bytes) for m in models)
    activations = max(activation_bytes(m, tp) for m in models)
    per_token = sum(m.sharded(tp).kv_bytes_per_token(gpu.kv_dtype_bytes) for m in models)
    memory = float(gpu.spec["memory_bytes"])
    kv = memory * utilization - weights - activations - RUNTIME_BYTES
    return MemoryPlan(gpu.gpu, tp, gpu.dtype, gpu.kv_dtype, memory, utilization, weights, activations,
                      RUNTIME_BYTES, kv, per_token)
