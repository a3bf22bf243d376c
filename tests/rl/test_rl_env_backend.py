"""``env.backend: ray`` in the trainer's config: a Ray cluster started by the test (its own
process, joined through ``env.ray.address`` as a multi-node run joins its head) gives the same
iteration as the worker-process pool on a fixed seed. The config keys are checked on load."""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

from jaxdm import config as cfgmod
from jaxdm.rl.train_config import TrainConfig

HERE = os.path.dirname(os.path.abspath(__file__))
TINY = ["env.name=toy_ordering", "teacher.kind=none", "algo.advantage=grpo",
        "env.num_workers=2"]
# A local Ray cluster in its own process: prints its address, lives until stdin closes.
CLUSTER = """
import sys, ray
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()
ray.shutdown()
"""


@pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                    reason="the [ray] extra is not installed")
def test_ray_backend_repeats_the_process_pool_iteration(tmp_path):
    # Ray's token authentication (on by default for a new cluster, its token in
    # ~/.ray/auth_token): a driver joining by address must run with RAY_AUTH_MODE=token.
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    head = subprocess.Popen([sys.executable, "-c", CLUSTER], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        address = head.stdout.readline().strip()
        assert address.count(":") == 1, f"the Ray cluster did not start (got {address!r})"
        done = subprocess.run([sys.executable, os.path.join(HERE, "env_backend_run.py"),
                               str(tmp_path), address], env=env, capture_output=True,
                              text=True, timeout=400)
        assert done.returncode == 0, done.stderr[-3000:]
    finally:
        head.stdin.close()
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait()
    proc, ray = np.load(tmp_path / "process.npz"), np.load(tmp_path / "ray.npz")
    assert str(proc["used"]) == "process" and str(ray["used"]) == "ray"
    assert len(ray["workers"]) == 2 and not set(ray["workers"]) & set(proc["workers"])
    np.testing.assert_array_equal(proc["metrics"], ray["metrics"])
    params = [k for k in proc.files if k.startswith("p")]
    assert len(params) > 4
    for k in params:
        np.testing.assert_array_equal(proc[k], ray[k])


def test_env_backend_keys_are_checked_on_load():
    load = lambda *o: cfgmod.load_config(TrainConfig, None, [*TINY, *o])  # noqa: E731
    with pytest.raises(cfgmod.ConfigError, match=r"env.backend: unknown worker backend 'dask'; "
                                                 r"known: \['process', 'ray'\]"):
        load("env.backend=dask")
    with pytest.raises(cfgmod.ConfigError, match=r"unknown config key\(s\) \['env.ray.gpus'\]"):
        load("env.backend=ray", "env.ray={gpus: 1}")
    with pytest.raises(cfgmod.ConfigError, match="env.ray is set but env.backend is 'process'"):
        load("env.ray={num_cpus: 1}")
    with pytest.raises(cfgmod.ConfigError, match="needs env.num_workers >= 1"):
        load("env.backend=ray", "env.num_workers=0")
    cfg = load("env.backend=ray", "env.ray={num_cpus: 0.5, resources: {env_node: 1}}")
    assert dataclasses.asdict(cfg.env)["ray"] == {"num_cpus": 0.5,
                                                  "resources": {"env_node": 1}}
