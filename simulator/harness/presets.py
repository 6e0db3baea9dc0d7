"""Model shapes the harness builds with random weights (timing depends on shapes only).

Each preset copies the published ``config.json`` of the model it names: hidden size,
intermediate (MLP) size, layers, attention heads, key/value heads (grouped-query attention),
head dimension, vocabulary, whether the output head shares the embedding matrix, whether
the q/k/v projections have biases (Qwen2) and whether queries and keys are RMS-normalised
per head (Qwen3). ``tiny`` is a toy for tests; ``llama-68m`` and ``llama-160m`` are a real
draft/target pair small enough to time on a CPU.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from simulator.errors import UnknownPreset


@dataclass(frozen=True)
class ModelShape:
    """The architecture of a Llama/Qwen-style decoder."""

    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool
    qkv_bias: bool = False
    qk_norm: bool = False
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-6
    source: str = ""
    #: a mixture-of-experts MLP: ``experts`` experts of width ``intermediate`` each, a token
    #: routed to ``experts_per_token`` of them (0: a dense MLP of width ``intermediate``)
    experts: int = 0
    experts_per_token: int = 0

    def __post_init__(self) -> None:
        if self.heads % self.kv_heads:
            raise ValueError(f"{self.name}: heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")

    def _layer_weights(self) -> tuple[int, int]:
        """Weights of one layer: those of its linear layers (projections, experts, router),
        and those of its biases and norms."""
        linear = self.hidden * self.head_dim * 2 * (self.heads + self.kv_heads) \
            + 3 * self.hidden * self.intermediate * max(1, self.experts) + self.hidden * self.experts
        small = (self.head_dim * (self.heads + 2 * self.kv_heads) if self.qkv_bias else 0) \
            + 2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0)
        return linear, small

    def parameters(self) -> int:
        """Number of weights (embedding counted once when tied)."""
        linear, small = self._layer_weights()
        embed = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return self.layers * (linear + small) + embed + self.hidden

    def sharded(self, tp: int) -> ModelShape:
        """The part of the model one of ``tp`` tensor-parallel GPUs holds (Megatron-style, as
        vLLM, TensorRT-LLM and SGLang split it): query heads, the MLP's intermediate width
        and the vocabulary split ``tp`` ways; KV heads split too, or replicated so that each GPU
        holds one when there are fewer than ``tp``; the hidden size whole. ``ValueError``
        naming both numbers when ``tp`` does not divide them."""
        if tp == 1:
            return self
        if tp < 1:
            raise ValueError(f"tensor parallelism must be >= 1, got {tp}")
        if self.heads % tp:
            raise ValueError(f"{self.name}: tensor parallelism {tp} does not divide its {self.heads} attention heads")
        if self.kv_heads % tp and tp % self.kv_heads:
            raise ValueError(f"{self.name}: tensor parallelism {tp} neither divides its {self.kv_heads} KV heads "
                             f"nor is a multiple of them")
        if self.intermediate % tp:
            raise ValueError(f"{self.name}: tensor parallelism {tp} does not divide its MLP width {self.intermediate}")
        from dataclasses import replace

        return replace(self, name=f"{self.name}/tp{tp}", heads=self.heads // tp,
                       kv_heads=max(1, self.kv_heads // tp), intermediate=self.intermediate // tp)

    def weight_bytes(self, tp: int = 1, dtype_bytes: int = 2) -> float:
        """Bytes of weights one of ``tp`` GPUs holds: the linear layers in ``dtype_bytes`` per
        weight (fp8: 1), embeddings, output head and norms in bf16; embedding and output head
        split ``tp`` ways (vocabulary-parallel)."""
        linear, small = self.sharded(tp)._layer_weights()
        embed = -(-self.vocab // tp) * self.hidden * (1 if self.tied_embeddings else 2)
        return float(self.layers * linear * dtype_bytes + 2 * (self.layers * small + self.hidden + embed))

    @property
    def active_intermediate(self) -> int:
        """MLP width a token's activations pass through: the dense width, or the width of
        each of the experts it is routed to, times their number."""
        return self.intermediate * max(1, self.experts_per_token)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Bytes of K and V cache one token occupies over all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _hf(model: str) -> str:
    return f"config.json of {model} on the Hugging Face hub"


PRESETS: dict[str, ModelShape] = {s.name: s for s in [
    # Untied: with a tied head and tiny random weights every model just repeats its input.
    ModelShape("tiny", 64, 128, 2, 4, 2, 16, 256, False, source="toy shape for tests"),
    ModelShape("llama-68m", 768, 3072, 2, 12, 12, 64, 32000, False, source=_hf("JackFram/llama-68m")),
    # llama-68m's widths over 12 layers: the target SpecInfer pairs with llama-68m as its draft
    ModelShape("llama-160m", 768, 3072, 12, 12, 12, 64, 32000, False, source=_hf("JackFram/llama-160m")),
    ModelShape("qwen2.5-0.5b", 896, 4864, 24, 14, 2, 64, 151936, True, qkv_bias=True,
               rope_theta=1e6, source=_hf("Qwen/Qwen2.5-0.5B")),
    ModelShape("qwen2.5-1.5b", 1536, 8960, 28, 12, 2, 128, 151936, True, qkv_bias=True,
               rope_theta=1e6, source=_hf("Qwen/Qwen2.5-1.5B")),
    ModelShape("qwen2.5-7b", 3584, 18944, 28, 28, 4, 128, 152064, False, qkv_bias=True,
               rope_theta=1e6, source=_hf("Qwen/Qwen2.5-7B")),
    ModelShape("llama-2-7b", 4096, 11008, 32, 32, 32, 128, 32000, False, norm_eps=1e-5,
               source=_hf("meta-llama/Llama-2-7b-hf")),
    ModelShape("llama-2-13b", 5120, 13824, 40, 40, 40, 128, 32000, False, norm_eps=1e-5,
               source=_hf("meta-llama/Llama-2-13b-hf")),
    ModelShape("llama-2-70b", 8192, 28672, 80, 64, 8, 128, 32000, False, norm_eps=1e-5,
               source=_hf("meta-llama/Llama-2-70b-hf")),
    ModelShape("mistral-7b-v0.1", 4096, 14336, 32, 32, 8, 128, 32000, False, norm_eps=1e-5,
               source=_hf("mistralai/Mistral-7B-v0.1")),
    ModelShape("llama-3.1-8b", 4096, 14336, 32, 32, 8, 128, 128256, False, rope_theta=500_000.0,
               norm_eps=1e-5, source=_hf("meta-llama/Llama-3.1-8B")),
    ModelShape("qwen3-0.6b", 1024, 3072, 28, 16, 8, 128, 151936, True, qk_norm=True,
               rope_theta=1e6, source=_hf("Qwen/Qwen3-0.6B")),
    ModelShape("qwen3-4b", 2560, 9728, 36, 32, 8, 128, 151936, True, qk_norm=True,
               rope_theta=1e6, source=_hf("Qwen/Qwen3-4B")),
    ModelShape("qwen3-8b", 4096, 12288, 36, 32, 8, 128, 151936, False, qk_norm=True,
               rope_theta=1e6, source=_hf("Qwen/Qwen3-8B")),
    ModelShape("qwen3-14b", 5120, 17408, 40, 40, 8, 128, 151936, False, qk_norm=True,
               rope_theta=1e6, source=_hf("Qwen/Qwen3-14B")),
    ModelShape("qwen3-32b", 5120, 25600, 64, 64, 8, 128, 151936, False, qk_norm=True,
               rope_theta=1e6, source=_hf("Qwen/Qwen3-32B")),
    ModelShape("qwen2.5-72b", 8192, 29568, 80, 64, 8, 128, 152064, False, qkv_bias=True,
               rope_theta=1e6, source=_hf("Qwen/Qwen2.5-72B")),
    ModelShape("llama-3.1-70b", 8192, 28672, 80, 64, 8, 128, 128256, False, rope_theta=500_000.0,
               norm_eps=1e-5, source=_hf("meta-llama/Llama-3.1-70B")),
    ModelShape("mistral-7b", 4096, 14336, 32, 32, 8, 128, 32768, False, rope_theta=1e6,
               norm_eps=1e-5, source=_hf("mistralai/Mistral-7B-Instruct-v0.3")),
    # mixtures of experts: ``intermediate`` is each expert's width
    ModelShape("mixtral-8x7b", 4096, 14336, 32, 32, 8, 128, 32000, False, rope_theta=1e6, norm_eps=1e-5,
               experts=8, experts_per_token=2, source=_hf("mistralai/Mixtral-8x7B-v0.1")),
    ModelShape("qwen3-30b-a3b", 2048, 768, 48, 32, 4, 128, 151936, False, qk_norm=True, rope_theta=1e6,
               experts=128, experts_per_token=8, source=_hf("Qwen/Qwen3-30B-A3B")),
]}


def get_preset(name: str) -> ModelShape:
    """The preset ``name``; :class:`UnknownPreset` listing the valid names otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise UnknownPreset(None, None, None, f"unknown model preset {name!r}; valid: {', '.join(PRESETS)}") from None


#: model_type -> (q/k/v projections carry biases, queries and keys RMS-normalised per head)
ARCHITECTURES = {"llama": (False, False), "mistral": (False, False), "qwen2": (True, False), "qwen3": (False, True),
                 "mixtral": (False, False), "qwen3_moe": (False, True)}


def shape_from_config(path: str | Path) -> ModelShape:
    """The shape a Hugging Face ``config.json`` describes (Llama, Mistral, Qwen2, Qwen3 decoders,
    and the Mixtral and Qwen3-MoE mixtures of experts).

    Reads ``hidden_size``, ``intermediate_size``, ``num_hidden_layers``,
    ``num_attention_heads``, ``num_key_value_heads`` (default: the attention heads),
    ``head_dim`` (default: hidden / heads), ``vocab_size``, ``tie_word_embeddings``,
    ``rope_theta``, ``rms_norm_eps``; the q/k/v biases and the q/k norms follow from
    ``model_type`` (an explicit ``attention_bias`` wins). A mixture of experts also reads
    ``num_local_experts`` (Mixtral) or ``num_experts`` (Qwen3-MoE), ``num_experts_per_tok`` and,
    for Qwen3-MoE, ``moe_intermediate_size`` (each expert's width; every layer sparse).
    :class:`UnknownPreset` names the file and the field that is missing or wrong."""
    from simulator import inputs

    where = str(path)
    raw = inputs.read_json(path, UnknownPreset, "config.json")
    if not isinstance(raw, dict):
        raise UnknownPreset(where, None, None, "a config.json is a JSON object")
    model_type = raw.get("model_type")
    if model_type not in ARCHITECTURES:
        raise UnknownPreset(where, None, "model_type", f"{model_type!r} is not a decoder simctl can compose "
                            f"(valid: {', '.join(ARCHITECTURES)})")

    def need(field: str, default: Any = None) -> int:
        value = raw.get(field, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UnknownPreset(where, None, field, f"must be an integer >= 1, got {value!r}")
        return value

    heads = need("num_attention_heads")
    hidden = need("hidden_size")
    bias, qk_norm = ARCHITECTURES[model_type]
    attention_bias = raw.get("attention_bias", bias)
    experts = per_token = 0
    intermediate_field = "intermediate_size"
    if model_type == "mixtral":
        experts, per_token = need("num_local_experts"), need("num_experts_per_tok")
    elif model_type == "qwen3_moe":
        experts, per_token = need("num_experts"), need("num_experts_per_tok")
        intermediate_field = "moe_intermediate_size"
    try:
        return ModelShape(
            name=Path(path).parent.name or Path(path).stem, hidden=hidden, intermediate=need(intermediate_field),
            experts=experts, experts_per_token=per_token,
            layers=need("num_hidden_layers"), heads=heads, kv_heads=need("num_key_value_heads", heads),
            head_dim=need("head_dim", hidden // heads), vocab=need("vocab_size"),
            tied_embeddings=bool(raw.get("tie_word_embeddings", False)), qkv_bias=bool(attention_bias),
            qk_norm=qk_norm, rope_theta=float(raw.get("rope_theta", 10_000.0)),
            norm_eps=float(raw.get("rms_norm_eps", 1e-6)), source=f"{where} ({model_type})")
    except (TypeError, ValueError) as exc:
        raise UnknownPreset(where, None, None, str(exc)) from None


def load_shape(name_or_path: str | Path) -> ModelShape:
    """A preset by name, or the shape of a Hugging Face ``config.json`` at a path."""
    if str(name_or_path) in PRESETS:
        return PRESETS[str(name_or_path)]
    if Path(name_or_path).suffix == ".json" or Path(name_or_path).exists():
        return shape_from_config(name_or_path)
    return get_preset(str(name_or_path))
