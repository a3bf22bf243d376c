"""jaxdm.models: one JAX decoder for Llama / Qwen2 / Qwen3, checkpoint loading, sampling,
sharding. See decoder.py for the parameter layout and einsum legend."""
import importlib

from jaxdm.models import presets
from jaxdm.models.config import ModelConfig
from jaxdm.models.decoder import (KVCache, forward, forward_with_cache, init_params, lm_logits,
                                  logits, prefill, token_logprobs)
from jaxdm.models.gguf_convert import convert_gguf
from jaxdm.models.loading import Pretrained, load_pretrained
from jaxdm.models.sampling import GenerationResult, generate, sample_logits
from jaxdm.models.sharding import (initialize_distributed, make_mesh, param_shardings, shard_batch,
                                   shard_params)


def __getattr__(name: str):
    # `smollm2` / `smollm2_path` load lazily so that `python -m jaxdm.models.smollm2` runs the
    # module without it being imported twice (runpy warns about that). If the submodule was
    # imported first, `jaxdm.models.smollm2` is the module, which is callable like the function.
    if name in ("smollm2", "smollm2_path"):
        module = importlib.import_module("jaxdm.models.smollm2")
        value = getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'jaxdm.models' has no attribute {name!r}")

__all__ = [
    "ModelConfig", "KVCache", "forward", "forward_with_cache", "init_params", "lm_logits",
    "logits", "prefill", "token_logprobs", "Pretrained", "load_pretrained", "convert_gguf",
    "smollm2", "smollm2_path", "GenerationResult", "generate", "sample_logits", "make_mesh",
    "shard_params", "param_shardings", "shard_batch", "initialize_distributed", "presets",
]
