"""Config system, run log and checkpoints."""
import dataclasses
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdm import config as cfgmod
from jaxdm import runlog
from jaxdm.rl.checkpoint import Checkpointer, numpy_rng_from_state, numpy_rng_state
from tests.config_fixtures import Optim, assert_file_refused, assert_yaml_round_trip


@dataclasses.dataclass(frozen=True)
class Demo:
    name: str = "x"
    steps: int = 3
    mode: Literal["grpo", "teacher"] = "teacher"
    seeds: tuple[int, ...] = (0, 1, 2)
    flag: bool = False
    optim: Optim = Optim()


def test_config_yaml_and_dotted_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("steps: 5\noptim:\n  lr: 1\nseeds: [4, 5]\n")
    c = cfgmod.load_config(Demo, p, ["optim.lr=3e-4", "mode=grpo", "flag=true",
                                     "optim.clip=null"])
    assert c == Demo(steps=5, mode="grpo", seeds=(4, 5), flag=True,
                     optim=Optim(lr=3e-4, clip=None))
    assert isinstance(c.optim.lr, float)
    assert_yaml_round_trip(c, tmp_path)


@pytest.mark.parametrize("override,msg", [
    ("optim.lrr=1", r"unknown config key optim.lrr .*did you mean optim.lr"),
    ("stepz=1", r"unknown config key stepz"),
    ("steps=1.5", r"steps: expected an int, got float 1.5"),
    ("steps='3'", r"steps: expected an int, got str"),
    ("flag=1", r"flag: expected true/false"),
    ("mode=ppo", r"mode: 'ppo' is not one of \['grpo', 'teacher'\]"),
    ("steps.x=1", r"steps is a value, not a section"),
    ("novalue", r"must look like key.path=value"),
])
def test_config_errors_name_the_key(override, msg):
    with pytest.raises(cfgmod.ConfigError, match=msg):
        cfgmod.load_config(Demo, None, [override])


def test_config_unknown_key_in_file(tmp_path):
    assert_file_refused(Demo, tmp_path / "bad.yaml", "optim:\n  beta: 2\n",
                        r"bad.yaml: unknown config key optim.beta")


@dataclasses.dataclass(frozen=True)
class WithKwargs:
    kwargs: dict = dataclasses.field(default_factory=dict)


def test_config_override_inside_mapping_field(tmp_path):
    p = tmp_path / "k.yaml"
    p.write_text("kwargs: {budget: 5, nested: {a: 1}}\n")
    c = cfgmod.load_config(WithKwargs, p, ["kwargs.budget=4", "kwargs.nested.b=2",
                                           "kwargs.split=test"])
    assert c.kwargs == {"budget": 4, "nested": {"a": 1, "b": 2}, "split": "test"}
    with pytest.raises(cfgmod.ConfigError, match="budget is a value, not a mapping"):
        cfgmod.load_config(WithKwargs, p, ["kwargs.budget.x=1"])


def test_config_from_argv_splits_flags(tmp_path):
    (tmp_path / "tiny.yaml").write_text("steps: 9\n")
    c, rest = cfgmod.config_from_argv(Demo, ["--config", "tiny", "--resume", "optim.lr=2"],
                                      presets_dir=tmp_path)
    assert c.steps == 9 and c.optim.lr == 2.0 and rest == ["--resume"]


def test_metrics_writer_jsonable_and_truncate(tmp_path):
    path = tmp_path / "m.jsonl"
    with runlog.MetricsWriter(path) as w:
        for k in range(4):
            w.write(k, {"a": jnp.float32(k) / 2, "b": np.int64(k), "nan": float("nan")})
    recs = runlog.read_metrics(path)
    assert [r["a"] for r in recs] == [0.0, 0.5, 1.0, 1.5] and recs[0]["nan"] is None
    with runlog.MetricsWriter(path, resume_step=1) as w:
        w.write(2, {"a": 9.0})
    assert [(r["step"], r["a"]) for r in runlog.read_metrics(path)] == [(0, 0.0), (1, 0.5),
                                                                         (2, 9.0)]
    with pytest.raises(TypeError, match="cannot log value of type object"):
        runlog.jsonable(object())


def test_plot_curves_writes_png(tmp_path):
    runs = {"a": [{"step": i, "success": i / 10} for i in range(5)],
            "b": [{"step": i, "success": 0.1} for i in range(5)]}
    out = runlog.plot_curves(runs, ["success"], tmp_path / "c.png")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000


def test_format_table():
    t = runlog.format_table([{"task": "clean", "s": 50.0}], ["task", "s"])
    assert t.splitlines()[2].split() == ["clean", "50.0"]


def test_metric_series_columns_defaults_and_missing_key():
    recs = [{"iteration": 1, "train/success": 0.1, "time/x": 2.0},
            {"iteration": 2, "train/success": 0.3, "eval/All": 50.0},
            {"iteration": 3, "eval/All": 75.0}]
    got = runlog.metric_series(recs, {"train": "train/success", "t": "time/x"},
                               present="train/success", defaults={"time/x": 0.0})
    assert got == {"iteration": [1, 2], "train": [0.1, 0.3], "t": [2.0, 0.0]}
    assert runlog.metric_series(recs, {"id": "eval/All"}, present="eval/All") == \
        {"iteration": [2, 3], "id": [50.0, 75.0]}
    with pytest.raises(KeyError, match="'time/x' missing at iteration 2"):
        runlog.metric_series(recs, {"t": "time/x"}, present="train/success")


def test_checkpoint_roundtrip_exact(tmp_path):
    rng = np.random.default_rng(7)
    rng.random(3)
    state = {"params": {"w": jnp.arange(6.0).reshape(2, 3)},
             "key": jax.random.key_data(jax.random.key(3)), "count": jnp.int32(4)}
    ck = Checkpointer(tmp_path / "ck", max_to_keep=2)
    for step in (1, 2, 3):
        ck.save(step, state, {"iteration": step, "rng": numpy_rng_state(rng)})
    assert ck.all_steps() == [2, 3] and ck.latest_step() == 3
    target = jax.tree.map(jnp.zeros_like, state)
    restored, host, step = ck.restore(target)
    assert step == 3 and host["iteration"] == 3
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    rng2 = numpy_rng_from_state(host["rng"])
    np.testing.assert_array_equal(rng2.random(4), rng.random(4))
    with pytest.raises(FileNotFoundError, match="no checkpoint for step 1"):
        ck.restore(target, step=1)
    ck.close()
