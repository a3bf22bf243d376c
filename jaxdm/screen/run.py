"""`jaxdm screen`: choose a judge by how well it judges recorded trajectories.

Seed 000's practical lesson (section 4, "Judges can be screened before training"): the Judge
measures on recorded trajectories pick the question and context that teach best, at a small
fraction of an RL run's cost. This job scores every action of every trajectory with every
judge under Prefix|Hindsight x Value|Progress (and, for Progress, the context expansions
+FB, 25/50/75/100 % of the rest), then writes the metrics, raw scores, a Markdown report and
PNG figures.

Reliability: the output folder is written pass by pass and can be resumed (``--resume``
skips finished passes; see ``jaxdm.screen.store``); a folder holding files is never
overwritten without ``--overwrite``. A pass with any failed score (a remote judge's outage)
is recorded as *incomplete*, its good scores kept: ``--resume`` asks only its failed questions
again and merges the answers in. A failed score is never a score: the trajectory is left out
of that pass's metrics and the count of scores that failed for good is reported
(``n_failed`` per pass, ``n_failed_scores`` in all, ``report.md``). A judge whose pass fails
(its share of failed scores exceeds ``max_failed_share``: a dead server, a backend raising
``FloatingPointError`` on a NaN checkpoint) is a *failed judge*: its remaining passes are
skipped, the other judges finish, the report and ``summary.json`` name it with the reason,
and the CLI exits 1.
"""
from __future__ import annotations

import dataclasses
import math
import os
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from jaxdm.config import to_dict
from jaxdm.decision import make_backend
from jaxdm.decision.specs import BackendSpecError, parse_backend_spec, parse_scalar, shown_spec
from jaxdm.decision.types import score_failed, score_ok
from jaxdm.envs.alfworld import noisy_expert_trajectories
from jaxdm.jsonl import write_atomic, write_json
from jaxdm.judges import SMOLLM2_PROGRESS
from jaxdm.registry import Registry, UnknownNameError
from jaxdm.roles.jobs import score_trajectories
from jaxdm.runlog import MAX_FAILED_SHARE, check_failed_share
from jaxdm.screen import figures, metrics
from jaxdm.screen.store import FIGURES, PassResult, ScreenError, ScreenStore
from jaxdm.secrets import redact
from jaxdm.trajectory import Trajectory, read_jsonl

COMBOS = (("progress", "prefix"), ("progress", "hindsight"), ("value", "prefix"), ("value", "hindsight"))
# Progress-question context expansions for the rank-shift analysis (seed 000, Fig. 6), in
# report order: label -> roles expansion. 100 % of the remaining trajectory is the Hindsight
# context (None: always scored, never chosen).
EXPANSIONS: Registry[Any] = Registry("context expansion")
for _label, _expansion in (("FB", "fb"), ("25%", 0.25), ("50%", 0.5), ("75%", 0.75),
                           ("100%", None)):
    EXPANSIONS.register(_label, _expansion)
GROUPS = ("single", "dependency", "independent")

JUDGE_ALIASES: dict[str, dict[str, Any]] = {
    "smollm2": {"kind": "local_readout", "path": "smollm2", "name": "smollm2-135m"},
    "oracle": {"kind": "oracle", "name": "oracle"},
    # The trained Hindsight + Progress judge shipped as an adapter (jaxdm.judges).
    "smollm2-judge": {"kind": "local_readout", "path": "<jaxdm.judges.SMOLLM2_PROGRESS>",
                      "name": "smollm2-135m-judge"},
}


@dataclasses.dataclass(frozen=True)
class ScreenConfig:
    """Settings of a screening run (YAML keys / dotted CLI overrides have these names).

    trajectories: JSONL of recorded trajectories; empty = generate with the ALFWorld noisy expert.
    num_trajectories / seed / budget: size, seed and action budget of generated trajectories.
    judges: judge specs (aliases 'smollm2', 'oracle', or dicts for jaxdm.decision.make_backend).
    expansions: Progress context expansions to score for the rank-shift analysis, a subset of
        "FB", "25%", "50%", "75%" (100 % of the rest is the Hindsight context, always scored).
    out_dir: where report.md, scores.jsonl, summary.json and the PNG figures go.
    max_failed_share: a pass in which a larger share of scores failed fails its judge (the
        judge's remaining passes are skipped, the report marks it, the job exits 1). A pass in
        which every score failed always fails its judge (1.0: only then). A pass with fewer
        failed scores is kept as incomplete: ``--resume`` asks its failed questions again.
    """

    trajectories: str = ""
    num_trajectories: int = 18
    seed: int = 0
    budget: int = 30
    judges: tuple = ("smollm2", "oracle")
    expansions: tuple = ("FB", "25%", "50%", "75%")
    out_dir: str = "screen_out"
    progress: bool = True
    max_failed_share: float = MAX_FAILED_SHARE

    def __post_init__(self):
        check_failed_share(self.max_failed_share)
        if not self.judges:
            raise ValueError("judges: at least one judge is needed")
        if not self.out_dir:
            raise ValueError("out_dir must not be empty")
        _expansion_plan(self.expansions)


# Settings that change a run's scores: a resumed run must have the same ones.
RUN_SETTINGS = ("trajectories", "num_trajectories", "seed", "budget", "judges", "expansions")


def task_group(task_type: str) -> str:
    """ALFWorld task groups of seed 000: single object (pick, look), dependency (clean / heat /
    cool: the state change must precede placement) and independent (pick two)."""
    t = task_type.lower()
    if any(k in t for k in ("clean", "heat", "cool")):
        return "dependency"
    if "two" in t or "pick2" in t:
        return "independent"
    if "look" in t or "pick" in t:
        return "single"
    return "other"


def _shown_spec(spec: str) -> str:
    """A judge spec string for messages, values of secret-looking keys hidden."""
    return shown_spec(spec)


def normalize_judge_spec(spec: Any) -> dict[str, Any]:
    """An alias string, 'kind:key=value,...', or a dict -> a backend spec dict with a name."""
    if isinstance(spec, Mapping):
        out = dict(spec)
    elif isinstance(spec, str):
        if spec in JUDGE_ALIASES:
            out = dict(JUDGE_ALIASES[spec])
            if out.get("path") == "<jaxdm.judges.SMOLLM2_PROGRESS>":
                out = folder_judge_spec(str(SMOLLM2_PROGRESS)) | {"name": out["name"]}
        elif _looks_like_folder(spec):
            out = folder_judge_spec(spec)
        else:  # 'kind:key=value,...' or an unknown name: the one spec parser
            out = spec
    else:
        out = spec
    try:
        out = parse_backend_spec(out, aliases=JUDGE_ALIASES, what="judge")
    except BackendSpecError as e:
        raise ScreenError(str(e)) from None
    return out


# What a judge folder must hold: an HF folder (exported by ``jaxdm train-dm`` or any
# transformers checkpoint of a supported family) or an adapter folder (``jaxdm.models.lora``).
HF_FOLDER_FILES = ("config.json", "*.safetensors", "tokenizer.json")


def _looks_like_folder(spec: str) -> bool:
    if Path(spec).is_dir():
        return True
    kind, colon, _ = spec.partition(":")
    if colon and "/" not in kind and os.sep not in kind and not kind.startswith("."):
        return False  # 'kind:key=value,...' (values may hold URLs and paths)
    return "/" in spec or os.sep in spec or spec.startswith(".")


def folder_judge_spec(path: str) -> dict[str, Any]:
    """``--judge path/to/folder``: a local_readout judge on an exported HF folder or on an
    adapter folder (base model + LoRA adapter). A path that is not such a folder raises
    ScreenError naming what is missing."""
    from jaxdm.models.lora import ADAPTER_FILES, is_adapter_folder  # why: JAX, folder judges only
    folder = Path(path)
    if not folder.is_dir():
        raise ScreenError(f"judge folder {str(folder)!r} does not exist (or is not a folder)")
    if is_adapter_folder(folder):
        missing = [f for f in ADAPTER_FILES if not (folder / f).is_file()]
    else:
        missing = [f for f in HF_FOLDER_FILES if not any(folder.glob(f))]
    if missing:
        raise ScreenError(f"judge folder {str(folder)!r} is not a loadable model folder: "
                          f"missing {missing} (an HF folder needs {list(HF_FOLDER_FILES)}; an "
                          f"adapter folder {list(ADAPTER_FILES)})")
    return {"kind": "local_readout", "path": str(folder), "name": folder.resolve().name}


def build_judges(specs: Sequence[Any]):
    """(name, backend) pairs; unknown kinds or keys raise ScreenError naming the judge."""
    judges, names = [], set()
    for raw in specs:
        spec = normalize_judge_spec(raw)
        # names are written to every result file: never with a URL's credentials in them
        name = redact(str(spec.pop("name")))
        if name in names:
            raise ScreenError(f"two judges are named {name!r}; give one a distinct name=")
        names.add(name)
        try:
            backend = make_backend(spec)   # an adapter folder path: base + merged LoRA
        except (ValueError, TypeError, KeyError, FileNotFoundError) as e:
            raise ScreenError(f"judge {name!r}: {e}") from e
        judges.append((name, backend))
    return judges


def load_trajectories(cfg: ScreenConfig) -> list[Trajectory]:
    """Read ``cfg.trajectories`` (strictly typed, see ``jaxdm.trajectory``) or generate them."""
    if cfg.trajectories:
        path = Path(cfg.trajectories)
        if not path.is_file():
            raise ScreenError(f"trajectory file not found: {path}")
        try:
            trajs = read_jsonl(path)
        except (ValueError, TypeError) as e:
            raise ScreenError(str(e)) from e
        if not trajs:
            raise ScreenError(f"{path}: no trajectories")
        return trajs

    return noisy_expert_trajectories(cfg.num_trajectories, seed=cfg.seed, budget=cfg.budget)


def _score(backend, trajs, judge, question, context_label, context, expansion=None) -> PassResult:
    # One backend call per pass, not one call for all passes: the passes share each
    # trajectory's token stream, but their question suffixes differ a lot in length (about
    # 20 tokens under Hindsight, 150 with +FB), and one mixed call pads them to the longest.
    # Measured on the demo (2 idle cores): 3 min 14 s per pass vs 3 min 55 s in one call.
    # The scoring job is the trainer's: failures (a backend raising included) are counted.
    res = score_trajectories(backend, trajs, question=question, context=context,
                             expansion=expansion)
    return PassResult(judge, question, context_label, res.per_trajectory(), dict(res.stats))


class _OnlyMissing:
    """A judge that asks ``backend`` only the questions whose saved score failed (NaN in
    ``per_traj``, in the scoring job's question order) and answers the others with their saved
    score, at no cost: the scoring job then merges and counts as for a fresh pass."""

    def __init__(self, backend, per_traj: Sequence[np.ndarray]):
        self.backend = backend
        self.saved = np.concatenate([np.asarray(a, np.float64) for a in per_traj])
        self.asked = 0

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def score(self, questions):
        if len(questions) != len(self.saved):
            raise RuntimeError(f"{len(questions)} questions for {len(self.saved)} saved scores")
        ask = [k for k, v in enumerate(self.saved) if not math.isfinite(v)]
        self.asked = len(ask)
        out = [score_ok(float(v)) if math.isfinite(v) else None for v in self.saved]
        try:
            got = list(self.backend.score([questions[k] for k in ask])) if ask else []
            if len(got) != len(ask):
                raise RuntimeError(f"backend returned {len(got)} results for {len(ask)} "
                                   "questions")
        except Exception as e:  # noqa: BLE001 - the saved scores are kept, the asked ones fail
            got = [score_failed(f"{type(e).__name__}: {e}")] * len(ask)
        for k, r in zip(ask, got):
            out[k] = r
        return out


def _rescore(backend, trajs, saved: PassResult, context, expansion=None) -> PassResult:
    """``saved`` with its failed questions asked again; stats merged (costs and seconds add
    up, ``retried`` counts the questions asked again)."""
    proxy = _OnlyMissing(backend, saved.per_traj)
    res = score_trajectories(proxy, trajs, question=saved.question, context=context,
                             expansion=expansion)
    stats = dict(res.stats)
    old = saved.stats
    for k in ("tokens_in", "tokens_out", "usd", "priced", "seconds"):
        stats[k] = float(old.get(k) or 0.0) + float(stats[k])
    stats["retried"] = float(old.get("retried") or 0.0) + proxy.asked
    return PassResult(saved.judge, saved.question, saved.context, res.per_trajectory(), stats)


def _metrics_block(scored: PassResult, trajs: list[Trajectory]) -> dict:
    ok = [i for i, s in enumerate(scored.per_traj) if s.size and np.all(np.isfinite(s))]
    def summ(idx):
        return metrics.summarize([scored.per_traj[i] for i in idx], [trajs[i].action_types for i in idx])
    by_type = defaultdict(list)
    by_group = defaultdict(list)
    for i in ok:
        by_type[trajs[i].task_type or "unknown"].append(i)
        by_group[task_group(trajs[i].task_type)].append(i)
    n = sum(s.size for s in scored.per_traj)
    st = scored.stats
    return {
        "overall": summ(ok),
        "by_task_type": {k: summ(v) for k, v in sorted(by_type.items())},
        "by_group": {k: summ(v) for k, v in sorted(by_group.items())},
        "n_scores": n,
        "n_failed": int(st["missing"]),
        "n_errors": int(st["errors"]),
        "n_traj_excluded": len(trajs) - len(ok),
        "failure_examples": list(st["error_examples"]),
        "status": scored.status,
        "seconds": st["seconds"],
        "seconds_per_1k": 1000 * st["seconds"] / max(n, 1),
        "tokens_in_per_1k": 1000 * st["tokens_in"] / max(n, 1),
        "tokens_out_per_1k": 1000 * st["tokens_out"] / max(n, 1),
        "usd_per_1k": None if not st.get("priced") else 1000 * st["usd"] / max(n, 1),
    }


def _expansion_plan(expansions) -> list[tuple[str, Any]]:
    """(label, roles expansion) pairs to score, in order, plus 100 % (= Hindsight)."""
    if expansions is True:
        expansions = [lab for lab, exp in EXPANSIONS.items() if exp is not None]
    elif not expansions:
        return []
    chosen = []
    for lab in expansions:
        try:
            exp = EXPANSIONS.get(lab, field="expansions")
        except UnknownNameError as e:
            raise ScreenError(str(e)) from None
        if exp is not None and lab not in chosen:
            chosen.append(lab)
    chosen.sort(key=list(EXPANSIONS).index)
    return [(lab, EXPANSIONS[lab]) for lab in chosen] + [("100%", None)]


def screen(trajs: Sequence[Trajectory], judges, *, expansions=True, progress: bool = True,
           out_dir: str | Path | None = None, resume: bool = False, overwrite: bool = False,
           max_failed_share: float = MAX_FAILED_SHARE, settings: Mapping[str, Any] | None = None) -> dict:
    """Score ``trajs`` with every judge; returns {"summary", "shifts", "ranking",
    "failed_judges", ...} and writes outputs to ``out_dir`` when given (pass by pass; see
    ``jaxdm.screen.store`` for ``resume`` / ``overwrite``). ``expansions``: True (all),
    False/() (none) or labels. ``settings``: what else identifies the run (a resumed run must
    match it). A pass whose share of failed scores exceeds ``max_failed_share`` fails its
    judge: the judge's remaining passes are skipped and ``failed_judges`` gives the reason."""
    trajs = list(trajs)
    if not trajs:
        raise ScreenError("no trajectories to screen")
    for i, tr in enumerate(trajs):
        if not tr.steps:
            raise ScreenError(f"trajectory {i} has no executed actions")
    check_failed_share(max_failed_share, error=ScreenError)
    plan = _expansion_plan(expansions)
    levels = [lab for lab, _ in plan]
    jobs = [(j, q, c, c, None) for j, _ in judges for q, c in COMBOS]
    jobs += [(j, "progress", lab, "prefix", exp) for j, _ in judges for lab, exp in plan
             if exp is not None]
    backends = dict(judges)
    store = None
    done: dict[tuple[str, str], PassResult] = {}
    if out_dir is not None:
        store = ScreenStore(out_dir)
        identity = {"judges": list(backends), "levels": levels,
                    "settings": _jsonable(dict(settings or {}))}
        done = store.open(identity, trajs, resume=resume, overwrite=overwrite)
    try:
        return _screen_passes(trajs, backends, jobs, plan, levels, done, store, resume,
                              progress, max_failed_share, out_dir)
    finally:
        if store is not None:
            store.close()


def _screen_passes(trajs, backends, jobs, plan, levels, done, store, resume, progress,
                   max_failed_share, out_dir) -> dict:
    if resume and done:
        finished = sum(p.complete for p in done.values())
        partial = [p for p in done.values() if not p.complete]
        _say(f"resume: {finished} of {len(jobs)} passes already finished in {out_dir}"
             + (f"; {len(partial)} pass(es) with {sum(p.n_missing for p in partial)} failed "
                "score(s): asking only those again" if partial else ""))
    bar = _progress(len(jobs), progress)
    passes: dict[str, dict[str, PassResult]] = defaultdict(dict)
    failed: dict[str, str] = {}
    try:
        for j, q, label, context, exp in jobs:
            key = f"{q}/{label}"
            saved = done.get((j, key))
            if saved is not None and saved.complete:
                passes[j][key] = saved
                bar.update(1)
                continue
            if j in failed:
                if saved is not None:   # kept as it was saved (its failed scores stay failed)
                    passes[j][key] = saved
                bar.update(1)
                continue
            bar.set_description(f"{j} {key}")
            if saved is None:
                p = _score(backends[j], trajs, j, q, label, context, exp)
            else:
                p = _rescore(backends[j], trajs, saved, context, exp)
            _check_pass(p, max_failed_share, getattr(backends[j], "down", None))
            if p.status == "failed":
                failed[j] = p.reason
                _say(f"JUDGE FAILED: {j}: {p.reason}; its remaining passes are skipped")
            elif p.status == "incomplete":
                _say(f"warning: judge {j} {key}: {p.reason}")
            if store is not None:
                if saved is None:
                    store.append(p, trajs)
                else:
                    store.replace(p, trajs)
            passes[j][key] = p
            bar.update(1)
    finally:
        bar.close()

    complete = [j for j in backends if j not in failed]
    summary: dict = {j: {key: _metrics_block(p, trajs) for key, p in passes[j].items()}
                     for j in backends}
    shifts: dict = defaultdict(dict)
    for j in complete:
        ref = passes[j]["progress/prefix"].per_traj
        for lab, exp in plan:
            other = passes[j]["progress/hindsight" if exp is None else f"progress/{lab}"].per_traj
            keep = [i for i in range(len(trajs)) if np.all(np.isfinite(ref[i])) and np.all(np.isfinite(other[i]))]
            mean, per = metrics.mean_rank_shift([ref[i] for i in keep], [other[i] for i in keep])
            shifts[j][lab] = {"mean": mean, "per_traj": per, "traj_index": keep}

    ranking = rank_judges({j: summary[j] for j in complete})
    incomplete = {f"{j} {key}": p.n_missing for j in backends for key, p in passes[j].items()
                  if p.n_missing}
    result = {"summary": summary, "shifts": dict(shifts), "ranking": ranking, "levels": levels,
              "n_trajectories": len(trajs), "failed_judges": failed,
              "n_failed_scores": int(sum(incomplete.values())), "incomplete_passes": incomplete}
    if incomplete and not failed:
        _say(f"warning: {result['n_failed_scores']} score(s) failed for good in "
             f"{len(incomplete)} pass(es) (left out of the metrics); run the same command with "
             "--resume to ask only those again")
    if out_dir is not None:
        write_outputs(result, trajs, Path(out_dir))
    return result


def _check_pass(p: PassResult, max_failed_share: float, down: str | None) -> None:
    """Mark ``p`` failed when its failed share exceeds the threshold (or nothing scored),
    incomplete when any score failed, else ok."""
    n, missing = p.stats["requests"], p.stats["missing"]
    share = missing / n if n else 0.0
    why = down or p.stats.get("last_error") or "no usable score"
    if share > max_failed_share or (n and missing == n):
        p.status = "failed"
        p.reason = (f"pass {p.key}: {int(missing)} of {int(n)} scores failed "
                    f"({share:.0%} > max_failed_share {max_failed_share:g}): {why}")
    elif missing:
        p.status = "incomplete"
        p.reason = (f"pass {p.key}: {int(missing)} of {int(n)} scores failed (last: {why}); "
                    "--resume asks them again")
    else:
        p.status, p.reason = "ok", None


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def rank_judges(summary: Mapping[str, Mapping[str, dict]]) -> list[tuple[str, float]]:
    """Judges ordered by Hindsight + Progress quality: mean of Recall@R and (1 - no-op miss)
    (the two ranking measures of seed 000's Figure 10), higher is better; NaN sorts last."""
    rows = []
    for j, blocks in summary.items():
        o = blocks["progress/hindsight"]["overall"]
        vals = [v for v in (o["recall_at_r"], 1 - o["noop_miss"]) if math.isfinite(v)]
        rows.append((j, float(np.mean(vals)) if vals else float("nan")))
    return sorted(rows, key=lambda r: (-r[1] if math.isfinite(r[1]) else math.inf, r[0]))


class _NoBar:
    def set_description(self, *_):
        pass

    def update(self, *_):
        pass

    def close(self):
        pass


def _progress(total: int, enabled: bool):
    if not enabled:
        return _NoBar()
    from tqdm import tqdm  # why: progress bars only

    return tqdm(total=total, unit="pass", dynamic_ncols=True)


# ---------------------------------------------------------------------------------------
# Outputs
# ---------------------------------------------------------------------------------------
def _fmt(x, nd=3):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return f"{x:.{nd}f}"


def summary_table(result: dict) -> str:
    """The terminal/Markdown table: judges x question x context."""
    head = ("| rank | judge | question | context | milestone | other | no-op | gap | Recall@R "
            "| milestone miss | no-op miss | s / 1k scores | failed |")
    lines = [head, "|" + "---|" * 13]
    rank = {j: i + 1 for i, (j, _) in enumerate(result["ranking"])}
    for j, _ in result["ranking"]:
        for q, c in COMBOS:
            b = result["summary"][j][f"{q}/{c}"]
            o = b["overall"]
            lines.append(
                f"| {rank[j]} | {j} | {q} | {c} | {_fmt(o['mean_milestone'])} | {_fmt(o['mean_other'])} "
                f"| {_fmt(o['mean_no_op'])} | {_fmt(o['gap'])} | {_fmt(o['recall_at_r'])} "
                f"| {_fmt(o['milestone_miss'])} | {_fmt(o['noop_miss'])} | {_fmt(b['seconds_per_1k'], 1)} "
                f"| {b['n_failed']} |")
    return "\n".join(lines)


def group_table(result: dict, question: str, context: str = "hindsight") -> str:
    """A markdown table of each judge's trajectory-averaged scores for one question x context by
    task group: milestone, other and no-op means, their gap and Recall@R."""
    lines = ["| judge | group | n traj | milestone | other | no-op | gap | Recall@R |", "|" + "---|" * 8]
    for j, _ in result["ranking"]:
        for g, o in result["summary"][j][f"{question}/{context}"]["by_group"].items():
            lines.append(f"| {j} | {g} | {o['n_traj']} | {_fmt(o['mean_milestone'])} | {_fmt(o['mean_other'])} "
                         f"| {_fmt(o['mean_no_op'])} | {_fmt(o['gap'])} | {_fmt(o['recall_at_r'])} |")
    return "\n".join(lines)


def shift_table(result: dict) -> str:
    """A markdown table of each judge's mean score shift at every expansion level (judges in ranking
    order)."""
    levels = result["levels"]
    lines = ["| judge | " + " | ".join(levels) + " |", "|" + "---|" * (len(levels) + 1)]
    for j, _ in result["ranking"]:
        if j in result["shifts"]:
            lines.append(f"| {j} | " + " | ".join(_fmt(result["shifts"][j][lv]["mean"], 2) for lv in levels) + " |")
    return "\n".join(lines)


def write_outputs(result: dict, trajs: list[Trajectory], out: Path) -> dict[str, Path]:
    """summary.json, report.md and the figures (scores.jsonl and trajectories.jsonl are
    written while scoring, see ``jaxdm.screen.store``)."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"scores": out / "scores.jsonl", "trajectories": out / "trajectories.jsonl",
             "summary": out / "summary.json"}
    write_json(paths["summary"], _jsonable(result))   # whole or not at all, credentials redacted

    judges = [j for j, _ in result["ranking"]]
    for name in FIGURES:  # figures of an earlier attempt must not outlive it
        (out / name).unlink(missing_ok=True)
    if judges:
        paths["heatmap"] = figures.action_type_heatmap(result["summary"], judges, "hindsight", out / "heatmap_hindsight.png")
        paths["heatmap_prefix"] = figures.action_type_heatmap(result["summary"], judges, "prefix", out / "heatmap_prefix.png")
        paths["recall"] = figures.recall_bars(result["summary"], judges, "hindsight", out / "recall_at_r.png")
        if result["levels"]:
            paths["rank_shift"] = figures.rank_shift_curves(result["shifts"], judges, result["levels"], out / "rank_shift.png")
        points = []
        for j in judges:
            b = result["summary"][j]["progress/hindsight"]
            points.append({"judge": j, "seconds_per_1k": b["seconds_per_1k"], "usd_per_1k": b["usd_per_1k"],
                           "milestone_miss": b["overall"]["milestone_miss"], "noop_miss": b["overall"]["noop_miss"]})
        paths["miss_cost"] = figures.miss_rate_vs_cost(points, out / "miss_rate_vs_cost.png")
    paths["report"] = out / "report.md"
    write_atomic(paths["report"], markdown_report(result, trajs, paths))
    return paths


def failed_table(result: dict) -> str:
    """A markdown table of the judges that failed: how many of their passes finished, and why they
    stopped."""
    lines = ["| judge | finished passes | reason |", "|---|---|---|"]
    for j, why in result["failed_judges"].items():
        ok = sum(b["status"] == "ok" for b in result["summary"][j].values())
        lines.append(f"| {j} | {ok} | {why.replace('|', '/')} |")
    return "\n".join(lines)


def markdown_report(result: dict, trajs: list[Trajectory], paths: Mapping[str, Path]) -> str:
    """report.md of a screen run: the trajectories and their action types, how scores are read, the
    judge ranking, the per-group, shift and failure tables, and links to the figures in ``paths``.
    """
    n_act = sum(len(t.steps) for t in trajs)
    types = defaultdict(int)
    for tr in trajs:
        for s in tr.steps:
            types[s.action_type] += 1
    succ = sum(t.success for t in trajs)
    parts = [
        "# jaxdm screen report", "",
        f"{len(trajs)} trajectories ({succ} successful), {n_act} actions "
        f"({types['milestone']} milestone, {types['other']} other, {types['no_op']} no-op).",
        "Scores are trajectory-averaged per action type (seed 000, Fig. 8). Recall@R: share of "
        "milestones among each trajectory's R highest-scored actions; misses as in Fig. 10; ties are "
        "broken by expected value. Judges are ranked by Hindsight + Progress: mean of Recall@R and "
        "1 - no-op miss.", "",
    ]
    if result["failed_judges"]:
        parts += ["## FAILED judges", "",
                  "These judges failed a pass (see `passes.jsonl`); they are not ranked and "
                  "their remaining passes were skipped. `jaxdm screen --resume` retries them.", "",
                  failed_table(result), ""]
    if result.get("incomplete_passes"):
        parts += ["## Failed scores", "",
                  f"{result['n_failed_scores']} score(s) failed for good (no answer from the "
                  "judge); a trajectory with a failed score is left out of that pass's metrics, "
                  "never scored as wrong. `jaxdm screen --resume` asks only these again.", "",
                  "| judge / pass | failed scores |", "|---|---|"]
        parts += [f"| {k} | {v} |" for k, v in result["incomplete_passes"].items()] + [""]
    parts += [
        "## All judges, questions and contexts", "", summary_table(result), "",
        "## Hindsight + Progress by task group", "", group_table(result, "progress"), "",
        "## Hindsight + Value by task group", "", group_table(result, "value"), "",
    ]
    if result["levels"]:
        parts += ["## Mean rank shift relative to Prefix (Progress)", "", shift_table(result), ""]
    parts += ["## Figures", ""] + [f"- `{p.name}`" for k, p in paths.items() if p.suffix == ".png"]
    return "\n".join(parts) + "\n"


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.floating, float)):
        return None if not math.isfinite(float(x)) else float(x)
    if isinstance(x, np.integer):
        return int(x)
    return x


def run(cfg: ScreenConfig, *, resume: bool = False, overwrite: bool = False) -> dict:
    """Load/generate trajectories, build the judges, screen (writing ``cfg.out_dir`` as it
    goes), print a summary. ``resume``: continue the run in ``cfg.out_dir`` (same settings;
    its saved trajectories are reused); ``overwrite``: replace the run there. A failed judge
    is printed and listed in ``result["failed_judges"]`` (the CLI then exits 1)."""
    judges = build_judges(cfg.judges)
    settings = {k: v for k, v in to_dict(cfg).items() if k in RUN_SETTINGS}
    store = ScreenStore(cfg.out_dir)
    if resume and not cfg.trajectories and store.holds_run() and store.trajectories.is_file():
        trajs = read_jsonl(store.trajectories)  # generated ones: no need to generate again
    else:
        trajs = load_trajectories(cfg)
    result = screen(trajs, judges, expansions=cfg.expansions, progress=cfg.progress,
                    out_dir=cfg.out_dir, resume=resume, overwrite=overwrite,
                    max_failed_share=cfg.max_failed_share, settings=settings)
    print()
    if result["ranking"]:
        print(summary_table(result))
    if result["levels"] and result["ranking"]:
        print("\nMean rank shift vs Prefix (Progress):")
        print(shift_table(result))
    print("\nRanking (Hindsight + Progress; mean of Recall@R and 1 - no-op miss):", ", ".join(f"{i + 1}. {j} ({_fmt(s)})"
                                                        for i, (j, s) in enumerate(result["ranking"])))
    for j, why in result["failed_judges"].items():
        print(f"FAILED judge {j}: {why}")
    print(f"Report, scores and figures in {Path(cfg.out_dir).resolve()}/")
    return result
