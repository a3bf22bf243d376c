"""The harness config (``jaxdm harness ... --config``): every key checked before any episode
runs, and ``load``, which reads a YAML file or a preset of ``experiments/configs`` with dotted
overrides.

``HarnessConfig`` holds the env (``EnvConfig``), the agent LLM and its cheap tier (``llm``,
``cheap_llm``: ``jaxdm.harness.llm.make_llm`` specs), the decision model (``dm``:
``jaxdm.harness.dm.make_dm``), the agent's optional steps (``agent``: ``AgentConfig``), the
task counts of the shadow pass, the test arms and Stage 2, the arms (``ArmConfig`` with their
``DelegationConfig``), the CASCADE frontier sweep, the threshold fit (``FitConfig``) and the
statistics (``StatsConfig``). Unknown keys and bad values are errors (``jaxdm.config``).
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Sequence

from jaxdm.config import ConfigError, load_config
from jaxdm.harness.agent import AgentConfig
from jaxdm.harness.errors import HarnessError
from jaxdm.harness.fit import CALIBRATIONS
from jaxdm.harness.modes import Delegation
from jaxdm.harness.pool import EnvWorkersConfig
from jaxdm.roles.harness import POINTS
from jaxdm.runlog import MAX_FAILED_SHARE, check_failed_share
from jaxdm.stats import check_settings


@dataclasses.dataclass(frozen=True)
class EnvConfig(EnvWorkersConfig):
    """The DECISION GYM tasks: ``variant`` (base | shift | hard), ``strict`` (an unplanned write
    ends the episode as an irreversible error) and ``max_steps`` per episode; and where their
    env steps run (``backend`` inline | process | ray, ``num_workers``, ``ray``, ...:
    ``jaxdm.harness.pool.EnvWorkersConfig``)."""

    variant: str = "base"
    strict: bool = True
    max_steps: int = 30


@dataclasses.dataclass(frozen=True)
class DelegationConfig:
    """One delegation; ``fitted: true`` takes the threshold from ``thresholds.json`` (a point
    the fit leaves to the LLM then gets no delegation)."""

    point: str
    mode: str
    threshold: float | None = None
    fitted: bool = False
    k: int = 3

    def __post_init__(self):
        if self.fitted and self.threshold is not None:
            raise ValueError(f"delegation {self.point}/{self.mode}: give either a threshold or "
                             f"fitted: true (the fit's threshold), not both")
        Delegation(self.point, self.mode, self.threshold, self.k)  # its own checks, by name


@dataclasses.dataclass(frozen=True)
class ArmConfig:
    """An arm: delegations, an optional decision model replacing the default one (e.g. the
    BM25 shortlist), ``candidate`` for Stage 1, and ``random_trigger_like`` = the name of a
    TRIGGER arm whose measured call rate a random trigger copies."""

    name: str
    delegations: tuple[DelegationConfig, ...] = ()
    dm: dict | None = None
    candidate: bool = False
    random_trigger_like: str | None = None


@dataclasses.dataclass(frozen=True)
class FitConfig:
    """The threshold fit: calibration ``method`` (isotonic | binned), ``value_per_task`` (USD of one
    solved task), ``min_support`` (shadow answers at or above a threshold), ``min_value_share``
    (floor of V as a share of the value) and the decision ``points`` fitted."""

    method: str = "isotonic"
    value_per_task: float = 1.0
    min_support: int = 5
    min_value_share: float = 0.05
    points: tuple[str, ...] = ("tool", "params", "stop", "memory", "reflect", "route", "notes")

    def __post_init__(self):
        if self.method not in CALIBRATIONS:
            raise ValueError(f"method must be one of {list(CALIBRATIONS)}, got {self.method!r}")
        if not (math.isfinite(self.value_per_task) and self.value_per_task > 0):
            raise ValueError(f"value_per_task must be a finite number > 0, got "
                             f"{self.value_per_task!r}")
        if self.min_support < 1:
            raise ValueError(f"min_support must be >= 1, got {self.min_support!r}")
        if not 0.0 <= self.min_value_share <= 1.0:
            raise ValueError(f"min_value_share must be in [0, 1], got {self.min_value_share!r}")
        for point in self.points:
            if point not in POINTS:
                raise ValueError(f"points: {point!r} is not a decision point {list(POINTS)}")


@dataclasses.dataclass(frozen=True)
class StatsConfig:
    """The registered tests: non-inferiority ``margin``, ``alpha``, the non-inferiority test
    ``ni_method`` and the cost test ``cost_method`` (``jaxdm.stats``)."""

    margin: float = 0.03
    alpha: float = 0.05
    ni_method: str = "tango"
    cost_method: str = "t"

    def __post_init__(self):
        check_settings(margin=self.margin, alpha=self.alpha, ni_method=self.ni_method,
                       cost_method=self.cost_method)


@dataclasses.dataclass(frozen=True)
class HarnessConfig:
    """A whole harness experiment (see the module docstring); every value is checked when it is
    built, so a bad one fails before any episode runs."""

    env: EnvConfig = EnvConfig()
    llm: dict = dataclasses.field(default_factory=lambda: {"kind": "simulated",
                                                           "profile": "strong"})
    cheap_llm: dict | None = None
    dm: dict = dataclasses.field(default_factory=lambda: {"kind": "oracle_noisy"})
    agent: AgentConfig = AgentConfig()
    shadow_tasks: int = 150
    test_tasks: int = 200
    stage2_tasks: int = 200
    arms: tuple[ArmConfig, ...] = ()
    frontier_point: str = "tool"
    frontier_thresholds: tuple[float, ...] = (0.0, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.99)
    fit: FitConfig = FitConfig()
    stats: StatsConfig = StatsConfig()
    out_dir: str = "harness_out"
    seed: int = 0
    progress: bool = True
    # a pass in which a larger share of the agent LLM's calls, or of the decision model's
    # answers, got no answer (a server down) stops its command (the name `jaxdm screen` uses)
    max_failed_share: float = MAX_FAILED_SHARE

    def __post_init__(self):
        # Everything a command would otherwise find wrong only after the episodes before it.
        check_failed_share(self.max_failed_share)
        for key in ("shadow_tasks", "test_tasks", "stage2_tasks"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)!r}")
        if self.frontier_point not in POINTS:
            raise ValueError(f"frontier_point {self.frontier_point!r} is not a decision point "
                             f"{list(POINTS)}")
        for i, th in enumerate(self.frontier_thresholds):
            if not 0.0 <= th <= 1.0:
                raise ValueError(f"frontier_thresholds[{i}] must be in [0, 1], got {th!r}")
        names = [a.name for a in self.arms]
        if "llm_alone" in names or len(set(names)) != len(names):
            raise ValueError(f"arms: names must be unique and not 'llm_alone' (the reference), "
                             f"got {names}")
        for arm in self.arms:
            for i, d in enumerate(arm.delegations):
                if d.fitted and d.point not in self.fit.points:
                    raise ValueError(f"arm {arm.name!r} delegations[{i}]: fitted threshold for "
                                     f"{d.point!r}, which fit.points {list(self.fit.points)} "
                                     f"leaves out")


def load(config: str | None, overrides: Sequence[str]) -> HarnessConfig:
    """The HarnessConfig from ``config`` (a YAML path, or a preset name:
    ``experiments/configs/harness_<name>.yaml``; None: the defaults) with dotted ``overrides``;
    ``HarnessError`` naming the key on any bad value."""
    path = config
    if path is not None and not Path(path).is_file():
        preset = Path(__file__).resolve().parents[2] / "experiments" / "configs" / \
            f"harness_{path}.yaml"
        if preset.is_file():
            path = str(preset)
    try:
        return load_config(HarnessConfig, path, list(overrides))
    except ConfigError as e:
        raise HarnessError(str(e)) from None


__all__ = ["HarnessConfig", "EnvConfig", "DelegationConfig", "ArmConfig", "FitConfig",
           "StatsConfig", "load"]
