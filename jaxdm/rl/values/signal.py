"""The ``values`` signal: V(s_0)..V(s_T) [B, T + 1] for a batch of trajectories, with a row
mask and metrics, from a value model, the group context and the trajectories' groups.

``values_signal`` summarises every task group once, builds one ``ValueQuery`` per target
trajectory with at least two actions (a trajectory of 0 or 1 actions has no interior state:
its values are the anchors alone, so it counts as ok with no query), asks the value model,
and writes the interior values into slots 1..T_i − 1. Slot 0 and slot T_i hold p̂_u and R_i
(what the estimator anchors them to anyway) so the array is the anchored value curve.
Failed rows keep ``value_rows`` False (the estimator gives them their GRPO advantage), are
counted in the metrics and listed in ``fallbacks`` (row, reason) for the run log. Rows not
``kept`` (episodes lost to an env error) are left out of everything: no query, no place in
their group's context, no part of p̂_u, ``value_rows`` False, not counted as failures.
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from jaxdm.decision.types import Cost
from jaxdm.rl.values.context import render_group_context, summarize_group
from jaxdm.rl.values.models import ValueQuery, ValueResult
from jaxdm.runlog import pyplot
from jaxdm.trajectory import Trajectory

__all__ = ["ValuesSignal", "values_signal", "plot_value_curves"]


@dataclasses.dataclass
class ValuesSignal:
    """The value_curves signal of one iteration: anchored value curves float32 [B, T + 1], which
    rows have real interior values [B], value/... metrics, the rows that fall back to GRPO with why,
    and each row's ValueResult."""
    values: np.ndarray       # float32 [B, T + 1], anchored value curves
    value_rows: np.ndarray   # bool [B], rows whose interior values are real
    metrics: dict            # flat, slash-separated keys (value/...)
    fallbacks: list          # [(row, reason)] rows that fall back to GRPO
    results: list            # ValueResult or None (no query) per row


def values_signal(trajectories: Sequence[Trajectory], group_ids: Sequence[int], value_model: Any,
                  *, num_steps: int, summariser: str = "deterministic",
                  summary_generator: Any = None, include_target: bool = False,
                  max_steps_per_rollout: int = 0, max_rollouts: int = 0,
                  kept: Sequence[bool] | None = None) -> ValuesSignal:
    """Values of every state of every trajectory (see module docstring).

    ``num_steps`` is the padded T of the batch (values get T + 1 slots); ``group_ids[i]`` the
    task group of trajectory i; ``kept`` [B] bool, False for rows lost to an env error
    (default: all kept). Group context options: see ``render_group_context``.
    """
    trajs = list(trajectories)
    gids = np.asarray(group_ids)
    b = len(trajs)
    if gids.shape != (b,):
        raise ValueError(f"group_ids must have shape [B]=[{b}], got {list(gids.shape)}")
    kept_rows = np.ones(b, bool) if kept is None else np.asarray(kept)
    if kept_rows.shape != (b,) or kept_rows.dtype != np.bool_:
        raise ValueError(f"kept must be bool [B]=[{b}], got {kept_rows.dtype} "
                         f"{list(kept_rows.shape)}")
    too_long = [i for i, t in enumerate(trajs) if kept_rows[i] and len(t.steps) > num_steps]
    if too_long:
        raise ValueError(f"trajectories {too_long[:5]} have more than num_steps={num_steps} "
                         f"actions")
    t0 = time.perf_counter()
    stats: dict = {}
    summary_cost = Cost()
    queries: list[ValueQuery] = []
    rows: list[int] = []
    # [LVRLX] a model that ignores the group context (the Oracle: reads_context False) skips
    # the summaries and the rendering (host time of the trainer's values signal).
    reads_context = getattr(value_model, "reads_context", True)
    for g in sorted(set(gids.tolist())):
        members = [i for i in range(b) if gids[i] == g and kept_rows[i]]
        if not members:
            continue
        if not reads_context:  # [LVRLX]
            summaries, cost = None, Cost()
        else:
            summaries, cost = summarize_group([trajs[i] for i in members], summariser,
                                              summary_generator, stats=stats) \
                if summariser == "llm" else summarize_group([trajs[i] for i in members],
                                                            summariser)
        summary_cost = summary_cost + cost
        for pos, i in enumerate(members):
            if len(trajs[i].steps) < 2:
                continue
            ctx = render_group_context(summaries, pos, include_target=include_target,
                                       max_steps_per_rollout=max_steps_per_rollout,
                                       max_rollouts=max_rollouts) if reads_context else ""
            queries.append(ValueQuery(trajs[i], ctx, ident=(int(g), pos,
                                                            trajs[i].metadata.get("id"))))
            rows.append(i)
    t_query = time.perf_counter()
    results = value_model.values(queries) if queries else []
    query_seconds = time.perf_counter() - t_query

    rewards = np.asarray([float(t.reward) for t in trajs], np.float32)
    values = np.zeros((b, num_steps + 1), np.float32)
    ok = kept_rows.copy()
    per_row: list[ValueResult | None] = [None] * b
    fallbacks = []
    cost = Cost()
    for i, res in zip(rows, results):
        per_row[i] = res
        cost = cost + res.cost
        n = len(trajs[i].steps)
        if res.ok and res.values is not None and res.values.shape == (n - 1,) \
                and np.all(np.isfinite(res.values)):
            values[i, 1:n] = res.values
        else:
            ok[i] = False
            shape = getattr(res.values, "shape", None)
            reason = res.error if not res.ok else f"values of shape {shape}, not [{n - 1}]"
            fallbacks.append((i, reason))
    for i, tr in enumerate(trajs):  # the anchors, so rows read as value curves
        if not kept_rows[i]:
            continue
        values[i, 0] = rewards[(gids == gids[i]) & kept_rows].mean()
        values[i, len(tr.steps)] = rewards[i]
    n_q = len(queries)
    metrics = {
        "value/queries": n_q,
        "value/failures": len(fallbacks),
        "value/fallback_rows": int((~ok & kept_rows).sum()),
        "value/states": int(sum(len(trajs[i].steps) - 1 for i in rows)),
        "value/tokens_in": cost.tokens_in,
        "value/tokens_out": cost.tokens_out,
        "value/usd": cost.usd if cost.usd is not None else 0.0,
        "value/seconds": query_seconds,
        "value/latency_per_traj_s": query_seconds / n_q if n_q else 0.0,
        "value/summary_tokens_in": summary_cost.tokens_in,
        "value/summary_tokens_out": summary_cost.tokens_out,
        "value/summary_usd": summary_cost.usd if summary_cost.usd is not None else 0.0,
        "value/summary_failures": stats.get("summary_failures", 0),
        "value/total_seconds": time.perf_counter() - t0,
    }
    if ok.any():
        interior = [values[i, 1:len(trajs[i].steps)] for i in range(b)
                    if ok[i] and len(trajs[i].steps) > 1]
        if interior:
            flat = np.concatenate(interior)
            metrics["value/mean"] = float(flat.mean())
            metrics["value/std"] = float(flat.std())
    return ValuesSignal(values, ok, metrics, fallbacks, per_row)


def plot_value_curves(trajectories: Sequence[Trajectory], values: np.ndarray, path: str | Path,
                      *, rows: Sequence[int] | None = None, title: str = "",
                      value_rows: Sequence[bool] | None = None) -> Path:
    """One panel per trajectory: V(s_t) vs step t (anchors hollow), milestone steps starred,
    no-op steps crossed, the outcome in the panel title. Rows with ``value_rows`` False (a
    failed value query) show their anchors only, titled "no values"."""
    plt = pyplot()
    rows = list(range(len(trajectories))) if rows is None else list(rows)
    if not rows:
        raise ValueError("plot_value_curves: no rows to plot")
    cols = min(4, len(rows))
    nrow = -(-len(rows) // cols)
    fig, axes = plt.subplots(nrow, cols, figsize=(3.2 * cols, 2.4 * nrow), squeeze=False)
    for ax, i in zip(axes.ravel(), rows):
        tr = trajectories[i]
        n = len(tr.steps)
        v = np.asarray(values[i][:n + 1])
        has_values = value_rows is None or bool(value_rows[i])
        if has_values:
            ax.plot(range(n + 1), v, "-", color="C0", lw=1.2)
            # the value of the state an action led to: milestone / no-op marks at t + 1
            for key, marker, colour in (("milestone", "*", "C2"), ("no_op", "x", "C3")):
                at = [t + 1 for t, s in enumerate(tr.steps) if s.annotations.get(key)]
                if at:
                    ax.plot(at, v[at], marker, color=colour, ms=7, label=key)
        ax.plot([0, n], [v[0], v[n]], "o", mfc="none", color="C0")
        ax.set_ylim(-0.05, 1.05)
        outcome = "success" if tr.success else "failure"
        ax.set_title(f"#{i} {outcome} ({n} actions)" + ("" if has_values else ", no values"),
                     fontsize=8, color="C2" if tr.success else "black")
        ax.set_xlabel("step", fontsize=7)
        ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
        ax.tick_params(labelsize=7)
    for ax in axes.ravel()[len(rows):]:
        ax.axis("off")
    handles = {}
    for ax in axes.ravel()[:len(rows)]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    if handles:
        axes.ravel()[0].legend(list(handles.values()), list(handles), fontsize=6,
                               loc="best")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
