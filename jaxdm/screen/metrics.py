"""Judge-quality metrics on recorded trajectories (seed 000, section 3.2 and Appendix E).

Every function takes per-trajectory score arrays (one score per executed action) and the
actions' types ('milestone' | 'other' | 'no_op'), and is plain numpy: screening runs on the
host after scoring. Ties in scores are resolved by *expected value under uniform random
tie-breaking*, so a judge that gives every action the same score gets exactly chance-level
Recall@R (never credit from the order actions happen to be stored in).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Mapping, Sequence

import numpy as np

from jaxdm.trajectory import ACTION_TYPES


def _check(scores: np.ndarray, types: Sequence[str], where: str = "") -> None:
    if scores.ndim != 1:
        raise ValueError(f"{where}scores must be 1-D, got shape {scores.shape}")
    if len(types) != scores.shape[0]:
        raise ValueError(f"{where}{scores.shape[0]} scores but {len(types)} action types")
    bad = set(types) - set(ACTION_TYPES)
    if bad:
        raise ValueError(f"{where}unknown action type(s) {sorted(bad)}; expected {ACTION_TYPES}")
    if not np.all(np.isfinite(scores)):
        raise ValueError(f"{where}scores contain NaN/inf (drop failed scores before metrics)")


def expected_hits_top(scores: np.ndarray, members: np.ndarray, r: int, *, largest: bool = True) -> float:
    """Expected number of ``members`` among the ``r`` highest (or lowest) scores.

    Ties at the cut-off are broken uniformly at random; the expectation is exact.
    """
    n = scores.shape[0]
    if not 0 <= r <= n:
        raise ValueError(f"r={r} outside [0, {n}]")
    if r == 0:
        return 0.0
    s = scores if largest else -scores
    order = np.sort(s)[::-1]
    cut = order[r - 1]
    above = s > cut
    tied = s == cut
    slots = r - int(above.sum())
    frac = slots / int(tied.sum())
    return float(members[above].sum() + frac * members[tied].sum())


def recall_at_r(scores, types) -> float | None:
    """Fraction of milestones among the R highest-scored actions (R = #milestones); None if R=0."""
    scores = np.asarray(scores, dtype=np.float64)
    _check(scores, types)
    m = np.array([t == "milestone" for t in types])
    r = int(m.sum())
    if r == 0:
        return None
    return expected_hits_top(scores, m, r) / r


def miss_rates(scores, types) -> tuple[float | None, float | None]:
    """(milestone miss, no-op miss) for one trajectory (seed 000, Appendix E.5).

    Milestone miss: fraction of the R milestones missing from the R highest-scored actions.
    No-op miss: fraction of the R' no-ops missing from the R' lowest-scored actions.
    None where the trajectory has no action of that type.
    """
    scores = np.asarray(scores, dtype=np.float64)
    _check(scores, types)
    m = np.array([t == "milestone" for t in types])
    z = np.array([t == "no_op" for t in types])
    mm = None if m.sum() == 0 else 1.0 - expected_hits_top(scores, m, int(m.sum())) / m.sum()
    zm = None if z.sum() == 0 else 1.0 - expected_hits_top(scores, z, int(z.sum()), largest=False) / z.sum()
    return mm, zm


def type_means(scores, types) -> dict[str, float]:
    """Mean score per action type within one trajectory (types that occur only)."""
    scores = np.asarray(scores, dtype=np.float64)
    _check(scores, types)
    out = {}
    for kind in ACTION_TYPES:
        sel = np.array([t == kind for t in types])
        if sel.any():
            out[kind] = float(scores[sel].mean())
    return out


def milestone_noop_gap(scores, types) -> float | None:
    """Within-trajectory mean(milestone) - mean(no-op); None unless both occur."""
    means = type_means(scores, types)
    if "milestone" in means and "no_op" in means:
        return means["milestone"] - means["no_op"]
    return None


def within_trajectory_ranks(scores) -> np.ndarray:
    """Rank 1 = highest score; tied actions share their average rank."""
    from scipy.stats import rankdata  # why: scipy.stats ~0.7 s

    scores = np.asarray(scores, dtype=np.float64)
    return rankdata(-scores, method="average")


def rank_shift(reference_scores, scores) -> float:
    """mean_t |rank_t(scores) - rank_t(reference)| within one trajectory (seed 000, Fig. 6)."""
    a = np.asarray(reference_scores, dtype=np.float64)
    b = np.asarray(scores, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"rank_shift needs equal 1-D shapes, got {a.shape} and {b.shape}")
    if a.size == 0:
        raise ValueError("rank_shift of an empty trajectory")
    return float(np.abs(within_trajectory_ranks(a) - within_trajectory_ranks(b)).mean())


def summarize(score_lists: Sequence[Sequence[float]], type_lists: Sequence[Sequence[str]]) -> dict:
    """Aggregate the per-trajectory metrics over a set of trajectories.

    ``mean_<type>``: trajectory-averaged type means (average within each trajectory, then
    across the trajectories that contain the type, as the paper's Figure 8);
    ``recall_at_r``: mean over trajectories with >= 1 milestone, plus ``recall_by_r`` {R: (mean, n)};
    ``gap``: mean within-trajectory milestone - no-op gap; ``milestone_miss``/``noop_miss``:
    mean miss rates; ``n_traj``/``n_actions`` counts.
    """
    if len(score_lists) != len(type_lists):
        raise ValueError(f"{len(score_lists)} score lists but {len(type_lists)} type lists")
    per_type = defaultdict(list)
    recalls, by_r, gaps, mmiss, zmiss = [], defaultdict(list), [], [], []
    n_actions = 0
    for i, (s, ty) in enumerate(zip(score_lists, type_lists)):
        s = np.asarray(s, dtype=np.float64)
        _check(s, ty, where=f"trajectory {i}: ")
        if s.size == 0:
            continue
        n_actions += s.size
        for k, v in type_means(s, ty).items():
            per_type[k].append(v)
        rec = recall_at_r(s, ty)
        if rec is not None:
            recalls.append(rec)
            by_r[sum(t == "milestone" for t in ty)].append(rec)
        g = milestone_noop_gap(s, ty)
        if g is not None:
            gaps.append(g)
        mm, zm = miss_rates(s, ty)
        if mm is not None:
            mmiss.append(mm)
        if zm is not None:
            zmiss.append(zm)

    def mean(xs):
        return float(np.mean(xs)) if xs else float("nan")

    out = {f"mean_{k}": mean(per_type[k]) for k in ACTION_TYPES}
    out.update(
        recall_at_r=mean(recalls),
        recall_by_r={r: (mean(v), len(v)) for r, v in sorted(by_r.items())},
        gap=mean(gaps),
        n_gap=len(gaps),
        milestone_miss=mean(mmiss),
        noop_miss=mean(zmiss),
        n_traj=len(score_lists),
        n_actions=n_actions,
    )
    return out


def mean_rank_shift(reference: Sequence[Sequence[float]], other: Sequence[Sequence[float]]) -> tuple[float, list[float]]:
    """Mean over trajectories of ``rank_shift`` and the per-trajectory values (for thin lines)."""
    if len(reference) != len(other):
        raise ValueError(f"{len(reference)} reference trajectories but {len(other)} others")
    per = [rank_shift(a, b) for a, b in zip(reference, other) if len(a) > 0]
    return (float(np.mean(per)) if per else float("nan")), per


def group_by(values: Mapping[int, str], items: Sequence[int]) -> dict[str, list[int]]:
    """Indices of ``items`` grouped by the label ``values[i]`` (e.g. task type)."""
    out: dict[str, list[int]] = defaultdict(list)
    for i in items:
        out[values[i]].append(i)
    return dict(out)


def bootstrap_intervals(score_lists: Sequence[Sequence[float]], type_lists: Sequence[Sequence[str]],
                        keys: Sequence[str] = ("gap", "recall_at_r", "noop_miss", "milestone_miss"),
                        *, n_resamples: int = 2000, level: float = 0.95, seed: int = 0
                        ) -> dict[str, tuple[float, float]]:
    """Trajectory-bootstrap percentile intervals of ``summarize``'s ``keys``: trajectories are
    resampled with replacement (the actions of one trajectory are not independent), with
    ``scipy.stats.bootstrap``. A resample in which a metric is undefined (no trajectory with
    both a milestone and a no-op, for the gap) makes that interval NaN rather than biased."""
    from scipy.stats import bootstrap  # why: scipy.stats ~0.7 s
    if len(score_lists) != len(type_lists):
        raise ValueError(f"{len(score_lists)} score lists but {len(type_lists)} type lists")
    if len(score_lists) < 2:
        raise ValueError(f"a bootstrap needs at least 2 trajectories, got {len(score_lists)}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    known = set(summarize(score_lists, type_lists))
    bad = [k for k in keys if k not in known]
    if bad:
        raise ValueError(f"unknown metric(s) {bad}; summarize gives {sorted(known)}")
    out = {}
    idx = np.arange(len(score_lists))
    for key in keys:
        def stat(sample, key=key):
            picked = sample.astype(int)
            return summarize([score_lists[i] for i in picked], [type_lists[i] for i in picked])[key]
        res = bootstrap((idx,), stat, n_resamples=n_resamples, confidence_level=level,
                        method="percentile", vectorized=False,
                        rng=np.random.default_rng(seed))
        out[key] = (float(res.confidence_interval.low), float(res.confidence_interval.high))
    return out
