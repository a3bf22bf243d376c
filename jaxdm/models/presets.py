"""Named ModelConfig presets (shapes of real checkpoints, for random-weight benchmarks/tests)."""
from __future__ import annotations

from jaxdm.models.config import ModelConfig
from jaxdm.registry import Registry

# SmolLM2-135M(-Instruct): the packaged default decision model.
SMOLLM2_135M = ModelConfig(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
    num_kv_heads=3, head_dim=64, rope_theta=100000.0, rms_norm_eps=1e-5, tie_embeddings=True,
    max_position_embeddings=8192, family="llama", architecture="LlamaForCausalLM",
    bos_token_id=1, eos_token_ids=(2,), pad_token_id=2)

# Qwen2.5-1.5B(-Instruct): policy size used in the papers.
QWEN2_5_1_5B = ModelConfig(
    vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_layers=28, num_heads=12,
    num_kv_heads=2, head_dim=128, rope_theta=1000000.0, rms_norm_eps=1e-6, qkv_bias=True,
    tie_embeddings=True, max_position_embeddings=32768, family="qwen2",
    architecture="Qwen2ForCausalLM", eos_token_ids=(151645, 151643), pad_token_id=151643)

# Qwen2.5-7B(-Instruct): the 1.5B's family and tokens, wider, untied embeddings.
QWEN2_5_7B = QWEN2_5_1_5B.replace(
    vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_heads=28, num_kv_heads=4,
    tie_embeddings=False)

# Qwen3-0.6B: a decision-model base (q/k norm, tied embeddings).
QWEN3_0_6B = ModelConfig(
    vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_layers=28, num_heads=16,
    num_kv_heads=8, head_dim=128, rope_theta=1000000.0, rms_norm_eps=1e-6, qk_norm=True,
    tie_embeddings=True, max_position_embeddings=40960, family="qwen3",
    architecture="Qwen3ForCausalLM", eos_token_ids=(151645, 151643), pad_token_id=151643)

# Tiny configs for unit tests: one per family, exercising GQA and every optional weight.
TINY_LLAMA = ModelConfig(
    vocab_size=128, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
    num_kv_heads=2, head_dim=8, rope_theta=10000.0, rms_norm_eps=1e-5, family="llama",
    architecture="LlamaForCausalLM", max_position_embeddings=512, eos_token_ids=(2,))
TINY_QWEN2 = TINY_LLAMA.replace(family="qwen2", architecture="Qwen2ForCausalLM", qkv_bias=True)
TINY_QWEN3 = TINY_LLAMA.replace(family="qwen3", architecture="Qwen3ForCausalLM", qk_norm=True,
                                tie_embeddings=True, head_dim=16)

PRESETS: Registry[ModelConfig] = Registry("model preset")
for _name, _config in (("smollm2-135m", SMOLLM2_135M), ("qwen2.5-1.5b", QWEN2_5_1_5B),
                       ("qwen2.5-7b", QWEN2_5_7B), ("qwen3-0.6b", QWEN3_0_6B),
                       ("tiny-llama", TINY_LLAMA), ("tiny-qwen2", TINY_QWEN2),
                       ("tiny-qwen3", TINY_QWEN3)):
    PRESETS.register(_name, _config)


def preset(name: str) -> ModelConfig:
    """The preset called `name` (see PRESETS); an unknown name raises UnknownNameError (a
    KeyError) listing them."""
    return PRESETS.get(name)
