"""Statistics for comparing agent arms on the same tasks (seed 003): non-inferiority of task
success, lower cost, Holm correction, and the two-stage registered delegation tests.

All tests are pure functions of 1-D arrays (host numpy; nothing here is traced by JAX). Two
arms are *paired*: element i of each array is the same task run by both arms. Arm ``a`` is
the reference (the LLM alone, or the LLM baseline of a stage), arm ``b`` the candidate
(a delegation, or a combination of delegations).

Symbols: n tasks; ``n10`` = tasks the reference solved and the candidate failed, ``n01`` =
the reverse; δ = p_b − p_a (success-rate difference, estimated by (n01 − n10) / n); m = the
non-inferiority margin (0.03 = 3 points); α = the one-sided level (0.05).

**Non-inferiority of success** (``noninferiority``): H0: δ ≤ −m against H1: δ > −m, one-sided
at level α; the candidate is non-inferior when H0 is rejected (p ≤ α). Methods (registry
``NONINFERIORITY_METHODS``; the seed does not name its statistic, the choice is ours):

- ``"tango"`` (default): Tango's score test for a paired difference of proportions (Tango
  1998, Stat. Med. 17:891). Z = (n01 − n10 + n·m) / sqrt(n·(2·q̃ − m·(1 + m))), where q̃ is
  the maximum-likelihood estimate of P(reference solves, candidate fails) under the
  constraint δ = −m (the root of a quadratic, ``_tango_restricted_q10``). Unlike the Wald
  test its variance is never zero (identical arms still get a finite Z), which matters when
  discordant pairs are few, as they are at 99 % success.
- ``"wald"``: Z = (δ̂ + m) / se, se² = ((n01 + n10)/n − δ̂²)/n (Wald, unrestricted variance).
  Zero discordant pairs give se = 0; then Z = +inf when δ̂ > −m (documented degeneracy).

p = 1 − Φ(Z). ``lower_bound`` is the one-sided (1 − α) confidence bound for δ obtained by
inverting the same test (closed form for Wald, bisection for Tango); p ≤ α iff
lower_bound ≥ −m.

The seed's check (n = 500, reference 0.994): the candidate at 0.972 fails and at 1.000 passes
under both methods, for *every* pairing consistent with those marginals (tests enumerate
them: with 3 reference failures and 14 candidate failures, n10 − n01 = 11 and n01 ∈ 0..3).

**Lower cost** (``cost_lower``): H0: mean(cost_b − cost_a) ≥ 0 against H1: < 0 on paired
per-task costs; ``"t"`` = one-sided paired t-test (default), ``"wilcoxon"`` = one-sided
Wilcoxon signed-rank test (registry ``COST_METHODS``).

**Holm** (``holm``): step-down adjusted p-values, p̃_(i) = max_{j ≤ i} min(1, (k − j + 1)·p_(j))
over the k p-values sorted ascending; reject where p̃ ≤ α, as statsmodels'
``multipletests(method="holm")`` does (tests compare the two). Every decision in this module
uses "p ≤ α" (equality has probability zero for these continuous statistics).

**Two stages** (seed 003 §"pass criteria"). ``register(...)`` builds a frozen
``Registration`` naming every Stage 1 candidate delegation (name, decision point), the margin,
α, methods and the Stage 2 selection rule *before* any result exists; ``stage1`` and
``stage2`` accept results only through it and reject names it did not register.

- Stage 1: every candidate alone vs the reference on the same tasks. Each candidate's test is
  the intersection-union of "non-inferior" and "cheaper": p = max(p_noninferiority, p_cost)
  (a level-α test that both alternatives hold; the seed counts one test per delegation), and
  Holm runs over the registered candidates. A candidate passes when its Holm-adjusted p ≤ α.
- Stage 2 selection (fixed by the registration): for each decision point, the passing
  candidate with the largest mean cost saving per task; a point with none stays with the LLM.
- Stage 2 test: the combination vs the reference on new tasks (task ids, when given, must be
  disjoint from Stage 1's), again the intersection-union p, Holm over the registered Stage 2
  comparisons (the combination, plus any extra named comparisons registered in advance).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np

from jaxdm.registry import Registry

def _sps():
    """scipy.stats, imported on first use: configs import this module to check their
    settings (``check_settings``), and start-up must not pay for scipy."""
    from scipy import stats
    return stats


# ----------------------------------------------------------------------------- validation


def _as_nonempty_1d(x: Any, name: str, what: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of {what}, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} is empty")
    return arr


def _as_binary(x: Any, name: str) -> np.ndarray:
    arr = _as_nonempty_1d(x, name, "task outcomes")
    if arr.dtype == bool:
        return arr.astype(np.int64)
    if not np.issubdtype(arr.dtype, np.number):
        raise TypeError(f"{name} must be bool or 0/1 numbers, got dtype {arr.dtype}")
    bad = ~np.isin(arr, (0, 1))
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"{name}[{i}] = {arr[i].item()!r}: task success must be 0/1 (or bool)")
    return arr.astype(np.int64)


def _as_cost(x: Any, name: str) -> np.ndarray:
    arr = _as_nonempty_1d(x, name, "per-task costs")
    if not np.issubdtype(arr.dtype, np.number) or arr.dtype == bool:
        raise TypeError(f"{name} must be numeric, got dtype {arr.dtype}")
    arr = arr.astype(np.float64)
    bad = ~np.isfinite(arr)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"{name}[{i}] = {arr[i]}: costs must be finite")
    return arr


def _same_length(a: np.ndarray, b: np.ndarray, na: str, nb: str) -> None:
    if a.shape != b.shape:
        raise ValueError(f"paired arrays differ in shape: {na} {a.shape} vs {nb} {b.shape} "
                         "(element i must be the same task in both arms)")


def _check_level(margin: float, alpha: float) -> None:
    if not (isinstance(margin, (int, float)) and math.isfinite(margin) and 0 <= margin < 1):
        raise ValueError(f"margin must be a number in [0, 1), got {margin!r}")
    if not (isinstance(alpha, (int, float)) and 0 < alpha < 1):
        raise ValueError(f"alpha must be a number in (0, 1), got {alpha!r}")


# ------------------------------------------------------------------- non-inferiority


class NonInferiority(NamedTuple):
    """Result of a paired one-sided non-inferiority test of success (candidate b vs a)."""

    method: str
    n: int
    p_a: float             # success rate of the reference
    p_b: float             # success rate of the candidate
    diff: float            # δ̂ = p_b − p_a
    n10: int               # reference solved, candidate failed
    n01: int               # candidate solved, reference failed
    margin: float
    alpha: float
    z: float
    p_value: float         # one-sided, H0: δ ≤ −margin
    lower_bound: float     # one-sided (1 − α) confidence bound for δ
    noninferior: bool      # p_value <= alpha


def _wald_z(n: int, n10: int, n01: int, delta0: float) -> float:
    d = (n01 - n10) / n
    var = ((n01 + n10) / n - d * d) / n
    if var <= 0.0:
        return math.inf if d > delta0 else (0.0 if d == delta0 else -math.inf)
    return (d - delta0) / math.sqrt(var)


def _tango_restricted_q10(n: int, n10: int, n01: int, delta0: float) -> float:
    """ML estimate of q10 = P(a solves, b fails) under the constraint q01 − q10 = delta0.

    It maximises n01·log(q + δ0) + n10·log(q) + (n − n01 − n10)·log(1 − 2q − δ0); clearing
    denominators in the score equation gives 2n·q² + B·q + C = 0 with
    B = −(n01 + n10) + δ0·(2n − n01 + n10) and C = −n10·δ0·(1 − δ0), whose larger root is the
    estimate (Tango 1998's restricted estimate, with his cells relabelled).
    """
    b_ = -(n01 + n10) + delta0 * (2.0 * n - n01 + n10)
    c_ = -n10 * delta0 * (1.0 - delta0)
    disc = max(b_ * b_ - 8.0 * n * c_, 0.0)
    return (-b_ + math.sqrt(disc)) / (4.0 * n)


def _tango_z(n: int, n10: int, n01: int, delta0: float) -> float:
    q10 = _tango_restricted_q10(n, n10, n01, delta0)
    var = n * (2.0 * q10 + delta0 * (1.0 - delta0))
    num = (n01 - n10) - n * delta0
    if var <= 0.0:
        return math.inf if num > 0 else (0.0 if num == 0 else -math.inf)
    return num / math.sqrt(var)


def _invert(zfun: Callable[[float], float], zcrit: float, hi: float) -> float:
    """Smallest δ0 in [−1, hi] with z(δ0) ≤ zcrit (z decreases in δ0), by bisection."""
    lo = -1.0 + 1e-12
    if zfun(lo) <= zcrit:
        return -1.0
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        if zfun(mid) > zcrit:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _wald_bound(n: int, n10: int, n01: int, alpha: float) -> float:
    d = (n01 - n10) / n
    var = max(((n01 + n10) / n - d * d) / n, 0.0)
    return d - _sps().norm.ppf(1 - alpha) * math.sqrt(var)


def _tango_bound(n: int, n10: int, n01: int, alpha: float) -> float:
    d = (n01 - n10) / n
    zcrit = _sps().norm.ppf(1 - alpha)
    return _invert(lambda d0: _tango_z(n, n10, n01, d0), zcrit, hi=d)


# One name, one place: method -> (z statistic, lower confidence bound).
NONINFERIORITY_METHODS: Registry[tuple[Callable[..., float], Callable[..., float]]] = Registry(
    "non-inferiority method")
NONINFERIORITY_METHODS.register("tango", (_tango_z, _tango_bound))
NONINFERIORITY_METHODS.register("wald", (_wald_z, _wald_bound))


def noninferiority(success_a: Any, success_b: Any, *, margin: float = 0.03,
                   alpha: float = 0.05, method: str = "tango") -> NonInferiority:
    """Paired one-sided non-inferiority test of task success, candidate ``b`` vs reference ``a``.

    Args:
      success_a, success_b: [n] bool or 0/1, element i = task i in both arms.
      margin: m, the largest acceptable loss in success rate (0.03 = 3 points).
      alpha: one-sided level.
      method: a key of ``NONINFERIORITY_METHODS`` ("tango" score test or "wald").
    Returns:
      ``NonInferiority``; ``noninferior`` is True when H0: δ ≤ −margin is rejected.
    """
    _check_level(margin, alpha)
    zfun, bound = NONINFERIORITY_METHODS.get(method, field="method")
    a = _as_binary(success_a, "success_a")
    b = _as_binary(success_b, "success_b")
    _same_length(a, b, "success_a", "success_b")
    n, n10, n01 = a.size, int(np.sum((a == 1) & (b == 0))), int(np.sum((a == 0) & (b == 1)))
    z = float(zfun(n, n10, n01, -float(margin)))
    p = float(_sps().norm.sf(z))
    return NonInferiority(method=method, n=n, p_a=float(a.mean()), p_b=float(b.mean()),
                          diff=(n01 - n10) / n, n10=n10, n01=n01, margin=float(margin),
                          alpha=float(alpha), z=z, p_value=p,
                          lower_bound=float(bound(n, n10, n01, alpha)), noninferior=p <= alpha)


def paired_outcomes(n: int, successes_a: int, successes_b: int, n01: int = 0
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Paired 0/1 arrays with the given marginals and ``n01`` tasks solved only by b.

    Then n10 = successes_a − successes_b + n01. Used to build the seed's check from the
    published success rates (the seed reports rates, not pairings). Raises ValueError when
    no pairing with these counts exists.
    """
    n10 = successes_a - successes_b + n01
    both = successes_a - n10
    neither = n - both - n10 - n01
    if min(n01, n10, both, neither) < 0:
        raise ValueError(f"no pairing of n={n} tasks with {successes_a} and {successes_b} "
                         f"successes has n01={n01} (gives n10={n10}, both={both}, "
                         f"neither={neither})")
    a = np.array([1] * both + [1] * n10 + [0] * n01 + [0] * neither, dtype=np.int64)
    b = np.array([1] * both + [0] * n10 + [1] * n01 + [0] * neither, dtype=np.int64)
    return a, b


# ---------------------------------------------------------------------------- cost


class CostTest(NamedTuple):
    """Paired one-sided test that the candidate's mean per-task cost is lower."""

    method: str
    n: int
    mean_a: float
    mean_b: float
    mean_diff: float       # mean(cost_b − cost_a); negative = candidate cheaper
    saving: float          # 1 − mean_b / mean_a (relative saving; nan when mean_a == 0)
    statistic: float
    p_value: float         # one-sided, H0: mean(cost_b − cost_a) ≥ 0
    cheaper: bool


def _cost_t(d: np.ndarray) -> tuple[float, float]:
    if np.all(d == d[0]):
        # Zero variance: every task differs by the same amount, the sign is certain.
        return (-math.inf, 0.0) if d[0] < 0 else (math.inf, 1.0) if d[0] > 0 else (0.0, 1.0)
    r = _sps().ttest_1samp(d, 0.0, alternative="less")
    return float(r.statistic), float(r.pvalue)


def _cost_wilcoxon(d: np.ndarray) -> tuple[float, float]:
    if np.all(d == 0):
        return 0.0, 1.0
    r = _sps().wilcoxon(d, alternative="less", zero_method="wilcox")
    return float(r.statistic), float(r.pvalue)


COST_METHODS: Registry[Callable[[np.ndarray], tuple[float, float]]] = Registry("cost method")
COST_METHODS.register("t", _cost_t)
COST_METHODS.register("wilcoxon", _cost_wilcoxon)


def cost_lower(cost_a: Any, cost_b: Any, *, alpha: float = 0.05, method: str = "t") -> CostTest:
    """Paired one-sided test that arm b costs less per task than arm a (see module doc)."""
    _check_level(0.0, alpha)
    test = COST_METHODS.get(method, field="method")
    a = _as_cost(cost_a, "cost_a")
    b = _as_cost(cost_b, "cost_b")
    _same_length(a, b, "cost_a", "cost_b")
    d = b - a
    stat, p = test(d)
    mean_a, mean_b = float(a.mean()), float(b.mean())
    return CostTest(method=method, n=a.size, mean_a=mean_a, mean_b=mean_b,
                    mean_diff=float(d.mean()),
                    saving=(1.0 - mean_b / mean_a) if mean_a != 0 else math.nan,
                    statistic=stat, p_value=p, cheaper=p <= alpha)


# ---------------------------------------------------------------------------- Holm


class Holm(NamedTuple):
    """Holm's step-down correction: adjusted p-values [k] in the input order and which hypotheses
    are rejected [k] (p_adjusted <= alpha)."""
    p_adjusted: np.ndarray   # [k] float, in the input order
    reject: np.ndarray       # [k] bool, p_adjusted <= alpha


def holm(p_values: Any, alpha: float = 0.05) -> Holm:
    """Holm's step-down correction of k p-values (family-wise error ≤ α).

    Sort ascending, p̃_(j) = min(1, (k − j + 1)·p_(j)) for j = 1..k, made monotone by a running
    maximum; reject where p̃ ≤ α. Matches ``statsmodels.stats.multitest.multipletests``
    with method="holm".
    """
    p = np.asarray(p_values, dtype=np.float64)
    if p.ndim != 1 or p.size == 0:
        raise ValueError(f"p_values must be a non-empty 1-D array, got shape {p.shape}")
    bad = ~(np.isfinite(p) & (p >= 0) & (p <= 1))
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"p_values[{i}] = {p[i]} is not a probability in [0, 1]")
    _check_level(0.0, alpha)
    k = p.size
    order = np.argsort(p, kind="stable")
    scaled = np.minimum(1.0, (k - np.arange(k)) * p[order])
    adj_sorted = np.maximum.accumulate(scaled)
    adj = np.empty(k)
    adj[order] = adj_sorted
    return Holm(p_adjusted=adj, reject=adj <= alpha)


# ------------------------------------------------------------------ arms and stages


@dataclasses.dataclass(frozen=True)
class Arm:
    """One arm's per-task outcomes: success [n] (0/1), cost [n] (e.g. USD), optional task ids."""

    success: np.ndarray
    cost: np.ndarray
    task_ids: tuple | None = None

    def __post_init__(self):
        s = _as_binary(self.success, "Arm.success")
        c = _as_cost(self.cost, "Arm.cost")
        _same_length(s, c, "Arm.success", "Arm.cost")
        object.__setattr__(self, "success", s)
        object.__setattr__(self, "cost", c)
        if self.task_ids is not None:
            ids = tuple(self.task_ids)
            if len(ids) != s.size:
                raise ValueError(f"Arm.task_ids has {len(ids)} ids for {s.size} tasks")
            if len(set(ids)) != len(ids):
                raise ValueError("Arm.task_ids has duplicates")
            object.__setattr__(self, "task_ids", ids)


def _check_paired(ref: Arm, arm: Arm, name: str) -> None:
    if ref.success.shape != arm.success.shape:
        raise ValueError(f"arm {name!r} has {arm.success.size} tasks, the reference "
                         f"{ref.success.size}; arms must be run on the same tasks")
    if ref.task_ids is not None and arm.task_ids is not None and ref.task_ids != arm.task_ids:
        i = next(i for i, (x, y) in enumerate(zip(ref.task_ids, arm.task_ids)) if x != y)
        raise ValueError(f"arm {name!r}: task {i} is {arm.task_ids[i]!r}, the reference's is "
                         f"{ref.task_ids[i]!r}; arms must list the same tasks in the same order")


class Comparison(NamedTuple):
    """A candidate vs the reference: both component tests and the intersection-union p."""

    name: str
    point: str | None
    noninferiority: NonInferiority
    cost: CostTest
    p_value: float          # max(noninferiority.p_value, cost.p_value)
    p_holm: float           # Holm-adjusted within its stage
    passed: bool            # p_holm <= alpha


def compare(ref: Arm, arm: Arm, *, name: str = "candidate", point: str | None = None,
            margin: float = 0.03, alpha: float = 0.05, ni_method: str = "tango",
            cost_method: str = "t") -> Comparison:
    """One unadjusted comparison (p_holm = p_value): non-inferior *and* cheaper."""
    _check_paired(ref, arm, name)
    ni = noninferiority(ref.success, arm.success, margin=margin, alpha=alpha, method=ni_method)
    ct = cost_lower(ref.cost, arm.cost, alpha=alpha, method=cost_method)
    p = max(ni.p_value, ct.p_value)
    return Comparison(name, point, ni, ct, p, p, p <= alpha)


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A Stage 1 candidate delegation: a unique name and its decision point."""

    name: str
    point: str


STAGE2_RULE = "per decision point: the passing Stage 1 candidate with the largest mean saving"


@dataclasses.dataclass(frozen=True)
class Registration:
    """The analysis plan, fixed before any result is read (create it with ``register``).

    ``stage2_comparisons`` names the Stage 2 arms besides the combination ("combined" is
    always first); ``digest`` fingerprints the whole plan so reports can show what was
    registered; ``plan()`` / ``from_plan`` write and read it as JSON; ``created`` is the
    wall-clock registration time.
    """

    candidates: tuple[Candidate, ...]
    margin: float = 0.03
    alpha: float = 0.05
    ni_method: str = "tango"
    cost_method: str = "t"
    stage2_comparisons: tuple[str, ...] = ("combined",)
    created: float = dataclasses.field(default_factory=time.time)

    def plan(self) -> dict:
        """The registered plan as plain JSON (write it out before Stage 1 runs)."""
        return {"candidates": [[c.name, c.point] for c in self.candidates],
                "margin": self.margin, "alpha": self.alpha, "ni_method": self.ni_method,
                "cost_method": self.cost_method, "stage2": list(self.stage2_comparisons),
                "rule": STAGE2_RULE}

    @property
    def digest(self) -> str:
        """A 16-hex-digit SHA-256 of the registered plan (plan()), naming it in reports so a changed
        plan shows."""
        return hashlib.sha256(json.dumps(self.plan(), sort_keys=True).encode()).hexdigest()[:16]

    @classmethod
    def from_plan(cls, plan: Mapping[str, Any]) -> "Registration":
        """Inverse of ``plan()`` (validated like ``register``); unknown keys are errors."""
        keys = {"candidates", "margin", "alpha", "ni_method", "cost_method", "stage2", "rule"}
        unknown = sorted(set(plan) - keys)
        if unknown:
            raise ValueError(f"registration plan: unknown key(s) {unknown}")
        if plan.get("rule", STAGE2_RULE) != STAGE2_RULE:
            raise ValueError(f"registration plan: rule {plan['rule']!r} is not {STAGE2_RULE!r}")
        if "candidates" not in plan:
            raise ValueError("registration plan: missing 'candidates'")
        return register([tuple(c) for c in plan["candidates"]],
                        margin=plan.get("margin", 0.03), alpha=plan.get("alpha", 0.05),
                        ni_method=plan.get("ni_method", "tango"),
                        cost_method=plan.get("cost_method", "t"),
                        stage2_comparisons=plan.get("stage2", ("combined",)))


def check_settings(*, margin: float, alpha: float, ni_method: str, cost_method: str) -> None:
    """Raise ValueError naming the setting of a registration that cannot be used (configs
    check theirs with this before any episode runs)."""
    _check_level(margin, alpha)
    NONINFERIORITY_METHODS.validate(ni_method, field="ni_method")
    COST_METHODS.validate(cost_method, field="cost_method")


def register(candidates: Sequence[tuple[str, str] | Candidate], *, margin: float = 0.03,
             alpha: float = 0.05, ni_method: str = "tango", cost_method: str = "t",
             stage2_comparisons: Sequence[str] = ("combined",)) -> Registration:
    """Register the Stage 1 candidates ((name, point) pairs) and the Stage 2 comparisons."""
    check_settings(margin=margin, alpha=alpha, ni_method=ni_method, cost_method=cost_method)
    cands = []
    for i, c in enumerate(candidates):
        if not isinstance(c, Candidate):
            if not (isinstance(c, (tuple, list)) and len(c) == 2):
                raise ValueError(f"candidates[{i}] must be a Candidate or a (name, point) pair, "
                                 f"got {c!r}")
            c = Candidate(str(c[0]), str(c[1]))
        cands.append(c)
    if not cands:
        raise ValueError("register: no candidates")
    names = [c.name for c in cands]
    dup = sorted({x for x in names if names.count(x) > 1})
    if dup:
        raise ValueError(f"register: duplicate candidate names {dup}")
    s2 = tuple(stage2_comparisons)
    if not s2 or s2[0] != "combined" or len(set(s2)) != len(s2):
        raise ValueError(f"stage2_comparisons must start with 'combined' and be unique, got {s2}")
    return Registration(tuple(cands), float(margin), float(alpha), ni_method, cost_method, s2)


class StageResult(NamedTuple):
    """The outcome of a registered stage (1 or 2): its registration, each candidate's comparison
    against the reference arm in registration order, and that reference."""
    stage: int
    registration: Registration
    comparisons: tuple[Comparison, ...]   # in registration order
    reference: Arm

    def passed(self) -> list[str]:
        """The names of the comparisons that passed (Holm-adjusted p <= alpha), in
        registration order."""
        return [c.name for c in self.comparisons if c.passed]

    def table(self) -> list[dict]:
        """Plain rows for reports (JSON-serialisable)."""
        return [{"name": c.name, "point": c.point, "n": c.noninferiority.n,
                 "success_ref": c.noninferiority.p_a, "success": c.noninferiority.p_b,
                 "diff": c.noninferiority.diff, "lower_bound": c.noninferiority.lower_bound,
                 "p_noninferiority": c.noninferiority.p_value, "cost_ref": c.cost.mean_a,
                 "cost": c.cost.mean_b, "saving": c.cost.saving, "p_cost": c.cost.p_value,
                 "p": c.p_value, "p_holm": c.p_holm, "passed": c.passed}
                for c in self.comparisons]


def _run_stage(stage: int, reg: Registration, ref: Arm, arms: Mapping[str, Arm],
               names: Sequence[str], points: Mapping[str, str | None]) -> StageResult:
    for what, arm in (("reference", ref), *arms.items()):
        if not isinstance(arm, Arm):
            raise TypeError(f"stage {stage}: {what} must be an Arm, got {type(arm).__name__}")
    unknown = sorted(set(arms) - set(names))
    missing = [n for n in names if n not in arms]
    if unknown:
        raise ValueError(f"stage {stage}: result(s) {unknown} were not registered "
                         f"(registered: {list(names)})")
    if missing:
        raise ValueError(f"stage {stage}: no result for registered {missing}")
    comps = [compare(ref, arms[n], name=n, point=points.get(n), margin=reg.margin,
                     alpha=reg.alpha, ni_method=reg.ni_method, cost_method=reg.cost_method)
             for n in names]
    h = holm([c.p_value for c in comps], reg.alpha)
    comps = tuple(c._replace(p_holm=float(ph), passed=bool(r))
                  for c, ph, r in zip(comps, h.p_adjusted, h.reject))
    return StageResult(stage, reg, comps, ref)


def stage1(reg: Registration, reference: Arm, candidates: Mapping[str, Arm]) -> StageResult:
    """Stage 1: each registered candidate alone vs the reference on the same tasks, Holm over
    all registered candidates. Every registered candidate needs a result, and only those."""
    if not isinstance(reg, Registration):
        raise TypeError(f"stage 1: expected a Registration from register(), got "
                        f"{type(reg).__name__}")
    return _run_stage(1, reg, reference, candidates, [c.name for c in reg.candidates],
                      {c.name: c.point for c in reg.candidates})


def stage2_selection(result1: StageResult) -> dict[str, str | None]:
    """The registered rule: per decision point, the passing Stage 1 candidate with the largest
    mean cost saving per task (ties: registration order), or None (the LLM keeps the point)."""
    if result1.stage != 1:
        raise ValueError(f"stage2_selection needs the Stage 1 result, got stage {result1.stage}")
    chosen: dict[str, str | None] = {}
    best: dict[str, float] = {}
    for c in result1.comparisons:
        chosen.setdefault(c.point, None)
        saving = -c.cost.mean_diff
        if c.passed and (chosen[c.point] is None or saving > best[c.point]):
            chosen[c.point], best[c.point] = c.name, saving
    return chosen


def stage2(result1: StageResult, reference: Arm, arms: Mapping[str, Arm]) -> StageResult:
    """Stage 2 on new tasks: the registered comparisons ('combined' = the selection of
    ``stage2_selection`` run together) vs the reference, Holm over them.

    Task ids, where both stages give them, must be disjoint from Stage 1's.
    """
    reg = result1.registration
    old = result1.reference.task_ids
    if old is not None and reference.task_ids is not None:
        overlap = sorted(set(old) & set(reference.task_ids), key=str)
        if overlap:
            raise ValueError(f"stage 2 must run on new tasks; {len(overlap)} task id(s) were "
                             f"used in stage 1, e.g. {overlap[:3]}")
    return _run_stage(2, reg, reference, arms, reg.stage2_comparisons, {})


__all__ = ["NonInferiority", "noninferiority", "NONINFERIORITY_METHODS", "paired_outcomes",
           "CostTest", "cost_lower", "COST_METHODS", "check_settings", "Holm", "holm", "Arm",
           "Comparison", "compare", "Candidate", "Registration", "STAGE2_RULE", "register",
           "StageResult", "stage1", "stage2_selection", "stage2"]
