"""Model configuration for the decoder family (Llama / SmolLM2, Qwen2 / Qwen2.5, Qwen3).

`ModelConfig` is frozen and hashable so it can be a static argument of jitted functions.
`ModelConfig.from_hf_dict` reads a transformers `config.json` dictionary (transformers 4.x
`rope_theta`/`rope_scaling` keys and 5.x `rope_parameters` alike).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

# HF `architectures` entry / `model_type` -> our family name. Families differ only in flags.
_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
_MODEL_TYPES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
_ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")
_DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape and flags of one decoder-only transformer.

    Attributes:
      vocab_size: V, rows of the embedding table.
      hidden_size: D, the residual stream width.
      intermediate_size: F, SwiGLU hidden width.
      num_layers: L.
      num_heads: N query heads.
      num_kv_heads: K key/value heads (GQA: N must be a multiple of K).
      head_dim: H.
      rope_theta: RoPE base frequency.
      rope_scaling: None or a dict with "rope_type" in default/linear/dynamic/llama3/yarn
        plus that type's parameters (HF names: factor, low_freq_factor, high_freq_factor,
        original_max_position_embeddings, beta_fast, beta_slow, attention_factor...).
      rms_norm_eps: epsilon inside every RMSNorm.
      qkv_bias: q/k/v projections carry a bias (Qwen2, Llama attention_bias).
      o_bias: the attention output projection carries a bias (Llama attention_bias, Qwen3).
      mlp_bias: gate/up/down projections carry a bias (Llama mlp_bias).
      qk_norm: per-head RMSNorm on q and k before RoPE (Qwen3).
      tie_embeddings: the LM head reuses the embedding table.
      max_position_embeddings: context length the checkpoint was trained for.
      family: "llama", "qwen2" or "qwen3".
      architecture: the HF class name the config came from.
      dtype: parameter dtype name ("float32", "bfloat16", "float16").
      bos_token_id / eos_token_ids / pad_token_id: special ids when the config names them.
      remat: rematerialise each decoder layer in the backward pass (``jax.checkpoint`` of the
        layer body inside the layer scan): a gradient keeps only every layer's input instead of
        all its activations (attention logits included), for one more forward's compute. Off
        for inference (no effect without a gradient); the SFT trainer turns it on. Not part of
        the HF config (``to_hf_dict`` leaves it out).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rope_scaling: Mapping[str, Any] | None = None
    rms_norm_eps: float = 1e-6
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    tie_embeddings: bool = False
    max_position_embeddings: int = 4096
    family: str = "llama"
    architecture: str = "LlamaForCausalLM"
    dtype: str = "float32"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    remat: bool = False

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                     "num_heads", "num_kv_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"ModelConfig.num_heads={self.num_heads} is not a multiple of "
                f"num_kv_heads={self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim must be even for RoPE, got {self.head_dim}")
        if self.family not in ("llama", "qwen2", "qwen3"):
            raise ValueError(f"ModelConfig.family must be llama/qwen2/qwen3, got {self.family!r}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"ModelConfig.dtype must be one of {_DTYPES}, got {self.dtype!r}")
        if self.rope_scaling is not None:
            scaling = dict(self.rope_scaling)
            rope_type = scaling.get("rope_type", scaling.get("type", "default"))
            if rope_type not in _ROPE_TYPES:
                raise ValueError(
                    f"ModelConfig.rope_scaling: unsupported rope_type {rope_type!r} "
                    f"(supported: {_ROPE_TYPES})")
            scaling["rope_type"] = rope_type
            scaling.pop("type", None)
            scaling.pop("rope_theta", None)
            # Stored as a read-only sorted tuple view so the config stays hashable.
            object.__setattr__(self, "rope_scaling", _FrozenDict(scaling))
        object.__setattr__(self, "eos_token_ids", tuple(int(i) for i in self.eos_token_ids))

    # Hash/eq include rope_scaling through its frozen form; needed for jit static args.
    def __hash__(self) -> int:
        # Shallow (astuple would deep-copy on every jit dispatch).
        return hash(tuple(getattr(self, f.name) for f in dataclasses.fields(self)))

    @property
    def num_groups(self) -> int:
        """G: query heads per KV head."""
        return self.num_heads // self.num_kv_heads

    @property
    def rope_type(self) -> str:
        """The RoPE variant: "default" without rope_scaling, else its "rope_type" (e.g. "llama3").
        """
        return "default" if self.rope_scaling is None else self.rope_scaling["rope_type"]

    def replace(self, **changes: Any) -> "ModelConfig":
        """A copy of this config with the given fields changed (the config is frozen)."""
        return dataclasses.replace(self, **changes)

    def num_params(self) -> int:
        """Parameter count (embedding counted once when tied)."""
        d, f, h = self.hidden_size, self.intermediate_size, self.head_dim
        n, k = self.num_heads, self.num_kv_heads
        per_layer = d * n * h + 2 * d * k * h + n * h * d + 3 * d * f + 2 * d
        per_layer += (n + 2 * k) * h if self.qkv_bias else 0
        per_layer += d if self.o_bias else 0
        per_layer += 2 * f + d if self.mlp_bias else 0
        per_layer += 2 * h if self.qk_norm else 0
        head = 0 if self.tie_embeddings else d * self.vocab_size
        return self.vocab_size * d + self.num_layers * per_layer + d + head

    @classmethod
    def from_hf_dict(cls, hf: Mapping[str, Any], path: str = "config.json",
                     dtype: str | None = None) -> "ModelConfig":
        """Builds a config from a transformers config.json dictionary.

        `path` only labels error messages. Unknown architectures raise ValueError naming the
        file and the `architectures` / `model_type` key.
        """
        if not isinstance(hf, Mapping):
            raise TypeError(f"{path}: expected a JSON object, got {type(hf).__name__}")
        archs = hf.get("architectures") or []
        family = None
        architecture = None
        for arch in archs:
            if arch in _ARCHITECTURES:
                family, architecture = _ARCHITECTURES[arch], arch
                break
        if family is None and archs:
            raise ValueError(
                f"{path}: unknown architecture in key 'architectures': {archs!r}; supported: "
                f"{sorted(_ARCHITECTURES)}")
        if family is None:
            model_type = hf.get("model_type")
            if model_type not in _MODEL_TYPES:
                raise ValueError(
                    f"{path}: unknown model_type {model_type!r} (and no 'architectures' key); "
                    f"supported: {sorted(_MODEL_TYPES)}")
            family = _MODEL_TYPES[model_type]
            architecture = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                            "qwen3": "Qwen3ForCausalLM"}[family]

        def need(key: str) -> Any:
            if key not in hf:
                raise ValueError(f"{path}: missing required key {key!r}")
            return hf[key]

        act = hf.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise ValueError(f"{path}: key 'hidden_act' is {act!r}; only silu (SwiGLU) is "
                             "supported")
        if hf.get("use_sliding_window", False):
            raise ValueError(f"{path}: key 'use_sliding_window' is true; sliding-window "
                             "attention is not supported")
        hidden = int(need("hidden_size"))
        heads = int(need("num_attention_heads"))
        head_dim = hf.get("head_dim") or hidden // heads
        rope_params = dict(hf.get("rope_parameters") or {})
        legacy_scaling = hf.get("rope_scaling")
        if legacy_scaling:
            rope_params.update(legacy_scaling)
        theta = rope_params.get("rope_theta", hf.get("rope_theta", 10000.0))
        rope_type = rope_params.get("rope_type", rope_params.get("type", "default"))
        scaling = None
        if rope_type != "default":
            scaling = {k: v for k, v in rope_params.items() if k not in ("rope_theta", "type")}
            scaling["rope_type"] = rope_type
        eos = hf.get("eos_token_id")
        eos_ids = () if eos is None else (tuple(eos) if isinstance(eos, (list, tuple)) else (eos,))
        if dtype is None:
            dtype = "float32"
        attention_bias = bool(hf.get("attention_bias", False))
        return cls(
            vocab_size=int(need("vocab_size")),
            hidden_size=hidden,
            intermediate_size=int(need("intermediate_size")),
            num_layers=int(need("num_hidden_layers")),
            num_heads=heads,
            num_kv_heads=int(hf.get("num_key_value_heads") or heads),
            head_dim=int(head_dim),
            rope_theta=float(theta),
            rope_scaling=scaling,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            # Qwen2 always has q/k/v bias and no o bias; Llama/Qwen3 use attention_bias for all.
            qkv_bias=True if family == "qwen2" else attention_bias,
            o_bias=False if family == "qwen2" else attention_bias,
            mlp_bias=bool(hf.get("mlp_bias", False)),
            qk_norm=family == "qwen3",
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
            family=family,
            architecture=architecture,
            dtype=dtype,
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=eos_ids,
            pad_token_id=hf.get("pad_token_id"),
        )

    def to_hf_dict(self) -> dict[str, Any]:
        """The transformers config.json dictionary for this config (used by the converter)."""
        rope = {"rope_theta": self.rope_theta, "rope_type": self.rope_type}
        if self.rope_scaling is not None:
            rope.update(dict(self.rope_scaling))
        out: dict[str, Any] = {
            "architectures": [self.architecture],
            "model_type": self.family,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": rope,
            "tie_word_embeddings": self.tie_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "attention_bias": self.qkv_bias if self.family != "qwen2" else False,
            "mlp_bias": self.mlp_bias,
            "torch_dtype": self.dtype,
        }
        if self.bos_token_id is not None:
            out["bos_token_id"] = self.bos_token_id
        if self.eos_token_ids:
            out["eos_token_id"] = (self.eos_token_ids[0] if len(self.eos_token_ids) == 1
                                   else list(self.eos_token_ids))
        if self.pad_token_id is not None:
            out["pad_token_id"] = self.pad_token_id
        return out


class _FrozenDict(Mapping[str, Any]):
    """A hashable read-only mapping (rope scaling parameters inside a frozen config)."""

    def __init__(self, data: Mapping[str, Any]):
        self._items = tuple(sorted((str(k), _freeze(v)) for k, v in data.items()))
        self._dict = dict(self._items)

    def __getitem__(self, key: str) -> Any:
        return self._dict[key]

    def __iter__(self):
        return iter(self._dict)

    def __len__(self) -> int:
        return len(self._dict)

    def __hash__(self) -> int:
        return hash(self._items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self) == dict(other)

    def __repr__(self) -> str:
        return f"{self._dict!r}"


def _freeze(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value
