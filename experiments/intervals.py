"""The error bars of ``experiments/README.md``, recomputed from the result folders.

One convention for every "±" over seeds (issue 40 §4): **mean ± 95 % t-interval over n seeds**,
half-width t_{0.975, n−1} · s / √n with the sample standard deviation s (ddof = 1). With 3
seeds t_{0.975, 2} = 4.303, so the half-width is 2.48 s: three seeds give wide intervals, and
the README says so instead of printing a standard error (s / √n) or a population sd (ddof = 0)
that looks three to four times tighter.

``python experiments/intervals.py`` reads the per-seed values the experiments saved (the
toy-ordering runs' ``<estimator>_seed<s>/metrics.jsonl``, the BabyAI experiments'
``summary.json``) and prints every README row: per-seed values, the recomputed interval and the
statistic the older README figure was (``pop. sd`` for the toy-ordering tables,
``teacher_grpo.py``'s ``np.std``; ``s.e.`` for the BabyAI tables, ``std(ddof=1) / √n``).
``--results DIR`` reads another results folder of the same layout.

``wilson_interval`` is for a single run's success rate over n tasks (no seeds to average), as
the opening table of the README uses it for the harness, bench and validation rows; the script
prints those rates too, read from their result files.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"


class IntervalError(ValueError):
    """Values an interval cannot be computed from (too few, non-finite, not numbers)."""


def t_interval(values: Any) -> tuple[Any, Any]:
    """Mean and 95 % t-interval half-width over axis 0 (the seeds).

    ``values``: shape [n] (returns two floats) or [n, ...] (two arrays of the trailing shape,
    e.g. a curve per seed: [n_seeds, n_iterations]). half_width = t.ppf(0.975, n − 1) · s / √n,
    s the sample standard deviation (ddof = 1). n < 2 (no spread to estimate) and non-finite
    values are an ``IntervalError``.
    """
    try:
        a = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise IntervalError(f"t_interval: values are not numbers: {e}") from None
    if a.ndim == 0:
        raise IntervalError("t_interval: values must be a sequence over seeds, got a scalar")
    n = a.shape[0]
    if n < 2:
        raise IntervalError(f"t_interval: needs at least 2 values (seeds), got {n}")
    if not np.all(np.isfinite(a)):
        raise IntervalError(f"t_interval: non-finite values: {a.tolist()}")
    from scipy import stats

    mean = a.mean(axis=0)
    half = stats.t.ppf(0.975, n - 1) * a.std(axis=0, ddof=1) / math.sqrt(n)
    if a.ndim == 1:
        return float(mean), float(half)
    return mean, half


def wilson_interval(successes: int, n: int) -> tuple[float, float]:
    """95 % Wilson score interval (low, high) of a success rate: ``successes`` of ``n`` tasks.

    For one run's task success (no seeds): it stays inside [0, 1] and is not degenerate at
    0 or n successes, unlike the normal approximation. Non-integers, n < 1 and successes
    outside [0, n] are an ``IntervalError``.
    """
    if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
               for v in (successes, n)):
        raise IntervalError(f"wilson_interval: successes and n must be integers, got "
                            f"{successes!r}, {n!r}")
    if n < 1 or not 0 <= successes <= n:
        raise IntervalError(f"wilson_interval: needs 0 <= successes <= n and n >= 1, got "
                            f"{successes} of {n}")
    from scipy import stats

    z = stats.norm.ppf(0.975)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return float(max(0.0, centre - half)), float(min(1.0, centre + half))


# ------------------------------------------------------------------ reading the result folders


def seed_runs(folder: Path, estimator: str) -> list[tuple[int, Path]]:
    """``(seed, run folder)`` of ``<folder>/<estimator>_seed<s>/``, sorted by seed."""
    pat = re.compile(re.escape(estimator) + r"_seed(\d+)$")
    runs = sorted((int(m.group(1)), p) for p in folder.iterdir()
                  if p.is_dir() and (m := pat.match(p.name)))
    if not runs:
        raise FileNotFoundError(f"no {estimator}_seed<s> runs in {folder}")
    return runs


def eval_per_seed(folder: Path, estimator: str, step: int | None = None) -> list[float]:
    """Held-out ``eval/All`` (%) of every seed of a ``teacher_grpo.py --compare`` run: the last
    evaluation in each ``metrics.jsonl``, or the one at iteration ``step``."""
    from jaxdm.runlog import read_metrics

    out = []
    for seed, run in seed_runs(folder, estimator):
        evals = [r for r in read_metrics(run / "metrics.jsonl") if "eval/All" in r]
        if step is not None:
            evals = [r for r in evals if r.get("step") == step]
        if not evals:
            at = f" at iteration {step}" if step is not None else ""
            raise FileNotFoundError(f"{run / 'metrics.jsonl'}: no eval/All record{at}")
        out.append(float(evals[-1]["eval/All"]))
    return out


def train_per_seed(folder: Path, estimator: str, first: int, last: int) -> list[float]:
    """Mean training success (%) over iterations ``first``..``last`` (1-based, inclusive) of
    every seed of a ``teacher_grpo.py --compare`` run."""
    from jaxdm.runlog import read_metrics

    out = []
    for seed, run in seed_runs(folder, estimator):
        succ = [r["train/success"] for r in read_metrics(run / "metrics.jsonl")
                if "train/success" in r][first - 1:last]
        if len(succ) != last - first + 1:
            raise FileNotFoundError(f"{run / 'metrics.jsonl'}: {len(succ)} of iterations "
                                    f"{first}-{last} recorded")
        out.append(100.0 * float(np.mean(succ)))
    return out


def babyai_per_seed(folder: Path, method: str, key: str) -> list[float]:
    """Per-seed success (%) of a BabyAI experiment (``lvrl_babyai.py`` / ``lvopd_babyai.py``
    ``summary.json``: ``methods[method][key]`` holds one fraction per seed)."""
    summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    try:
        values = summary["methods"][method][key]
    except KeyError:
        raise KeyError(f"{folder / 'summary.json'}: no methods.{method}.{key}") from None
    return [100.0 * float(v) for v in values]


@dataclass(frozen=True)
class Row:
    """One "±" figure of the README: its table, row and column, the per-seed values and the
    statistic the older figure was (``"pop. sd"``, ``"s.e."``; ``None`` for a figure the
    README did not have before, such as a paired difference)."""
    table: str
    label: str
    values: tuple[float, ...]
    old: str | None

    def old_value(self) -> float:
        a = np.asarray(self.values)
        if self.old == "pop. sd":
            return float(a.std(ddof=0))
        if self.old == "s.e.":
            return float(a.std(ddof=1) / math.sqrt(len(a)))
        raise IntervalError(f"unknown old statistic {self.old!r}")


def readme_rows(results: Path = RESULTS) -> list[Row]:
    """Every "±"-over-seeds figure of ``experiments/README.md`` (and the two of README.md's
    trained-judge paragraph, the v3 8-iteration rows), in README order."""
    rows: list[Row] = []

    def toy(table, label, folder, est, step=None):
        rows.append(Row(table, label, tuple(eval_per_seed(results / folder, est, step)),
                        "pop. sd"))

    t = "toy ordering, standard: held-out success % after 30 it."
    toy(t, "outcome-only GRPO", "toy_ordering", "grpo")
    toy(t, "GRPO + oracle teacher", "toy_ordering", "teacher")
    t = "toy ordering, hard: held-out success % after 30 it."
    toy(t, "outcome-only GRPO", "toy_ordering_hard", "grpo")
    toy(t, "GRPO + oracle teacher", "toy_ordering_hard", "teacher")
    t = "hard, judge as teacher: held-out % after 3 it."
    toy(t, "none (outcome-only GRPO)", "toy_ordering_hard_judge", "grpo")
    toy(t, "Oracle", "toy_ordering_hard_judge", "teacher")
    toy(t, "trained judge, prompts v2", "toy_ordering_hard_judge", "teacher@smollm2-judge")
    toy(t, "untrained SmolLM2, prompts v2", "toy_ordering_hard_judge/untrained_control",
        "teacher@smollm2")
    toy(t, "retrained judge, prompts v3", "toy_ordering_hard_judge_v3",
        "teacher@smollm2-judge", step=3)
    toy(t, "untrained SmolLM2, prompts v3", "toy_ordering_hard_judge_v3/untrained_control",
        "teacher@smollm2")
    t = "hard, judge as teacher: held-out % after 8 it."
    toy(t, "none (GRPO)", "toy_ordering_hard_judge_v3/baselines_8iterations", "grpo")
    toy(t, "Oracle", "toy_ordering_hard_judge_v3/baselines_8iterations", "teacher")
    toy(t, "retrained judge (v3)", "toy_ordering_hard_judge_v3", "teacher@smollm2-judge",
        step=8)

    def babyai(table, label, folder, method, key):
        rows.append(Row(table, label, tuple(babyai_per_seed(results / folder, method, key)),
                        "s.e."))

    t = "LVRL BabyAI (it. 100)"
    for m, name in (("grpo", "GRPO"), ("ppo", "PPO"), ("lvrl_oracle", "LVRL, Oracle value"),
                    ("lvrl_noisy", "LVRL, noisy Oracle")):
        babyai(t, f"{name}: ID %", "lvrl_babyai", m, "id")
        babyai(t, f"{name}: OOD %", "lvrl_babyai", m, "ood")
    for folder, coef, methods in (
            ("lvopd_babyai", "1.0", ("lvrl", "lvrl_lvopd", "opd_pure", "opd_trajectory")),
            ("lvopd_babyai_coef0.1", "0.1", ("lvrl_lvopd", "opd_pure", "opd_trajectory")),
            ("lvopd_babyai_coef0.02", "0.02", ("opd_pure", "opd_trajectory"))):
        t = f"LVOPD BabyAI, c = {coef}"
        for m in methods:
            for key, col in (("id", "ID % (it. 60)"), ("id_mid", "ID % (it. 30)"),
                             ("ood", "OOD %")):
                babyai(t, f"{m}: {col}", folder, m, key)
    return rows


def paired_differences(results: Path = RESULTS) -> list[Row]:
    """The comparisons the README's opening table states, as per-seed differences a − b of
    runs that share their seeds (seed s: the same model initialisation, tasks and sampling
    seed for both arms), so the interval is the paired one over seeds."""
    rows: list[Row] = []

    def toy(label, folder, a, b, step=None):
        fa = results / folder
        rows.append(Row("paired differences (percentage points)", label, tuple(
            x - y for x, y in zip(eval_per_seed(fa, a, step), eval_per_seed(fa, b, step))),
            None))

    def cross(label, a, b):  # a, b: (folder, estimator or method, step or summary key)
        va, vb = (eval_per_seed(results / f, m, k) if not isinstance(k, str)
                  else babyai_per_seed(results / f, m, k) for f, m, k in (a, b))
        if len(va) != len(vb):
            raise IntervalError(f"{label}: {len(va)} vs {len(vb)} seeds")
        rows.append(Row("paired differences (percentage points)", label,
                        tuple(x - y for x, y in zip(va, vb)), None))

    toy("toy standard: oracle teacher − GRPO (it. 30)", "toy_ordering", "teacher", "grpo")
    toy("toy hard: oracle teacher − GRPO (it. 30)", "toy_ordering_hard", "teacher", "grpo")
    hard = results / "toy_ordering_hard"
    rows.append(Row("paired differences (percentage points)",
                    "toy hard: oracle teacher − GRPO, train success it. 21-30", tuple(
                        x - y for x, y in zip(train_per_seed(hard, "teacher", 21, 30),
                                              train_per_seed(hard, "grpo", 21, 30))), None))
    base8 = "toy_ordering_hard_judge_v3/baselines_8iterations"
    cross("toy hard: retrained judge (v3) − GRPO (it. 8)",
          ("toy_ordering_hard_judge_v3", "teacher@smollm2-judge", 8), (base8, "grpo", None))
    cross("toy hard: Oracle teacher − GRPO (it. 8)", (base8, "teacher", None),
          (base8, "grpo", None))
    cross("toy hard: retrained judge (v3) − Oracle (it. 8)",
          ("toy_ordering_hard_judge_v3", "teacher@smollm2-judge", 8), (base8, "teacher", None))
    for m in ("lvrl_oracle", "lvrl_noisy"):
        cross(f"LVRL BabyAI ID: {m} − grpo", ("lvrl_babyai", m, "id"),
              ("lvrl_babyai", "grpo", "id"))
    cross("LVRL BabyAI ID: lvrl_noisy − lvrl_oracle", ("lvrl_babyai", "lvrl_noisy", "id"),
          ("lvrl_babyai", "lvrl_oracle", "id"))
    c1, c01, c002 = "lvopd_babyai", "lvopd_babyai_coef0.1", "lvopd_babyai_coef0.02"
    cross("LVOPD ID: lvrl_lvopd c 1.0 − lvrl alone", (c1, "lvrl_lvopd", "id"), (c1, "lvrl", "id"))
    cross("LVOPD ID: lvrl_lvopd c 0.1 − lvrl alone", (c01, "lvrl_lvopd", "id"),
          (c1, "lvrl", "id"))
    cross("LVOPD ID: lvrl_lvopd c 0.1 − opd_pure c 0.02", (c01, "lvrl_lvopd", "id"),
          (c002, "opd_pure", "id"))
    cross("LVOPD ID: lvrl_lvopd c 0.1 − opd_trajectory c 0.02", (c01, "lvrl_lvopd", "id"),
          (c002, "opd_trajectory", "id"))
    return rows


def _count(rate: float, n: int, what: str) -> int:
    """The success count behind a stored rate (rates are stored as k / n floats)."""
    k = round(rate * n)
    if abs(k - rate * n) > 1e-6:
        raise IntervalError(f"{what}: rate {rate} is not a count out of {n}")
    return k


def single_run_rates(results: Path = RESULTS) -> list[tuple[str, int, int]]:
    """``(label, successes, n)`` of every one-run rate the README's opening table gives a
    Wilson interval for, read from the result files."""
    out = []
    for setting, arms in (("base_strong", ("llm_alone", "tool_cascade_fitted",
                                           "tool_replace_no_threshold")),
                          ("base_weak", ("llm_alone", "tool_cascade_fitted"))):
        summary = json.loads((results / "harness" / setting / "summary.json").read_text())
        for arm in arms:
            a = summary["arms"][arm]
            out.append((f"harness {setting}: {arm} success", _count(a["success"], a["n"], arm),
                        a["n"]))
    for folder, model, key, n_key in (("mc_validation", "oracle", "agree_all", "events"),
                                      ("mc_validation_smollm2", "smollm2 [first 8 ep.]",
                                       "agree_pitfalls", "pitfalls")):
        for env in json.loads((results / folder / "summary.json").read_text()):
            m = env["models"][model]
            out.append((f"{folder} {env['env']}: {model} {key}",
                        _count(m[key], m[n_key], key), m[n_key]))
    bench = json.loads((results / "train_dm_gym" / "results.json").read_text())["bench"]
    for backend in ("smollm2-base", "smollm2-sft"):
        l2 = bench["backends"][backend]["l2"]
        out.append((f"train_dm_gym L2 accuracy: {backend}", _count(l2["accuracy"], l2["n"],
                                                                   backend), l2["n"]))
    grpo = json.loads((results / "harness_grpo" / "summary.json").read_text())
    for when in ("before", "after"):
        t = grpo[when]
        out.append((f"harness_grpo test success {when}", _count(t["success"], t["tasks"], when),
                    t["tasks"]))
    # SmolLM2 values: sign of each interior step difference where the Oracle's value moves
    moved = agreed = 0
    for line in (results / "lvrl_smollm2_values" / "trajectories.jsonl").read_text().splitlines():
        r = json.loads(line)
        d_llm, d_oracle = np.diff(r["smollm2"][1:-1]), np.diff(r["oracle"][1:-1])
        m = d_oracle != 0
        moved += int(m.sum())
        agreed += int((np.sign(d_llm[m]) == np.sign(d_oracle[m])).sum())
    out.append(("lvrl_smollm2_values: step-sign agreement where the Oracle moves", agreed, moved))
    return out


def format_row(row: Row, digits: int = 1) -> str:
    """A markdown table line: row, n, per-seed values, mean ± 95 % t-interval (and the
    interval's ends), the old figure."""
    mean, half = t_interval(row.values)
    per_seed = " / ".join(f"{v:.{digits}f}" for v in row.values)
    old = (f"{mean:.{digits}f} ± {row.old_value():.{digits}f} ({row.old})"
           if row.old is not None else "–")
    return (f"| {row.label} | {len(row.values)} | {per_seed} | {mean:.{digits}f} ± "
            f"{half:.{digits}f} [{mean - half:.{digits}f}, {mean + half:.{digits}f}] | {old} |")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", type=Path, default=RESULTS,
                    help="results folder (default: experiments/results)")
    args = ap.parse_args(argv)
    try:
        rows = readme_rows(args.results) + paired_differences(args.results)
        rates = single_run_rates(args.results)
    except (FileNotFoundError, KeyError, ValueError) as e:
        print(f"intervals: error: {e}", file=sys.stderr)
        return 2
    table = None
    for row in rows:
        if row.table != table:
            table = row.table
            print(f"\n{table}\n\n| row | n | per seed | mean ± 95 % t-interval [low, high] "
                  f"| old figure |\n|---|---|---|---|---|")
        print(format_row(row))
    print("\none run's success rates: 95 % Wilson interval over its tasks\n\n"
          "| rate | successes / n | rate [low, high] |\n|---|---|---|")
    for label, k, n in rates:
        low, high = wilson_interval(k, n)
        print(f"| {label} | {k} / {n} | {k / n:.3f} [{low:.3f}, {high:.3f}] |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
