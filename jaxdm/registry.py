"""One registry type for every name -> entry table of jaxdm (estimators, signals, loss terms,
critics, rollout and policy kinds, envs, gates, value models, worker backends, ...).

A ``Registry`` maps names to entries of one kind; the kind (``what``) only words the errors::

    GATES = Registry("gate")
    GATES.register("pure", pure_gate)          # directly
    @GATES.register("trajectory")              # or as a decorator (returns the function)
    def trajectory_gate(...): ...
    GATES.get("pure")                          # or GATES["pure"]
    GATES.validate(cfg.algo.lvopd_gate, field="algo.lvopd_gate")   # config validation

- A name registered twice is a ``DuplicateNameError`` unless ``replace=True``.
- An unknown name is an ``UnknownNameError`` (a ``KeyError`` and a ``ValueError``, so callers
  catching either keep working, and ``jaxdm.config`` turns it into a ``ConfigError``) whose
  message names the entry kind, the name, the config field when one is given, and every known
  name sorted: ``algo.advantage: unknown estimator 'nope'; known: ['gae', 'grpo', ...]``.
- ``providers``: modules that register more entries when imported (a registry of a lower
  module filled by a higher one, which the lower one must not import at module level). They
  are imported on the first lookup that misses and before the names are listed, so a listing
  or an error is complete.

Nothing here imports JAX or any other jaxdm module.
"""
from __future__ import annotations

import importlib
from typing import Generic, Iterable, Iterator, Sequence, TypeVar

__all__ = ["Registry", "UnknownNameError", "DuplicateNameError"]

T = TypeVar("T")
_MISSING = object()


class UnknownNameError(KeyError, ValueError):
    """A name no entry of a registry has (the message lists the known names, sorted)."""

    def __str__(self) -> str:  # KeyError's would print the message as a quoted repr
        return str(self.args[0]) if self.args else ""


class DuplicateNameError(ValueError):
    """A name registered twice without ``replace=True``."""


class Registry(Generic[T]):
    """Named entries of one kind (module docstring). ``what`` words the errors ("estimator",
    "loss term"); ``hint`` is appended to an unknown-name error (where more names come from);
    ``providers`` are modules imported before a lookup misses or the names are listed."""

    def __init__(self, what: str, *, hint: str = "", providers: Sequence[str] = ()):
        if not isinstance(what, str) or not what:
            raise ValueError(f"Registry: what must be a non-empty string, got {what!r}")
        self.what, self.hint = what, hint
        self._providers = tuple(providers)
        self._providers_loaded = not self._providers
        self._entries: dict[str, T] = {}

    def __repr__(self) -> str:
        return f"Registry({self.what!r}, names={sorted(self._entries)})"

    def _load_providers(self) -> None:
        if self._providers_loaded:
            return
        # Marked first: a provider that is being imported (it imported the module that owns
        # this registry) is found in sys.modules and registers its entries as it goes on.
        self._providers_loaded = True
        try:
            for module in self._providers:
                importlib.import_module(module)
        except BaseException:
            self._providers_loaded = False  # tried again next time; the error names the module
            raise

    def register(self, name: str, entry: T = _MISSING, *, replace: bool = False):
        """Register ``entry`` under ``name`` and return it; without ``entry``, a decorator that
        registers the decorated object and returns it unchanged. A name already registered is a
        ``DuplicateNameError`` unless ``replace``."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"{self.what} names are non-empty strings, got {name!r}")
        if entry is _MISSING:
            def decorate(obj: T) -> T:
                return self.register(name, obj, replace=replace)
            return decorate
        if name in self._entries and not replace:
            raise DuplicateNameError(f"{self.what} {name!r} is already registered")
        self._entries[name] = entry
        return entry

    def _unknown(self, name, field: str | None, also: Iterable[str] = (),
                 what: str | None = None) -> UnknownNameError:
        known = sorted(set(self.names()) | set(also))
        where = f"{field}: " if field else ""
        hint = f" ({self.hint})" if self.hint and what is None else ""
        return UnknownNameError(f"{where}unknown {what or self.what} {name!r}; known: "
                                f"{known}{hint}")

    def get(self, name: str, *, field: str | None = None) -> T:
        """The entry of ``name``; ``UnknownNameError`` listing the known names (prefixed by
        ``field``, the config key it came from, when given) if none is registered."""
        if isinstance(name, str):
            if name not in self._entries:
                self._load_providers()
            if name in self._entries:
                return self._entries[name]
        raise self._unknown(name, field)

    __getitem__ = get

    def validate(self, name: str, *, field: str, also: Sequence[str] = (),
                 what: str | None = None) -> None:
        """Config validation: ``name`` (the value of config key ``field``) is registered or one
        of ``also`` (names the field accepts besides the registry's, e.g. "none"); else an
        ``UnknownNameError`` naming ``field`` and every accepted name, sorted. ``what`` words
        the accepted names when ``also`` makes them more than this registry's entries (the
        registry's ``hint`` is then left out)."""
        if isinstance(name, str) and (name in also or name in self):
            return
        raise self._unknown(name, field, also, what)

    def names(self) -> list[str]:
        """Every registered name (the providers' included), sorted."""
        self._load_providers()
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        if name not in self._entries:
            self._load_providers()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        """The names in registration order (the providers' included)."""
        self._load_providers()
        return iter(list(self._entries))

    def items(self) -> list[tuple[str, T]]:
        """(name, entry) pairs in registration order (the providers' included)."""
        self._load_providers()
        return list(self._entries.items())

    def __len__(self) -> int:
        self._load_providers()
        return len(self._entries)

