"""PNG figures of a screening run (matplotlib, Agg backend, no display needed)."""
from __future__ import annotations

import errno
import math
import os
from pathlib import Path

import numpy as np

from jaxdm.jsonl import OutputError
from jaxdm.runlog import pyplot
from jaxdm.trajectory import ACTION_TYPES

TYPE_LABELS = {"milestone": "Milestone", "other": "Other", "no_op": "No-op"}


def save_figure(fig, path: Path, dpi: int = 120) -> Path:
    """Writes ``fig`` as PNG to ``path`` whole: a temporary file of this writer next to it,
    renamed over it. A failed write (no space left, a read-only place) removes the temporary,
    leaves ``path`` as it was and raises ``jaxdm.jsonl.OutputError`` naming it."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        fig.savefig(tmp, dpi=dpi, format="png")
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        why = "no space left on device" if e.errno == errno.ENOSPC else (e.strerror or str(e))
        raise OutputError(f"cannot write {path}: {why}") from e
    finally:
        pyplot().close(fig)
    return path


def action_type_heatmap(summary: dict, judges: list[str], context: str, path: Path) -> Path:
    """Judges x (question x action type) mean scores under one context (seed 000, Fig. 8)."""
    plt = pyplot()
    questions = ["value", "progress"]
    cols = [(q, t) for q in questions for t in ACTION_TYPES]
    grid = np.full((len(judges), len(cols)), np.nan)
    for i, j in enumerate(judges):
        for k, (q, t) in enumerate(cols):
            grid[i, k] = summary[j][f"{q}/{context}"]["overall"].get(f"mean_{t}", np.nan)
    fig, ax = plt.subplots(figsize=(1.3 * len(cols) + 2, 0.7 * len(judges) + 1.8))
    im = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(cols)), [f"{q.title()}\n{TYPE_LABELS[t]}" for q, t in cols])
    ax.set_yticks(range(len(judges)), judges)
    for i in range(grid.shape[0]):
        for k in range(grid.shape[1]):
            if math.isfinite(grid[i, k]):
                ax.text(k, i, f"{grid[i, k]:.2f}", ha="center", va="center",
                        color="white" if grid[i, k] < 0.6 else "black", fontsize=9)
    ax.set_title(f"Mean action scores by type ({context.title()} context)")
    fig.colorbar(im, ax=ax, fraction=0.04)
    fig.tight_layout()
    return save_figure(fig, path)


def recall_bars(summary: dict, judges: list[str], context: str, path: Path) -> Path:
    """Recall@R grouped by R, per judge and question (seed 000, Fig. 5b)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), sharey=True)
    for ax, q in zip(axes, ["value", "progress"]):
        rs = sorted({int(r) for j in judges for r in summary[j][f"{q}/{context}"]["overall"]["recall_by_r"]})
        width = 0.8 / max(1, len(judges))
        for i, j in enumerate(judges):
            by_r = {int(k): v for k, v in summary[j][f"{q}/{context}"]["overall"]["recall_by_r"].items()}
            ys = [by_r.get(r, (np.nan, 0))[0] for r in rs]
            ax.bar(np.arange(len(rs)) + i * width, ys, width, label=j)
        ax.set_xticks(np.arange(len(rs)) + width * (len(judges) - 1) / 2, [f"R={r}" for r in rs])
        ax.set_ylim(0, 1)
        ax.set_title(f"{q.title()} + {context.title()}: milestone Recall@R")
    axes[0].set_ylabel("Recall@R")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)


def rank_shift_curves(shifts: dict, judges: list[str], levels: list[str], path: Path) -> Path:
    """Per judge: each trajectory's mean rank shift vs Prefix (thin) and the mean (dashed)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(judges), figsize=(4.2 * len(judges), 3.4), squeeze=False)
    x = np.arange(len(levels) + 1)
    for ax, j in zip(axes[0], judges):
        per_traj = np.array([[0.0] + [shifts[j][lv]["per_traj"][i] for lv in levels]
                             for i in range(len(shifts[j][levels[0]]["per_traj"]))]) if levels else np.zeros((0, 1))
        for row in per_traj:
            ax.plot(x, row, color="tab:blue", alpha=0.25, lw=0.8)
        if len(per_traj):
            ax.plot(x, per_traj.mean(0), "k--", lw=2, label="mean")
        ax.set_xticks(x, ["Prefix"] + [lv if lv == "FB" else lv for lv in levels])
        ax.set_title(j)
        ax.set_ylabel("rank shift vs Prefix")
    fig.suptitle("Progress: action ranking shifts as more context becomes visible")
    fig.tight_layout()
    return save_figure(fig, path)


def miss_rate_vs_cost(points: list[dict], path: Path) -> Path:
    """Milestone / no-op miss rate vs cost per 1,000 scores (seed 000, Fig. 10)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, key, title in [(axes[0], "milestone_miss", "Milestone miss rate"),
                           (axes[1], "noop_miss", "No-op miss rate")]:
        shown = [p for p in points if p[key] is not None and math.isfinite(p[key])]
        costs = [max(p["seconds_per_1k"], 1e-3) for p in shown]
        for p, cost in zip(shown, costs):
            label = p["judge"] + (f" (${p['usd_per_1k']:.3g})" if p.get("usd_per_1k") is not None else "")
            ax.scatter([cost], [p[key]], s=50)
            ax.annotate(label, (cost, p[key]), fontsize=8, xytext=(4, 4), textcoords="offset points")
        if shown:
            ax.set_xscale("log")
            ax.set_xlim(min(costs) / 3, max(costs) * 3)
        else:  # e.g. no trajectory has a no-op: say so instead of plotting nothing
            ax.text(0.5, 0.5, "no trajectory has this action type", ha="center", transform=ax.transAxes)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("seconds per 1,000 scores (USD per 1,000 in brackets where priced)")
        ax.set_title(title + " (Hindsight + Progress)\nlower left is better", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)
