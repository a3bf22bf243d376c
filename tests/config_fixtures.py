"""Pieces the config-system tests share: a small nested section, the YAML round trip and a
bad YAML file's error."""
from __future__ import annotations

import dataclasses

import pytest

from jaxdm import config as cfgmod


@dataclasses.dataclass(frozen=True)
class Optim:
    """A nested config section with a float and an Optional float."""

    lr: float = 1e-3
    clip: float | None = 1.0


def assert_yaml_round_trip(config, tmp_path) -> None:
    """``config`` written by ``dump_yaml`` and read back by ``load_config`` is equal to it."""
    out = tmp_path / "dump.yaml"
    cfgmod.dump_yaml(config, out)
    assert cfgmod.load_config(type(config), out) == config


def assert_file_refused(config_type, path, text: str, match: str) -> None:
    """A config file ``path`` holding ``text`` is a ConfigError matching ``match``."""
    path.write_text(text)
    with pytest.raises(cfgmod.ConfigError, match=match):
        cfgmod.load_config(config_type, path)
