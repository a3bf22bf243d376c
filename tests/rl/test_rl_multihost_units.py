"""The pieces of multi-process training that one process can check (``jaxdm.rl.distributed``).

- Sampling a turn's live episodes in two parts, each with its ``SampleWindow`` (its rows of
  the whole turn's noise), picks the actions of sampling them all at once: what lets two
  processes reproduce the one-process rollout.
- Settings that need batch statistics or other processes' rows are refused, naming the key.
"""
from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest

from jaxdm import config as cfgmod
from jaxdm.rl import build, distributed
from jaxdm.rl.env_factories import make_venv
from jaxdm.rl.policy import SampleWindow, TurnInput, bucket
from jaxdm.rl.trainer import TrainConfig

PRESET = Path(__file__).resolve().parents[2] / "experiments/configs/teacher_grpo_cpu_smoke.yaml"


def _cfg(*overrides: str) -> TrainConfig:
    return cfgmod.load_config(TrainConfig, PRESET, ["progress=false", *overrides])


def test_windowed_sampling_equals_the_whole_turn():
    cfg = _cfg()
    train_factory, eval_factory = build.env_factories(cfg)
    policy, params, _, _ = build.build_policy(cfg, train_factory, eval_factory)
    venv = make_venv(cfg, train_factory, 8, 4)
    try:
        obs, infos = venv.reset(5)
    finally:
        venv.close()
    states = [TurnInput(info["goal"], o, tuple(info["admissible_actions"]), (), 0, 5)
              for o, info in zip(obs, infos)]
    # one state with few options: its part's own option bucket is narrower than the turn's
    states[6] = TurnInput(states[6].goal, states[6].observation, states[6].admissible[:2],
                          (), 0, 5)
    live = [0, 1, 2, 4, 6, 7]  # slots 3 and 5 have ended
    turn = [states[i] for i in live]
    key = jax.random.key(11)
    whole = policy.act(params, turn, key, pad_to=8)
    options = bucket(max(len(s.admissible) for s in turn), 8)
    parts = []
    for offset, part in ((0, turn[:3]), (3, turn[3:])):  # process 0: slots 0-3, 1: 4-7
        parts += policy.act(params, part, key, pad_to=4,
                            window=SampleWindow(offset, bucket(8), options))
    assert [o.action for o in parts] == [o.action for o in whole]
    np.testing.assert_allclose([o.logp for o in parts], [o.logp for o in whole], atol=1e-6)


@pytest.mark.parametrize("override,named", [
    ("rollout_pipeline=true", "rollout_pipeline"),
    ("algo.advantage=gigpo", None),
    ("critic.kind=decoder", None),  # a critic: values per process, columns gathered
])
def test_multi_process_settings_checked(override, named):
    cfg = _cfg(override, "teacher.kind=none" if "gigpo" in override else "progress=false")
    every = distributed.sh.make_mesh(-1, 1)
    if named is not None:
        with pytest.raises(ValueError, match=named):
            distributed.check_config(cfg, every)
        return
    distributed.check_config(cfg, every)  # per-group estimators, a critic are fine
    if jax.device_count() > 1:  # a mesh that leaves devices (processes) out is refused
        with pytest.raises(ValueError, match="mesh_data=-1"):
            distributed.check_config(cfg, distributed.sh.make_mesh(1, 1))


def test_trainer_prints_per_device_memory_at_start(tmp_path, capsys):
    import optax
    from jax.sharding import AbstractMesh

    from jaxdm.models.decoder import init_params
    from jaxdm.models.sharding import train_memory_per_device
    from jaxdm.rl import sharding
    from jaxdm.rl.trainer import Trainer

    cfg = _cfg(f"out_dir={tmp_path}")
    tr = Trainer(cfg)  # log=True: process 0 prints the line
    try:
        lines = [s for s in capsys.readouterr().out.splitlines() if "per device" in s]
        want = sharding.train_memory(tr.params, tr.txs["policy"], tr.mesh)
    finally:
        tr.close()
    assert len(lines) == 1 and lines[0].startswith("mesh data 1 x model 1 (1 devices)"), lines
    assert f"= {want['total'] / 2 ** 20:.1f} MiB" in lines[0], (lines, want)
    # the trainer's estimate is the preset estimate (experiments/mesh_memory.py) for a decoder
    # and AdamW, also on meshes larger than this machine's (FSDP x TP: shards split over both)
    params = jax.eval_shape(lambda: init_params(tr.model_config, jax.random.key(0)))
    for data, model in ((1, 1), (4, 2)):
        mesh = AbstractMesh((data, model), ("data", "model"))
        got = sharding.train_memory(params, optax.adamw(1e-3), mesh)
        assert got == train_memory_per_device(tr.model_config, data, model), (data, model)
    one = sharding.train_memory(params, optax.adamw(1e-3), AbstractMesh((1, 1), ("data", "model")))
    assert got["params"] < one["params"] and got["optimizer"] < one["optimizer"]


def test_train_step_keeps_the_state_shardings():
    """``sharding.keep_shardings``: the new state keeps the placed shardings, so the next
    call compiles nothing (left to XLA, the outputs come back otherwise sharded)."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    from jaxdm.rl import sharding

    mesh = sharding.make_mesh(2, 1, devices=jax.devices()[:2])
    placed = NamedSharding(mesh, P(None, "data"))
    params = {"embed": jax.device_put(np.arange(32, dtype=np.float32).reshape(4, 8), placed)}
    opts = {"count": jax.device_put(np.zeros((), np.int32), sharding.replicated(mesh))}

    def step(p, o, batch):
        p = jax.tree.map(lambda x: x * batch.sum(), p)
        # the layout XLA is free to pick for an output (here forced, for the test)
        p = jax.lax.with_sharding_constraint(p, NamedSharding(mesh, P("data", None)))
        return p, {"count": o["count"] + 1}, {"n": batch.sum()}

    raw = jax.jit(step)
    drifted, _, _ = raw(params, opts, np.ones(2, np.float32))
    assert not drifted["embed"].sharding.is_equivalent_to(placed, 2)
    kept = sharding.keep_shardings(raw, params, opts)
    assert sharding.keep_shardings(raw, params, opts) is kept  # one wrapper per layout
    p, o = params, opts
    for _ in range(2):
        p, o, met = kept(p, o, np.ones(2, np.float32))
    assert p["embed"].sharding == placed and o["count"].sharding == opts["count"].sharding
    assert kept._cache_size() == 1 and int(o["count"]) == 2 and float(met["n"]) == 2.0
    np.testing.assert_array_equal(np.asarray(p["embed"]), 4 * np.asarray(params["embed"]))


def test_local_copy_is_the_tree_on_one_device():
    """``act_on_local_copy`` acts with ``LocalCopy``: the placed tree replicated onto this
    process's first device (reused for the same tree), the key there too."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    mesh = distributed.sh.make_mesh(2, 1, devices=jax.devices()[:2])
    tree = {"w": jax.device_put(np.arange(16, dtype=np.float32).reshape(2, 8),
                                NamedSharding(mesh, P(None, "data")))}
    copy = distributed.LocalCopy(mesh)
    local = copy(tree)
    assert local["w"].devices() == {jax.devices()[0]}
    np.testing.assert_array_equal(np.asarray(local["w"]), np.asarray(tree["w"]))
    assert copy(tree) is local
    key = jax.device_put(jax.random.key(3), distributed.sh.replicated(mesh))
    moved = distributed.LocalCopy.key(key)
    assert moved.devices() == {jax.devices()[0]}
    assert np.array_equal(jax.random.key_data(moved), jax.random.key_data(jax.random.key(3)))
