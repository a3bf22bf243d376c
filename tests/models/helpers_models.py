"""Shared builders for the model tests: tiny torch checkpoints saved as HF folders."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

VOCAB = 97
CHAT_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }} {{ m['content'] }}</s>{% endfor %}"
                 "{% if add_generation_prompt %}<s>assistant {% endif %}")


def tiny_hf_config(family: str, **overrides):
    """A small random transformers config of the given family (GQA 4 query / 2 KV heads)."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    if family == "llama":
        cfg = LlamaConfig(**common, rms_norm_eps=1e-5, rope_theta=10000.0,
                          tie_word_embeddings=False)
    elif family == "qwen2":
        cfg = Qwen2Config(**common, rms_norm_eps=1e-6, rope_theta=1000000.0,
                          tie_word_embeddings=False)
    elif family == "qwen3":
        cfg = Qwen3Config(**common, head_dim=16, rms_norm_eps=1e-6, rope_theta=1000000.0,
                          tie_word_embeddings=True)
    else:
        raise ValueError(family)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return cfg


def build_torch_model(family: str, seed: int = 0, **overrides):
    """A transformers torch model with weights perturbed away from their init (biases,
    norms and q/k norms become non-trivial, so every weight matters for parity)."""
    import torch
    from transformers import LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cls = {"llama": LlamaForCausalLM, "qwen2": Qwen2ForCausalLM,
           "qwen3": Qwen3ForCausalLM}[family]
    model = cls(tiny_hf_config(family, **overrides)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def write_tiny_tokenizer(folder: Path) -> None:
    """A word-level tokenizer.json over VOCAB tokens plus a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for i in range(3, VOCAB):
        vocab[f"w{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "chat_template": CHAT_TEMPLATE}))


def save_checkpoint(model, folder: Path, *, tokenizer: bool = True,
                    max_shard_size: str | None = None) -> Path:
    kwargs = {"safe_serialization": True}
    if max_shard_size is not None:
        kwargs["max_shard_size"] = max_shard_size
    model.save_pretrained(str(folder), **kwargs)
    if tokenizer:
        write_tiny_tokenizer(folder)
    return folder


def torch_logits(model, tokens: np.ndarray, positions: np.ndarray | None = None) -> np.ndarray:
    import torch

    with torch.no_grad():
        kwargs = {}
        if positions is not None:
            kwargs["position_ids"] = torch.tensor(positions)
        return model(torch.tensor(tokens), **kwargs).logits.float().numpy()


def require_cpu_attention() -> None:
    """Skips where the fused CPU attention kernel cannot run here (by choice or by CPU); fails
    where it should run but is off (a failed build)."""
    import pytest

    from jaxdm.models.cpu import attention as cpu_attention

    on, why = cpu_attention.status()
    if not on:
        if cpu_attention.cannot_run_here(why):
            pytest.skip(f"fused CPU attention {why}")
        pytest.fail(f"fused CPU attention {why}")
