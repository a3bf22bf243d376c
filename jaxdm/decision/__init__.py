"""Decision models: typed questions answered by local, prompted, remote or oracle backends.

Backends (all with ``.name``, ``.choose(list[MultipleChoice])``, ``.score(list[YesNo])``):
``LocalReadout``, ``LocalLikelihood``, ``Prompted`` (local jaxdm model), ``Remote``
(OpenAI-compatible HTTP) and ``Oracle`` (environment annotations). ``make_backend(spec)``
builds one from a plain dict (YAML configs, the ``jaxdm screen`` job); ``parse_backend_spec``
(``jaxdm.decision.specs``) is the one parser of spec strings / aliases / dicts every command
uses.

The throughput core is ``score_batch`` (pure, jitted, differentiable shared-prefix scoring;
see ``jaxdm.decision.shared_prefix``).
"""
from __future__ import annotations

from typing import Any, Mapping

from jaxdm.config import Kind, kind_and_options
from jaxdm.decision.oracle import Oracle
from jaxdm.decision.parsing import parse_choice, parse_score
from jaxdm.decision.remote import Remote
from jaxdm.decision.specs import BACKEND_ALIASES, BackendSpecError, parse_backend_spec
from jaxdm.decision.types import (ChoiceResult, Cost, DecisionModel, MultipleChoice, ScoreResult,
                                  YesNo, choice_failed, choice_ok, score_failed, score_ok)
from jaxdm.registry import Registry

_LOCAL = ("LocalReadout", "LocalLikelihood", "encode_messages", "single_token_id")
_SHARED_PREFIX = ("MASKED_LOGPROB", "Request", "ScoringBatch", "pack_groups", "plan_groups",
                  "score_batch", "score_requests", "score_requests_one_by_one")


def __getattr__(name: str):
    # The scorer and local backends import jaxdm.models (JAX); load them lazily so that roles,
    # the Oracle and the Remote backend stay light to import.
    if name in _SHARED_PREFIX or name in _LOCAL or name == "Prompted":
        from jaxdm.decision import local, prompted, shared_prefix  # why: JAX, see above
        owner = shared_prefix if name in _SHARED_PREFIX else local if name in _LOCAL else prompted
        return getattr(owner, name)
    raise AttributeError(f"module 'jaxdm.decision' has no attribute {name!r}")


_COMMON_LOCAL = {"path", "dtype", "max_groups_per_call", "min_shared_frac", "progress", "name",
                 "prefix_cache_mb", "prefix_cache_block"}
def _load_pretrained(path: str, dtype: Any):
    import jax.numpy as jnp  # why: JAX loads with the first local backend, not the package

    from jaxdm.models.lora import load_model
    return load_model(path, jnp.dtype(dtype or "float32").name)


def _local(kind: str, class_name: str):
    """build(options, pretrained) of a local backend kind: the model from ``pretrained`` or
    ``path``; the class comes through ``__getattr__`` (JAX loads with the first one)."""
    def build(opts: dict[str, Any], pretrained: Any) -> DecisionModel:
        path, dtype = opts.pop("path", None), opts.pop("dtype", None)
        if pretrained is None:
            if path is None:
                raise ValueError(f"backend kind {kind!r} needs 'path' (an HF folder or 'smollm2')")
            pretrained = _load_pretrained(path, dtype)
        return __getattr__(class_name)(pretrained, **opts)
    return build


def _remote(opts: dict[str, Any], pretrained: Any) -> Remote:
    for key in ("base_url", "model"):
        if key not in opts:
            raise ValueError(f"backend kind 'remote' needs {key!r}")
    return Remote(**opts)


# make_backend's kinds: the spec keys each takes besides "kind", build(options, pretrained).
BACKEND_KINDS: Registry[Kind] = Registry("backend kind")
BACKEND_KINDS.register("local_readout", Kind(frozenset(_COMMON_LOCAL),
                                             _local("local_readout", "LocalReadout")))
BACKEND_KINDS.register("local_likelihood", Kind(
    frozenset(_COMMON_LOCAL | {"reduction", "append_end"}),
    _local("local_likelihood", "LocalLikelihood")))
BACKEND_KINDS.register("prompted", Kind(
    frozenset({"path", "dtype", "max_new_tokens", "progress", "name", "batch_size"}),
    _local("prompted", "Prompted")))
BACKEND_KINDS.register("remote", Kind(frozenset(
    {"base_url", "model", "interface", "endpoint", "api_key_env", "price_per_1k_in",
     "price_per_1k_out", "concurrency", "timeout", "max_retries", "backoff", "max_backoff",
     "top_logprobs", "max_tokens", "label_match", "progress", "down_after", "probe_after",
     "tokenizer"}), _remote))
BACKEND_KINDS.register("oracle", Kind(frozenset({"noise", "seed", "levels"}),
                                      lambda opts, pretrained: Oracle(**opts)))


def make_backend(spec: Mapping[str, Any], *, pretrained: Any = None) -> DecisionModel:
    """A backend from a dict, e.g. {"kind": "local_readout", "path": "smollm2"},
    {"kind": "oracle", "noise": 0.1}, {"kind": "remote", "base_url": ..., "model": ...,
    "api_key_env": "MY_KEY", "price_per_1k_in": 0.1}.

    ``path`` is an HF folder, an adapter folder (``jaxdm.models.lora``: its base model with the
    LoRA adapters merged, e.g. the trained judge ``jaxdm/judges/smollm2_progress``) or
    "smollm2" (the packaged default model); ``pretrained`` (an
    already loaded jaxdm.models.Pretrained) overrides ``path``. Unknown kinds or keys raise
    ValueError naming them.
    """
    kind, opts = kind_and_options(spec, BACKEND_KINDS, "backend")
    return BACKEND_KINDS.get(kind).build(opts, pretrained)


__all__ = [
    "ChoiceResult", "Cost", "DecisionModel", "MultipleChoice", "ScoreResult", "YesNo",
    "choice_failed", "choice_ok", "score_failed", "score_ok", "Oracle", "Remote",
    "LocalReadout", "LocalLikelihood", "Prompted", "make_backend", "BACKEND_KINDS",
    "parse_backend_spec", "BackendSpecError", "BACKEND_ALIASES",
    "parse_choice", "parse_score", "Request", "ScoringBatch", "score_batch", "score_requests",
    "score_requests_one_by_one", "plan_groups", "pack_groups", "MASKED_LOGPROB",
]
