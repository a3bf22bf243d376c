"""SmolLM2-135M before / after packed SFT on DECISION GYM states, scored on L1 and L2.

1. Training data: noisy-agent states of DECISION GYM train-split tasks (``--train-tasks``),
   written in the ``jaxdm train-dm`` line format (``experiments/decision_gym_data.py``'s rows).
2. Before: ``jaxdm bench`` (L1 BFCL subset + L2 test-split states) with SmolLM2 as an
   option-likelihood decision model (constrained readout cannot show DECISION GYM's 69 tools:
   26 labels).
3. ``jaxdm train-dm`` (LoRA rank 32, lr 1e-4, AdamW, likelihood mode; ``--max-steps`` bounds
   the CPU budget), exporting the merged model.
4. After: the same bench with the exported folder. Writes ``before_after.md`` / ``.json``.

    python experiments/train_dm_gym.py --out train_dm_gym_out                # CPU budget run
    python experiments/train_dm_gym.py --out /tmp/x --quick                  # smoke run
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def write_train_states(path: Path, tasks: int, error_rate: float, max_states: int | None,
                       seed: int) -> dict:
    from jaxdm.envs.decision_gym import (DecisionGym, GymParams, NoisyAgent, run_episode,
                                         split_seed)
    env = DecisionGym()
    params = GymParams(variant="base", strict=True, split="train")
    agent = NoisyAgent(error_rate=error_rate, seed=seed)
    rows = []
    for i in range(tasks):
        traj, records = run_episode(env, agent, split_seed("train", i), params)
        for r in records:
            rows.append(r.to_dict() | {"seed": split_seed("train", i), "split": "train",
                                       "variant": "base"})
    if max_states is not None:
        import random
        rows = random.Random(seed).sample(rows, min(max_states, len(rows)))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return {"train_tasks": tasks, "train_states": len(rows),
            "train_after_error_share": sum(r["after_error"] for r in rows) / max(len(rows), 1),
            "train_questions": sum(len(r["questions"]) for r in rows)}


def bench(judge: str, out: Path, args) -> dict:
    from jaxdm.bench.run import BenchConfig, run
    cfg = BenchConfig(judges=(judge,), out_dir=str(out), l1_tool=args.l1, l1_param=args.l1,
                      l2_tasks=args.test_tasks, l2_max_states=args.test_states, seed=0,
                      progress=not args.no_progress, batch=8)
    return run(cfg)["backends"]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--train-tasks", type=int, default=30)
    ap.add_argument("--train-states", type=int, default=40)
    ap.add_argument("--error-rate", type=float, default=0.25)
    ap.add_argument("--max-steps", type=int, default=40)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--test-tasks", type=int, default=6)
    ap.add_argument("--test-states", type=int, default=16)
    ap.add_argument("--l1", type=int, default=20, help="L1 tool and parameter items each")
    ap.add_argument("--quick", action="store_true", help="tiny smoke run (2 steps)")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.train_tasks, args.train_states, args.max_steps = 2, 2, 2
        args.test_tasks, args.test_states, args.l1 = 1, 2, 3
    out = Path(args.out)
    t0 = time.perf_counter()
    data = write_train_states(out / "train_states.jsonl", args.train_tasks, args.error_rate,
                              args.train_states, 0)
    print(json.dumps(data), file=sys.stderr)
    timing = {}
    t = time.perf_counter()
    before = bench("local_likelihood:path=smollm2,name=smollm2-base", out / "bench_before", args)
    timing["bench_before_s"] = time.perf_counter() - t

    from jaxdm.train.sft import TrainDMConfig, train
    t = time.perf_counter()
    summary = train(TrainDMConfig(data=str(out / "train_states.jsonl"), model="smollm2",
                                  out_dir=str(out / "run"), mode="likelihood",
                                  epochs=args.epochs, max_steps=args.max_steps, save_every=10,
                                  progress=not args.no_progress, export=False))
    timing["train_s"] = time.perf_counter() - t
    # Export whatever was trained (a budget run stops before the 2 epochs end).
    import jax  # noqa: F401
    from jaxdm.models.loading import save_pretrained
    from jaxdm.rl.checkpoint import Checkpointer
    from jaxdm.train import lora
    from jaxdm.train.sft import load_model
    pre = load_model("smollm2")
    lcfg = lora.LoraConfig()
    target = {"trainable": lora.init_adapters(pre.params, lcfg, jax.random.key(0))}
    import optax
    target["opt"] = optax.adamw(1e-4).init(target["trainable"])
    ck = Checkpointer(out / "run" / "checkpoints")
    state, _, step = ck.restore(target)
    ck.close()
    folder = save_pretrained(out / "model", lora.merge(pre.params, state["trainable"], lcfg),
                             pre.config, tokenizer=pre.tokenizer, source=pre.path)
    t = time.perf_counter()
    after = bench(f"local_likelihood:path={folder},name=smollm2-sft", out / "bench_after", args)
    timing["bench_after_s"] = time.perf_counter() - t
    result = {"data": data, "train": {k: v for k, v in summary.items()
                                      if k != "skipped_indistinct"}, "trained_steps": step,
              "before": before, "after": after, "timing": timing,
              "seconds": time.perf_counter() - t0}
    (out / "before_after.json").write_text(json.dumps(result, indent=2), encoding="utf-8")
    rows = ["| group | before acc | before ECE | after acc | after ECE | n |", "|---|---|---|---|---|---|"]
    b, a = next(iter(before.values())), next(iter(after.values()))
    for g in ("l1/l1_tool", "l1/l1_param", "l2/tool", "l2/param", "l2/stop", "l2/after_error",
              "l2/no_error", "l2/tool/must_ask", "all"):
        if g in b:
            f = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
            rows.append(f"| {g} | {f(b[g]['accuracy'])} | {f(b[g]['ece'])} | "
                        f"{f(a[g]['accuracy'])} | {f(a[g]['ece'])} | {b[g]['n']} |")
    text = (f"SmolLM2-135M (option likelihood) before / after {step} packed-SFT steps on "
            f"{data['train_states']} DECISION GYM train states ({data['train_questions']} "
            f"questions), LoRA rank 32, lr 1e-4; {time.perf_counter() - t0:.0f} s in all.\n\n"
            + "\n".join(rows) + "\n")
    (out / "before_after.md").write_text(text, encoding="utf-8")
    print(text)
    return result


if __name__ == "__main__":
    main()
