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

from jaxdm.config import kind_and_options
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
# make_backend's kinds -> the spec keys each takes besides "kind".
BACKEND_KINDS: Registry[frozenset[str]] = Registry("backend kind")
BACKEND_KINDS.register("local_readout", frozenset(_COMMON_LOCAL))
BACKEND_KINDS.register("local_likelihood", frozenset(_COMMON_LOCAL | {"reduction", "append_end"}))
BACKEND_KINDS.register("prompted", frozenset(
    {"path", "dtype", "max_new_tokens", "progress", "name", "batch_size"}))
BACKEND_KINDS.register("remote", frozenset(
    {"base_url", "model", "interface", "endpoint", "api_key_env", "price_per_1k_in",
     "price_per_1k_out", "concurrency", "timeout", "max_retries", "backoff", "max_backoff",
     "top_logprobs", "max_tokens", "label_match", "progress", "down_after", "probe_after",
     "tokenizer"}))
BACKEND_KINDS.register("oracle", frozenset({"noise", "seed", "levels"}))


def _load_pretrained(path: str, dtype: Any):
    import jax.numpy as jnp  # why: JAX loads with the first local backend, not the package

    from jaxdm.models.lora import load_model
    return load_model(path, jnp.dtype(dtype or "float32").name)


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
    if kind == "oracle":
        return Oracle(**opts)
    if kind == "remote":
        for key in ("base_url", "model"):
            if key not in opts:
                raise ValueError(f"backend kind 'remote' needs {key!r}")
        return Remote(**opts)
    path = opts.pop("path", None)
    dtype = opts.pop("dtype", None)
    if pretrained is None:
        if path is None:
            raise ValueError(f"backend kind {kind!r} needs 'path' (an HF folder or 'smollm2')")
        pretrained = _load_pretrained(path, dtype)
    from jaxdm.decision import local, prompted  # why: JAX (see __getattr__)
    backend = {"local_readout": local.LocalReadout, "local_likelihood": local.LocalLikelihood,
               "prompted": prompted.Prompted}[kind]
    return backend(pretrained, **opts)


__all__ = [
    "ChoiceResult", "Cost", "DecisionModel", "MultipleChoice", "ScoreResult", "YesNo",
    "choice_failed", "choice_ok", "score_failed", "score_ok", "Oracle", "Remote",
    "LocalReadout", "LocalLikelihood", "Prompted", "make_backend", "BACKEND_KINDS",
    "parse_backend_spec", "BackendSpecError", "BACKEND_ALIASES",
    "parse_choice", "parse_score", "Request", "ScoringBatch", "score_batch", "score_requests",
    "score_requests_one_by_one", "plan_groups", "pack_groups", "MASKED_LOGPROB",
]
