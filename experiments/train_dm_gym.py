"""SmolLM2-135M before / after packed SFT on DECISION GYM states: AGENT DECISION BENCH L1 / L2 /
L3 and the trained model as the harness's CASCADE decision model.

1. Training data: noisy-agent states of DECISION GYM **train-split, base-variant** tasks
   (``--train-tasks``), in the ``jaxdm train-dm`` line format. Shift is held out (never
   trained on); evaluation uses test-split tasks only.
2. ``jaxdm train-dm`` (LoRA rank 32, lr 1e-4, AdamW, option likelihood, decoder remat;
   ``--max-steps`` bounds the CPU budget); the adapter folder it exports is merged into an HF
   folder (``model/``) every backend loads.
3. One ``jaxdm bench`` run over three decision models: Oracle-noisy (noise 0.2; a reference
   so Kendall τ has more than two points), SmolLM2 before and after (option likelihood:
   constrained readout cannot show DECISION GYM's 69 tools, 26 labels): L1 (BFCL subset),
   L2 (test-split states), L3 (takeover; ``--l3-envs`` / ``--l3-tasks``).
4. CASCADE in the harness (``jaxdm harness``: shadow on fit-split tasks, fitted
   thresholds, arms on test-split tasks), before vs after, with the SmolLM2 model restricted
   to the ``stop`` and ``params`` points (``points_only``): its 69-option tool question costs
   minutes per step on the shared CPU (stated in ``experiments/harness_decision_gym.py``).
   The fitted savings = 1 − cost / cost of the LLM alone on the same test tasks.

Stages (``data``, ``sft``, ``bench/<level>``, ``cascade/<model>``) record their start in
``results.json`` before they write and their end (with their results) after, in one atomic
write. ``--resume`` keeps every finished stage (refused if it was made with other settings)
and redoes an interrupted one: a stage started but not finished continues its own resumable
parts (train-dm's checkpoints, the bench's finished units, the harness's journals) when its
settings are the same, and starts again from nothing when they are not. A folder holding
results is never written over without ``--resume`` or ``--overwrite``. Writes
``before_after.md`` and ``before_after.png`` at the end.

    nice -n 10 python experiments/train_dm_gym.py --out experiments/results/train_dm_gym
    python experiments/train_dm_gym.py --out /tmp/x --quick                  # smoke run
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from jaxdm.jsonl import write_atomic, write_json, write_records  # noqa: E402
from jaxdm.rundir import (Layout, RunFolderError, check_folder, clear_outputs,  # noqa: E402
                          lock_run_dir)


def write_train_states(path: Path, tasks: int, error_rate: float, max_states: int | None,
                       seed: int, kinds: tuple[str, ...] | None = None,
                       per_question: bool = False) -> dict:
    """Noisy-agent states of train-split base tasks; ``kinds``: keep only these question
    kinds (tool / param / stop; states left without a question are dropped).
    ``per_question``: one line (one SFT step's context) per question of a state, so a step
    runs one trunk: in the rows layout every group of a step is padded to the step's longest
    trunk, and a state's questions do not share their prompts (the question text follows
    the context), so a whole state per step ran its stop question's ~900-token prompt
    padded to the tool question's ~2,300 (5 trunks of 2,304 tokens for a 4-question state)."""
    from jaxdm.envs.decision_gym import (DecisionGym, GymParams, NoisyAgent, run_episode,
                                         split_seed)
    env = DecisionGym()
    params = GymParams(variant="base", strict=True, split="train")
    agent = NoisyAgent(error_rate=error_rate, seed=seed)
    rows = []
    for i in range(tasks):
        traj, records = run_episode(env, agent, split_seed("train", i), params)
        for r in records:
            row = r.to_dict() | {"seed": split_seed("train", i), "split": "train",
                                 "variant": "base"}
            if kinds is not None:
                row["questions"] = [q for q in row["questions"] if q["kind"] in kinds]
            if row["questions"]:
                rows.append(row)
    if max_states is not None:
        import random
        rows = random.Random(seed).sample(rows, min(max_states, len(rows)))
    if per_question:
        rows = [r | {"questions": [q]} for r in rows for q in r["questions"]]
    path.parent.mkdir(parents=True, exist_ok=True)
    write_records(path, rows)
    return {"train_tasks": tasks, "train_states": len(rows), "kinds": list(kinds or []),
            "per_question": per_question,
            "train_after_error_share": sum(r["after_error"] for r in rows) / max(len(rows), 1),
            "train_questions": sum(len(r["questions"]) for r in rows)}


def sft(out: Path, args, progress: bool) -> tuple[dict, Path]:
    """Train (or continue from ``out/run``'s checkpoint), then merge the exported adapter into
    an HF folder; (summary, folder)."""
    from jaxdm.models.loading import save_pretrained
    from jaxdm.models.lora import load_adapted, load_model
    from jaxdm.train.sft import TrainDMConfig, train

    summary = train(TrainDMConfig(data=str(out / "train_states.jsonl"), model=args.model,
                                  out_dir=str(out / "run"), mode="likelihood",
                                  epochs=args.epochs, max_steps=args.max_steps,
                                  save_every=10, progress=progress, export=True,
                                  dtype=args.dtype))
    if "model" in summary:  # the run finished its epochs: train-dm merged and exported
        return summary, Path(summary["model"])
    pre = load_adapted(summary["adapter"])
    base = load_model(args.model)
    folder = save_pretrained(out / "model", pre.params, pre.config, tokenizer=pre.tokenizer,
                             source=base.path)
    return summary, folder


def bench(judges: list, out: Path, args, progress: bool, levels: tuple[str, ...]) -> dict:
    from jaxdm.bench.run import BenchConfig, run
    cfg = BenchConfig(levels=levels, judges=tuple(judges),
                      out_dir=str(out), l1_tool=args.l1,
                      l1_param=args.l1, l2_tasks=args.test_tasks, l2_max_states=args.test_states,
                      l3_envs=tuple(args.l3_envs.split(",")), l3_tasks=args.l3_tasks,
                      l3_max_steps=args.l3_max_steps, seed=0, progress=progress, batch=8)
    # results.json lists the finished levels; an interrupted one continues where it stopped
    return run(cfg, resume=True)


def cascade(model_path: str, tag: str, out: Path, args, progress: bool,
            inner: dict | None = None) -> dict:
    """shadow -> fit -> run (LLM alone vs CASCADE at the fitted thresholds on stop / params),
    each harness command resumed where an interrupted one stopped (its journal) and kept
    where finished; the results are read from the folder's files. ``inner``: another
    decision-model spec instead of the SmolLM2 folder (tests)."""
    from jaxdm.harness.arms import cmd_run
    from jaxdm.harness.config import ArmConfig, DelegationConfig, FitConfig, HarnessConfig
    from jaxdm.harness.shadow import cmd_shadow
    from jaxdm.harness.thresholds import cmd_fit, load_thresholds
    cfg = HarnessConfig(
        dm={"kind": "points_only", "points": list(args.cascade_points.split(",")),
            "dm": inner or {"kind": "local_likelihood", "path": model_path, "name": tag}},
        shadow_tasks=args.shadow_tasks, test_tasks=args.cascade_tasks, stage2_tasks=1,
        **({"llm": json.loads(args.cascade_llm)} if args.cascade_llm else {}),
        arms=(ArmConfig("cascade_fitted", tuple(
            DelegationConfig(p, "cascade", fitted=True)
            for p in args.cascade_points.split(",")), candidate=True),),
        frontier_point="route", frontier_thresholds=(),
        fit=FitConfig(points=tuple(args.cascade_points.split(",")), min_support=3),
        out_dir=str(out), progress=progress)
    out.mkdir(parents=True, exist_ok=True)
    for command in (cmd_shadow, cmd_fit, cmd_run):
        command(cfg, resume=True)   # a finished command returns None: read its files
    summary = json.loads((out / "summary.json").read_text())
    fits = load_thresholds(out) or {}
    ref, arm = summary["arms"]["llm_alone"], summary["arms"]["cascade_fitted"]
    return {"thresholds": {p: (f or {}).get("threshold") for p, f in fits.items()},
            "fit": fits,
            "llm_alone": {k: ref[k] for k in ("success", "cost", "llm_calls", "dm_calls")},
            "cascade": {k: arm[k] for k in ("success", "cost", "llm_calls", "dm_calls",
                                            "dm_failures")},
            "saving": 1.0 - arm["cost"] / ref["cost"] if ref["cost"] else None,
            "success_delta": arm["success"] - ref["success"]}


def _save(out: Path, result: dict) -> None:
    write_json(out / "results.json", result, indent=2, default=str)


# The options each stage's results depend on (SFT: also its data's; bench and CASCADE: also
# the recorded settings of the SFT stage whose model they evaluate, see Stages.settings).
DATA_ARGS = ("train_tasks", "train_states", "train_kinds", "whole_states", "error_rate")
STAGE_ARGS = {"data": DATA_ARGS, "sft": DATA_ARGS + ("model", "epochs", "max_steps", "dtype"),
              "bench": ("model", "test_tasks", "test_states", "l1", "l3_envs", "l3_tasks",
                        "l3_max_steps"),
              "cascade": ("model", "cascade_points", "shadow_tasks", "cascade_tasks",
                          "cascade_llm")}
# Every output of the job (``--overwrite`` removes them; ``stage_outputs``: a stage's own).
OUTPUTS = ("results.json", "train_states.jsonl", "run", "model", "bench", "before_after.md",
           "before_after.png", "harness_*")
# The job's folder (jaxdm.rundir): any output makes it hold a run; the settings are compared
# per stage (``Stages``), not for the whole job.
LAYOUT = Layout("results.json", OUTPUTS, kind="a train_dm_gym run", foreign_files=True,
                holds=lambda out: any(any(out.glob(name)) for name in OUTPUTS),
                view=lambda settings: {})


def stage_outputs(out: Path, stage: str) -> list[Path]:
    """The files and folders ``stage`` writes (removed before it starts again from nothing)."""
    kind, _, part = stage.partition("/")
    return {"data": [out / "train_states.jsonl"], "sft": [out / "run", out / "model"],
            "bench": [out / "bench" / part], "cascade": [out / f"harness_{part}"]}[kind]


def _remove(paths) -> None:
    for p in paths:
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink(missing_ok=True)


class Stages:
    """Start and end records of the job's stages in ``results.json`` (``result["stages"]``:
    stage -> {"settings", "started", "finished"}), written with the results they describe."""

    def __init__(self, out: Path, result: dict, args):
        self.out, self.result, self.args = out, result, args
        self.records = result.setdefault("stages", {})

    def settings(self, stage: str) -> dict:
        kind = stage.partition("/")[0]
        now = {k: getattr(self.args, k) for k in STAGE_ARGS[kind]}
        if now.get("dtype") == "float32":  # the default: runs recorded before --dtype match
            del now["dtype"]
        if kind in ("bench", "cascade"):   # the trained model they evaluate
            now["sft"] = (self.records.get("sft") or {}).get("settings")
        return now

    def begin(self, stage: str) -> bool:
        """True when ``stage`` is to run (its start record written); False when it finished
        with these settings. Finished with other settings: SystemExit naming them."""
        rec, now = self.records.get(stage), self.settings(stage)
        if rec and rec.get("finished"):
            if rec["settings"] != now:
                was = {k: rec["settings"].get(k) for k in now if rec["settings"].get(k) != now[k]}
                raise SystemExit(f"{self.out}: stage {stage} finished with other settings "
                                 f"({was}); resume with those, pass --overwrite, or use "
                                 f"another --out")
            return False
        if rec and rec["settings"] != now:
            # interrupted with other settings: its partial output is not continued
            _remove(stage_outputs(self.out, stage))
        self.records[stage] = {"settings": now, "started": time.time()}
        _save(self.out, self.result)
        return True

    def end(self, stage: str) -> None:
        """The end record, saved with the results the stage put into ``result``."""
        self.records[stage]["finished"] = time.time()
        _save(self.out, self.result)

    def finished(self, stage: str) -> bool:
        return bool((self.records.get(stage) or {}).get("finished"))


def open_results(out: Path, resume: bool, overwrite: bool) -> dict:
    """The results of an earlier run of the job in ``out`` (``resume``), or a fresh start
    (``overwrite`` removes the earlier outputs first). A folder holding outputs is refused
    without one of the two."""
    try:
        check_folder(out, LAYOUT, {}, resume=resume, overwrite=overwrite)
    except RunFolderError as e:
        raise SystemExit(str(e)) from None
    if overwrite:
        clear_outputs(out, LAYOUT)
        return {}
    prev = out / "results.json"
    return json.loads(prev.read_text()) if prev.is_file() else {}


def table(result: dict) -> str:
    f = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    backends = (result.get("bench") or {}).get("backends", {})
    lines = ["| decision model | L1 acc. | L2 acc. | L2 ECE | L3 step acc. | L3 success | "
             "L3 success per env | CASCADE saving | CASCADE success (LLM alone) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, b in backends.items():
        t = b.get("l3_tasks") or {}
        per_env = ", ".join(f"{e} {f(s['success'])}" for e, s in t.items() if e != "all")
        c = (result.get("cascade") or {}).get(name) or {}
        cas = (f"{c['saving']:+.1%}" if c.get("saving") is not None else "-")
        cas_s = (f"{f(c['cascade']['success'])} ({f(c['llm_alone']['success'])})"
                 if c else "-")
        lines.append(f"| {name} | {f((b.get('l1') or {}).get('accuracy'))} | "
                     f"{f((b.get('l2') or {}).get('accuracy'))} | "
                     f"{f((b.get('l2') or {}).get('ece'))} | "
                     f"{f((b.get('l3') or {}).get('accuracy'))} | "
                     f"{f((t.get('all') or {}).get('success'))} | {per_env} | {cas} | {cas_s} |")
    return "\n".join(lines)


def figure(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    import numpy as np

    backends = (result.get("bench") or {}).get("backends", {})
    names = list(backends)
    cols = [("L1 acc.", lambda b: (b.get("l1") or {}).get("accuracy")),
            ("L2 acc.", lambda b: (b.get("l2") or {}).get("accuracy")),
            ("L3 step acc.", lambda b: (b.get("l3") or {}).get("accuracy")),
            ("L3 success", lambda b: ((b.get("l3_tasks") or {}).get("all") or {}).get("success"))]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    w = 0.8 / max(len(names), 1)
    for i, n in enumerate(names):
        ax.bar(np.arange(len(cols)) + i * w, [fn(backends[n]) or 0.0 for _, fn in cols], w,
               label=n)
    ax.set_xticks(np.arange(len(cols)) + w * (len(names) - 1) / 2)
    ax.set_xticklabels([c for c, _ in cols])
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    ax.set_title("SmolLM2-135M before / after SFT (DECISION GYM states), Oracle-noisy for "
                 "reference", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="smollm2",
                    help="the base model: 'smollm2' or an HF folder (tests: a tiny one)")
    ap.add_argument("--train-tasks", type=int, default=30)
    ap.add_argument("--train-states", type=int, default=40)
    ap.add_argument("--train-kinds", default="tool,param,stop",
                    help="question kinds to train on (the 69-option tool question is the "
                         "memory-heavy one)")
    ap.add_argument("--whole-states", action="store_true",
                    help="one SFT context per state (default: one per question, see "
                         "write_train_states)")
    ap.add_argument("--error-rate", type=float, default=0.25)
    ap.add_argument("--max-steps", type=int, default=40)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                    help="the frozen weights' precision in training (bfloat16: mixed "
                         "precision, fp32 adapters; pick by measurement on your CPU)")
    ap.add_argument("--test-tasks", type=int, default=6)
    ap.add_argument("--test-states", type=int, default=6)
    ap.add_argument("--l1", type=int, default=20, help="L1 tool and parameter items each")
    ap.add_argument("--levels", default="l1,l2,l3", help="bench levels")
    ap.add_argument("--l3-envs", default="base,shift,alfworld")
    ap.add_argument("--l3-tasks", type=int, default=2)
    ap.add_argument("--l3-max-steps", type=int, default=15)
    ap.add_argument("--cascade-points", default="stop,params")
    ap.add_argument("--shadow-tasks", type=int, default=8)
    ap.add_argument("--cascade-tasks", type=int, default=8)
    ap.add_argument("--cascade-llm", default="",
                    help="the agent LLM of the CASCADE stage as a JSON spec "
                         "(jaxdm.harness.llm.make_llm; default: the harness's strong simulated "
                         "LLM), e.g. '{\"kind\": \"simulated\", \"profile\": \"weak\", "
                         "\"accuracy\": {\"stop\": 0.8, \"params\": 0.8}}'")
    ap.add_argument("--skip", default="", help="comma list of stages to skip: sft,bench,cascade")
    ap.add_argument("--quick", action="store_true", help="tiny smoke run (2 steps)")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--resume", action="store_true",
                    help="continue the job in --out: finished stages are kept")
    ap.add_argument("--overwrite", action="store_true", help="replace the job in --out")
    args = ap.parse_args(argv)
    if args.quick:
        args.train_tasks, args.train_states, args.max_steps = 2, 2, 2
        args.test_tasks, args.test_states, args.l1 = 1, 1, 2
        args.l3_envs, args.l3_tasks, args.l3_max_steps = "alfworld", 1, 3
        args.shadow_tasks, args.cascade_tasks = 1, 1
    progress = not args.no_progress
    skip = set(filter(None, args.skip.split(",")))
    out = Path(args.out)
    lock_run_dir(out)   # the folder is this job's until the process ends
    t0 = time.perf_counter()
    result = open_results(out, args.resume, args.overwrite)
    result["args"] = vars(args)
    timing = result.setdefault("timing", {})
    stages = Stages(out, result, args)
    if stages.begin("data"):
        result["data"] = write_train_states(out / "train_states.jsonl", args.train_tasks,
                                            args.error_rate, args.train_states, 0,
                                            tuple(args.train_kinds.split(",")),
                                            per_question=not args.whole_states)
        stages.end("data")
    folder = out / "model"
    if "sft" not in skip and stages.begin("sft"):
        t = time.perf_counter()
        summary, folder = sft(out, args, progress)
        timing["sft_s"] = round(time.perf_counter() - t, 1)
        result["train"] = {k: v for k, v in summary.items() if k != "skipped_indistinct"}
        result["train"]["folder"] = str(folder)
        stages.end("sft")
    if stages.finished("sft"):
        folder = Path(result["train"]["folder"])   # this run's or an earlier one's
    elif "sft" in skip and ("bench" not in skip or "cascade" not in skip):
        raise SystemExit(f"{out}: --skip sft needs a finished sft stage there (none recorded)")
    models = {"smollm2-base": args.model, "smollm2-sft": str(folder)}
    if "bench" not in skip:
        # dict specs: a 'kind:path=a/b' string is taken for a folder by screen's parser
        judges = ["oracle:noise=0.2,name=oracle-noisy"] + [
            {"kind": "local_likelihood", "path": p, "name": n} for n, p in models.items()]
        # One bench run per level (bench/<level>/), merged per backend and saved with the
        # level's end record, so a late kill keeps the finished levels and a resume skips them.
        from jaxdm.bench import metrics
        merged = result.setdefault("bench", {"backends": {}, "data": {}, "levels_done": []})
        for level in args.levels.split(","):
            if not stages.begin(f"bench/{level}"):
                continue
            t = time.perf_counter()
            r = bench(judges, out / "bench" / level, args, progress, (level,))
            for name, b in r["backends"].items():
                merged["backends"].setdefault(name, {}).update(
                    {k: v for k, v in b.items() if k != "cost"})
                merged["backends"][name].setdefault("cost", {})[level] = b["cost"]
            merged["data"].update(r["data"])
            if level not in merged["levels_done"]:
                merged["levels_done"].append(level)
            merged["kendall"] = metrics.level_agreement(merged["backends"])
            timing[f"bench_{level}_s"] = round(time.perf_counter() - t, 1)
            stages.end(f"bench/{level}")
    if "cascade" not in skip:
        result.setdefault("cascade", {})
        for name, path in models.items():
            if not stages.begin(f"cascade/{name}"):
                continue
            t = time.perf_counter()
            result["cascade"][name] = cascade(path, name, out / f"harness_{name}", args,
                                              progress)
            timing[f"cascade_{name}_s"] = round(time.perf_counter() - t, 1)
            stages.end(f"cascade/{name}")
    result["seconds"] = round(time.perf_counter() - t0, 1)
    _save(out, result)
    text = ("SmolLM2-135M before / after packed SFT on DECISION GYM train states "
            f"({result['data']['train_states']} states, "
            f"{result.get('train', {}).get('steps_done', '?')} SFT steps), option likelihood.\n\n"
            + table(result) + "\n")
    write_atomic(out / "before_after.md", text)
    if result.get("bench"):
        figure(result, out / "before_after.png")
    print(text)
    return result


if __name__ == "__main__":
    main()
