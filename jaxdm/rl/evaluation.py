"""Held-out evaluation: success per task type, and task completion by action cutoff.

For every eval seed one rollout of the held-out tasks (task seeds from
``cfg.eval_task_offset``); per task type (and "All") it reports the success rate and, per
cutoff k in ``cfg.eval_cutoffs``, the share of tasks completed within k actions (seed 000,
Table 4), averaged over seeds (± std over seeds). Keys: ``eval/<type>``,
``eval/<type>_std``, ``eval/<type>@<k>``; ``eval/table`` is the printed table.

With a value model (``values``: the run's ``values`` signal backend, estimator ``lvrl``) it
also values a handful of the evaluation trajectories and writes their value curves to
``<cfg.out_dir>/value_curves/iter_XXXX.png`` (``jaxdm.rl.values.curves``), adding the
value-query metrics as ``eval/value/...``.
"""
from __future__ import annotations

from typing import Any

import jax
import numpy as np

from jaxdm import runlog
from jaxdm.rl.rollout import rollout
from jaxdm.rl.values.curves import evaluation_value_curves

__all__ = ["evaluate"]


def _per_seed(episodes, cutoffs) -> dict[str, float]:
    by_type: dict[str, list] = {}
    for e in episodes:
        by_type.setdefault(e.task_type or "all", []).append(e)
    by_type = dict(sorted(by_type.items()))
    by_type["All"] = list(episodes)
    row = {}
    for t, eps in by_type.items():
        row[t] = 100.0 * float(np.mean([e.success for e in eps]))
        for k in cutoffs:
            row[f"{t}@{k}"] = 100.0 * float(np.mean([e.success and len(e.actions) <= k
                                                     for e in eps]))
    return row


def evaluate(policy, params, venv, cfg, *, values: Any = None,
             iteration: int = 0) -> dict[str, Any]:
    """Evaluate ``policy`` with ``params`` on ``venv``: one rollout per evaluation seed (greedy if
    cfg.eval_greedy) from the evaluation task offset; eval/<type> success means over seeds, their
    std, success within each step cutoff, a printable table, and with a value model its value
    curves."""
    per_seed, episodes = [], []
    for s in cfg.eval_seeds:
        res = rollout(policy, params, venv, seed=cfg.eval_task_offset, key=jax.random.key(s),
                      max_actions=cfg.max_actions, greedy=cfg.eval_greedy,
                      env_name=cfg.env.name, pipeline=cfg.rollout_pipeline)
        per_seed.append(_per_seed(res.episodes, cfg.eval_cutoffs))
        episodes.append(res.episodes)
    keys = list(per_seed[0])
    types = [k for k in keys if "@" not in k]
    summary = {f"eval/{k}": float(np.mean([r[k] for r in per_seed])) for k in keys}
    summary.update({f"eval/{t}_std": float(np.std([r[t] for r in per_seed])) for t in types})
    cut_cols = [f"@{k}" for k in cfg.eval_cutoffs]
    rows = []
    for t in types:
        row = {"type": t, "success %": f"{summary[f'eval/{t}']:.1f} ± "
                                       f"{summary[f'eval/{t}_std']:.1f}"}
        row.update({f"@{k}": summary[f"eval/{t}@{k}"] for k in cfg.eval_cutoffs})
        rows.append(row)
    summary["eval/table"] = runlog.format_table(rows, ["type", "success %", *cut_cols])
    if values is not None:
        summary.update(evaluation_value_curves(episodes, values, cfg, iteration=iteration,
                                               out_dir=cfg.out_dir))
    return summary
