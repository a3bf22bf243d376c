"""A local Ray instance for the tests whose Ray actors import a test folder's modules."""
from __future__ import annotations

import contextlib
import os

import pytest


@contextlib.contextmanager
def local_ray_with(folder: str):
    """``ray.init`` (4 CPUs, no dashboard) with ``folder`` on PYTHONPATH, yielding ``ray``; shut
    down on exit. Skips the test without the [ray] extra. The actors import ``folder``'s
    modules under the names pytest gave them; Ray's workers inherit the environment of the
    instance started here (a runtime_env would do the same but costs seconds per actor)."""
    ray = pytest.importorskip("ray", reason="the [ray] extra is not installed")
    path = os.pathsep.join([folder, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", path)
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()
