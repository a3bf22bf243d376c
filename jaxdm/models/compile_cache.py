"""JAX's persistent compilation cache under the jaxdm cache folder (on by default).

A second process running the same job loads its compiled XLA programs from disk instead of
compiling them again (the scoring programs of a SmolLM2 screen take tens of seconds to
compile on 2 CPU cores). ``enable()`` is called by the ``jaxdm`` command and by the local
decision models (``jaxdm.decision.local``); library users may call it themselves.

Where (``JAXDM_COMPILATION_CACHE``):

- unset or empty: ``<jaxdm cache>/xla`` (``$JAXDM_CACHE``, else ``~/.cache/jaxdm``; the same
  folder as the converted models, see ``jaxdm.models.paths.cache_root``);
- ``0`` / ``off`` / ``false`` / ``no`` (any case): disabled;
- anything else: that folder (``~`` expanded).

If the process already set ``jax_compilation_cache_dir`` itself, that choice is kept.
Every program is written, whatever its compile time and size (JAX's defaults, 1 s and a
file-system dependent minimum size, would skip the small CPU programs); the folder is bounded
to ``MAX_BYTES`` with least-recently-used eviction, which also makes JAX take a file lock around
reads and writes (several processes share the folder).
JAX puts its version, the backend and the compile options into every key, so entries of an
older jax or another machine are never loaded. The folder is trusted code: do not point it at
a folder others can write.

Whole programs (``stored``): JAX's cache still traces and lowers the function in every new
process to compute its key (0.3-0.5 s per SmolLM2 scoring program on 2 idle cores, 1-1.5 s
loaded). ``stored(jitted, static_argnames)`` wraps a ``jax.jit`` function so that, while the
cache is on, each compiled program is also written whole (``jax.experimental.
serialize_executable``) to ``<cache folder>/programs`` and a later process loads it without
tracing. Its key is computed without tracing: the function's name, the source of every module
of the jaxdm package and of the function's own module, the static arguments' ``repr``, the
other arguments' tree structure, shapes, dtypes and shardings, the versions of jax, jaxlib,
numpy, ml_dtypes and opt_einsum, the devices, every ``jax.config`` value, the ``XLA_*`` /
``JAX_*`` / ``JAXDM_*`` environment variables (not the cache locations) and whether the fused
CPU kernels are on (``jaxdm.models.cpu.build.fingerprint``). A program is stored
only when XLA compiled it in this process (see ``FRESH_COMPILE_OPTIONS``). Code outside those
sources that changes what the function traces to (another package's source edited in place
without a version change) is not seen: set ``JAXDM_COMPILATION_CACHE=0`` while editing such
code. The folder is bounded to ``PROGRAMS_MAX_BYTES`` (least recently used removed).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import inspect
import json
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Iterable

import jax
import jaxlib
import ml_dtypes
import numpy
import opt_einsum
from jax import monitoring
from jax.experimental import serialize_executable
from jax.tree_util import PyTreeDef, default_registry

from jaxdm.models.cpu import build as cpu_build
from jaxdm.models.paths import cache_root

ENV_VAR = "JAXDM_COMPILATION_CACHE"
OFF_VALUES = ("0", "off", "false", "no")
# Every program, eager single ops included (a few KB each): with a time threshold, which
# programs are written would depend on how loaded the machine was during the first run.
MIN_COMPILE_SECONDS = 0.0
MAX_BYTES = 4 << 30
PROGRAMS_DIR = "programs"
PROGRAMS_MAX_BYTES = 1 << 30
_PROGRAMS_FORMAT = 2
ENV_PREFIXES = ("XLA_", "JAX_", "JAXDM_")
# Where caches live changes no program (a moved folder keeps its programs valid).
LOCATION_VARS = (ENV_VAR, "JAXDM_CACHE", "JAXDM_PARAMS_CACHE")

_lock = threading.Lock()
_enabled: Path | None = None


def resolve() -> Path | None:
    """The folder ``enable()`` would use (None: disabled by ``JAXDM_COMPILATION_CACHE``)."""
    value = os.environ.get(ENV_VAR, "").strip()
    if value.lower() in OFF_VALUES:
        return None
    if value:
        return Path(value).expanduser()

    return cache_root() / "xla"


def enable() -> Path | None:
    """Turns JAX's persistent compilation cache on (idempotent); returns its folder or None.

    None when ``JAXDM_COMPILATION_CACHE`` disables it. A cache folder the process configured
    itself (``jax_compilation_cache_dir``) is kept and returned. A folder that cannot be
    created raises OSError naming it and the variable.
    """
    global _enabled

    with _lock:
        current = jax.config.jax_compilation_cache_dir
        if current is not None:
            return Path(current)
        path = resolve()
        if path is None:
            return None
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OSError(f"cannot create the JAX compilation cache folder {path} ({e}); set "
                          f"{ENV_VAR} to another folder or to 0 to disable it") from e
        jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
        jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
        jax.config.update("jax_compilation_cache_dir", str(path))
        _enabled = path
        return path


def release_freed_memory() -> bool:
    """Hands the C heap's free pages back to the OS (glibc's ``malloc_trim``); False where
    there is no glibc. Call it after compiling a large program: XLA's compiler frees hundreds
    of MB in small blocks that glibc keeps, so the program's first run would add its buffers
    on top of them (the 69-option fp32 LoRA step: peak RSS 3.23 -> 2.27 GB)."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL("libc.so.6")
            _libc.malloc_trim
        except (OSError, AttributeError):
            _libc = False
    if not _libc:
        return False
    _libc.malloc_trim(0)
    return True


_libc: Any = None


def enabled_dir() -> Path | None:
    """The folder this module turned the cache on in (None if ``enable`` did not)."""
    return _enabled


def stored(jitted: Callable, static_argnames: Iterable[str]) -> Callable:
    """``jitted`` (a ``jax.jit`` function; ``static_argnames`` its static arguments, by name)
    with its compiled programs stored whole in the compilation-cache folder, loaded by later
    processes without tracing or lowering (see the module docstring). Same results as
    ``jitted`` (the same compiled program). Calls go straight to ``jitted`` while the cache is
    off. Use it for host-side entry points; transformations (``jax.grad``, ``vmap``) need the
    plain ``jitted``. The same wrapper is returned for the same arguments (so calling
    ``stored(fn, names)(...)`` at each call keeps the programs loaded so far); a function
    without ``.lower`` (not a ``jax.jit`` function, e.g. a test's spy) is returned as is.
    Each call computes the key: about 0.3 ms (20-leaf params, 2 idle cores) on top of the jit's
    0.02 ms dispatch, nothing next to a scoring call."""
    if not hasattr(jitted, "lower"):
        return jitted
    key = (jitted, frozenset(static_argnames))
    with _lock:
        wrapper = _wrappers.get(key)
        if wrapper is None:
            wrapper = _wrappers[key] = _Stored(jitted, key[1])
    return wrapper


_wrappers: dict[tuple, Callable] = {}


class _Stored:
    def __init__(self, jitted: Callable, static: frozenset[str]):
        self._jitted = jitted
        self._signature = inspect.signature(jitted)
        self._static = static
        unknown = static - set(self._signature.parameters)
        if unknown:
            raise ValueError(f"static_argnames {sorted(unknown)} are not parameters of "
                             f"{jitted}")
        self._name = f"{getattr(jitted, '__module__', '')}.{getattr(jitted, '__qualname__', '')}"
        self._loaded: dict[str, Any] = {}
        self._lock = threading.Lock()
        functools.update_wrapper(self, jitted)

    def __call__(self, *args, **kwargs):
        folder = _enabled
        if folder is None or _multi_process():
            return self._jitted(*args, **kwargs)
        names = list(self._signature.parameters)
        dyn_args = [a for name, a in zip(names, args) if name not in self._static]
        dyn_kwargs = {k: v for k, v in kwargs.items() if k not in self._static}
        static = self._signature.bind_partial(*args, **kwargs).arguments
        static = {k: v for k, v in static.items() if k in self._static}
        key = self._key(static, (dyn_args, dyn_kwargs))
        compiled = self._loaded.get(key)
        if compiled is None:
            path = folder / PROGRAMS_DIR / f"{key}.jaxprog"
            compiled = _read_program(path, jax.tree.structure((tuple(dyn_args), dyn_kwargs)))
            if compiled is None:
                compiled, fresh = _compile_fresh(self._jitted.lower(*args, **kwargs))
                if fresh:
                    _write_program(path, compiled)
            with self._lock:
                self._loaded[key] = compiled
        return compiled(*dyn_args, **dyn_kwargs)

    def _key(self, static: dict, dynamic) -> str:
        leaves, tree = jax.tree.flatten(dynamic)
        # the fingerprint also builds and registers the kernels a loaded program may call
        parts = [_PROGRAMS_FORMAT, self._name, _sources_digest(self._jitted), str(tree),
                 sorted((k, repr(v)) for k, v in static.items()),
                 [_leaf_key(x) for x in leaves], _environment(), cpu_build.fingerprint()]
        return hashlib.sha256(repr(parts).encode()).hexdigest()[:40]


# Only an executable XLA compiled in this process serialises completely: one JAX loaded from its
# persistent cache and serialised again lost its kernels on XLA:CPU (the next process failed
# with "Function wrapped_iota not found"). So a stored program's compile carries an option that
# changes nothing in the compiled code (a dump setting at its default; dumping is off) but is
# part of JAX's cache key, which keeps JAX's cache from serving the plain jit's entry; and a
# program JAX's cache served anyway (e.g. a stored program removed from the folder) is used but
# not stored.
FRESH_COMPILE_OPTIONS = {"xla_dump_large_constants": False}
_hits = threading.local()
_hits_listening = False


def _compile_fresh(lowered) -> tuple[Any, bool]:
    """``lowered.compile`` with ``FRESH_COMPILE_OPTIONS``; also whether XLA compiled it here
    (no persistent-cache hit in this thread during the compile)."""
    global _hits_listening

    with _lock:
        if not _hits_listening:
            def count(name, **kwargs):
                if name == "/jax/compilation_cache/cache_hits":
                    _hits.n = getattr(_hits, "n", 0) + 1

            monitoring.register_event_listener(count)
            _hits_listening = True
    before = getattr(_hits, "n", 0)
    compiled = lowered.compile(FRESH_COMPILE_OPTIONS)
    return compiled, getattr(_hits, "n", 0) == before


def _multi_process() -> bool:
    return jax.process_count() > 1


def _leaf_key(x) -> tuple:
    if isinstance(x, jax.Array):
        return ("array", x.shape, str(x.dtype), x.weak_type, repr(x.sharding), x.committed)
    shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
    if shape is not None and dtype is not None:
        return ("host", tuple(shape), str(dtype))
    return ("python", type(x).__name__)  # traced as a weakly typed scalar


@functools.lru_cache(maxsize=None)
def _sources_digest(fn: Callable) -> str:
    """sha256 of every .py file of the jaxdm package and of ``fn``'s module (once a process)."""
    files = set(Path(__file__).resolve().parents[1].rglob("*.py"))
    module = sys.modules.get(getattr(fn, "__module__", ""))
    if getattr(module, "__file__", None):
        files.add(Path(module.__file__).resolve())
    h = hashlib.sha256()
    for path in sorted(files):
        h.update(str(path).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _environment() -> list:
    devices = [(d.platform, d.device_kind, d.id, d.process_index,
                getattr(d.client, "platform_version", "")) for d in jax.devices()]
    return [[m.__version__ for m in (jax, jaxlib, numpy, ml_dtypes, opt_einsum)], devices,
            sorted((k, repr(v)) for k, v in jax.config.values.items()
                   if k != "jax_compilation_cache_dir"),
            sorted((k, v) for k, v in os.environ.items()
                   if k.startswith(ENV_PREFIXES) and k not in LOCATION_VARS)]


def _read_program(path: Path, in_tree):
    """The compiled program stored at ``path`` for arguments of structure ``in_tree``, or None
    (missing, unreadable, other format or structure). The file is a JSON header line, then the
    serialised executable and the output structure (protocol buffer); no pickle."""
    try:
        with open(path, "rb") as f:
            header = json.loads(f.readline())
            blob = f.read(header["blob_bytes"])
            out_proto = f.read()
        if header.get("format") != _PROGRAMS_FORMAT or header["in_tree"] != str(in_tree) \
                or len(blob) != header["blob_bytes"]:
            return None

        by_id = {d.id: d for d in jax.devices()}
        out_tree = PyTreeDef.deserialize_using_proto(default_registry, out_proto)
        compiled = serialize_executable.deserialize_and_load(
            blob, in_tree, out_tree,
            execution_devices=[by_id[i] for i in header["device_ids"]])
    except FileNotFoundError:
        return None
    except Exception:  # noqa: BLE001 - a damaged entry costs a compile, never the job
        return None
    try:
        os.utime(path)  # recency for the eviction
    except OSError:
        pass
    return compiled


def _write_program(path: Path, compiled) -> None:
    """Stores ``compiled`` at ``path`` (temporary file + rename: safe across processes) and
    keeps the folder under ``PROGRAMS_MAX_BYTES``. A program that cannot be serialised or
    written is only not stored."""
    try:
        blob, in_tree, out_tree = serialize_executable.serialize(compiled)
        device_ids = [d.id for d in compiled.runtime_executable().local_devices()]
        # the input structure is the call's (checked on load); the output structure as a
        # protocol buffer (a user-defined output node raises here: not stored)
        out_proto = out_tree.serialize_using_proto()
        header = {"format": _PROGRAMS_FORMAT, "in_tree": str(in_tree),
                  "device_ids": device_ids, "blob_bytes": len(blob)}
        data = json.dumps(header).encode() + b"\n" + blob + out_proto
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o644)  # mkstemp creates 0600; the cache is shared read-only
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        _evict(path.parent, PROGRAMS_MAX_BYTES)
    except Exception:  # noqa: BLE001 - e.g. a program with constants JAX cannot serialise
        return


def _evict(folder: Path, max_bytes: int) -> None:
    entries = []
    for p in folder.glob("*.jaxprog"):
        try:
            st = p.stat()
        except OSError:
            continue
        entries.append((st.st_mtime, st.st_size, p))
    total = sum(size for _, size, _ in entries)
    for _, size, p in sorted(entries):
        if total <= max_bytes:
            break
        p.unlink(missing_ok=True)
        total -= size
