"""A fused attention kernel for XLA:CPU (``cpu_attention.cc``), called through XLA's FFI.

XLA:CPU has no fused attention: at head dim 64 the packed readout spent ~58 % of its bf16
time (~36 % fp32) in attention, its fp32 logits crossing memory 3-4 times per block (issue
17). The kernel takes a group of query vectors over the keys in blocks of 16: logits and
each vector's exact max, then probabilities, then the weighted values, the group's logits
and probabilities staying in L1/L2; blocks masked for the whole group are skipped. fp32 runs
on AVX-512 FMAs; bf16 at head dim 64 on AMX tiles where the CPU has them. Work is spread over
XLA's intra-op thread pool. It is still a pure jitted function: an XLA custom call, no host
callback.

- ``attend(q, sources, reference)`` is ``decoder.attend``'s fast path: on CPU the kernel, on
  every other platform ``reference`` (``lax.platform_dependent``). Differentiation runs
  ``reference`` (a custom JVP: the kernel is forward-only), so gradients are the XLA path's.
- The kernel is compiled from its C++ source on first use (``g++`` or ``$CXX``, ``-O3
  -march=native``) into ``<jaxdm cache>/kernels`` (keyed by the source, the compiler, jaxlib
  and the CPU), and registered with XLA. ``cpu_attention.main(["--build"])`` does it ahead of
  time (``make test`` and ``make demo`` run it).
- ``JAXDM_CPU_ATTENTION=0`` (or ``off``/``false``/``no``) turns it off (``1``/``on``/``true``/
  ``yes`` or unset: on; anything else is an error naming the variable). It is also off where
  it cannot run: not x86-64 with AVX-512 F/BW/VL, no compiler, a failed build (one warning
  names why). ``status()`` says which. Off means the XLA attention, same results to fp32
  rounding.

Numbers: logits, softmax and accumulation in fp32. fp32 agrees with the XLA path to ~1e-6;
bf16 rounds the probabilities to bf16 before the value product as the XLA path does (on the
FMA path, without AMX, they stay fp32), so the two agree to bf16 output rounding. A query
vector that may attend to no key gets the uniform average of the values, as in the XLA path.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

ENV_VAR = "JAXDM_CPU_ATTENTION"
OFF_VALUES = ("0", "off", "false", "no")
ON_VALUES = ("", "1", "on", "true", "yes")
TARGET = "jaxdm_cpu_attention"
SOURCE = Path(__file__).with_name("cpu_attention.cc")
HEAD_DIMS = (32, 64, 128, 256)
DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
_CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl")
CXXFLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC")

_lock = threading.Lock()
_state: tuple[bool, str] | None = None
_library: Any = None  # the loaded shared library (kept alive: XLA holds its handler)


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def _library_path(cxx: str) -> Path:
    from jaxdm.models.smollm2 import cache_root

    version = subprocess.run([cxx, "--version"], capture_output=True, text=True,
                             check=False).stdout.splitlines()[:1]
    model = ""
    try:
        model = next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines()
                      if ln.startswith("model name")), "")
    except OSError:
        pass
    key = hashlib.sha256()
    for part in (SOURCE.read_bytes(), repr(version).encode(), " ".join(CXXFLAGS).encode(), jax.__version__.encode(),
                 model.encode(), " ".join(sorted(_cpu_flags())).encode()):
        key.update(part)
        key.update(b"\0")
    return cache_root() / "kernels" / f"cpu_attention-{key.hexdigest()[:16]}.so"


def build() -> Path:
    """Compiles the kernel (if not already built for this source, compiler, jax and CPU) and
    returns the shared library's path. Raises RuntimeError naming what failed."""
    cxx = _compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler (g++, c++ or $CXX) on PATH")
    path = _library_path(cxx)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    # Built beside its final name and renamed: processes building at once never load a
    # half-written library.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
    os.close(fd)
    cmd = [cxx, *CXXFLAGS, f"-I{jax.ffi.include_dir()}", str(SOURCE), "-o", tmp]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        os.unlink(tmp)
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-12:])
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{tail}")
    os.replace(tmp, path)
    return path


def _load() -> tuple[bool, str]:
    global _library
    value = os.environ.get(ENV_VAR, "").strip().lower()
    if value in OFF_VALUES:
        return False, f"off: {ENV_VAR}={os.environ[ENV_VAR]}"
    if value not in ON_VALUES:
        raise ValueError(f"{ENV_VAR}={os.environ[ENV_VAR]!r}: expected one of "
                         f"{', '.join(repr(v) for v in OFF_VALUES + ON_VALUES[1:])} (or unset)")
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False, f"off: {platform.machine()} is not x86-64"
    missing = [f for f in _CPU_FLAGS if f not in _cpu_flags()]
    if missing:
        return False, f"off: the CPU lacks {', '.join(missing)}"
    try:
        path = build()
        _library = ctypes.cdll.LoadLibrary(str(path))
        jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(_library.JaxdmCpuAttention),
                                    platform="cpu")
    except (RuntimeError, OSError, AttributeError) as exc:
        warnings.warn(f"jaxdm: the fused CPU attention kernel is off, XLA's attention is used "
                      f"instead: {exc}", RuntimeWarning, stacklevel=3)
        return False, f"off: {exc}".splitlines()[0]
    return True, f"on: {path.name}"


def status() -> tuple[bool, str]:
    """(on, why): whether the kernel is used, after building and registering it if needed."""
    global _state
    with _lock:
        if _state is None:
            _state = _load()
        return _state


def enabled() -> bool:
    return status()[0]


def fingerprint() -> str:
    """What programs traced in this process depend on (for keys of stored programs): whether
    the kernel is on; a program that calls it needs it registered before it runs."""
    return "cpu_attention:" + ("on" if enabled() else "off")


# Query vectors (S * G) per (row, KV head) below which XLA's attention is used: the kernel
# packs each (row, head)'s keys once per call, which a decoding step (S = 1, G = 3) does not
# amortise (whole-program A/B, 16 x 32 greedy tokens: bf16 0.92x, fp32 ~1x; issue 17).
MIN_QUERY_VECTORS = 16


def supports(q: jax.Array, sources: list[tuple[jax.Array, jax.Array, jax.Array]]) -> bool:
    """Whether the kernel takes these operands (dtype, head dim, key batches) and is used for
    them: at least ``MIN_QUERY_VECTORS`` query vectors per (row, KV head), and in bf16 no cache
    shared by several rows (XLA contracts all B * G * S rows against it in one AMX matmul;
    Actor option scoring ran 0.94x with the kernel)."""
    if q.ndim != 5 or jnp.dtype(q.dtype) not in DTYPES or q.shape[-1] not in HEAD_DIMS:
        return False
    b, s, _, g, _ = q.shape
    if s * g < MIN_QUERY_VECTORS:
        return False
    for k, v, mask in sources:
        if k.dtype != q.dtype or v.dtype != q.dtype or k.shape != v.shape or k.ndim != 4:
            return False
        if k.shape[0] not in (1, b) or mask.shape != (b, s, k.shape[1]):
            return False
        if k.shape[0] == 1 < b and q.dtype == jnp.bfloat16:
            return False
    return True


def _kernel(q: jax.Array, sources: list[tuple[jax.Array, jax.Array, jax.Array]]) -> jax.Array:
    """The custom call: q [B, S, K, G, H], sources (k, v [Bk, T, K, H], mask [B, S, T]) ->
    [B, S, K, G, H] in q's dtype (scale 1/sqrt(H) applied inside)."""
    on, why = status()
    if not on:
        raise RuntimeError(f"the fused CPU attention kernel is {why}")
    operands = [q]
    for k, v, mask in sources:
        operands += [k, v, mask.astype(jnp.bool_)]
    call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct(q.shape, q.dtype),
                            vmap_method="broadcast_all")
    return call(*operands, scale=np.float32(1.0 / np.sqrt(q.shape[-1])))


def make_attend(reference: Callable) -> Callable:
    """``attend(q, sources)`` -> [B, S, N, H] like ``reference`` (``decoder``'s XLA
    attention): the kernel on CPU, ``reference`` elsewhere and under differentiation."""

    @jax.custom_jvp
    def attend(q, sources):
        def on_cpu(q, sources):
            b, s, kh, g, hd = q.shape
            return _kernel(q, sources).reshape(b, s, kh * g, hd)

        return jax.lax.platform_dependent(q, sources, cpu=on_cpu, default=reference)

    @attend.defjvp
    def _jvp(primals, tangents):
        return jax.jvp(reference, primals, tangents)

    return attend


def cannot_run_here(why: str) -> bool:
    """Whether an off ``status()`` reason is by choice, by CPU or by a missing compiler (the
    kernel is optional: XLA's attention is used), not a failed build."""
    return why.startswith((f"off: {ENV_VAR}=", "off: the CPU lacks", "off: no C++ compiler")) \
        or "x86-64" in why


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", action="store_true",
                        help="build and register the kernel now (exit 1 if that fails)")
    args = parser.parse_args(argv)
    on, why = status()
    print(f"jaxdm cpu attention: {why}")
    return 1 if args.build and not on and not cannot_run_here(why) else 0


if __name__ == "__main__":
    sys.exit(main())
