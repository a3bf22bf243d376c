"""A pass: one harness (agent LLM, decision model, delegations) over a list of task indices,
each finished episode journaled as it ends, with the failure accounting; and the rows and
summaries a command writes from its episodes.

Failure accounting (per pass: the shadow pass, each arm, each Stage 2 run): an episode in which
an agent-LLM call or a decision-model answer got no answer (a server down, its transport
failing) is flagged ``incomplete`` in its records and never counted as a success or failure
(left out of success rates, the fit and the tests, with the count reported); a pass in which
more than ``max_failed_share`` of the LLM's calls or of the model's answers got no answer
stops its command with ``HarnessError`` after journaling what finished, and ``resume`` runs
the flagged and the missing episodes again. Every pass prints its episodes, calls, failures
and the episodes run again.

The episodes' env steps run where ``env.backend`` says (``jaxdm.harness.pool``: inline, or on
worker processes / Ray actors, the agent LLM and the decision model staying here); an episode
lost to an env worker (dead, hung) is run again and counted (``env_failures``), and more lost
than ``max_failed_share`` of the episodes started stops the pass with ``HarnessError``.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
from tqdm.auto import tqdm

from jaxdm import jsonl
from jaxdm.envs.decision_gym import DecisionGym, GymParams
from jaxdm.harness.agent import Episode, Harness
from jaxdm.harness.config import HarnessConfig
from jaxdm.harness.dm import make_dm
from jaxdm.harness.errors import HarnessError
from jaxdm.harness.journal import Journal, make_dir, note_pass
from jaxdm.harness.llm import make_llm
from jaxdm.harness.modes import Delegation
from jaxdm.harness.pool import EnvWorkersFailed, EpisodeRunner
from jaxdm.jsonl import read_records

# A pass stops before its end only once this many calls (or answers) failed: one failed
# call in the first episode is no evidence yet that the server is down.
EARLY_STOP_MIN_FAILED = 10


def _gym_params(cfg: HarnessConfig, split: str):
    try:
        return GymParams(variant=cfg.env.variant, strict=cfg.env.strict,
                         max_steps=cfg.env.max_steps, split=split)
    except ValueError as e:
        raise HarnessError(f"env: {e}") from None


def _progress(cfg: HarnessConfig, total: int, desc: str):
    if not cfg.progress:
        return None
    return tqdm(total=total, desc=desc, dynamic_ncols=True, file=sys.stderr)


def run_episodes(cfg: HarnessConfig, harness: Harness, split: str, indices: Sequence[int],
                 desc: str, journal: Journal | None = None) -> list[Episode]:
    """One episode per task index, in order. ``journal``: each finished episode is appended
    to its ``<desc>.jsonl`` as it ends, and episodes already there are kept instead of run
    again (a resumed command) — except incomplete ones (a call got no answer), which run
    again.

    Failure accounting: the pass stops with ``HarnessError`` (its finished episodes kept in
    the journal) when more than ``cfg.max_failed_share`` of the agent LLM's calls, or of the
    decision model's answers, got no answer (checked after every episode once
    ``EARLY_STOP_MIN_FAILED`` did, and at the end), or when every call failed (then nothing of
    the pass is kept), or when more than that share of its episodes were lost to env workers
    (``jaxdm.harness.pool.EpisodeRunner``: each lost one is run again). Its summary line gives
    calls, failures and the episodes run again. The episodes' env steps run on ``cfg.env``'s
    backend; the results are the same on every backend."""
    params = _gym_params(cfg, split)
    path = None if journal is None else journal.path(desc)
    kept: dict[int, Episode] = {}
    if path is not None and path.is_file():
        rows: dict[int, Any] = {}
        try:
            for _, row in read_records(path, drop_torn_tail=True):
                rows[int(row["index"])] = row          # an episode run again: the last wins
                kept[int(row["index"])] = Episode.from_dict(row["episode"])
        except (ValueError, KeyError, TypeError) as e:
            raise HarnessError(f"{path}: not a harness journal ({e}); use --overwrite") from None
        # rewritten whole: a torn last line must not stay in front of the next append
        jsonl.write_records(path, list(rows.values()))
    bar = _progress(cfg, len(indices), desc)
    eps: list[Episode] = []
    rerun = 0
    todo = [i for i in indices if kept.get(i) is None or kept[i].incomplete]
    runner = EpisodeRunner(cfg.env, DecisionGym, params, env_name="decision_gym",
                           max_failed_share=cfg.max_failed_share,
                           early_min=EARLY_STOP_MIN_FAILED)
    played = runner.play(todo, lambda i: harness.for_episode())
    try:
        for i in indices:
            ep = kept.get(i)
            if ep is not None and not ep.incomplete:
                eps.append(ep)
            else:
                rerun += ep is not None
                _, _, new = next(played)
                eps.append(new)
                if journal is not None:
                    journal.append(desc, i, eps[-1])
                _check_pass(cfg, eps, desc, path, early=True)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(success=f"{np.mean([e.success for e in eps]):.3f}")
        next(played, None)   # the pool's end-of-pass check, then it closes
    except EnvWorkersFailed as e:
        raise HarnessError(f"{desc}: {e}; the finished episodes are kept: run the command "
                           f"again with --resume") from None
    finally:
        played.close()
        if bar is not None:
            bar.close()
    _check_pass(cfg, eps, desc, path, early=False)
    tally = _tally(desc, eps, rerun, runner.env_failures)
    note_pass(tally)
    print(f"{desc}: {_accounting(tally)}", flush=True)
    return eps


def _tally(desc: str, eps: Sequence[Episode], rerun: int = 0,
           env_failures: int = 0) -> dict[str, Any]:
    return {"desc": desc, "episodes": len(eps),
            "incomplete": sum(e.incomplete for e in eps), "rerun": rerun,
            "env_failures": env_failures,
            "llm_calls": sum(e.llm_calls for e in eps),
            "llm_failures": sum(e.llm_failures for e in eps),
            "llm_unanswered": sum(e.llm_unanswered for e in eps),
            "dm_questions": sum(e.dm_questions for e in eps),
            "dm_failures": sum(e.dm_failures for e in eps),
            "dm_unanswered": sum(e.dm_unanswered for e in eps)}


def _accounting(t: Mapping[str, Any]) -> str:
    return (f"{t['episodes']} episodes ({t['incomplete']} incomplete, not counted; "
            f"{t['rerun']} run again); agent LLM {t['llm_calls']} calls ({t['llm_failures']} "
            f"failed, {t['llm_unanswered']} unanswered); decision model {t['dm_questions']} "
            f"questions ({t['dm_failures']} failed, {t['dm_unanswered']} unanswered)"
            + (f"; {t['env_failures']} episode(s) lost to env workers and run again"
               if t.get("env_failures") else ""))


def _check_pass(cfg: HarnessConfig, eps: Sequence[Episode], desc: str, journal: Path | None,
                *, early: bool) -> None:
    """Stops a pass that measures an outage, not the method (``run_episodes``). A pass in
    which every call of the agent LLM, or every answer of the decision model, failed (the
    harness fell back at every decision) is not kept at all (a resumed command runs it
    again); a pass over ``max_failed_share`` keeps its finished episodes (``--resume`` runs
    the incomplete and the missing ones). Failures below the bound are counted, and the
    episodes they hit flagged incomplete."""
    least = EARLY_STOP_MIN_FAILED if early else 1
    bound = cfg.max_failed_share
    llm = [c for e in eps for c in e.calls if c.kind == "llm"]
    llm_lost = sum(e.llm_unanswered for e in eps)
    dm_failed = sum(e.dm_failures for e in eps)
    dm_lost = sum(e.dm_unanswered for e in eps)
    dm_asked = sum(e.dm_questions for e in eps)
    dm_answered = sum(r.dm_choice is not None for e in eps for r in e.decisions)
    failed = None
    if len(llm) >= least and not any(c.ok for c in llm):
        first = next((c.error for c in llm if c.error), "no error given")
        failed = ("agent LLM", f"every agent LLM call failed ({len(llm)} calls over {len(eps)} "
                               f"tasks; first error: {first})")
    elif dm_failed >= least and not dm_answered:
        # calls that went through carry the backend's own reason for its failed answers;
        # those that raised (then asked one question at a time) come after
        errors = [c.error for c in sorted((c for e in eps for c in e.calls
                                           if c.kind == "dm" and c.error), key=lambda c: not c.ok)]
        first = f"; first error: {errors[0]}" if errors else ""
        failed = ("decision model", f"every decision model answer failed ({dm_failed} over "
                                    f"{len(eps)} tasks{first})")
    if failed is not None:
        if journal is not None:
            journal.unlink(missing_ok=True)
        raise HarnessError(f"{desc}: {failed[1]}; this pass is not kept: fix the {failed[0]} "
                           f"and run the command again with --resume")
    over = []
    if llm_lost >= least and llm_lost > bound * len(llm):
        first = next(c.error for c in llm if c.unanswered)
        over.append(("agent LLM", f"{llm_lost} of {len(llm)} agent LLM calls got no answer "
                                  f"({llm_lost / len(llm):.1%}; first error: {first})"))
    if dm_lost >= least and dm_lost > bound * dm_asked:
        first = next(c.error for e in eps for c in e.calls if c.kind == "dm" and c.unanswered)
        over.append(("decision model", f"{dm_lost} of {dm_asked} decision model answers got no "
                                       f"answer ({dm_lost / dm_asked:.1%}; first error: "
                                       f"{first})"))
    if over:
        flagged = sum(e.incomplete for e in eps)
        raise HarnessError(
            f"{desc}: {'; '.join(w for _, w in over)}: over max_failed_share {bound:g}, so the "
            f"pass stops after {len(eps)} tasks; {len(eps) - flagged} finished episodes are "
            f"kept and {flagged} incomplete ones flagged: once the "
            f"{' and the '.join(who for who, _ in over)} answers, run the command again with "
            f"--resume (it runs the flagged and the missing episodes)")


def write_rows(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """Writes ``rows`` as a JSONL file, whole (its folder made first)."""
    make_dir(path.parent)
    jsonl.write_records(path, rows)


def read_rows(path: Path) -> list[dict]:
    """The rows of a JSONL result file, or ``HarnessError`` naming it (missing: run the earlier
    command first)."""
    if not path.is_file():
        raise HarnessError(f"{path} does not exist (run the earlier harness command first)")
    try:
        return [row for _, row in read_records(path)]
    except ValueError as e:
        raise HarnessError(str(e)) from None


def build_harness(cfg: HarnessConfig, delegations: Sequence[Delegation],
                  dm_spec: Mapping | None, shadow: bool = False, dm: Any = None) -> Harness:
    """The Harness of ``cfg``: its agent LLM (and cheap tier), the decision model ``dm`` or one
    built from ``dm_spec`` / ``cfg.dm`` when delegating or in shadow mode, ``delegations`` and
    ``cfg.agent``; bad values as ``HarnessError``."""
    settings = cfg.agent
    llm = make_llm(cfg.llm)
    cheap = make_llm(cfg.cheap_llm) if cfg.cheap_llm is not None else None
    if dm is None and (delegations or shadow):
        try:
            dm = make_dm(dm_spec if dm_spec is not None else cfg.dm)
        except (TypeError, ValueError) as e:
            raise HarnessError(f"dm: {e}") from None
    try:
        return Harness(llm, dm, delegations, settings, cheap_llm=cheap, shadow=shadow)
    except ValueError as e:
        raise HarnessError(str(e)) from None


def decision_rows(eps: Sequence[Episode], arm: str) -> list[dict]:
    """Every decision; those of an incomplete episode flagged (``"incomplete": true``)."""
    return [{"arm": arm, **r.to_dict(), **({"incomplete": True} if e.incomplete else {})}
            for e in eps for r in e.decisions]


def episode_rows(eps: Sequence[Episode]) -> list[dict]:
    """One row per episode: its summary and its failure accounting (``incomplete``: a call
    got no answer; not counted as a success or a failure)."""
    return [{**e.summary(), "dm_questions": e.dm_questions, "llm_unanswered": e.llm_unanswered,
             "dm_unanswered": e.dm_unanswered, "incomplete": e.incomplete} for e in eps]


def complete_episodes(eps: Sequence[Episode]) -> list[Episode]:
    """The episodes that count (an incomplete one measured an outage, not the method)."""
    return [e for e in eps if not e.incomplete]


def arm_summary(name: str, eps: Sequence[Episode]) -> dict[str, Any]:
    """Success, cost and decisions over the complete episodes (``n``); calls and failures
    over all (they were paid), with the count of incomplete episodes left out."""
    every, eps = eps, complete_episodes(eps)
    n = len(eps)
    per_point: dict[str, dict[str, int]] = {}
    for e in eps:
        for r in e.decisions:
            c = per_point.setdefault(r.point, {"n": 0, "dm": 0, "correct": 0, "keyed": 0})
            c["n"] += 1
            c["dm"] += r.who in ("dm", "dm_fallback")
            if r.correct is not None:
                c["keyed"] += 1
                c["correct"] += bool(r.correct)
    return {"arm": name, "n": n, "success": float(np.mean([e.success for e in eps])) if n else 0.0,
            "cost": float(np.mean([e.cost for e in eps])) if n else 0.0,
            "seconds": float(np.sum([e.seconds for e in eps])),
            "overhead_s": float(np.sum([e.overhead_s for e in eps])),
            "llm_calls": int(sum(e.llm_calls for e in every)),
            "dm_calls": int(sum(e.dm_calls for e in every)),
            "dm_failures": int(sum(e.dm_failures for e in every)),
            "llm_failures": int(sum(e.llm_failures for e in every)),
            "llm_unanswered": int(sum(e.llm_unanswered for e in every)),
            "dm_unanswered": int(sum(e.dm_unanswered for e in every)),
            "incomplete": len(every) - n,
            "points": per_point}


__all__ = ["EARLY_STOP_MIN_FAILED", "run_episodes", "build_harness", "write_rows",
           "read_rows", "decision_rows", "episode_rows", "complete_episodes", "arm_summary"]
