"""Where jaxdm keeps what it builds once per machine: converted models, the parameter cache,
compiled XLA programs, CPU kernels. A leaf module (no jaxdm imports), so every part of
``jaxdm.models`` can read it without importing the model loaders."""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_root"]


def cache_root() -> Path:
    """$JAXDM_CACHE, else ~/.cache/jaxdm."""
    env = os.environ.get("JAXDM_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "jaxdm"
