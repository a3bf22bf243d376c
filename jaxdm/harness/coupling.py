"""Correlated errors of the simulated agent LLM and the simulated decision model.

Each simulated party decides right or wrong at a decision by one uniform draw ``u`` from its
own seeded stream (right when ``u < accuracy``). With a ``correlation`` ρ in [0, 1] the draw is
coupled through a Gaussian copula to a per-decision latent ``z0`` ~ N(0, 1) that both parties
compute from the same ``decision_key`` (task id / step / point [/ parameter]): the party's
latent is √ρ·z0 + √(1−ρ)·Φ⁻¹(u) and its coupled uniform Φ of that. A large ``z0`` is a hard
decision for both. Two parties with weights ρ_a and ρ_b have latent correlation √(ρ_a·ρ_b), so
both set to ρ gives ρ; one at 0 keeps the two independent. ρ = 0 returns ``u`` itself (no
arithmetic), so results without coupling are the draws from before it existed.

``error_correlation`` is the resulting correlation of the two error indicators (the phi
coefficient), smaller than the latent ρ, computed from the bivariate normal.
"""
from __future__ import annotations

import hashlib
import math
from statistics import NormalDist

_STD = NormalDist()
# a uniform of exactly 0 or 1 has no finite normal quantile
_U_EDGE = 1e-12


def check_correlation(rho: object, who: str) -> float:
    """ρ as a float; ``ValueError`` naming ``who`` unless a finite number in [0, 1]."""
    if isinstance(rho, bool) or not isinstance(rho, (int, float)) or not math.isfinite(rho) \
            or not 0.0 <= rho <= 1.0:
        raise ValueError(f"{who}: correlation must be a finite number in [0, 1], got {rho!r}")
    return float(rho)


def decision_key(task_id: str, step: int, point: str, param: str | None = None) -> str:
    """The key of one decision that the harness gives both parties (``meta['decision_key']``
    of a question, ``hidden['decision_key']`` + point for the LLM's own tool choice)."""
    base = f"{task_id}/{int(step)}/{point}"
    return base if param is None else f"{base}/{param}"


def shared_latent(key: str) -> float:
    """The decision's latent z0 ~ N(0, 1), a pure function of ``key`` (no party's seed)."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"decision key must be a non-empty string, got {key!r}")
    bits = int.from_bytes(hashlib.sha256(f"decision-latent/{key}".encode()).digest()[:8],
                          "little")
    u = (bits + 0.5) / 2.0 ** 64
    return _STD.inv_cdf(u)


def coupled_uniform(u: float, key: str | None, rho: float) -> float:
    """``u`` (a party's own uniform draw) coupled to the decision's latent with weight ``rho``;
    ``u`` unchanged at ρ = 0. A missing ``key`` at ρ > 0 is a ``ValueError``."""
    if rho == 0.0:
        return u
    if key is None:
        raise ValueError(f"correlation {rho} needs the decision's key (meta['decision_key'] / "
                         f"hidden['decision_key']), which this decision lacks")
    own = _STD.inv_cdf(min(max(u, _U_EDGE), 1.0 - _U_EDGE))
    return _STD.cdf(math.sqrt(rho) * shared_latent(key) + math.sqrt(1.0 - rho) * own)


def error_correlation(rho: float, accuracy_a: float, accuracy_b: float) -> float:
    """Phi coefficient of the two error indicators when both parties couple with weight ``rho``
    at accuracies ``accuracy_a`` / ``accuracy_b`` (errors: the coupled uniform ≥ accuracy)."""
    from scipy.stats import multivariate_normal  # why: only the report and tests need it

    rho = check_correlation(rho, "error_correlation")
    for name, a in (("accuracy_a", accuracy_a), ("accuracy_b", accuracy_b)):
        if not (isinstance(a, (int, float)) and 0.0 < a < 1.0):
            raise ValueError(f"error_correlation: {name} must be in (0, 1), got {a!r}")
    qa, qb = _STD.inv_cdf(accuracy_a), _STD.inv_cdf(accuracy_b)
    pa, pb = 1.0 - accuracy_a, 1.0 - accuracy_b
    # P(both err) = P(Za > qa, Zb > qb) = P(-Za < -qa, -Zb < -qb)
    both = float(multivariate_normal(mean=[0.0, 0.0], cov=[[1.0, rho], [rho, 1.0]]).cdf(
        [-qa, -qb]))
    return (both - pa * pb) / math.sqrt(pa * (1 - pa) * pb * (1 - pb))


__all__ = ["check_correlation", "decision_key", "shared_latent", "coupled_uniform",
           "error_correlation"]
