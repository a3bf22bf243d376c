"""Run directories: refuse to clobber a run, refuse a resume with changed settings, and the
exceptions that stop a run on purpose.

A run directory (``out_dir``) holds ``config.yaml`` (the settings of the run), ``metrics.jsonl``
and ``checkpoints/``. A fresh run into a directory holding checkpoints or metrics is refused
unless ``overwrite`` (which deletes them first); ``resume`` compares the saved settings with
the current ones and refuses any change to a setting that changes what the run computes (all
but ``train_config.RUN_CHANGING_EXEMPT``), naming the keys; a model shape change
(``model.hidden_size``) is named here before orbax would fail on array shapes.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from jaxdm import config as cfgmod
from jaxdm.rl.train_config import RUN_CHANGING_EXEMPT, TrainConfig, nested_items

__all__ = ["RunDirError", "ResumeMismatchError", "TrainingStopped", "NonFiniteLossError",
           "TeacherFailureError", "holds_run", "describe_run", "clear_run",
           "check_resume_config"]


class RunDirError(RuntimeError):
    """A fresh run was pointed at a directory that holds a run."""


class ResumeMismatchError(ValueError):
    """``resume`` with settings that change the run."""


class TrainingStopped(RuntimeError):
    """The run stopped on purpose (reason in the message and in ``metrics``)."""

    def __init__(self, message: str, metrics: dict[str, Any] | None = None):
        super().__init__(message)
        self.metrics = dict(metrics or {})


class NonFiniteLossError(TrainingStopped, FloatingPointError):
    """A loss term or gradient became NaN/inf."""


class TeacherFailureError(TrainingStopped):
    """Too many teacher requests of one iteration failed (teacher.max_failed_share)."""


def holds_run(out: Path, checkpointer) -> bool:
    """Whether the run folder ``out`` holds a run: a checkpoint step or a non-empty metrics.jsonl.
    """
    metrics = out / "metrics.jsonl"
    return bool(checkpointer.all_steps()) or (metrics.exists() and metrics.stat().st_size > 0)


def describe_run(out: Path, checkpointer) -> str:
    """The refusal message for a folder holding a run: its last checkpoint steps and metrics lines,
    and the --resume / --overwrite choice."""
    steps = checkpointer.all_steps()
    metrics = out / "metrics.jsonl"
    n = sum(1 for _ in open(metrics, encoding="utf-8")) if metrics.exists() else 0
    return (f"{out} holds a run (checkpoint steps {steps[-3:] or 'none'}, {n} metrics "
            f"lines): pass --resume to continue it or --overwrite to replace it")


def clear_run(out: Path) -> None:
    """Delete a run's checkpoints and metrics (``overwrite``)."""
    shutil.rmtree(out / "checkpoints", ignore_errors=True)
    for name in ("metrics.jsonl", "curves.png"):
        (out / name).unlink(missing_ok=True)


def check_resume_config(out: Path, cfg: TrainConfig) -> None:
    """On --resume, compare the saved config.yaml of ``out`` with ``cfg``: any changed setting that
    changes the run (all but RUN_CHANGING_EXEMPT) is a ResumeMismatchError listing each key's old
    and new value; no saved config, nothing to compare."""
    saved_path = out / "config.yaml"
    if not saved_path.exists():
        return
    saved = nested_items(cfgmod.to_dict(cfgmod.load_config(TrainConfig, saved_path, [])))
    now = nested_items(cfgmod.to_dict(cfg))
    changed = sorted(k for k in set(saved) | set(now)
                     if k not in RUN_CHANGING_EXEMPT and saved.get(k) != now.get(k))
    if changed:
        detail = ", ".join(f"{k}: {cfgmod.shown(k, saved.get(k))} -> "
                           f"{cfgmod.shown(k, now.get(k))}" for k in changed)
        raise ResumeMismatchError(
            f"--resume of {out} with changed settings that change the run: {detail}. Resume "
            f"with the saved settings ({saved_path}) or start a new out_dir; free to change: "
            f"{list(RUN_CHANGING_EXEMPT)}")
