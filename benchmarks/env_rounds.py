"""Alternated timing rounds of the VectorEnv benchmarks (``env_vector_section.py``,
``env_workers.py``): an in-process baseline against worker pools, medians taken by the
callers."""
from __future__ import annotations


def alternated_rates(baseline_round, vector_round, env, pools: dict, *, batch: int,
                     steps: int, rounds: int, warm_steps: int) -> tuple[list[float], dict]:
    """Steps/s of ``baseline_round(env, batch, steps, seed)`` and of ``vector_round(pool, ...)``
    for each of ``pools``, alternated within every round (the baseline, then the pools in
    order), after one warm-up round of ``warm_steps`` on every side. The pools are closed at
    the end, also on an error. Returns (the baseline's rates, {pool key: its rates})."""
    baseline, rates = [], {key: [] for key in pools}
    try:
        baseline_round(env, batch, warm_steps, seed=999)  # warm caches on every side
        for pool in pools.values():
            vector_round(pool, batch, warm_steps, seed=999)
        for r in range(rounds):
            baseline.append(baseline_round(env, batch, steps, seed=r))
            for key, pool in pools.items():
                rates[key].append(vector_round(pool, batch, steps, seed=r))
    finally:
        for pool in pools.values():
            pool.close()
    return baseline, rates
