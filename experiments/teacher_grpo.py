"""Teacher-augmented GRPO experiments (seed 000, Algorithm 1) on CPU, GPU or TPU.

Train one configuration::

    python experiments/teacher_grpo.py --config cpu_smoke
    python experiments/teacher_grpo.py --config alfworld_qwen1.5b \
        model.path=/ckpt/Qwen2.5-1.5B-Instruct
    python experiments/teacher_grpo.py --config cpu --resume           # continue exactly

Compare advantage estimators on the same seeds (PNG curves + a summary table)::

    python experiments/teacher_grpo.py --config toy_ordering --compare grpo,teacher --seeds 0,1,2

``teacher`` uses the config's teacher; ``teacher@JUDGE`` the same estimator with another judge,
named as ``jaxdm screen --judge`` names one (``smollm2``, ``smollm2-judge``: the trained judge
shipped in ``jaxdm/judges``, an HF or adapter folder, ``kind:key=value``), e.g.
``--compare grpo,teacher,teacher@smollm2-judge`` (runs in ``teacher@smollm2-judge_seed0``, ...).

``--config`` takes a path or a preset name in ``experiments/configs/`` (``teacher_grpo_<name>
.yaml``); any ``a.b=value`` argument overrides a config key (unknown keys are an error).

Several processes (hosts) train one run together (``jaxdm.rl.distributed``): start the same
command on each, with ``--coordinator HOST:PORT --num-processes P --process-id I`` (or the
``JAX_COORDINATOR_ADDRESS`` / ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID`` variables; SLURM
and TPU pods are detected) and ``mesh_data=-1``; ``out_dir`` on a shared file system.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

from jaxdm import config as cfgmod
from jaxdm import runlog
from jaxdm.registry import UnknownNameError
from jaxdm.rl.estimators import ESTIMATORS
import jaxdm.train.harness_rollout  # noqa: F401  registers policy.kind: harness (--config harness)
from jaxdm.rl.errors import TrainingStopped
from jaxdm.rl.trainer import TrainConfig, train_run
from jaxdm.jsonl import write_json

PRESETS = Path(__file__).resolve().parent / "configs"
if str(PRESETS.parent) not in sys.path:  # experiments/ also when this file is loaded by path
    sys.path.insert(0, str(PRESETS.parent))
from intervals import t_interval  # noqa: E402  (experiments/intervals.py: the README's error bars)


def resolve_preset(argv: list[str]) -> list[str]:
    """Map ``--config NAME`` to ``experiments/configs/teacher_grpo_NAME.yaml`` when it exists."""
    out = list(argv)
    for i, a in enumerate(out):
        if a == "--config" and i + 1 < len(out):
            name = out[i + 1]
            cand = PRESETS / f"teacher_grpo_{name}.yaml"
            if not Path(name).is_file() and cand.is_file():
                out[i + 1] = str(cand)
    return out


def teacher_for(judge: str, base):
    """The ``TeacherSection`` ``base`` with the judge ``judge`` (a ``jaxdm screen --judge``
    name: alias, HF or adapter folder, ``kind:key=value``); question, context and failure
    settings stay. A spec key the teacher section has no field for is an error naming it."""
    from jaxdm.screen.run import ScreenError, normalize_judge_spec

    try:
        spec = normalize_judge_spec(judge)
    except ScreenError as e:
        raise SystemExit(f"--compare: teacher@{judge}: {e}") from None
    spec.pop("name", None)
    fields = {f.name for f in dataclasses.fields(base)}
    unknown = sorted(set(spec) - fields)
    if unknown:
        raise SystemExit(f"--compare: teacher@{judge}: key(s) {unknown} are not teacher "
                         f"settings (teacher.*: {sorted(fields)})")
    return dataclasses.replace(base, **spec)


def compare(cfg: TrainConfig, estimators: list[str], seeds: list[int], resume: bool,
            overwrite: bool = False) -> dict:
    """Train every estimator on every seed; plot mean success curves; return a summary."""
    base = Path(cfg.out_dir)
    curves: dict[str, list[dict]] = {}
    summary: dict[str, dict] = {}
    teachers = {}                       # every entry checked before the first run starts
    for est in estimators:
        name, _, judge = est.partition("@")
        try:
            ESTIMATORS.validate(name, field="--compare")
        except UnknownNameError as e:
            raise SystemExit(str(e)) from None
        if judge and name != "teacher":
            raise SystemExit(f"--compare: {est!r}: only the 'teacher' estimator takes a judge")
        if name != "teacher":
            teachers[est] = dataclasses.replace(cfg.teacher, kind="none")
        else:
            teachers[est] = teacher_for(judge, cfg.teacher) if judge else cfg.teacher
    for est in estimators:
        name = est.partition("@")[0]
        runs = []
        for s in seeds:
            teacher = teachers[est]
            c = dataclasses.replace(
                cfg, seed=s, out_dir=str(base / f"{est}_seed{s}"), teacher=teacher,
                algo=dataclasses.replace(cfg.algo, advantage=name),
                model=dataclasses.replace(cfg.model, init_seed=s))
            print(f"== {est}, seed {s} -> {c.out_dir}", flush=True)
            runs.append(train_run(c, resume=resume, overwrite=overwrite))
        train = [[r for r in recs if "train/success" in r] for recs in runs]
        n_it = min(len(t) for t in train)
        succ = np.array([[t[i]["train/success"] for i in range(n_it)] for t in train])
        curves[est] = [{"iteration": i + 1, "success": float(succ[:, i].mean()),
                        "success_ci95": t_interval(succ[:, i])[1]
                        if len(seeds) > 1 else 0.0} for i in range(n_it)]
        evals = [[r for r in recs if "eval/All" in r][-1] for recs in runs
                 if any("eval/All" in r for r in recs)]
        row = {"train_success_first5": float(succ[:, :5].mean()),
               "train_success_last5": float(succ[:, -5:].mean()),
               "iterations_to_0.5": _first_crossing(succ.mean(0), 0.5)}
        stds = [r["teacher/score_std"] for t in train for r in t
                if r.get("teacher/score_std") is not None]
        if stds:  # how much the judge's scores vary (a flat judge adds ~nothing to A_out)
            row["teacher_score_std"] = float(np.mean(stds))
        if evals:
            for k in sorted(evals[0]):
                if k.startswith("eval/") and not k.endswith("_std"):
                    vals = [e[k] for e in evals]
                    row[k] = float(np.mean(vals))
                    row[k + "_ci95"] = t_interval(vals)[1] if len(vals) > 1 else 0.0
        summary[est] = row
    png = runlog.plot_curves({k: v for k, v in curves.items()}, ["success"],
                             base / "success_curves.png", x="iteration",
                             title=f"train success (mean ± 95 % t-interval, seeds {seeds})",
                             band={"success": "success_ci95"})
    write_json(base / "summary.json", {"seeds": seeds, "summary": summary,
                                                   "curves": curves}, indent=1)
    print(f"\nwrote {png} and {base / 'summary.json'}")
    cols = ["estimator"] + sorted({k for r in summary.values() for k in r})
    print(runlog.format_table([{"estimator": e, **r} for e, r in summary.items()], cols,
                              float_fmt="{:.3g}"))
    return summary


def _first_crossing(values: np.ndarray, level: float) -> int | None:
    hits = np.flatnonzero(values >= level)
    return int(hits[0]) + 1 if hits.size else None


def main(argv: list[str] | None = None) -> int:
    argv = resolve_preset(list(sys.argv[1:] if argv is None else argv))
    cfg, rest = cfgmod.config_from_argv(TrainConfig, argv, presets_dir=PRESETS)
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--resume", action="store_true",
                        help="continue from the latest checkpoint in out_dir")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a run already in out_dir (without it, a fresh run "
                             "refuses a directory that holds one)")
    parser.add_argument("--compare", default=None,
                        help="comma-separated estimators to compare (grpo,teacher,gigpo)")
    parser.add_argument("--seeds", default="0,1,2", help="seeds for --compare")
    parser.add_argument("--coordinator", default=None,
                        help="multi-process run: HOST:PORT of process 0 (jax.distributed)")
    parser.add_argument("--num-processes", type=int, default=None,
                        help="multi-process run: number of processes")
    parser.add_argument("--process-id", type=int, default=None,
                        help="multi-process run: this process's index")
    args = parser.parse_args(rest)
    from jaxdm.models.sharding import initialize_distributed

    initialize_distributed(args.coordinator, args.num_processes, args.process_id)
    if args.resume and args.overwrite:
        parser.error("--resume and --overwrite exclude each other")
    try:
        if args.compare:
            compare(cfg, args.compare.split(","), [int(s) for s in args.seeds.split(",")],
                    args.resume, args.overwrite)
        else:
            train_run(cfg, resume=args.resume, overwrite=args.overwrite)
    except (TrainingStopped, ValueError) as e:   # ValueError: jaxdm.rundir refusals too
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
