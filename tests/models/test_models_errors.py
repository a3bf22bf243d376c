"""Bad checkpoints and bad inputs raise clear errors naming the file, tensor or key."""
from __future__ import annotations

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from jaxdm.models import (ModelConfig, forward, forward_with_cache, generate, init_params,
                          load_pretrained, prefill, token_logprobs)
from jaxdm.models.presets import TINY_LLAMA, preset

from tests.models.helpers_models import build_torch_model, save_checkpoint

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def good_folder(tmp_path_factory):
    return save_checkpoint(build_torch_model("llama"), tmp_path_factory.mktemp("good"))


@pytest.fixture
def folder(good_folder, tmp_path):
    copy = tmp_path / "ckpt"
    shutil.copytree(good_folder, copy)
    return copy


def _rewrite_weights(folder, edit):
    tensors = load_file(str(folder / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def test_missing_tensor_is_named(folder):
    _rewrite_weights(folder, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ValueError, match=r"missing tensor 'model\.layers\.1\.mlp\.up_proj"):
        load_pretrained(folder)


def test_wrong_shape_names_tensor_and_shapes(folder):
    def edit(t):
        t["model.layers.0.self_attn.k_proj.weight"] = np.zeros((12, 32), np.float32)
    _rewrite_weights(folder, edit)
    with pytest.raises(ValueError, match=r"model\.safetensors: tensor 'model\.layers\.0\.self_attn"
                       r"\.k_proj\.weight' has shape \(12, 32\), expected \(16, 32\)"):
        load_pretrained(folder)


def test_unexpected_tensor_is_named(folder):
    _rewrite_weights(folder, lambda t: t.update(extra_head=np.zeros(3, np.float32)))
    with pytest.raises(ValueError, match="unexpected tensor 'extra_head'"):
        load_pretrained(folder)


def test_unknown_architecture_names_key(folder):
    cfg = json.loads((folder / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"config\.json: unknown architecture in key "
                                         r"'architectures': \['GPT2LMHeadModel'\]"):
        load_pretrained(folder)


def test_missing_config_key_is_named(folder):
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["num_hidden_layers"]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="missing required key 'num_hidden_layers'"):
        load_pretrained(folder)


def test_missing_tokenizer_json(folder):
    (folder / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match="missing tokenizer.json"):
        load_pretrained(folder)
    # Weights alone still load when the caller opts out of the tokenizer.
    assert load_pretrained(folder, tokenizer=False).tokenizer is None


def test_only_pickle_weights_refused_without_unpickling(folder):
    (folder / "model.safetensors").unlink()
    # Not a valid pickle: proves nothing tries to unpickle it.
    (folder / "pytorch_model.bin").write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match=r"only pickle weights found \(pytorch_model\.bin\).*"
                                         "safetensors only"):
        load_pretrained(folder)


def test_index_naming_missing_shard(folder):
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    index = {"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(FileNotFoundError, match="model-00002-of-00002.safetensors"):
        load_pretrained(folder)


def test_config_validation_errors():
    with pytest.raises(ValueError, match="num_heads=6 is not a multiple of num_kv_heads=4"):
        TINY_LLAMA.replace(num_heads=6, num_kv_heads=4)
    with pytest.raises(ValueError, match="rope_type 'ntk'"):
        TINY_LLAMA.replace(rope_scaling={"rope_type": "ntk", "factor": 2.0})
    with pytest.raises(ValueError, match="use_sliding_window"):
        ModelConfig.from_hf_dict({"architectures": ["Qwen2ForCausalLM"], "vocab_size": 8,
                                  "hidden_size": 8, "intermediate_size": 8,
                                  "num_hidden_layers": 1, "num_attention_heads": 2,
                                  "use_sliding_window": True})
    with pytest.raises(KeyError, match="unknown model preset 'gpt5'"):
        preset("gpt5")
    # Hashable (static jit argument) even with a rope-scaling dict.
    scaled = TINY_LLAMA.replace(rope_scaling={"rope_type": "linear", "factor": 2.0})
    assert hash(scaled) == hash(TINY_LLAMA.replace(rope_scaling={"factor": 2.0,
                                                                 "rope_type": "linear"}))


def test_entry_point_shape_errors():
    cfg = TINY_LLAMA
    params = init_params(cfg, jax.random.key(0))
    tokens = jnp.zeros((2, 5), jnp.int32)
    with pytest.raises(ValueError, match=r"positions shape \(2, 4\) != tokens shape \(2, 5\)"):
        forward(params, cfg, tokens, jnp.zeros((2, 4), jnp.int32))
    with pytest.raises(ValueError, match=r"tokens must be \[B, S\], got shape \(5,\)"):
        forward(params, cfg, tokens[0], tokens[0])
    with pytest.raises(TypeError, match="integer ids"):
        forward(params, cfg, tokens.astype(jnp.float32), tokens)
    with pytest.raises(ValueError, match=r"params\['embed'\] must be \[128, 32\]"):
        forward(init_params(cfg.replace(vocab_size=64), jax.random.key(0)), cfg, tokens, tokens)
    with pytest.raises(ValueError, match="cache_size=3 is smaller than the prompt length S=5"):
        prefill(params, cfg, tokens, tokens, jnp.array([5, 5]), cache_size=3)
    _, cache = prefill(params, cfg, tokens, tokens, jnp.array([5, 5]), cache_size=8)
    with pytest.raises(ValueError, match=r"cache_mask must be \[B, S, C\]=\(2, 1, 8\)"):
        forward_with_cache(params, cfg, tokens[:, :1], tokens[:, :1], cache,
                           jnp.ones((2, 1, 7), bool))
    with pytest.raises(ValueError, match="hidden must be"):
        token_logprobs(params, cfg, jnp.zeros((2, 5, 32)), jnp.zeros((2, 4), jnp.int32))
    with pytest.raises(ValueError, match="outside"):
        generate(params, cfg, None, [[1, 500]], max_new_tokens=2, greedy=True)
    with pytest.raises(ValueError, match="needs a PRNG key"):
        generate(params, cfg, None, [[1, 2]], max_new_tokens=2)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        generate(params, cfg, None, [[1], []], max_new_tokens=2, greedy=True)


def _assert_continuations_are_forwards(params, cfg, hidden, ctx, conts, *, start):
    """hidden [S, D] of a packed row holds, from slot ``start`` on, each continuation (v, own)
    of ``conts`` back to back: the states a plain forward of ctx[:v] + own gives its tokens."""
    for v, own in conts:
        full = ctx[:v] + own
        ref = forward(params, cfg, jnp.asarray([full], jnp.int32),
                      jnp.arange(len(full))[None])[0]
        np.testing.assert_allclose(hidden[start:start + len(own)], ref[v:], atol=1e-5)
        start += len(own)


@pytest.mark.parametrize("head_dim", [8, 32])  # XLA's attention over the plan; the CPU kernel
def test_continuations_may_begin_before_the_trunk_bound(head_dim):
    """The packed scorer's layout: continuations right after the context's real end, before
    the static ``trunk`` bound, one of them crossing it; the same states as plain forwards
    (the plan's context cut must then cover the crossing continuation's own earlier keys,
    not only the 2-3 context tokens they see)."""
    from jaxdm.models.cpu import attention as cpu_attention
    from jaxdm.models.decoder import forward_trunk_suffixes
    cfg = TINY_LLAMA.replace(head_dim=head_dim)
    params = init_params(cfg, jax.random.key(1))
    ctx = [5, 6, 7, 8, 9, 10]
    conts = [(3, [20, 21, 22]), (2, [30, 31, 32])]   # slots 6-8 (crossing trunk=8) and 9-11
    tokens = ctx + [t for _, c in conts for t in c] + [0]
    segs = [0] * 6 + [1, 1, 1, 2, 2, 2, -1]
    vis = [0] * 6 + [3, 3, 3, 2, 2, 2, 0]
    pos = list(range(6)) + [3, 4, 5, 2, 3, 4, 0]
    arr = lambda x: jnp.asarray([x], jnp.int32)  # noqa: E731
    if head_dim == 32 and not cpu_attention.segments_enabled():
        pytest.skip("the CPU attention kernel is off here")
    hidden = forward_trunk_suffixes(params, cfg, arr(tokens), arr(pos), arr(segs), arr(vis),
                                    trunk=8, window=3, attn_chunk=4, context_cuts=2)[0]
    _assert_continuations_are_forwards(params, cfg, hidden, ctx, conts, start=6)


def test_forward_trunk_suffixes_equals_forward_and_checks_shapes():
    """Two continuations packed after a shared context give the hidden states a plain forward
    of each full sequence gives; bad shapes and a bad trunk/window are named."""
    from jaxdm.models.decoder import forward_trunk_suffixes
    cfg = TINY_LLAMA
    params = init_params(cfg, jax.random.key(0))
    ctx = [5, 6, 7, 8, 9, 10]
    conts = [(3, [20, 21]), (6, [30, 31, 32])]   # (context tokens seen, own tokens)
    tokens = ctx + [0, 0] + [t for _, c in conts for t in c]   # trunk slots 0..7 (2 padding)
    segs = [0] * 6 + [-1, -1] + [1, 1, 2, 2, 2]
    vis = [0] * 8 + [3, 3, 6, 6, 6]
    pos = list(range(8)) + [3, 4, 6, 7, 8]
    arr = lambda x: jnp.asarray([x], jnp.int32)  # noqa: E731
    hidden = forward_trunk_suffixes(params, cfg, arr(tokens), arr(pos), arr(segs), arr(vis),
                                    trunk=8, window=3, attn_chunk=4)[0]
    _assert_continuations_are_forwards(params, cfg, hidden, ctx, conts, start=8)
    np.testing.assert_allclose(hidden[:6], forward(params, cfg, arr(ctx), arr(list(range(6))))[0],
                               atol=1e-5)
    # only some slots read (the last layer then runs at those alone): the same states there,
    # in the order asked, repeats allowed; context and continuation slots alike (a padding
    # slot attends to nothing: its state means nothing either way)
    read = [9, 2, 12, 9, 5, 0]
    picked = forward_trunk_suffixes(params, cfg, arr(tokens), arr(pos), arr(segs), arr(vis),
                                    trunk=8, window=3, attn_chunk=4, read=arr(read))[0]
    np.testing.assert_allclose(picked, hidden[jnp.asarray(read)], atol=1e-5)
    with pytest.raises(ValueError, match=r"read must be integer slots \[B=1, M\]"):
        forward_trunk_suffixes(params, cfg, arr(tokens), arr(pos), arr(segs), arr(vis),
                               trunk=8, window=3, read=jnp.asarray(read, jnp.int32))
    with pytest.raises(ValueError, match=r"visible must be \[B, S\]=\(1, 13\)"):
        forward_trunk_suffixes(params, cfg, arr(tokens), arr(pos), arr(segs), arr(vis[:-1]),
                               trunk=8, window=3)
    with pytest.raises(ValueError, match="trunk=20"):
        forward_trunk_suffixes(params, cfg, arr(tokens), arr(pos), arr(segs), arr(vis),
                               trunk=20, window=3)
