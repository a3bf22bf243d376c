"""Typed experiment configs: frozen dataclasses loaded from YAML plus dotted overrides.

Any frozen dataclass (nested dataclasses allowed) is a config schema::

    cfg = load_config(TrainConfig, "experiments/configs/teacher_grpo_cpu.yaml",
                      ["optim.lr=3e-4", "teacher.kind=oracle"])

Rules (one definition used by every jaxdm job):
- Unknown keys are an error naming the full dotted key and listing the valid ones.
- Values are type-checked against the field annotation (int, float, bool, str, ``X | None``,
  ``tuple[T, ...]``, ``Literal[...]``, nested dataclasses, ``dict``); an int is accepted for
  a float field, nothing else is coerced (the string "3" is not an int, 1 is not a bool).
- Overrides ``a.b=value`` parse ``value`` as YAML (``3``, ``1e-4``, ``true``, ``[1, 2]``,
  ``null``) and are applied in order after the file.
- A list is accepted for a tuple field (YAML has no tuples); the value becomes a tuple.
- Non-finite numbers (``.nan``, ``.inf``, also inside lists and free-form mappings) are
  rejected naming the key: a NaN learning rate is never a setting.
- Values of secret-looking keys (``api_key``, ``token``, ``secret``, ``password``, ...) are
  never echoed in an error; secrets belong in environment variables named by ``api_key_env``.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import re
import types
import typing
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple, Sequence, TypeVar

import yaml

from jaxdm.jsonl import write_atomic
from jaxdm.registry import Registry
from jaxdm.secrets import is_secret_key

__all__ = ["ConfigError", "Kind", "kind_and_options", "from_dict", "load_config",
           "apply_overrides", "parse_override", "to_dict", "dump_yaml", "config_from_argv",
           "check_finite", "is_secret_key", "shown", "shown_override", "SECRET_HINT",
           "command_overrides"]

C = TypeVar("C")


class ConfigError(ValueError):
    """A config file or override does not fit the schema (message names the key)."""


SECRET_HINT = ("secrets do not belong in configs: put the key in an environment variable and "
               "name that variable with api_key_env")


def shown(key: str, value: Any) -> str:
    """``repr(value)`` for messages, or a placeholder when ``key`` names a secret."""
    return "<value hidden>" if is_secret_key(key) else repr(value)


def _typed(key: str, value: Any) -> str:
    return f"{type(value).__name__} {shown(key, value)}"


def check_finite(value: Any, key: str) -> None:
    """Raise ConfigError naming ``key`` if ``value`` holds a NaN/inf float (lists and mappings
    are searched)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key}: non-finite number {value!r} is not allowed")
    if isinstance(value, Mapping):
        for k, v in value.items():
            check_finite(v, f"{key}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            check_finite(v, f"{key}[{i}]")


class Kind(NamedTuple):
    """One kind of a ``{"kind": ..., <options>}`` spec (an entry of a ``Registry`` that
    ``kind_and_options`` reads): the option keys it takes and ``build(options, ...)``, which
    makes the object (its further arguments are the caller's)."""
    keys: frozenset[str]
    build: Callable[..., Any]


def kind_and_options(spec: Any, kinds: Registry[Kind], what: str
                     ) -> tuple[str, dict[str, Any]]:
    """(kind, the other keys) of a ``{"kind": ..., <options>}`` spec whose allowed option keys
    depend on its kind (``kinds``: a ``jaxdm.registry.Registry`` of ``Kind`` entries). Raises
    TypeError for a spec that is not a mapping, the registry's ``UnknownNameError`` (a
    ValueError listing the known kinds) for an unknown kind, and ValueError naming ``what``,
    the kind and the unknown keys."""
    if not isinstance(spec, Mapping):
        raise TypeError(f"{what} spec must be a mapping, got {type(spec).__name__}")
    kind = spec.get("kind")
    allowed = kinds.get(kind).keys
    opts = {k: v for k, v in spec.items() if k != "kind"}
    unknown = sorted(set(opts) - set(allowed))
    if unknown:
        raise ValueError(f"{what} kind {kind!r}: unknown key(s) {unknown}; allowed: "
                         f"{sorted(allowed)}")
    return kind, opts


class _Loader(yaml.SafeLoader):
    """SafeLoader that reads YAML 1.2 floats: ``1e-6`` is a float, not the string "1e-6"."""


_Loader.yaml_implicit_resolvers = {k: list(v) for k, v in
                                   yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+
                  |[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                  |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                  |[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))


def _yaml_load(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


def _is_dataclass_type(tp) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _is_mapping_type(tp) -> bool:
    return tp in (dict, Mapping) or typing.get_origin(tp) in (dict, Mapping)


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _check_value(value: Any, tp: Any, key: str) -> Any:
    """Validate ``value`` against annotation ``tp``; returns the (possibly converted) value."""
    if tp is Any:
        check_finite(value, key)
        return value
    if tp in (tuple, list):  # a bare ``tuple`` field: YAML and overrides give lists
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {_typed(key, value)}")
        check_finite(value, key)
        return tuple(value)
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise ConfigError(f"{key}: null is not allowed (expected {_type_name(tp)})")
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _check_value(value, arg, key)
            except ConfigError as e:
                errors.append(str(e))
        for e in errors:  # a non-finite number is the whole story, not a type mismatch
            if "non-finite" in e:
                raise ConfigError(e)
        raise ConfigError(f"{key}: {shown(key, value)} fits none of {_type_name(tp)}")
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{key}: {shown(key, value)} is not one of {list(allowed)}")
        return value
    if origin in (tuple, list, Sequence):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {_typed(key, value)}")
        args = typing.get_args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(args) != len(value):
                raise ConfigError(f"{key}: expected {len(args)} items, got {len(value)}")
            return tuple(_check_value(v, a, f"{key}[{i}]") for i, (v, a) in
                         enumerate(zip(value, args)))
        item = args[0] if args else Any
        return tuple(_check_value(v, item, f"{key}[{i}]") for i, v in enumerate(value))
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__}")
        check_finite(value, key)
        return dict(value)
    if _is_dataclass_type(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping for {tp.__name__}, "
                              f"got {_typed(key, value)}")
        return _build(tp, value, key + ".")
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true/false, got {shown(key, value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an int, got {_typed(key, value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            hint = ""
            if isinstance(value, str) and value.strip().lower().lstrip("+-.") in ("nan", "inf",
                                                                                 "infinity"):
                hint = " (non-finite numbers are not allowed)"
            raise ConfigError(f"{key}: expected a number, got {_typed(key, value)}{hint}")
        if not math.isfinite(value):
            raise ConfigError(f"{key}: non-finite number {value!r} is not allowed")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {_typed(key, value)}")
        return value
    if isinstance(tp, type):
        if not isinstance(value, tp):
            raise ConfigError(f"{key}: expected {tp.__name__}, got {type(value).__name__}")
        return value
    raise ConfigError(f"{key}: unsupported annotation {tp!r} in the config schema")


def _build(cls, data: Mapping[str, Any], prefix: str = ""):
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in data if k not in fields]
    if unknown:
        k = unknown[0]
        close = difflib.get_close_matches(str(k), list(fields), n=1)
        hint = f" (did you mean {prefix}{close[0]!s}?)" if close else ""
        if is_secret_key(f"{prefix}{k!s}"):
            hint += f"; {SECRET_HINT}"
        raise ConfigError(f"unknown config key {prefix}{k!s}{hint}; valid keys under "
                          f"{prefix or 'the top level'}: {sorted(fields)}")
    kwargs = {name: _check_value(value, hints[name], prefix + name)
              for name, value in data.items()}
    missing = [n for n, f in fields.items() if n not in kwargs
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"missing required config key(s): {[prefix + m for m in missing]}")
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{prefix.rstrip('.') or cls.__name__}: {e}") from None


def from_dict(cls: type[C], data: Mapping[str, Any] | None) -> C:
    """Build config ``cls`` from a (nested) mapping, validating every key and value."""
    if not _is_dataclass_type(cls):
        raise TypeError(f"{cls!r} is not a dataclass type")
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"config must be a mapping at the top level, got {type(data).__name__}")
    return _build(cls, data)


def to_dict(cfg: Any) -> dict[str, Any]:
    """Nested plain dict (tuples as lists) of a config, for YAML/JSON dumps and logs."""
    def plain(v):
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, Mapping):
            return {k: plain(x) for k, x in v.items()}
        return v
    return plain(cfg)


def shown_override(text: str) -> str:
    """An override for messages: ``'a.api_key=<value hidden>'`` when its key names a secret."""
    key, eq, _ = str(text).partition("=")
    return repr(f"{key}=<value hidden>") if eq and is_secret_key(key.strip()) else repr(text)


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"a.b=3"`` → (["a", "b"], 3); the value is parsed as YAML."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key.path=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {shown_override(text)} has an empty key")
    try:
        value = _yaml_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        why = "" if is_secret_key(key) else f" ({e})"
        raise ConfigError(f"override {shown_override(text)}: value is not valid "
                          f"YAML{why}") from None
    return key.split("."), value


def _set_path(data: dict, cls, path: list[str], value: Any, full: str) -> None:
    node, node_cls = data, cls
    for depth, part in enumerate(path):
        names = {f.name: f for f in dataclasses.fields(node_cls)}
        dotted = ".".join(path[:depth + 1])
        if part not in names:
            close = difflib.get_close_matches(part, list(names), n=1)
            hint = f" (did you mean {'.'.join(path[:depth] + [close[0]])}?)" if close else ""
            if is_secret_key(dotted):
                hint += f"; {SECRET_HINT}"
            raise ConfigError(f"unknown config key {dotted} in override "
                              f"{shown_override(full)}{hint}")
        if depth == len(path) - 1:
            node[part] = value
            return
        sub_cls = typing.get_type_hints(node_cls)[part]
        if _is_mapping_type(sub_cls):
            # free-form mapping field (e.g. env kwargs): the rest of the path is its keys
            child = node.get(part)
            child = {} if child is None else dict(child)
            node[part] = child
            for key in path[depth + 1:-1]:
                nxt = child.get(key)
                if nxt is not None and not isinstance(nxt, Mapping):
                    raise ConfigError(f"override {shown_override(full)}: {key} is a value, "
                                      "not a mapping")
                child[key] = {} if nxt is None else dict(nxt)
                child = child[key]
            child[path[-1]] = value
            return
        if not _is_dataclass_type(sub_cls):
            raise ConfigError(f"override {shown_override(full)}: {dotted} is a value, "
                              "not a section")
        child = node.get(part)
        if not isinstance(child, dict):
            child = {} if child is None else dict(child)
            node[part] = child
        node, node_cls = child, sub_cls


def apply_overrides(cls: type[C], data: Mapping[str, Any] | None,
                    overrides: Sequence[str]) -> dict[str, Any]:
    """Apply dotted overrides to a raw mapping (validated against ``cls``'s field names)."""
    out = copy.deepcopy(dict(data or {}))
    for text in overrides:
        path, value = parse_override(text)
        _set_path(out, cls, path, value, text)
    return out


def command_overrides(args: Any, flags: Sequence[str]) -> list[str]:
    """A command's dotted overrides from its parsed ``args``: the positional
    ``args.overrides``, then ``key=value`` for each of ``flags`` given (``args.<key>`` set),
    then ``progress=false`` for ``--no-progress``."""
    overrides = list(args.overrides)
    for key in flags:
        if getattr(args, key):
            overrides.append(f"{key}={getattr(args, key)}")
    if args.no_progress:
        overrides.append("progress=false")
    return overrides


def load_config(cls: type[C], path: str | Path | None = None,
                overrides: Sequence[str] = ()) -> C:
    """Load ``cls`` from a YAML file (optional) and dotted overrides; validates everything."""
    data: Mapping[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist")
        try:
            data = _yaml_load(p.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{p}: invalid YAML ({e})") from None
        if not isinstance(data, Mapping):
            raise ConfigError(f"{p}: the top level must be a mapping")
    try:
        return from_dict(cls, apply_overrides(cls, data, overrides))
    except ConfigError as e:
        where = f"{path}: " if path is not None else ""
        raise ConfigError(f"{where}{e}") from None


def dump_yaml(cfg: Any, path: str | Path) -> None:
    """Write a config as YAML (round-trips through ``load_config``), whole and with URL
    credentials redacted (``jaxdm.jsonl.write_atomic``)."""
    write_atomic(path, yaml.safe_dump(to_dict(cfg), sort_keys=False))


def config_from_argv(cls: type[C], argv: Sequence[str], *, presets_dir: str | Path | None = None
                     ) -> tuple[C, list[str]]:
    """Split argv into a config and the remaining flags.

    ``--config PATH`` (or a preset name looked up in ``presets_dir`` as ``NAME.yaml``) and any
    ``key.path=value`` items build the config; every other item (flags like ``--resume``)
    is returned untouched, in order, for the caller's own parser.
    """
    path, overrides, rest = None, [], []
    items = list(argv)
    i = 0
    while i < len(items):
        a = items[i]
        if a == "--config" or a.startswith("--config="):
            if a == "--config":
                if i + 1 >= len(items):
                    raise ConfigError("--config needs a path or preset name")
                path, i = items[i + 1], i + 1
            else:
                path = a.split("=", 1)[1]
        elif "=" in a and not a.startswith("-"):
            overrides.append(a)
        else:
            rest.append(a)
        i += 1
    if path is not None and presets_dir is not None and not Path(path).is_file():
        candidate = Path(presets_dir) / f"{path}.yaml"
        if candidate.is_file():
            path = str(candidate)
    return load_config(cls, path, overrides), rest
