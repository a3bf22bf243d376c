"""Pieces the config-system tests share: a small nested section and the YAML round trip."""
from __future__ import annotations

import dataclasses

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
