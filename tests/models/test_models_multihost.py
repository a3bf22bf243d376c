"""Two JAX processes on 127.0.0.1 (CPU, gloo collectives) train like one process.

Each process owns 2 CPU devices and only its half of the global batch
(``jaxdm.models.sharding.process_rows`` / ``global_batch``); the data-parallel mesh spans both
processes. After the same SGD steps the parameters equal those of one process running the
same global batch on a 4-device mesh (within 1e-6), and the orbax checkpoint that both
processes wrote restores them exactly.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import multihost_worker  # noqa: E402  (the worker script, also the single-process reference)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.skipif(jax.device_count() < 4, reason="needs 4 (fake) devices")
def test_two_processes_train_like_one(tmp_path):
    from jaxdm.models import presets
    from jaxdm.models import sharding as sh

    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=2")
    coordinator = f"127.0.0.1:{_free_port()}"
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "multihost_worker.py"),
                               coordinator, "2", str(i), str(tmp_path)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for i in range(2)]
    try:
        outs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-4000:]

    cfg = presets.TINY_QWEN2
    mesh = sh.make_mesh(data=4, model=1, devices=jax.devices()[:4])
    single = multihost_worker.flat(
        multihost_worker.train(mesh, cfg, multihost_worker.make_batch(cfg)), mesh)
    final = dict(np.load(tmp_path / "final.npz"))
    restored = dict(np.load(tmp_path / "restored.npz"))
    assert final.keys() == single.keys() == restored.keys()
    init = {jax.tree_util.keystr(path): x for path, x in
            jax.tree_util.tree_leaves_with_path(multihost_worker.initial_params(cfg))}
    moved = max(float(np.max(np.abs(final[k] - init[k]))) for k in final)
    assert moved > 1e-3  # training changed the parameters
    for k in final:
        np.testing.assert_allclose(final[k], single[k], atol=1e-6, err_msg=k)
        np.testing.assert_array_equal(restored[k], final[k], err_msg=k)
