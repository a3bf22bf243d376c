"""jaxdm's XLA:CPU kernels: C++ called through XLA's FFI (``attention``, ``matmul``).

The sources beside this file (``attention.cc``, ``matmul.cc`` and the header they share,
``kernels.h``) are compiled on first use into one shared library (``g++`` or ``$CXX``, ``-O3
-march=native``) under ``<jaxdm cache>/kernels``, keyed by the sources, the compiler, jax and
the CPU; ``build.main(["--build"])`` does it ahead of time (``make test`` and ``make
demo`` run it). Each kernel is a ``Kernel`` here: its own environment variable
turns it off, it is off where the CPU lacks what it needs, and a failed build turns it off
with one warning naming why (XLA's operations are used instead: same results to rounding).
``JAXDM_CPU_AMX=0`` keeps both kernels off AMX tiles on CPUs that have them (they take the
AVX-512 BF16 paths CPUs without AMX run, e.g. to compare or test those).
"""
from __future__ import annotations

import argparse
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
from typing import Any

import jax

from jaxdm.models.paths import cache_root
from jaxdm.registry import Registry

HERE = Path(__file__).parent
SOURCES = (HERE / "attention.cc", HERE / "matmul.cc")
HEADERS = (HERE / "kernels.h",)
CXXFLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC")
OFF_VALUES = ("0", "off", "false", "no")
AMX_ENV_VAR = "JAXDM_CPU_AMX"  # both kernels: off = their AVX-512 BF16 paths on AMX CPUs
ON_VALUES = ("", "1", "on", "true", "yes")

_lock = threading.Lock()
_library: Any = None  # the loaded library (kept alive: XLA holds its handlers)
_library_file: Path | None = None
_library_error: Exception | None = None


def cpu_flags() -> set[str]:
    """The CPU feature flags /proc/cpuinfo lists (avx512f, amx_tile, ...); empty where it cannot be
    read."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def compiler() -> str | None:
    """The C++ compiler to build the kernels with: $CXX, else g++ or c++ on PATH; None when there is
    none."""
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def library_path(cxx: str) -> Path:
    """Where the shared library built by ``cxx`` lives: under the jaxdm cache root, named by a hash
    of the sources and headers, the compiler's version, the flags, jax's version, the CPU model and
    its flags (so any change builds a new one)."""
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True,
                             check=False).stdout.splitlines()[:1]
    model = ""
    try:
        model = next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines()
                      if ln.startswith("model name")), "")
    except OSError:
        pass
    key = hashlib.sha256()
    for part in (*(p.read_bytes() for p in SOURCES + HEADERS), repr(version).encode(),
                 " ".join(CXXFLAGS).encode(), jax.__version__.encode(), model.encode(),
                 " ".join(sorted(cpu_flags())).encode()):
        key.update(part)
        key.update(b"\0")
    return cache_root() / "kernels" / f"cpu_kernels-{key.hexdigest()[:16]}.so"


def build() -> Path:
    """Compiles the library (if not already built for these sources, compiler, jax and CPU)
    and returns its path. Raises RuntimeError naming what failed."""
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler (g++, c++ or $CXX) on PATH")
    path = library_path(cxx)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    # Built beside its final name and renamed: processes building at once never load a
    # half-written library.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
    os.close(fd)
    cmd = [cxx, *CXXFLAGS, f"-I{jax.ffi.include_dir()}", f"-I{HERE}", *map(str, SOURCES),
           "-o", tmp]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        os.unlink(tmp)
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-12:])
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{tail}")
    os.replace(tmp, path)
    return path


def env_switch(name: str) -> bool:
    """An on/off environment variable (unset: on); any other value raises ValueError naming
    it."""
    value = os.environ.get(name, "").strip().lower()
    if value in OFF_VALUES:
        return False
    if value not in ON_VALUES:
        raise ValueError(f"{name}={os.environ[name]!r}: expected one of "
                         f"{', '.join(repr(v) for v in OFF_VALUES + ON_VALUES[1:])} (or unset)")
    return True


def library() -> Any:
    """The loaded library, built if needed (once per process; a failure is remembered and
    raised again). ``JAXDM_CPU_AMX=0`` keeps its kernels off AMX tiles (their AVX-512 BF16
    paths, as on CPUs without AMX: to compare or test those on an AMX machine)."""
    global _library, _library_error, _library_file
    amx = env_switch(AMX_ENV_VAR)  # a bad value is an error, not a failed build
    with _lock:
        if _library is None and _library_error is None:
            try:
                _library_file = build()
                _library = ctypes.cdll.LoadLibrary(str(_library_file))
                _library.JaxdmSetAmx(ctypes.c_int(int(amx)))
            except (RuntimeError, OSError, AttributeError) as exc:
                _library_error = exc
        if _library_error is not None:
            raise _library_error
        return _library


class Kernel:
    """One FFI handler of the library: ``status()`` is (on, why), computed once."""

    def __init__(self, name: str, env_var: str, target: str, symbol: str,
                 needs: tuple[str, ...], what: str, instead: str):
        self.name, self.env_var, self.target, self.symbol = name, env_var, target, symbol
        self.needs, self.what, self.instead = needs, what, instead
        self._state: tuple[bool, str] | None = None
        self._lock = threading.Lock()

    def _load(self) -> tuple[bool, str]:
        if not env_switch(self.env_var):
            return False, f"off: {self.env_var}={os.environ[self.env_var]}"
        env_switch(AMX_ENV_VAR)  # checked before any build: a bad value is an error
        if platform.machine().lower() not in ("x86_64", "amd64"):
            return False, f"off: {platform.machine()} is not x86-64"
        missing = [f for f in self.needs if f not in cpu_flags()]
        if missing:
            return False, f"off: the CPU lacks {', '.join(missing)}"
        try:
            lib = library()
            jax.ffi.register_ffi_target(self.target, jax.ffi.pycapsule(getattr(lib, self.symbol)),
                                        platform="cpu")
        except (RuntimeError, OSError, AttributeError) as exc:
            warnings.warn(f"jaxdm: the {self.what} is off, {self.instead} is used instead: "
                          f"{exc}", RuntimeWarning, stacklevel=4)
            return False, f"off: {exc}".splitlines()[0]
        return True, f"on: {self.target} in {_library_file.name}"

    def status(self) -> tuple[bool, str]:
        """(on, why): whether the kernel is used, after building and registering it if
        needed. A bad value of its environment variable raises ValueError naming it."""
        with self._lock:
            if self._state is None:
                self._state = self._load()
            return self._state

    def enabled(self) -> bool:
        """Whether this kernel is used (status()'s first part; builds and registers it on first
        call)."""
        return self.status()[0]

    def cannot_run_here(self, why: str) -> bool:
        """Whether an off ``status()`` reason is by choice, by CPU or by a missing compiler
        (the kernels are optional: XLA's operations are used), not a failed build."""
        return why.startswith((f"off: {self.env_var}=", "off: the CPU lacks",
                               "off: no C++ compiler")) or "x86-64" in why


# The library's kernels (their modules, attention and matmul beside this one, hold the Python
# sides). The names stay cpu_*: they are the fingerprint's keys of stored programs.
ATTENTION = Kernel("cpu_attention", "JAXDM_CPU_ATTENTION", "jaxdm_cpu_attention",
                   "JaxdmCpuAttention", ("avx512f", "avx512bw", "avx512vl"),
                   what="fused CPU attention kernel", instead="XLA's attention")
# The same source and switch as ATTENTION: masks by the segment rule instead of pred arrays.
ATTENTION_SEGMENTS = Kernel("cpu_attention_segments", "JAXDM_CPU_ATTENTION",
                            "jaxdm_cpu_attention_segments", "JaxdmCpuAttentionSegments",
                            ("avx512f", "avx512bw", "avx512vl"),
                            what="fused CPU attention kernel (segment masks)",
                            instead="XLA's attention")
# The same source and switch as ATTENTION: the segment rule's backward pass (bf16, head dim
# 64, AMX tiles only; elsewhere XLA's backward, decoder.segment_attention_vjp, runs).
ATTENTION_SEGMENTS_GRAD = Kernel("cpu_attention_segments_grad", "JAXDM_CPU_ATTENTION",
                                 "jaxdm_cpu_attention_segments_grad",
                                 "JaxdmCpuAttentionSegmentsGrad",
                                 ("avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_bf16",
                                  "amx_tile"),
                                 what="fused CPU attention backward kernel (segment masks)",
                                 instead="XLA's attention backward")
# Its forward for training: the segment kernel's output and each query vector's log-sum-exp.
ATTENTION_SEGMENTS_LSE = Kernel("cpu_attention_segments_lse", "JAXDM_CPU_ATTENTION",
                                "jaxdm_cpu_attention_segments_lse",
                                "JaxdmCpuAttentionSegmentsLse", ATTENTION_SEGMENTS_GRAD.needs,
                                what="fused CPU attention kernel (segment masks, log-sum-exp)",
                                instead="XLA's attention backward")
MATMUL = Kernel("cpu_matmul", "JAXDM_CPU_MATMUL", "jaxdm_cpu_matmul", "JaxdmCpuMatmul",
                ("avx512f", "avx512bw", "avx512vl", "avx512_bf16"),
                what="bf16 matmul kernel", instead="XLA's dot")
# The same source and switch as MATMUL; its own status (CPUs with AVX-512 but not its BF16).
MATMUL_F32 = Kernel("cpu_matmul_f32", "JAXDM_CPU_MATMUL", "jaxdm_cpu_matmul_f32",
                    "JaxdmCpuMatmulF32", ("avx512f", "avx512bw", "avx512vl"),
                    what="fp32 matmul kernel", instead="XLA's dot")
# Every kernel by name (its status line, the programs' fingerprint).
KERNELS: Registry[Kernel] = Registry("CPU kernel")
for _kernel in (ATTENTION, ATTENTION_SEGMENTS, ATTENTION_SEGMENTS_GRAD, ATTENTION_SEGMENTS_LSE,
                MATMUL, MATMUL_F32):
    KERNELS.register(_kernel.name, _kernel)


def fingerprint() -> str:
    """What programs traced in this process depend on (for keys of stored programs): which
    kernels are on; a program that calls one needs it registered before it runs."""
    return ",".join(f"{name}:{'on' if k.enabled() else 'off'}"
                    for name, k in sorted(KERNELS.items()))


def main(argv: list[str] | None = None) -> int:
    """``python -m jaxdm.models.cpu.build [--build]``: print each kernel's status and why; with
    --build exit 1 when a kernel that could run here is off."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", action="store_true",
                        help="build and register the kernels now (exit 1 if that fails)")
    args = parser.parse_args(argv)
    failed = False
    for name, kernel in sorted(KERNELS.items()):
        on, why = kernel.status()
        print(f"jaxdm {name}: {why}")
        failed |= not on and not kernel.cannot_run_here(why)
    return 1 if args.build and failed else 0


if __name__ == "__main__":
    sys.exit(main())
