"""``jaxdm harness fit``: per decision point the LLM's accuracy q_L, the price saved per call
ΔC and the success lost per wrong choice V from the shadow pass, the calibration (isotonic or
binned) and ``fit_threshold``; writes ``thresholds.json`` and ``calibration.png``.
``load_thresholds`` reads them back for the arms."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from jaxdm import jsonl
from jaxdm.harness.config import HarnessConfig
from jaxdm.harness.fit import binned, ece, estimate_point, fit_threshold
from jaxdm.harness.journal import recorded
from jaxdm.harness.llm import LLMProfile, make_llm
from jaxdm.harness.passes import read_rows
from jaxdm.harness.report import calibration_figure, nan_to_none


def _prices(cfg: HarnessConfig, eps_rows: Sequence[Mapping], dec_rows: Sequence[Mapping]
            ) -> tuple[float, float]:
    """Mean LLM act-call price and the price of one answer's output tokens (from the
    simulated profile, or 20 output tokens at the remote price)."""
    llm = make_llm(cfg.llm)
    p = getattr(llm, "profile", None)
    calls = sum(r["llm_calls"] for r in eps_rows)
    cost = sum(r["cost"] for r in eps_rows) - sum(d.get("cost_usd", 0.0) for d in dec_rows)
    act = cost / calls if calls else 0.0
    out_price = p.price_per_1k_out if isinstance(p, LLMProfile) else \
        getattr(llm, "price_out", 0.0)
    return act, 20 / 1000 * out_price


@recorded("fit")
def cmd_fit(cfg: HarnessConfig) -> dict[str, Any]:
    """``jaxdm harness fit``: the threshold per point from the complete shadow episodes; writes
    ``thresholds.json`` and ``calibration.png`` and returns the fits."""
    out = Path(cfg.out_dir)
    dec = read_rows(out / "shadow_decisions.jsonl")
    eps = read_rows(out / "shadow_episodes.jsonl")
    # incomplete shadow episodes (a call got no answer) are not fitted on
    flagged = {r["task_id"] for r in eps if r.get("incomplete")}
    if flagged:
        eps = [r for r in eps if not r.get("incomplete")]
        dec = [d for d in dec if d["task_id"] not in flagged and not d.get("incomplete")]
        print(f"fit: {len(flagged)} incomplete shadow episodes left out ({len(eps)} fitted on)")
    act_price, answer_price = _prices(cfg, eps, dec)
    dm_q = cfg.agent.dm_price_per_call
    fits: dict[str, Any] = {}
    for point in cfg.fit.points:
        est = estimate_point(dec, eps, point, value_per_task=cfg.fit.value_per_task,
                             llm_price_per_answer=answer_price, act_call_price=act_price,
                             dm_price_per_question=dm_q, min_value_share=cfg.fit.min_value_share)
        if not est["confidence"]:
            continue
        f = fit_threshold(est["confidence"], est["correct"], q_llm=est["q_llm"],
                          delta_cost=est["delta_cost"], value=est["value"],
                          method=cfg.fit.method, min_support=cfg.fit.min_support, point=point)
        fits[point] = {**f._asdict(), "ece": ece(est["confidence"], est["correct"]),
                       "dm_accuracy": float(np.mean(est["correct"])),
                       "bins": binned(est["confidence"], est["correct"])}
        th = "LLM keeps" if f.threshold is None else f"{f.threshold:.3f}"
        print(f"fit {point:7s}: n={f.n:5d} q_L={f.q_llm:.3f} dC={f.delta_cost:.5f} "
              f"V={f.value:.3f} tau*={f.tau_star:.3f} threshold={th} share_above="
              f"{f.share_above:.3f}")
    jsonl.write_json(out / "thresholds.json", fits, default=nan_to_none)
    calibration_figure(dec, fits, out / "calibration.png")
    return fits


def load_thresholds(out_dir: str | Path) -> dict | None:
    """The fits in ``out_dir/thresholds.json`` (None when it is absent)."""
    p = Path(out_dir) / "thresholds.json"
    return json.loads(p.read_text()) if p.is_file() else None


__all__ = ["cmd_fit", "load_thresholds"]
