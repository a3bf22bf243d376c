"""Shared helpers for the decision tests: a tiny random model with SmolLM2's tokenizer, the
real SmolLM2 (cached per process), a small hand-written trajectory and a backend that
raises."""
from __future__ import annotations

import dataclasses
import functools

import jax

from jaxdm.trajectory import Step, Trajectory


@functools.lru_cache(maxsize=None)
def smollm2_pretrained():
    from jaxdm.models.smollm2 import smollm2
    return smollm2()


@functools.lru_cache(maxsize=None)
def tiny_pretrained(seed: int = 0):
    """SmolLM2's tokenizer and vocabulary over a 2-layer random decoder (fast on CPU)."""
    from jaxdm.models import decoder
    from jaxdm.models.config import ModelConfig
    from jaxdm.models.loading import Pretrained, load_tokenizer
    from jaxdm.models.smollm2 import smollm2_path
    path = smollm2_path()
    config = ModelConfig(vocab_size=49152, hidden_size=32, intermediate_size=64, num_layers=2,
                         num_heads=4, num_kv_heads=2, head_dim=8, rope_theta=100000.0,
                         rms_norm_eps=1e-5, tie_embeddings=True, max_position_embeddings=2048)
    params = decoder.init_params(config, jax.random.key(seed))
    return Pretrained(params=params, config=config, tokenizer=load_tokenizer(path),
                      chat_template=None, path=path)


def with_params(pretrained, params):
    return dataclasses.replace(pretrained, params=params)


def small_trajectory(success: bool = True) -> Trajectory:
    return Trajectory(
        goal="put a hot mug in cabinet",
        steps=(
            Step("You are in the middle of a room. You see a cabinet 1, a countertop 1 and a "
                 "microwave 1.", "go to countertop 1"),
            Step("You arrive at countertop 1. On the countertop 1, you see a mug 1.",
                 "take mug 1 from countertop 1", annotations={"milestone": True}),
            Step("You pick up the mug 1 from the countertop 1.", "look",
                 annotations={"no_op": True}),
            Step("You are facing the countertop 1.", "go to microwave 1"),
        ),
        final_observation="You arrive at microwave 1. The microwave 1 is closed.",
        reward=float(success), success=success, budget=30, task_type="heat", env="alfworld",
        metadata={"id": "small-0"})


class RaisingBackend:
    """A decision backend whose every call (``choose`` or ``score``) raises ``error``: a
    server that is down, a model that refuses the question."""

    def __init__(self, name: str, error: Exception):
        self.name, self.error = name, error

    def choose(self, questions):
        raise self.error

    def score(self, questions):
        raise self.error
