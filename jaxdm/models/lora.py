"""LoRA as a parameter transform: ``merge(params, adapters) -> params`` with low-rank deltas.

Why a transform and not ``qwix``: qwix (PyPI 0.1.8) adds LoRA by intercepting the matmuls of
flax modules (``qwix.apply_lora_to_model`` on nnx / linen models, matching module paths).
jaxdm's decoder is plain functions over a parameter dict (``jaxdm.models.decoder``), with no
flax modules to intercept, so qwix has nothing to attach to. A transform keeps every decoder
entry point (forward, packed scoring, sampling, export) unchanged: the adapted model is just
other parameters.

Adapted projections (stacked over layers L, see ``decoder``'s parameter layout):
  q [L, D, N, H], k / v [L, D, K, H], gate / up [L, D, F]: input D, output the rest
  o [L, N, H, D]: input N·H, output D;   down [L, F, D]: input F, output D
For a weight W with input size I and output size O the adapter is A [L, I, r], B [L, r, O] and

    W' = W + (α / r) · A @ B    (reshaped to W's shape)

so x·W' = x·W + (α / r)·(x·A)·B (the unmerged form; ``adapt``). A starts
normal with std 1/√I, B at zero, so training starts at the base model (Hu et al., 2021).
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from safetensors.numpy import load_file, save_file

from jaxdm.jsonl import write_json
from jaxdm.models import load_pretrained
from jaxdm.models.decoder import Adapted
from jaxdm.models.smollm2 import smollm2

# weight name -> number of leading (after L) axes that form the input
TARGETS: dict[str, int] = {"q": 1, "k": 1, "v": 1, "o": 2, "gate": 1, "up": 1, "down": 1}


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """rank r, α (scale α / r), and which projections get adapters."""

    rank: int = 32
    alpha: float = 32.0
    targets: tuple[str, ...] = tuple(TARGETS)

    def __post_init__(self):
        if self.rank < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {self.rank}")
        if not math.isfinite(self.alpha) or self.alpha <= 0:
            raise ValueError(f"LoRA alpha must be a positive finite number, got {self.alpha}")
        bad = sorted(set(self.targets) - set(TARGETS))
        if bad or not self.targets:
            raise ValueError(f"unknown LoRA target(s) {bad or '(none given)'}; known: "
                             f"{list(TARGETS)}")

    @property
    def scale(self) -> float:
        """The factor the low-rank update B A is multiplied by: alpha / rank."""
        return self.alpha / self.rank


def _io(shape: tuple[int, ...], split: int) -> tuple[int, int]:
    return math.prod(shape[1:1 + split]), math.prod(shape[1 + split:])


def init_adapters(params: dict, cfg: LoraConfig, key: jax.Array) -> dict[str, dict[str, Any]]:
    """Adapters {name: {"a": [L, I, r], "b": [L, r, O]}} (float32) for ``params``."""
    layers = params["layers"]
    missing = [t for t in cfg.targets if t not in layers]
    if missing:
        raise ValueError(f"params have no layer weight(s) {missing} to adapt")
    out = {}
    for name, k in zip(cfg.targets, jax.random.split(key, len(cfg.targets))):
        w = layers[name]
        i, o = _io(w.shape, TARGETS[name])
        a = jax.random.normal(k, (w.shape[0], i, cfg.rank), jnp.float32) / math.sqrt(i)
        out[name] = {"a": a, "b": jnp.zeros((w.shape[0], cfg.rank, o), jnp.float32)}
    return out


def _adapted_weight(layers: dict, name: str, ad: dict) -> Any:
    """The stacked weight ``name`` adapts, after checking a [L, I, r] / b [L, r, O] fit it."""
    if name not in TARGETS or name not in layers:
        raise ValueError(f"adapter for unknown weight {name!r}")
    w = layers[name]
    l, i, r = ad["a"].shape
    if (l, i) != (w.shape[0], _io(w.shape, TARGETS[name])[0]) or ad["b"].shape[:2] != (l, r) \
            or ad["b"].shape[2] != _io(w.shape, TARGETS[name])[1]:
        raise ValueError(f"adapter {name}: a {ad['a'].shape} / b {ad['b'].shape} do not fit "
                         f"weight {w.shape}")
    return w


def merge(params: dict, adapters: dict[str, dict[str, Any]], cfg: LoraConfig) -> dict:
    """params with W + (α/r)·A@B for every adapted weight (pure; differentiable in both)."""
    layers = dict(params["layers"])
    for name, ad in adapters.items():
        w = _adapted_weight(layers, name, ad)
        delta = jnp.einsum("LIR,LRO->LIO", ad["a"], ad["b"]) * cfg.scale
        layers[name] = (w.astype(jnp.float32) + delta.reshape(w.shape)).astype(w.dtype)
    return {**params, "layers": layers}


def adapt(params: dict, adapters: dict[str, dict[str, Any]], cfg: LoraConfig) -> dict:
    """params with every adapted weight as a ``decoder.Adapted`` (W, A, B, α/r), which the
    decoder applies unmerged as x·W + (α/r)·(x·A)·B: the same numbers as ``merge`` (to fp32
    rounding), but neither W + A·B nor its dense gradient xᵀ·dy is built in a train step
    (``benchmarks/sft_memory.py --compare lora``: 1.20x less peak RSS on the 69-option step)."""
    layers = dict(params["layers"])
    for name, ad in adapters.items():
        layers[name] = Adapted(_adapted_weight(layers, name, ad), ad["a"], ad["b"], cfg.scale)
    return {**params, "layers": layers}


def num_params(adapters: dict) -> int:
    """How many numbers the adapter tree holds (the trained parameters' count)."""
    return sum(int(x.size) for x in jax.tree.leaves(adapters))


# ----------------------------------------------------------------------------- adapter folders
# A trained adapter kept apart from its base model: ``adapter.json`` (base model spec, rank,
# alpha, targets, how it was made) + ``adapter.safetensors`` (a_<name> [L, I, r] and
# b_<name> [L, r, O] per target). A few MB instead of the merged model's 540 MB.
ADAPTER_FILES = ("adapter.json", "adapter.safetensors")
ADAPTER_DTYPES = ("float32", "float16", "bfloat16")


def save_adapter(folder, adapters: dict, cfg: LoraConfig, *, base: str,
                 dtype: str = "float32", meta: dict | None = None):
    """Writes an adapter folder (see above); ``base`` names the model it adapts ("smollm2"
    or an HF folder path). ``dtype`` is the stored precision. Returns the folder."""
    if dtype not in ADAPTER_DTYPES:
        raise ValueError(f"adapter dtype must be one of {ADAPTER_DTYPES}, got {dtype!r}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    np_dtype = {"float32": np.float32, "float16": np.float16}.get(dtype)
    tensors = {}
    for name, ad in adapters.items():
        for part in ("a", "b"):
            x = jnp.asarray(ad[part], jnp.float32)
            x = np.asarray(x.astype(jnp.bfloat16).astype(jnp.float32)) if np_dtype is None \
                else np.asarray(x).astype(np_dtype)
            tensors[f"{part}_{name}"] = np.ascontiguousarray(x)
    save_file(tensors, str(folder / "adapter.safetensors"), metadata={"format": "jaxdm-lora"})
    info = {"format": "jaxdm-lora", "base": base, "rank": cfg.rank, "alpha": cfg.alpha,
            "targets": list(cfg.targets), "dtype": dtype} | dict(meta or {})
    write_json(folder / "adapter.json", info, indent=2)
    return folder


def is_adapter_folder(folder) -> bool:
    """Whether ``folder`` holds a LoRA adapter (its adapter.json)."""
    return (Path(folder) / "adapter.json").is_file()


def read_adapter(folder) -> tuple[dict, LoraConfig, dict]:
    """(adapters as float32 arrays, LoraConfig, adapter.json) of an adapter folder; a missing
    file or key, or a tensor that does not match the config, raises ValueError naming it."""
    folder = Path(folder)
    missing = [f for f in ADAPTER_FILES if not (folder / f).is_file()]
    if missing:
        raise ValueError(f"adapter folder {folder}: missing {missing}")
    try:
        info = json.loads((folder / "adapter.json").read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{folder / 'adapter.json'}: not JSON ({e})") from e
    for key in ("base", "rank", "alpha", "targets"):
        if key not in info:
            raise ValueError(f"{folder / 'adapter.json'}: missing key {key!r}")
    cfg = LoraConfig(int(info["rank"]), float(info["alpha"]), tuple(info["targets"]))
    tensors = load_file(str(folder / "adapter.safetensors"))
    adapters = {}
    for name in cfg.targets:
        for part in ("a", "b"):
            if f"{part}_{name}" not in tensors:
                raise ValueError(f"{folder / 'adapter.safetensors'}: no tensor "
                                 f"'{part}_{name}' for target {name!r}")
        a, b = tensors[f"a_{name}"], tensors[f"b_{name}"]
        if a.ndim != 3 or b.ndim != 3 or a.shape[2] != cfg.rank or b.shape[1] != cfg.rank:
            raise ValueError(f"{folder / 'adapter.safetensors'}: {name} a {a.shape} / b "
                             f"{b.shape} are not [L, I, {cfg.rank}] / [L, {cfg.rank}, O]")
        adapters[name] = {"a": jnp.asarray(a, jnp.float32), "b": jnp.asarray(b, jnp.float32)}
    return adapters, cfg, info


def load_model(spec: str, dtype: str = "float32"):
    """"smollm2" (the packaged default), an HF folder, or an adapter folder (``save_adapter``:
    its base loaded the same way, the adapters merged) -> ``jaxdm.models.Pretrained``. The one
    loader of a model named in a spec (decision backends, train-dm, the harness)."""
    if spec == "smollm2":
        return smollm2(jnp.dtype(dtype))
    if is_adapter_folder(spec):
        return load_adapted(spec, dtype)
    return load_pretrained(spec, jnp.dtype(dtype))


def load_adapted(folder, dtype: str = "float32"):
    """An adapter folder (``save_adapter``) -> ``Pretrained``: its base model (as
    ``load_model`` loads it) with the adapters merged; ``path`` is the adapter folder."""
    adapters, lcfg, info = read_adapter(folder)
    pre = load_model(str(info["base"]), dtype)
    params = merge(pre.params, adapters, lcfg)
    return dataclasses.replace(pre, params=params, path=Path(folder))
