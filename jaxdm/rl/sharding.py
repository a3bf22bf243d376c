"""Placing the RL train state on a mesh: ``jaxdm.models.sharding``'s rules, re-exported.

One set of rules serves inference and training and lives in ``jaxdm.models.sharding`` (FSDP
over ``data``, tensor parallel over ``model``, logical axis names per parameter). The train
state's optimizer leaves mirror the parameters under extra path prefixes (``mu/...``,
``nu/...``): a leaf whose path ends with a known parameter path gets that parameter's
sharding, anything else (step counts, ...) is replicated, i.e. ``strict=False`` there. Batch
arrays put their leading axis on ``data`` (the padded mini-batch must divide by it). XLA's
partitioner inserts the collectives.
"""
from __future__ import annotations

from typing import Any

from jax.sharding import Mesh

from jaxdm.models import sharding as _rules
from jaxdm.models.sharding import batch_sharding, make_mesh, replicated

__all__ = ["make_mesh", "param_spec", "shard_params", "batch_sharding", "replicated"]


def param_spec(path, shape: tuple[int, ...], mesh: Mesh):
    """Partition spec of a parameter or optimizer-state leaf at ``path`` (replicated if unknown)."""
    return _rules.param_spec(path, shape, mesh, strict=False)


def shard_params(tree: Any, mesh: Mesh) -> Any:
    """Place a parameter (or optimizer-state) pytree on ``mesh``."""
    return _rules.shard_params(tree, mesh, strict=False)
