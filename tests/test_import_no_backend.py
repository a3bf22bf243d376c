"""Importing the trainer (and the CLI) never starts the XLA backend: multi-process runs must
call jax.distributed.initialize() after their imports and before any JAX computation."""
import subprocess
import sys


def test_imports_leave_the_backend_uninitialised():
    code = ("from jax._src import xla_bridge as xb\n"
            "import jaxdm.rl.trainer, jaxdm.cli, jaxdm.harness, jaxdm.bench.run\n"
            "print(sorted(xb._backends))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout
