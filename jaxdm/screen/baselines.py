"""Cheap judges a trained judge must beat (issue 40 §2): they read an action's text and the
feedback it got, never the task, so they show how far surface cues alone go.

- ``keyword_scores``: a fixed three-rule judge. Feedback "Nothing happens." -> 0 (the usual
  no-op); an action with a milestone's verb (take, put/move, clean, heat, cool, use, slice)
  -> 1; anything else -> 0.5.
- ``BagOfWordsJudge``: logistic regression (statsmodels' binomial GLM, L2-penalised) on a bag
  of the action's and the feedback's words, fitted on the same labels a judge trains on
  (milestone 1, no-op 0, other actions 0.5 or left out: ``jaxdm.train.judge_data``'s rule).

Both return one score per executed action, the shape ``jaxdm.screen.metrics`` reads.
"""
from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from jaxdm.trajectory import Trajectory

__all__ = ["PROGRESS_VERBS", "keyword_scores", "action_words", "BagOfWordsJudge"]

PROGRESS_VERBS = frozenset({"take", "put", "move", "clean", "heat", "cool", "use", "slice"})
NOTHING_HAPPENS = "nothing happens"
# The 0.5 target of an action that is neither milestone nor no-op (judge_data other="either").
LABELS = {"milestone": 1.0, "no_op": 0.0, "other": 0.5}


def keyword_scores(traj: Trajectory) -> np.ndarray:
    """The three-rule keyword judge's score of every action of ``traj``."""
    out = np.empty(len(traj.steps))
    for t, step in enumerate(traj.steps):
        words = step.action.lower().split()
        if traj.feedback(t).strip().lower().startswith(NOTHING_HAPPENS):
            out[t] = 0.0
        elif words and words[0] in PROGRESS_VERBS:
            out[t] = 1.0
        else:
            out[t] = 0.5
    return out


def action_words(traj: Trajectory, t: int) -> list[str]:
    """The features of action ``t``: its words (``a:``) and its feedback's words (``f:``);
    instance numbers are dropped, so "mug 1" and "mug 2" share a feature."""
    def words(text: str) -> list[str]:
        return re.findall(r"[a-z]+", text.lower())
    return ([f"a:{w}" for w in words(traj.steps[t].action)]
            + [f"f:{w}" for w in words(traj.feedback(t))])


class BagOfWordsJudge:
    """Bag-of-words logistic regression over action and feedback words (module docstring).

    ``other``: "either" trains other actions at 0.5 (as the judge's ``judge_lines(other=
    "either")``), "skip" leaves them out. ``l2``: the penalty weight (statsmodels' ``alpha``
    of ``fit_regularized`` with ``L1_wt=0``); ``min_count``: words seen fewer times are
    dropped from the vocabulary."""

    def __init__(self, *, other: str = "either", l2: float = 1e-3, min_count: int = 2):
        if other not in ("either", "skip"):
            raise ValueError(f"other must be 'either' or 'skip', got {other!r}")
        if not (np.isfinite(l2) and l2 > 0):
            raise ValueError(f"l2 must be a positive number, got {l2!r}")
        if not (isinstance(min_count, int) and min_count >= 1):
            raise ValueError(f"min_count must be an integer >= 1, got {min_count!r}")
        self.other, self.l2, self.min_count = other, float(l2), min_count
        self.vocab: dict[str, int] | None = None
        self.coef: np.ndarray | None = None

    def _features(self, traj: Trajectory) -> np.ndarray:
        x = np.zeros((len(traj.steps), len(self.vocab) + 1))
        x[:, -1] = 1.0                                       # intercept
        for t in range(len(traj.steps)):
            for w in action_words(traj, t):
                if w in self.vocab:
                    x[t, self.vocab[w]] += 1.0
        return x

    def fit(self, trajectories: Sequence[Trajectory]) -> "BagOfWordsJudge":
        """Fits on the annotated actions of ``trajectories``."""
        import statsmodels.api as sm
        counts: dict[str, int] = {}
        rows = []
        for traj in trajectories:
            for t, kind in enumerate(traj.action_types):
                if kind == "other" and self.other == "skip":
                    continue
                rows.append((traj, t, LABELS[kind]))
                for w in set(action_words(traj, t)):
                    counts[w] = counts.get(w, 0) + 1
        labels = {y for _, _, y in rows}
        if not {0.0, 1.0} <= labels:
            raise ValueError("BagOfWordsJudge.fit needs at least one milestone and one no-op "
                             f"among the annotated actions, got labels {sorted(labels)}")
        self.vocab = {w: i for i, w in enumerate(sorted(w for w, c in counts.items()
                                                        if c >= self.min_count))}
        x = np.stack([self._features(traj)[t] for traj, t, _ in rows])
        y = np.array([lab for _, _, lab in rows])
        model = sm.GLM(y, x, family=sm.families.Binomial())
        self.coef = np.asarray(model.fit_regularized(alpha=self.l2, L1_wt=0.0).params)
        if not np.all(np.isfinite(self.coef)):
            raise FloatingPointError("BagOfWordsJudge.fit: non-finite coefficients")
        return self

    def scores(self, traj: Trajectory) -> np.ndarray:
        """P(progress) of every action of ``traj``."""
        if self.coef is None:
            raise RuntimeError("BagOfWordsJudge.scores before fit")
        return 1.0 / (1.0 + np.exp(-(self._features(traj) @ self.coef)))
