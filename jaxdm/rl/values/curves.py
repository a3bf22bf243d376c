"""Value curves at evaluation: the run's value model on a handful of held-out trajectories.

When a run has a value model (the ``values`` signal, estimator ``lvrl``), every evaluation
(``jaxdm.rl.evaluation.evaluate``) values the interior states of its first
``value.eval_trajectories`` evaluation trajectories (default 8; 0 turns this off) with the
same model and group-context options as training, and writes
``<out_dir>/value_curves/iter_XXXX.png``: one panel per trajectory, V(s_t) against step t
(the two anchors hollow), milestone steps starred, no-op steps crossed, the outcome in the
panel title. Its value-query metrics go to the evaluation record as ``eval/value/...``
(values mean/std, queries, failures, tokens, cost, latency).

Groups: the evaluation plays each held-out task once per eval seed, so the rollouts of one
task across seeds form its group (group context and p̂_u); with one eval seed every group
has a single rollout and V(s_0) = p̂_u is that rollout's own reward. Trajectories are taken
task by task (all seeds of a task, then the next task) until the count is reached.
Episodes lost to an env error are skipped.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping, Sequence

from jaxdm.rl.values.signal import plot_value_curves, values_signal
from jaxdm.trajectory import Trajectory

__all__ = ["DEFAULT_EVAL_TRAJECTORIES", "eval_trajectory_count", "evaluation_value_curves"]

DEFAULT_EVAL_TRAJECTORIES = 8
# env kwargs an Oracle replay reads from a trajectory's metadata (BabyAI: the split's task
# distribution and the room size); the evaluation env's own values are recorded there.
_REPLAY_KEYS = ("split", "room_size")


def eval_trajectory_count(spec: Mapping[str, Any]) -> int:
    """``value.eval_trajectories`` (default 8); ValueError naming the key when invalid."""
    n = spec.get("eval_trajectories", DEFAULT_EVAL_TRAJECTORIES)
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"value.eval_trajectories: must be an int >= 0 (0: no value curves "
                         f"at evaluation), got {n!r}")
    return n


def _with_replay_facts(traj: Trajectory, env_kwargs: Mapping[str, Any]) -> Trajectory:
    extra = {k: env_kwargs[k] for k in _REPLAY_KEYS
             if k in env_kwargs and k not in traj.metadata}
    if not extra:
        return traj
    return dataclasses.replace(traj, metadata={**traj.metadata, **extra})


def evaluation_value_curves(episodes_per_seed: Sequence[Sequence[Any]], backend: Any, cfg,
                            *, iteration: int, out_dir: str | Path) -> dict[str, Any]:
    """Value and plot a handful of evaluation trajectories (see module docstring).

    ``episodes_per_seed``: the ``EpisodeRecord`` lists of the evaluation rollouts, one per
    eval seed; ``backend``: the ``values`` signal's (value model, options) pair. Returns the
    ``eval/value/...`` metrics (empty when ``value.eval_trajectories`` is 0), including
    ``eval/value/curves``, the PNG path relative to ``out_dir``.
    """
    n = eval_trajectory_count(cfg.value)
    if n == 0:
        return {}
    model, opts = backend
    env_kwargs = {**dict(cfg.env.kwargs), **dict(cfg.env.eval_kwargs)}
    by_task: dict[int, list[Trajectory]] = {}
    for eps in episodes_per_seed:
        for ep in eps:
            if not ep.error and ep.trajectory is not None:
                by_task.setdefault(int(ep.group), []).append(ep.trajectory)
    trajs: list[Trajectory] = []
    groups: list[int] = []
    for g in sorted(by_task):
        for tr in by_task[g]:
            if len(trajs) < n:
                trajs.append(_with_replay_facts(tr, env_kwargs))
                groups.append(g)
    if not trajs:
        return {"eval/value/trajectories": 0}
    num_steps = max(len(t.steps) for t in trajs)
    sig = values_signal(trajs, groups, model, num_steps=num_steps, **opts)
    rel = Path("value_curves") / f"iter_{int(iteration):04d}.png"
    name = getattr(model, "name", type(model).__name__)
    plot_value_curves(trajs, sig.values, Path(out_dir) / rel, value_rows=sig.value_rows,
                      title=f"iteration {iteration}: {name} on {len(trajs)} evaluation "
                            f"trajectories ({sig.metrics['value/failures']} failed)")
    out = {f"eval/{k}": v for k, v in sig.metrics.items()}
    out["eval/value/trajectories"] = len(trajs)
    out["eval/value/curves"] = str(rel)
    return out
