"""``jaxdm harness shadow``: the decision model answers every question of ``shadow_tasks``
fit-split tasks without acting; writes ``shadow_decisions.jsonl`` (point, options count, the
model's probabilities and confidence, the LLM's choice, the key, the task outcome) and
``shadow_episodes.jsonl``."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from jaxdm.harness.config import HarnessConfig
from jaxdm.harness.journal import command_journal, recorded
from jaxdm.harness.passes import (arm_summary, build_harness, decision_rows, episode_rows,
                                  run_episodes, write_rows)


@recorded("shadow")
def cmd_shadow(cfg: HarnessConfig) -> dict[str, Any]:
    """``jaxdm harness shadow``: the shadow pass on ``shadow_tasks`` fit-split tasks; writes the
    decisions and episodes and returns the pass's summary."""
    out = Path(cfg.out_dir)
    h = build_harness(cfg, (), None, shadow=True)
    eps = run_episodes(cfg, h, "fit", range(cfg.shadow_tasks), "shadow",
                       command_journal(cfg, "shadow"))
    write_rows(out / "shadow_decisions.jsonl", decision_rows(eps, "shadow"))
    write_rows(out / "shadow_episodes.jsonl", episode_rows(eps))
    summary = arm_summary("shadow", eps)
    print(f"shadow: {len(eps)} fit tasks ({summary['incomplete']} incomplete, not counted), "
          f"LLM success {summary['success']:.3f}, {sum(len(e.decisions) for e in eps)} "
          f"decisions -> {out}/shadow_decisions.jsonl")
    return summary


__all__ = ["cmd_shadow"]
