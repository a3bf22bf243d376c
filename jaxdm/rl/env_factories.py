"""Picklable environment factories for ``VectorEnv`` workers (no JAX import here).

``EnvSection.name`` in a training config maps to a ``module:callable`` through
``ENV_FACTORIES`` (the one registry of env names); keyword arguments become the env's params.
"""
from __future__ import annotations

from typing import Any

from jaxdm.envs.alfworld import AlfWorldEnv, AlfWorldParams
from jaxdm.envs.local import LocalVectorEnv
from jaxdm.envs.vector import VectorEnv
from jaxdm.envs.webshop.env import make_webshop_env
from jaxdm.registry import Registry

# env.name -> the "module:callable" a worker imports (a string, so a factory pickles cheaply).
ENV_FACTORIES: Registry[str] = Registry("env", hint="or give env.factory='module:callable'")
ENV_FACTORIES.register("toy_ordering", "jaxdm.envs.toy:make_ordering_env")
ENV_FACTORIES.register("toy_pick", "jaxdm.envs.toy:make_pick_env")
ENV_FACTORIES.register("alfworld", "jaxdm.rl.env_factories:alfworld_env")
ENV_FACTORIES.register("webshop", "jaxdm.rl.env_factories:webshop_env")


def alfworld_env(**params: Any):
    """``AlfWorldEnv(AlfWorldParams(**params))``; ``data_root``+``data_split`` read official
    game files instead of generating problems."""
    root, split = params.pop("data_root", None), params.pop("data_split", None)
    if "task_types" in params:
        params["task_types"] = tuple(params["task_types"])
    if root is not None:
        return AlfWorldEnv.from_split(root, split or "train", **params)
    return AlfWorldEnv(AlfWorldParams(**params))


def webshop_env(**params: Any):
    """``jaxdm.envs.webshop.env.make_webshop_env(**params)`` (real files or a generated
    catalogue)."""
    return make_webshop_env(**params)


def make_venv(cfg, factory, num_envs: int, group_size: int):
    """The host vector env of a ``TrainConfig``: in-process (``env.num_workers`` 0) or over
    ``env.num_workers`` workers (``jaxdm.envs.vector.VectorEnv``) of ``env.backend`` (worker
    processes, or Ray actors with the ``env.ray`` options)."""
    e = cfg.env
    if e.num_workers <= 0:
        return LocalVectorEnv(factory(), num_envs, group_size=group_size)

    return VectorEnv(factory, num_envs, num_workers=e.num_workers, group_size=group_size,
                     step_timeout=e.step_timeout, max_steps=cfg.max_actions, env_name=e.name,
                     backend=e.backend, backend_options=dict(e.ray) or None)
