"""``jaxdm bench``: AGENT DECISION BENCH L1 (BFCL v4), L2 (recorded DECISION GYM states) and
L3 (the decision model taking over a running agent, ``jaxdm.bench.l3``).

Every backend (``jaxdm screen``'s judge specs: "oracle", "smollm2", or
"kind:key=value,...", e.g. ``oracle:noise=0.2``, ``local_likelihood:path=smollm2``,
``local_readout:path=/run/model`` for an exported checkpoint folder, ``remote:base_url=...``)
answers every question; per backend the report gives accuracy and ECE (``jaxdm.bench.metrics``,
10 equal-width bins) overall, per level and decision point, L2 after an error vs not and L2
must-ask states, plus cost (input tokens, USD where priced), wall time and decision-model
calls (one per question). A backend that cannot answer a question (e.g. constrained readout
has 26 single-letter labels and DECISION GYM's tool question has 69 options) gets it counted
as failed with the reason, never silently dropped.

L3 (``levels`` holds "l3"): per backend and env (DECISION GYM base / Shift / Hard, ALFWorld)
task success, cost, time, decision-model and LLM calls, failures, and the step-level
accuracy of the model's own takeover choices (as level "l3" records, kind = env). Across
backends: Kendall τ between each level's step-level accuracy and L3 task success
(``metrics.level_agreement``; needs at least two backends).

Writes ``bench.json``, ``records.jsonl`` (one line per question / keyed takeover decision and
backend), ``l3_episodes.jsonl`` (one line per L3 episode and backend), ``report.md``,
``accuracy.png`` and ``levels.png`` (L1 vs L2 accuracy vs L3 task success per backend) to
``out_dir``, after ``units.jsonl`` (``jaxdm.bench.store``) got each backend x level unit as it
finished: ``--resume`` continues an interrupted run, ``--overwrite`` replaces one, and neither
given, a folder holding files is refused.

Failed answers (no answer came back: a remote backend's outage; in L3 an episode with a
failed agent-LLM call or decision-model answer, *flagged*) are never wrong answers: they are
left out of accuracy and task success and counted. A unit with any is saved as incomplete, its
good answers kept, and ``--resume`` asks only its failed questions again (re-runs only its
flagged L3 episodes), merging the answers in; the report says how many failed for good. A
unit whose failed share exceeds ``max_failed_share`` (or that failed every answer; in L3 the
share of failed agent-LLM calls or of lost decision-model answers) makes the job fail (exit 2)
after the rest has run and been written.
"""
from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from tqdm.auto import tqdm

from jaxdm.bench import l1 as l1_lib
from jaxdm.bench import l3 as l3_lib
from jaxdm.bench import metrics
from jaxdm.bench.l2 import AFTER_ERROR_SHARE, L2Config, build_l2
from jaxdm.bench.store import BenchStore
from jaxdm.decision.types import choice_failed
from jaxdm.harness.dm import make_dm
from jaxdm.harness.errors import HarnessError
from jaxdm.harness.llm import make_llm
from jaxdm.harness.pool import EnvWorkersConfig, EnvWorkersFailed
from jaxdm.jsonl import write_atomic, write_json, write_records
from jaxdm.registry import Registry, UnknownNameError
from jaxdm.runlog import MAX_FAILED_SHARE, check_failed_share, pyplot
from jaxdm.screen.figures import save_figure
from jaxdm.screen.run import ScreenError, build_judges, normalize_judge_spec

@dataclasses.dataclass(frozen=True)
class BenchLevel:
    """One bench level: ``questions(cfg)`` -> (its questions, how they were drawn), or None for
    a level that asks while it plays (L3); ``units(cfg)``: the names of its units (a backend
    x unit is run, saved and resumed as one), in order."""

    questions: Callable[[Any], tuple[list, Any]] | None
    units: Callable[[Any], list[str]]


def _l1_questions(cfg: BenchConfig) -> tuple[list, Any]:
    return l1_lib.build_l1(cfg.l1_tool, cfg.l1_param, cfg.seed)


def _l2_questions(cfg: BenchConfig) -> tuple[list, Any]:
    return build_l2(L2Config(
        tasks=cfg.l2_tasks, variant=cfg.l2_variant, agent_error_rate=cfg.l2_agent_error_rate,
        after_error_share=cfg.l2_after_error_share, max_states=cfg.l2_max_states,
        seed=cfg.seed))


# The levels, in the bench's order (questions are built in it): L1 and L2 are one unit each,
# L3 one unit per env ("l3/<env>", the longest part of a bench).
LEVELS: Registry[BenchLevel] = Registry("bench level")
LEVELS.register("l1", BenchLevel(_l1_questions, lambda cfg: ["l1"]))
LEVELS.register("l2", BenchLevel(_l2_questions, lambda cfg: ["l2"]))
LEVELS.register("l3", BenchLevel(None, lambda cfg: [f"l3/{env}" for env in cfg.l3_envs]))


class BenchError(ValueError):
    """A bench setting or backend spec is wrong (the message names it)."""


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """levels: which of "l1", "l2"; l1_tool / l1_param: seeded subset sizes (None = all);
    l2_*: see ``jaxdm.bench.l2.L2Config``; l3_*: see ``jaxdm.bench.l3.L3Config`` (l3_llm: the
    agent LLM spec of ``jaxdm.harness.llm.make_llm``); env: where L3's env steps run
    (``jaxdm.harness.pool.EnvWorkersConfig``: ``env.backend`` inline | process | ray,
    ``env.num_workers``, ``env.ray.address`` ...); batch: questions per backend call;
    max_failed_share: a unit (backend x level, or L3 env) in which a larger share of answers
    failed (in L3: of agent-LLM calls, or of decision-model answers) fails the job after the
    rest is written; one in which every answer failed always does (1.0: only then). A unit
    with fewer failed answers is kept as incomplete: ``--resume`` asks them again."""

    levels: tuple[str, ...] = tuple(LEVELS)
    judges: tuple[str, ...] = ("oracle:noise=0.2,name=oracle-noisy", "smollm2")
    out_dir: str = "bench_out"
    l1_tool: int | None = 200
    l1_param: int | None = 200
    l2_tasks: int = 20
    l2_variant: str = "base"
    l2_agent_error_rate: float = 0.25
    l2_after_error_share: float | None = AFTER_ERROR_SHARE
    l2_max_states: int | None = None
    l3_envs: tuple[str, ...] = tuple(l3_lib.L3_ENVS)
    l3_tasks: int = 20
    l3_llm: dict = dataclasses.field(default_factory=lambda: dict(l3_lib.DEFAULT_LLM))
    l3_max_steps: int = 30
    # where L3's env steps run (``env.backend`` inline | process | ray, ``env.num_workers``,
    # ``env.ray``: jaxdm.harness.pool.EnvWorkersConfig); L1 / L2 need no env workers
    env: EnvWorkersConfig = EnvWorkersConfig()
    seed: int = 0
    batch: int = 32
    ece_bins: int = metrics.ECE_BINS
    progress: bool = True
    max_failed_share: float = MAX_FAILED_SHARE

    def __post_init__(self):
        check_failed_share(self.max_failed_share, error=BenchError)
        if not self.levels:
            raise BenchError(f"levels: no bench level given; known: {LEVELS.names()}")
        try:
            for level in self.levels:
                LEVELS.validate(level, field="levels")
            if "l3" in self.levels:
                for env in self.l3_envs:
                    l3_lib.L3_ENVS.validate(env, field="l3_envs")
        except UnknownNameError as e:
            raise BenchError(str(e)) from None
        if not self.judges:
            raise BenchError("bench needs at least one judge (backend spec)")
        if self.batch < 1 or self.ece_bins < 1:
            raise BenchError("batch and ece_bins must be >= 1")
        if "l3" in self.levels:
            try:
                self.l3_config()
            except ValueError as e:
                raise BenchError(str(e)) from None

    def l3_config(self) -> l3_lib.L3Config:
        """The L3 settings this bench config names (its l3_* keys; one step cap for both DECISION
        GYM and ALFWorld)."""
        return l3_lib.L3Config(envs=tuple(self.l3_envs), tasks=self.l3_tasks,
                               llm=dict(self.l3_llm), gym_max_steps=self.l3_max_steps,
                               alfworld_max_steps=self.l3_max_steps)


def build_questions(cfg: BenchConfig) -> tuple[dict[str, list], dict[str, Any]]:
    """The L1 and L2 questions of the levels ``cfg`` runs, as ({level: questions}, {level: how they
    were drawn}); L3 asks its questions while it plays, so it has none here."""
    qs: dict[str, list] = {}
    stats: dict[str, Any] = {}
    for name, level in LEVELS.items():
        if name in cfg.levels and level.questions is not None:
            qs[name], stats[name] = level.questions(cfg)
    return qs, stats


def answer_all(backend: Any, questions: Sequence[Any], batch: int, bar=None,
               refused: list | None = None) -> list:
    """Results for every question; a batch the backend refuses is retried one by one, and a
    question it refuses gets a failed result carrying the reason (its position is added to
    ``refused`` when given)."""
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
                    if refused is not None:
                        refused.append(len(out))
                    out.append(choice_failed(f"{type(e1).__name__}: {e1}"))
            del e
        if bar is not None:
            bar.update(len(chunk))
    return out


# Config keys that do not shape a unit's answers (a resumed run may change them; ``env``: where
# L3's env steps run, the same episodes on every backend).
UNRECORDED_KEYS = ("out_dir", "progress", "ece_bins", "max_failed_share", "env")


# Harness controls a bench may rank beside the decision models (``jaxdm.harness.dm``).
CONTROL_KINDS = ("bm25",)


def build_backends(specs: Sequence[Any]) -> list[tuple[str, Any]]:
    """(name, backend) pairs of the bench's judges: the screen's judges
    (``jaxdm.screen.run.build_judges``) and the harness's retrieval control ``bm25``
    (``bm25`` or ``bm25:query=dialogue``, see ``jaxdm.harness.dm.BM25Shortlist``)."""
    out: list[tuple[str, Any] | None] = []
    models = []
    try:
        for raw in specs:
            spec = normalize_judge_spec(f"{raw}:" if raw in CONTROL_KINDS else raw)
            if spec.get("kind") in CONTROL_KINDS:
                name = str(spec.get("name") or spec["kind"])
                out.append((name, make_dm({**spec, "name": name})))
            else:
                out.append(None)
                models.append(raw)
        built = iter(build_judges(models))
    except (ScreenError, ValueError) as e:
        raise BenchError(str(e)) from e
    judges = [j if j is not None else next(built) for j in out]
    names = [n for n, _ in judges]
    if len(set(names)) < len(names):
        raise BenchError(f"two judges share a name in {names}; give one a distinct name=")
    return judges


def run(cfg: BenchConfig, *, resume: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """Answer every question of every level with every backend; write the folder (see
    ``jaxdm.bench.store``: unit by unit; ``resume`` continues a run there with the same
    settings, ``overwrite`` replaces it; a saved incomplete unit gets only its failed
    questions asked again). A unit whose failed share exceeds ``cfg.max_failed_share`` (or
    that failed every answer) is kept as incomplete, reported, and makes the job fail
    (``BenchError``) after the rest has run and been written."""
    judges = build_backends(cfg.judges)
    if "l3" in cfg.levels:
        try:
            make_llm(dict(cfg.l3_llm))
        except (HarnessError, ValueError, TypeError) as e:
            raise BenchError(f"l3_llm: {e}") from None
    store = BenchStore(cfg.out_dir)
    identity = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in UNRECORDED_KEYS}
    try:
        done = store.open(identity, resume=resume, overwrite=overwrite)
    except ValueError as e:
        raise BenchError(str(e)) from None
    try:
        return _run(cfg, judges, store, done)
    finally:
        store.close()


def _run(cfg: BenchConfig, judges, store, done) -> dict[str, Any]:
    if done:
        kept = [f"{b}/{lv}" for (b, lv), u in done.items() if _complete(u)]
        again = {f"{b}/{lv}": _n_lost(u) for (b, lv), u in done.items() if not _complete(u)}
        print(f"bench: resuming {cfg.out_dir}: {len(kept)} finished unit(s) kept "
              f"({', '.join(kept)})" + (
                  "; asking only the failed answers again in " + ", ".join(
                      f"{k} ({n})" for k, n in again.items()) if again else ""), flush=True)
    out = Path(cfg.out_dir)
    t0 = time.perf_counter()
    questions, stats = build_questions(cfg)
    stats["build_seconds"] = round(time.perf_counter() - t0, 3)
    result: dict[str, Any] = {"config": dataclasses.asdict(cfg), "data": stats, "backends": {}}
    all_recs, l3_rows, all_failed = [], [], []
    failed_answers: dict[str, dict[str, int]] = {}
    parts = [p for lv in cfg.levels for p in LEVELS.get(lv).units(cfg)]
    for name, backend in judges:
        units = {}
        for part in parts:
            unit = done.get((name, part))
            if unit is None or not _complete(unit):
                if unit is None:
                    unit = _run_unit(backend, name, part, questions.get(part, []), cfg)
                else:
                    unit = _retry_unit(backend, name, part, questions.get(part, []), cfg, unit)
                why = _too_many_failed(unit, cfg.max_failed_share)
                if why is not None:
                    all_failed.append((name, part, why))
                store.put(unit)
            units[part] = unit
            if _n_lost(unit):
                failed_answers.setdefault(name, {})[part] = _n_lost(unit)
        recs = [r for u in units.values() for r in u["records"]]
        rows = [r for u in units.values() for r in u["l3_rows"]]
        l3_rows.extend(dict(r, backend=name) for r in rows)
        seconds: dict[str, float] = {}
        for part, u in units.items():
            level = part.split("/")[0]
            seconds[level] = seconds.get(level, 0.0) + u["seconds"]
        summary = metrics.breakdown(recs, cfg.ece_bins)
        if rows:
            summary["l3_tasks"] = l3_lib.breakdown(rows)
        errors = sorted({r["error"] for r in recs if r["error"]})
        n_questions = sum(r["level"] != "l3" for r in recs)
        # L3: the decision model's own questions, tokens and measured seconds per episode
        # (an L3 unit's seconds include the agent LLM and the env); rows saved before these
        # were counted give calls only
        l3_calls = sum(r.get("dm_questions", r["dm_calls"]) for r in rows)
        model_seconds = (sum(v for k, v in seconds.items() if k != "l3")
                         + sum(r.get("dm_seconds", 0.0) for r in rows))
        summary["cost"] = {
            "calls": n_questions + l3_calls,
            "tokens_in": (sum(r["tokens_in"] for r in recs)
                          + sum(r.get("dm_tokens_in", 0) for r in rows)),
            "usd": (sum(r["usd"] for r in recs if r["usd"] is not None)
                    if any(r["usd"] is not None for r in recs) else None),
            "seconds": {k: round(v, 3) for k, v in seconds.items()},
            "seconds_per_call": round(model_seconds / max(n_questions + l3_calls, 1), 5)}
        summary["failure_reasons"] = errors[:5]
        result["backends"][name] = summary
        all_recs.extend(dict(r, backend=name) for r in recs)
    if "l3" in cfg.levels:
        result["kendall"] = metrics.level_agreement(result["backends"])
    # what failed for good (asked again by --resume): answers, and flagged L3 episodes
    result["failed_answers"] = failed_answers
    result["n_failed_answers"] = sum(n for b in failed_answers.values() for n in b.values())
    if all_failed:
        result["failed_units"] = [{"backend": b, "level": lv, "reason": why}
                                  for b, lv, why in all_failed]
    write_records(out / "records.jsonl", all_recs)
    if l3_rows:
        write_records(out / "l3_episodes.jsonl", l3_rows)
    write_json(out / "bench.json", result, indent=2)
    _figure(result, out / "accuracy.png")
    levels_figure(result, out / "levels.png")
    text = report(result)
    write_atomic(out / "report.md", text)
    print(text)
    if all_failed:
        listed = "; ".join(f"{b} on {lv} ({why})" for b, lv, why in all_failed)
        raise BenchError(f"too many failed answers: {listed}; the other units and the good "
                         f"answers are written to {out}, and `jaxdm bench --resume` asks the "
                         f"failed ones again")
    if result["n_failed_answers"]:
        print(f"bench: warning: {result['n_failed_answers']} answer(s) or L3 episode(s) failed "
              f"for good (left out of accuracy and success); run the same command with "
              f"--resume to ask only those again", file=sys.stderr, flush=True)
    return result


def _n_lost(unit: Mapping[str, Any]) -> int:
    """Failed answers of a unit (L1/L2 questions; L3: flagged episodes)."""
    if unit["level"].startswith("l3/"):
        return sum(bool(r.get("flagged")) for r in unit["l3_rows"])
    return sum(metrics.is_lost(r) for r in unit["records"])


def _complete(unit: Mapping[str, Any]) -> bool:
    return unit.get("complete", True) and not _n_lost(unit)


def _too_many_failed(unit: Mapping[str, Any], max_share: float) -> str | None:
    """Why a unit fails the job: its share of failed answers (L3: of failed agent-LLM calls,
    or of lost decision-model answers) exceeds ``max_share``, or everything failed."""
    recs, rows = unit["records"], unit["l3_rows"]
    if not unit["level"].startswith("l3/"):
        lost = [r for r in recs if metrics.is_lost(r)]
        if recs and lost and (len(lost) / len(recs) > max_share or len(lost) == len(recs)):
            return (f"{len(lost)} of {len(recs)} answers failed ({len(lost) / len(recs):.0%} > "
                    f"max_failed_share {max_share:g}): {lost[-1]['error']}")
        return None
    for what, calls, failures in (
            ("the agent LLM's calls", sum(r["llm_calls"] for r in rows),
             sum(r["llm_failures"] for r in rows)),
            ("the decision model's answers", sum(r["dm_calls"] for r in rows),
             sum(r.get("dm_lost", 0) for r in rows))):
        share = min(failures / calls, 1.0) if calls else 0.0
        if calls and failures and (share > max_share or failures >= calls):
            return (f"{failures} of {what} ({calls}) failed ({share:.0%} > max_failed_share "
                    f"{max_share:g}); {sum(bool(r.get('flagged')) for r in rows)} of "
                    f"{len(rows)} episodes flagged")
    return None


def _retry_unit(backend: Any, name: str, level: str, questions: Sequence[Any],
                cfg: BenchConfig, saved: Mapping[str, Any]) -> dict[str, Any]:
    """A saved incomplete unit with only its failed questions asked again (L3: its flagged
    episodes run again), merged in; seconds add up."""
    t0 = time.perf_counter()
    recs, rows = list(saved["records"]), list(saved["l3_rows"])
    if level.startswith("l3/"):
        seeds = sorted({r["seed"] for r in rows if r.get("flagged")})
        if any("seed" not in r for r in recs):   # saved before records had seeds: all again
            return _run_unit(backend, name, level, questions, cfg)
        new_recs, new_rows = _run_l3(backend, cfg, name, level.split("/", 1)[1], only=seeds)
        by_seed: dict[int, list] = {}
        for r in new_recs:
            by_seed.setdefault(r["seed"], []).append(r)
        new_by_seed = {r["seed"]: r for r in new_rows}
        rows = [new_by_seed.get(r["seed"], r) for r in rows]
        merged = []
        for row in rows:   # records in episode order, as a fresh run writes them
            s = row["seed"]
            merged.extend(by_seed.get(s, []) if s in new_by_seed
                          else [r for r in recs if r["seed"] == s])
        recs = merged
    else:
        if len(recs) != len(questions):   # not this run's questions: all again
            return _run_unit(backend, name, level, questions, cfg)
        ask = [k for k, r in enumerate(recs) if metrics.is_lost(r)]
        refused: list[int] = []
        got = answer_all(backend, [questions[k] for k in ask], cfg.batch, None, refused)
        new = metrics.records([questions[k] for k in ask], got, level, refused)
        for k, r in zip(ask, new):
            recs[k] = r
    unit = {"backend": name, "level": level, "records": recs, "l3_rows": rows,
            "seconds": saved["seconds"] + time.perf_counter() - t0}
    unit["complete"] = not _n_lost(unit)
    return unit


def _run_unit(backend: Any, name: str, level: str, questions: Sequence[Any],
              cfg: BenchConfig) -> dict[str, Any]:
    """One backend on one level ("l1", "l2") or L3 env ("l3/<env>"): {"backend", "level",
    "records", "l3_rows", "seconds"}."""
    t0 = time.perf_counter()
    rows: list[dict] = []
    if level.startswith("l3/"):
        recs, rows = _run_l3(backend, cfg, name, level.split("/", 1)[1])
    else:
        bar = None
        if cfg.progress:
            bar = tqdm(total=len(questions), desc=f"bench {name} {level}", unit="q")
        refused: list[int] = []
        recs = metrics.records(questions, answer_all(backend, questions, cfg.batch, bar,
                                                     refused), level, refused)
        if bar is not None:
            bar.close()
    unit = {"backend": name, "level": level, "records": recs, "l3_rows": rows,
            "seconds": time.perf_counter() - t0}
    unit["complete"] = not _n_lost(unit)
    return unit


def _run_l3(backend: Any, cfg: BenchConfig, name: str, env: str,
            only: Sequence[int] | None = None) -> tuple[list, list]:
    l3cfg = dataclasses.replace(cfg.l3_config(), envs=(env,))
    bar = None
    if cfg.progress:
        bar = tqdm(total=l3cfg.tasks if only is None else len(only), desc=f"L3 {name} {env}",
                   unit="task")
    try:
        recs, rows = l3_lib.run_l3(
            backend, l3cfg, only=only, workers=cfg.env, max_failed_share=cfg.max_failed_share,
            on_episode=(lambda r: bar.update(1)) if bar is not None else None)
    except EnvWorkersFailed as e:
        raise BenchError(f"L3 {name} on {env}: {e}") from None
    finally:
        if bar is not None:
            bar.close()
    return recs, rows


GROUPS = ("l1/l1_tool", "l1/l1_param", "l2/tool", "l2/param", "l2/stop", "l2/after_error",
          "l2/no_error", "l2/tool/must_ask", "l3/base", "l3/shift", "l3/hard", "l3/alfworld")


def _fmt(x: Any) -> str:
    return "-" if x is None else (f"{x:.3f}" if isinstance(x, float) else str(x))


def report(result: dict[str, Any]) -> str:
    """report.md's text for a finished bench ``result`` (bench.json's content): how ECE and failures
    are counted, what each level drew, then per level a table of each backend's accuracy, ECE,
    success, cost, time and calls, and the Kendall tau between levels' backend rankings."""
    lines = ["# AGENT DECISION BENCH", "",
             f"ECE: {result['config']['ece_bins']} equal-width confidence bins; confidence = "
             "probability of the chosen option. A failed answer (none came back: an outage) is "
             "left out of accuracy and ECE and counted; a question the backend refuses (it "
             "cannot show it) counts as wrong and is left out of ECE. L3 episodes with a "
             "failed agent-LLM call or decision-model answer are flagged and left out.", ""]
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
                         + (f", {s['failed']} failed" if s["failed"] else "")
                         + (f", {s['refused']} refused" if s.get("refused") else "") + ")")
        c = b["cost"]
        lines.append(f"| {name} | " + " | ".join(cells) +
                     f" | {c['calls']} | {c['tokens_in']} | {c['seconds_per_call']} |")
    l3_rows = [(name, b["l3_tasks"]) for name, b in result["backends"].items()
               if "l3_tasks" in b]
    if l3_rows:
        c = result["config"]
        lines += ["", f"L3 (taking over: the model makes every tool choice / ALFWorld action, "
                      f"the agent LLM {c['l3_llm']} writes the parameters; {c['l3_tasks']} "
                      f"tasks per env, test split / ALFWorld valid_unseen, max "
                      f"{c['l3_max_steps']} steps):", "",
                  "| backend | env | task success | step acc. | cost / task (USD) | s / task "
                  "| DM calls | LLM calls | DM failures | irreversible errors | flagged |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for name, t in l3_rows:
            for env_name, s in t.items():
                if not s["n"]:
                    lines.append(f"| {name} | {env_name} | - | - | - | - | - | - | - | - | "
                                 f"{s.get('flagged', 0)} |")
                    continue
                lines.append(f"| {name} | {env_name} | {_fmt(s['success'])} | "
                             f"{_fmt(s['step_accuracy'])} | {s['cost_per_task']:.5f} | "
                             f"{s['seconds_per_task']:.2f} | {s['dm_calls']} | "
                             f"{s['llm_calls']} | {s['dm_failures']} | "
                             f"{s['irreversible_errors']} | {s.get('flagged', 0)} |")
    for key, k in (result.get("kendall") or {}).items():
        lines += ["", f"Kendall τ, {key.replace('_', ' ')} across {k['n']} backends: "
                      f"{_fmt(k['tau'])} (p {_fmt(k['p'])})"]
    for name, b in result["backends"].items():
        if b["failure_reasons"]:
            lines += ["", f"{name} failures (first reasons): " + "; ".join(b["failure_reasons"])]
    if result.get("n_failed_answers"):
        per = "; ".join(f"{b}: " + ", ".join(f"{lv} {n}" for lv, n in units.items())
                        for b, units in result["failed_answers"].items())
        lines += ["", f"**{result['n_failed_answers']} answer(s) failed for good** (L3: flagged "
                      f"episodes; left out of accuracy and success): {per}. `jaxdm bench "
                      f"--resume` asks only these again."]
    for u in result.get("failed_units", []):
        lines += ["", f"**{u['backend']} failed on {u['level']}** ({u['reason']}): kept as "
                      f"incomplete; `jaxdm bench --resume` asks its failed answers again."]
    return "\n".join(lines) + "\n"


def _figure(result: dict[str, Any], path: Path) -> None:
    plt = pyplot()
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
    save_figure(fig, path, dpi=110)


def levels_figure(result: dict[str, Any], path: Path) -> None:
    """Per backend: L1 accuracy, L2 accuracy, L3 step accuracy and L3 task success (bars)."""
    plt = pyplot()
    names = list(result["backends"])
    bars = [("L1 accuracy", lambda b: (b.get("l1") or {}).get("accuracy")),
            ("L2 accuracy", lambda b: (b.get("l2") or {}).get("accuracy")),
            ("L3 step accuracy", lambda b: (b.get("l3") or {}).get("accuracy")),
            ("L3 task success",
             lambda b: ((b.get("l3_tasks") or {}).get("all") or {}).get("success"))]
    bars = [(lab, f) for lab, f in bars if any(f(b) is not None
                                               for b in result["backends"].values())]
    fig, ax = plt.subplots(figsize=(1.5 + 1.6 * len(names), 3.6))
    w = 0.8 / max(len(bars), 1)
    for i, (lab, f) in enumerate(bars):
        ys = [f(result["backends"][n]) for n in names]
        ax.bar(np.arange(len(names)) + i * w, [y or 0.0 for y in ys], w, label=lab)
    ax.set_xticks(np.arange(len(names)) + w * (len(bars) - 1) / 2)
    ax.set_xticklabels(names, rotation=20, ha="right", fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy / success")
    tau = ((result.get("kendall") or {}).get("l1_accuracy_vs_l3_success") or {}).get("tau")
    ax.set_title("L1 vs L2 vs L3 per decision model" +
                 (f" (τ L1 acc. vs L3 success {tau:.2f})" if tau is not None else ""),
                 fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
