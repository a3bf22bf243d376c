"""JAX's persistent compilation cache under the jaxdm cache folder (on by default).

A second process running the same job loads its compiled XLA programs from disk instead of
compiling them again (the scoring programs of a SmolLM2 screen take tens of seconds to
compile on 2 CPU cores). ``enable()`` is called by the ``jaxdm`` command and by the local
decision models (``jaxdm.decision.local``); library users may call it themselves.

Where (``JAXDM_COMPILATION_CACHE``):

- unset or empty: ``<jaxdm cache>/xla`` (``$JAXDM_CACHE``, else ``~/.cache/jaxdm``; the same
  folder as the converted models, see ``jaxdm.models.smollm2.cache_root``);
- ``0`` / ``off`` / ``false`` / ``no`` (any case): disabled;
- anything else: that folder (``~`` expanded).

If the process already set ``jax_compilation_cache_dir`` itself, that choice is kept.
Every program is written, whatever its compile time and size (JAX's defaults, 1 s and a
file-system dependent minimum size, would skip the small CPU programs); the folder is bounded to ``MAX_BYTES`` with least-recently-used eviction, which
also makes JAX take a file lock around reads and writes (several processes share the folder).
JAX puts its version, the backend and the compile options into every key, so entries of an
older jax or another machine are never loaded. The folder is trusted code: do not point it at
a folder others can write.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

ENV_VAR = "JAXDM_COMPILATION_CACHE"
OFF_VALUES = ("0", "off", "false", "no")
# Every program, eager single ops included (a few KB each): with a time threshold, which
# programs are written would depend on how loaded the machine was during the first run.
MIN_COMPILE_SECONDS = 0.0
MAX_BYTES = 4 << 30

_lock = threading.Lock()
_enabled: Path | None = None


def resolve() -> Path | None:
    """The folder ``enable()`` would use (None: disabled by ``JAXDM_COMPILATION_CACHE``)."""
    value = os.environ.get(ENV_VAR, "").strip()
    if value.lower() in OFF_VALUES:
        return None
    if value:
        return Path(value).expanduser()
    from jaxdm.models.smollm2 import cache_root

    return cache_root() / "xla"


def enable() -> Path | None:
    """Turns JAX's persistent compilation cache on (idempotent); returns its folder or None.

    None when ``JAXDM_COMPILATION_CACHE`` disables it. A cache folder the process configured
    itself (``jax_compilation_cache_dir``) is kept and returned. A folder that cannot be
    created raises OSError naming it and the variable.
    """
    global _enabled
    import jax

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


def enabled_dir() -> Path | None:
    """The folder this module turned the cache on in (None if ``enable`` did not)."""
    return _enabled
