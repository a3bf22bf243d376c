"""``jaxdm bench``: AGENT DECISION BENCH L1 (BFCL v4) and L2 (recorded DECISION GYM states).

Every backend (``jaxdm screen``'s judge specs: "oracle", "smollm2", or
"kind:key=value,...", e.g. ``oracle:noise=0.2``, ``local_likelihood:path=smollm2``,
``local_readout:path=/run/model`` for an exported checkpoint folder, ``remote:base_url=...``)
answers every question; per backend the report gives accuracy and ECE (``jaxdm.bench.metrics``,
10 equal-width bins) overall, per level and decision point, L2 after an error vs not and L2
must-ask states, plus cost (input tokens, USD where priced), wall time and decision-model
calls (one per question). A backend that cannot answer a question (e.g. constrained readout
has 26 single-letter labels and DECISION GYM's tool question has 69 options) gets it counted
as failed with the reason, never silently dropped.

Writes ``bench.json``, ``records.jsonl`` (one line per question and backend), ``report.md``
and ``accuracy.png`` to ``out_dir``. L3 (a decision model taking over a running agent) is not
part of this command.
"""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Sequence

from jaxdm.bench import l1 as l1_lib
from jaxdm.bench import metrics
from jaxdm.bench.l2 import AFTER_ERROR_SHARE, L2Config, build_l2
from jaxdm.decision.types import choice_failed

LEVELS = ("l1", "l2")


class BenchError(ValueError):
    """A bench setting or backend spec is wrong (the message names it)."""


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """levels: which of "l1", "l2"; l1_tool / l1_param: seeded subset sizes (None = all);
    l2_*: see ``jaxdm.bench.l2.L2Config``; batch: questions per backend call."""

    levels: tuple[str, ...] = LEVELS
    judges: tuple[str, ...] = ("oracle:noise=0.2,name=oracle-noisy", "smollm2")
    out_dir: str = "bench_out"
    l1_tool: int | None = 200
    l1_param: int | None = 200
    l2_tasks: int = 20
    l2_variant: str = "base"
    l2_agent_error_rate: float = 0.25
    l2_after_error_share: float | None = AFTER_ERROR_SHARE
    l2_max_states: int | None = None
    seed: int = 0
    batch: int = 32
    ece_bins: int = metrics.ECE_BINS
    progress: bool = True

    def __post_init__(self):
        bad = sorted(set(self.levels) - set(LEVELS))
        if bad or not self.levels:
            raise BenchError(f"unknown bench level(s) {bad or '(none)'}; known: {list(LEVELS)}")
        if not self.judges:
            raise BenchError("bench needs at least one judge (backend spec)")
        if self.batch < 1 or self.ece_bins < 1:
            raise BenchError("batch and ece_bins must be >= 1")


def build_questions(cfg: BenchConfig) -> tuple[dict[str, list], dict[str, Any]]:
    qs: dict[str, list] = {}
    stats: dict[str, Any] = {}
    if "l1" in cfg.levels:
        qs["l1"], stats["l1"] = l1_lib.build_l1(cfg.l1_tool, cfg.l1_param, cfg.seed)
    if "l2" in cfg.levels:
        qs["l2"], stats["l2"] = build_l2(L2Config(
            tasks=cfg.l2_tasks, variant=cfg.l2_variant, agent_error_rate=cfg.l2_agent_error_rate,
            after_error_share=cfg.l2_after_error_share, max_states=cfg.l2_max_states,
            seed=cfg.seed))
    return qs, stats


def answer_all(backend: Any, questions: Sequence[Any], batch: int, bar=None) -> list:
    """Results for every question; a batch the backend refuses is retried one by one, and a
    question it refuses gets a failed result carrying the reason."""
    out = []
    for i in range(0, len(questions), batch):
        chunk = list(questions[i:i + batch])
        try:
            out.extend(backend.choose(chunk))
        except (ValueError, TypeError) as e:
            for q in chunk:
                try:
                    out.extend(backend.choose([q]))
                except (ValueError, TypeError) as e1:
                    out.append(choice_failed(f"{type(e1).__name__}: {e1}"))
            del e
        if bar is not None:
            bar.update(len(chunk))
    return out


def run(cfg: BenchConfig) -> dict[str, Any]:
    from jaxdm.screen.run import ScreenError, build_judges

    try:
        judges = build_judges(cfg.judges)
    except ScreenError as e:
        raise BenchError(str(e)) from e
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    questions, stats = build_questions(cfg)
    stats["build_seconds"] = round(time.perf_counter() - t0, 3)
    n_total = sum(len(v) for v in questions.values())
    result: dict[str, Any] = {"config": dataclasses.asdict(cfg), "data": stats, "backends": {}}
    all_recs = []
    for name, backend in judges:
        bar = None
        if cfg.progress:
            from tqdm.auto import tqdm
            bar = tqdm(total=n_total, desc=f"bench {name}", unit="q")
        recs, seconds = [], {}
        for level, qs in questions.items():
            t1 = time.perf_counter()
            res = answer_all(backend, qs, cfg.batch, bar)
            seconds[level] = time.perf_counter() - t1
            recs.extend(metrics.records(qs, res, level))
        if bar is not None:
            bar.close()
        summary = metrics.breakdown(recs, cfg.ece_bins)
        errors = sorted({r["error"] for r in recs if r["error"]})
        summary["cost"] = {
            "calls": len(recs), "tokens_in": sum(r["tokens_in"] for r in recs),
            "usd": (sum(r["usd"] for r in recs if r["usd"] is not None)
                    if any(r["usd"] is not None for r in recs) else None),
            "seconds": {k: round(v, 3) for k, v in seconds.items()},
            "seconds_per_call": round(sum(seconds.values()) / max(len(recs), 1), 5)}
        summary["failure_reasons"] = errors[:5]
        result["backends"][name] = summary
        all_recs.extend(dict(r, backend=name) for r in recs)
    with open(out / "records.jsonl", "w", encoding="utf-8") as f:
        for r in all_recs:
            f.write(json.dumps(r) + "\n")
    (out / "bench.json").write_text(json.dumps(result, indent=2), encoding="utf-8")
    _figure(result, out / "accuracy.png")
    (out / "report.md").write_text(report(result), encoding="utf-8")
    print(report(result))
    return result


GROUPS = ("l1/l1_tool", "l1/l1_param", "l2/tool", "l2/param", "l2/stop", "l2/after_error",
          "l2/no_error", "l2/tool/must_ask")


def _fmt(x: Any) -> str:
    return "-" if x is None else (f"{x:.3f}" if isinstance(x, float) else str(x))


def report(result: dict[str, Any]) -> str:
    lines = ["# AGENT DECISION BENCH", "",
             f"ECE: {result['config']['ece_bins']} equal-width confidence bins; confidence = "
             "probability of the chosen option; failed answers count as wrong and are left "
             "out of ECE.", ""]
    data = result["data"]
    if "l1" in data:
        d = data["l1"]
        lines += [f"L1 (BFCL v4 via bfcl-eval): {d['used/tool']} of {d['tool/total']} tool "
                  f"selections, {d['used/param']} of {d['param/total']} parameter items. "
                  f"{d['when2call']}",
                  "Counts per category: " + ", ".join(f"{k} {v}" for k, v in d.items()
                                                     if k.startswith(("tool/", "param/"))
                                                     and not k.endswith("total")), ""]
    if "l2" in data:
        d = data["l2"]
        lines += [f"L2 (DECISION GYM {d['variant']}, {d['split']} split): {d['states']} states "
                  f"from {d['tasks']} noisy-agent tasks (error rate {d['agent_error_rate']}), "
                  f"{_fmt(d['after_error_share'])} after an error, {d['must_ask_states']} "
                  f"must-ask; {d['questions']} questions (tool {d['questions/tool']}, param "
                  f"{d['questions/param']}, stop {d['questions/stop']}).", ""]
    groups = [g for g in GROUPS if any(g in b for b in result["backends"].values())]
    lines += ["| backend | " + " | ".join(groups) + " | calls | tokens in | s / call |",
              "|---|" + "---|" * (len(groups) + 3)]
    for name, b in result["backends"].items():
        cells = []
        for g in groups:
            s = b.get(g)
            cells.append("-" if not s or s["n"] == 0 else
                         f"{_fmt(s['accuracy'])} (ECE {_fmt(s['ece'])}, n {s['n']}"
                         + (f", {s['failed']} failed" if s["failed"] else "") + ")")
        c = b["cost"]
        lines.append(f"| {name} | " + " | ".join(cells) +
                     f" | {c['calls']} | {c['tokens_in']} | {c['seconds_per_call']} |")
    for name, b in result["backends"].items():
        if b["failure_reasons"]:
            lines += ["", f"{name} failures (first reasons): " + "; ".join(b["failure_reasons"])]
    return "\n".join(lines) + "\n"


def _figure(result: dict[str, Any], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    import numpy as np

    names = list(result["backends"])
    groups = [g for g in GROUPS if any(g in b for b in result["backends"].values())]
    fig, ax = plt.subplots(figsize=(1.2 + 1.1 * len(groups), 3.6))
    w = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        b = result["backends"][name]
        ys = [(b.get(g) or {}).get("accuracy") or 0.0 for g in groups]
        ax.bar(np.arange(len(groups)) + i * w, ys, w, label=name)
    ax.set_xticks(np.arange(len(groups)) + w * (len(names) - 1) / 2)
    ax.set_xticklabels(groups, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    ax.set_title("AGENT DECISION BENCH: accuracy by level and decision point")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
