"""One parser for decision-backend specs (``jaxdm screen --judge``, ``jaxdm bench --judge``,
``jaxdm decide --backend``, the harness's ``dm``).

A spec is an alias (``"smollm2"``, ``"oracle"``, or the caller's own aliases), a string
``"kind:key=value,..."`` (values parsed as int, float, true/false, else kept as text), or a
mapping. The result is a plain dict with ``kind`` (and ``name`` unless ``with_name=False``:
the ``model``, the last part of ``path``, or the kind) for ``jaxdm.decision.make_backend`` or
``jaxdm.harness.make_dm``. Keys that look like secrets and non-finite numbers are rejected;
errors (``BackendSpecError``, a ValueError) name the item and never show a secret's value.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

from jaxdm.config import SECRET_HINT, is_secret_key

BACKEND_ALIASES: dict[str, dict[str, Any]] = {
    "smollm2": {"kind": "local_readout", "path": "smollm2", "name": "smollm2-135m"},
    "oracle": {"kind": "oracle", "name": "oracle"},
}


class BackendSpecError(ValueError):
    """A backend spec that cannot be parsed (the message names the item)."""


def shown_spec(spec: str) -> str:
    """A spec string for messages, values of secret-looking keys hidden."""
    kind, colon, rest = spec.partition(":")
    # An item without "=" may be a pasted secret: never shown.
    items = [f"{k}=<value hidden>" if eq and is_secret_key(k.strip()) else
             (f"{k}{eq}{v}" if eq or not k else "<item without '='>")
             for k, eq, v in (item.partition("=") for item in rest.split(","))]
    return repr(kind + colon + ",".join(items))


def parse_scalar(v: str, key: str = "value", what: str = "backend") -> Any:
    """int, then float, then true/false, else the text; non-finite numbers are an error."""
    for cast in (int, float):
        try:
            out = cast(v)
        except ValueError:
            continue
        if not math.isfinite(out):
            raise BackendSpecError(f"{what} spec key {key!r}: non-finite number {v!r} is not "
                                   "allowed")
        return out
    return {"true": True, "false": False}.get(v.lower(), v)


def parse_backend_spec(spec: Any, *, aliases: Mapping[str, Mapping[str, Any]] | None = None,
                       what: str = "backend", with_name: bool = True) -> dict[str, Any]:
    """An alias, ``"kind:key=value,..."`` or a mapping -> a spec dict (module docstring).

    ``aliases`` default to ``BACKEND_ALIASES``; ``what`` names the spec in messages ("judge",
    "decision model")."""
    aliases = BACKEND_ALIASES if aliases is None else aliases
    if isinstance(spec, Mapping):
        out = dict(spec)
    elif isinstance(spec, str):
        if spec in aliases:
            out = dict(aliases[spec])
        elif ":" in spec:
            kind, _, rest = spec.partition(":")
            out = {"kind": kind}
            for n, item in enumerate(rest.split(","), 1):
                if item and "=" not in item:
                    raise BackendSpecError(f"{what} spec {shown_spec(spec)}: item {n} is not "
                                           "key=value")
                if not item:
                    continue
                k, v = item.split("=", 1)
                out[k.strip()] = parse_scalar(v.strip(), k.strip(), what)
        else:
            raise BackendSpecError(f"unknown {what} {shown_spec(spec)}; known aliases: "
                                   f"{sorted(aliases)}, or use 'kind:key=value,...' "
                                   "(e.g. local_readout:path=/ckpt)")
    else:
        raise BackendSpecError(f"{what} spec must be a string or a mapping, got "
                               f"{type(spec).__name__}")
    secret = sorted(k for k in out if is_secret_key(str(k)))
    if secret:
        raise BackendSpecError(f"{what} spec key(s) {secret} look like secrets: {SECRET_HINT}")
    for k, v in out.items():
        if isinstance(v, float) and not math.isfinite(v):
            raise BackendSpecError(f"{what} spec key {k!r}: non-finite number {v!r} is not "
                                   "allowed")
    if "kind" not in out:
        raise BackendSpecError(f"{what} spec {sorted(out)} has no 'kind'")
    if with_name:
        out.setdefault("name", out.get("model") or Path(str(out.get("path", out["kind"]))).name
                       or out["kind"])
    return out


__all__ = ["BACKEND_ALIASES", "BackendSpecError", "parse_backend_spec", "parse_scalar",
           "shown_spec"]
