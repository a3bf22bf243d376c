"""Converts a llama-architecture GGUF file (e.g. SmolLM2-135M-Instruct.Q4_1.gguf) to an HF folder.

The result (config.json, model.safetensors in fp32, tokenizer.json, tokenizer_config.json,
chat_template.jinja) loads with `load_pretrained` and with transformers' torch classes.
Quantized tensors are dequantized with the `gguf` package. llama.cpp's converter permutes the
rows of the q/k projections for its interleaved RoPE; `unpermute_rope_rows` undoes that.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

from jaxdm.models.config import ModelConfig

# GGUF tensor name -> HF tensor name ("{i}" is the layer index). Data, not code.
GGUF_TO_HF: tuple[tuple[str, str], ...] = (
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
    ("blk.{i}.attn_norm.weight", "model.layers.{i}.input_layernorm.weight"),
    ("blk.{i}.attn_q.weight", "model.layers.{i}.self_attn.q_proj.weight"),
    ("blk.{i}.attn_k.weight", "model.layers.{i}.self_attn.k_proj.weight"),
    ("blk.{i}.attn_v.weight", "model.layers.{i}.self_attn.v_proj.weight"),
    ("blk.{i}.attn_output.weight", "model.layers.{i}.self_attn.o_proj.weight"),
    ("blk.{i}.ffn_norm.weight", "model.layers.{i}.post_attention_layernorm.weight"),
    ("blk.{i}.ffn_gate.weight", "model.layers.{i}.mlp.gate_proj.weight"),
    ("blk.{i}.ffn_up.weight", "model.layers.{i}.mlp.up_proj.weight"),
    ("blk.{i}.ffn_down.weight", "model.layers.{i}.mlp.down_proj.weight"),
)
# GGUF token types (llama.cpp): 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
_SPECIAL_TOKEN_TYPES = (2, 3, 4)
CONVERTER_VERSION = 1


def unpermute_rope_rows(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """Undoes llama.cpp's q/k row permutation of a [n_heads * head_dim, d_model] weight.

    llama.cpp stores each head's rows as interleaved (even, odd) pairs; HF uses the two halves.
    View as [n_heads, head_dim/2, 2, d_model], swap the middle axes, flatten back.
    """
    rows = weight.shape[0]
    if rows % (2 * n_heads):
        raise ValueError(f"unpermute_rope_rows: {rows} rows do not split into {n_heads} heads "
                         "of even size")
    head_dim = rows // n_heads
    return (weight.reshape(n_heads, head_dim // 2, 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def _field(reader: Any, key: str, default: Any = ...) -> Any:
    field = reader.fields.get(key)
    if field is None:
        if default is ...:
            raise ValueError(f"GGUF file is missing metadata key {key!r}")
        return default
    return field.contents()


def gguf_config(reader: Any, path: str = "gguf") -> ModelConfig:
    """ModelConfig from llama-architecture GGUF metadata."""
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: GGUF architecture {arch!r} is not supported (only 'llama')")
    names = {t.name for t in reader.tensors}
    hidden = int(_field(reader, "llama.embedding_length"))
    heads = int(_field(reader, "llama.attention.head_count"))
    tokens = _field(reader, "tokenizer.ggml.tokens")
    eps = float(_field(reader, "llama.attention.layer_norm_rms_epsilon"))
    eos = _field(reader, "tokenizer.ggml.eos_token_id", None)
    return ModelConfig(
        vocab_size=int(_field(reader, "llama.vocab_size", len(tokens))),
        hidden_size=hidden,
        intermediate_size=int(_field(reader, "llama.feed_forward_length")),
        num_layers=int(_field(reader, "llama.block_count")),
        num_heads=heads,
        num_kv_heads=int(_field(reader, "llama.attention.head_count_kv", heads)),
        head_dim=int(_field(reader, "llama.rope.dimension_count", hidden // heads)),
        rope_theta=float(_field(reader, "llama.rope.freq_base", 10000.0)),
        # GGUF stores eps as float32 (9.99999974e-06); HF configs use the decimal value.
        rms_norm_eps=float(f"{eps:.6g}"),
        tie_embeddings="output.weight" not in names,
        max_position_embeddings=int(_field(reader, "llama.context_length", 4096)),
        family="llama",
        architecture="LlamaForCausalLM",
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id", None),
        eos_token_ids=() if eos is None else (int(eos),),
        pad_token_id=_field(reader, "tokenizer.ggml.padding_token_id", None),
    )


def dequantized_tensors(reader: Any, config: ModelConfig) -> dict[str, np.ndarray]:
    """All tensors as fp32 numpy arrays under HF names, q/k rows unpermuted."""
    from gguf import dequantize  # why: gguf (+ sentencepiece) ~20 ms, conversion only
    table = {}
    for gguf_name, hf_name in GGUF_TO_HF:
        if "{i}" in gguf_name:
            for i in range(config.num_layers):
                table[gguf_name.format(i=i)] = hf_name.format(i=i)
        else:
            table[gguf_name] = hf_name
    out = {}
    for tensor in reader.tensors:
        if tensor.name not in table:
            raise ValueError(f"GGUF tensor {tensor.name!r} has no HF mapping")
        # GGUF shapes list the fastest axis first; numpy order is the reverse.
        shape = tuple(int(d) for d in reversed(tensor.shape))
        array = np.asarray(dequantize(tensor.data, tensor.tensor_type), np.float32)
        array = array.reshape(shape)
        if tensor.name.endswith("attn_q.weight"):
            array = unpermute_rope_rows(array, config.num_heads)
        elif tensor.name.endswith("attn_k.weight"):
            array = unpermute_rope_rows(array, config.num_kv_heads)
        out[table[tensor.name]] = np.ascontiguousarray(array)
    return out


def gguf_tokenizer(reader: Any):
    """A `tokenizers.Tokenizer` (byte-level BPE, digit split) rebuilt from GGUF metadata."""
    model = _field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise ValueError(f"GGUF tokenizer model {model!r} is not supported (only byte-level "
                         "BPE, 'gpt2')")
    tokens = list(_field(reader, "tokenizer.ggml.tokens"))
    types = list(_field(reader, "tokenizer.ggml.token_type", [1] * len(tokens)))
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ValueError("GGUF tokenizer has duplicate tokens")
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False,
                                     byte_fallback=False))
    pre = _field(reader, "tokenizer.ggml.pre", "default")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("smollm", "starcoder", "refact"):
        # These vocabularies split every digit on its own before the byte-level split.
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tokenizer.pre_tokenizer = byte_level
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    specials = [AddedToken(tokens[i], special=True, normalized=False)
                for i, t in enumerate(types) if t in _SPECIAL_TOKEN_TYPES]
    tokenizer.add_special_tokens(specials)
    return tokenizer


def _token(tokens: list[str], reader: Any, key: str) -> str | None:
    idx = _field(reader, key, None)
    return None if idx is None else tokens[int(idx)]


def convert_gguf(gguf_path: str | Path, out_dir: str | Path) -> Path:
    """Writes an HF folder for a llama GGUF file; returns out_dir. Overwrites its files."""
    from gguf import GGUFReader  # why: as in dequantized_tensors
    gguf_path = Path(gguf_path)
    if not gguf_path.exists():
        raise FileNotFoundError(f"convert_gguf: {gguf_path} does not exist")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    reader = GGUFReader(str(gguf_path))
    config = gguf_config(reader, str(gguf_path))
    tensors = dequantized_tensors(reader, config)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    hf_config = config.to_hf_dict()
    hf_config["torch_dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(hf_config, indent=2))

    tokenizer = gguf_tokenizer(reader)
    tokenizer.save(str(out / "tokenizer.json"))
    tokens = list(_field(reader, "tokenizer.ggml.tokens"))
    template = _field(reader, "tokenizer.chat_template", None)
    tok_config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(_field(reader, "tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": config.max_position_embeddings,
    }
    for name, key in (("bos_token", "tokenizer.ggml.bos_token_id"),
                      ("eos_token", "tokenizer.ggml.eos_token_id"),
                      ("unk_token", "tokenizer.ggml.unknown_token_id"),
                      ("pad_token", "tokenizer.ggml.padding_token_id")):
        value = _token(tokens, reader, key)
        if value is not None:
            tok_config[name] = value
    if template is not None:
        tok_config["chat_template"] = template
        (out / "chat_template.jinja").write_text(template)
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": config.bos_token_id,
         "eos_token_id": config.eos_token_ids[0] if config.eos_token_ids else None,
         "pad_token_id": config.pad_token_id}, indent=2))
    return out
