"""The harness's named error (a leaf module: the LLM builder and the commands both raise it)."""


class HarnessError(ValueError):
    """A harness job cannot run as configured (message names the key or file)."""


__all__ = ["HarnessError"]
