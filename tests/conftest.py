"""Test-wide setup: 8 fake CPU devices (for the sharding tests) before JAX is imported."""
import os
import signal

flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in flags:
    os.environ["XLA_FLAGS"] = (flags + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# On a fresh machine (CI: an empty compilation cache) the suite is compile-bound: hundreds of
# small programs, each ~0.2-1 s of LLVM. XLA's HLO passes (fusion, layout) still run; only
# the backend's LLVM optimisations are off. Cold-cache runs, 2026-12-03: tests/decision 369 ->
# 231 s. A test that starts a process with its own XLA_FLAGS keeps them.
if "xla_backend_optimization_level" not in flags:
    os.environ["XLA_FLAGS"] += " --xla_backend_optimization_level=0"

# A shell without job control starts background commands (`pytest ... &`) with SIGINT ignored,
# and an ignored signal is inherited by every child process: the Ctrl-C tests (a SIGINT to this
# process or to a training / screening subprocess) need it delivered as in a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
