"""Memory of one SmolLM2-135M SFT step with and without per-layer rematerialisation.

``jaxdm train-dm`` differentiates the decoder's layer scan; without ``ModelConfig.remat`` the
backward pass keeps every layer's activations (attention logits and probabilities included),
with it only each layer's input, recomputing one layer at a time. Two realistic states, each
one packed SFT step of train-dm (rows layout, LoRA rank 32 on every projection, AdamW):

- ``judge``: the longest of six ALFWorld noisy-expert trajectories (native engine, one per
  task type, budget 30) judged under Hindsight + Progress, every action a Yes/No question
  (constrained readout);
- ``gym``: the DECISION GYM train state with the most options (69 tools), option-likelihood
  mode, every question of that state (the state that asked for 62 GB before).

Per (state, remat) a fresh process compiles the step and reports XLA's compiled temporary
buffer size (``memory_analysis().temp_size_in_bytes``: what the step needs beyond its inputs
and outputs, known before it runs), then, when that fits the machine (``--max-run-gb``),
runs one step and reports the process's peak RSS (``ru_maxrss``: model, compile and step).

``--compare lora`` instead compares how LoRA is applied, remat on: ``merged`` (W + (α/r)·A·B
built every step, its dense gradient xᵀ·dy contracted to dA, dB) against ``unmerged`` (train-dm's
default, ``decoder.Adapted``: x·W + (α/r)·(x·A)·B, no weight-sized gradient), one process
each, alternated ``--rounds`` times; the step time is the second step's (the first runs once
after compiling). ``--compare layout`` compares the rows layout with the packed one
(``--layout`` of train-dm), unmerged LoRA, remat on; ``--compare dtype`` bf16 frozen
weights against fp32 (packed layout; the loss of each is printed: compare them).

  python benchmarks/sft_memory.py            # both states, remat off and on
  python benchmarks/sft_memory.py --quick    # judge state, 6 layers, budget 12 (< 60 s idle)
  python benchmarks/sft_memory.py --compare lora --states gym,judge
  python benchmarks/sft_memory.py --compare layout --states gym,judge
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time


def judge_items(budget: int):
    from jaxdm.decision.types import YesNo
    from jaxdm.envs.alfworld import noisy_expert_trajectories
    from jaxdm.roles import judge_requests
    from jaxdm.train.packing import SFTItem
    # The longest of one trajectory per task type (the first ones end after a few actions).
    traj = max(noisy_expert_trajectories(6, seed=0, budget=budget), key=lambda t: len(t.steps))
    qs = judge_requests(traj, question="progress", context="hindsight")
    return [SFTItem(YesNo(context=q.context, question=q.question),
                    (0 if (q.meta.get("annotations") or {}).get("milestone") else 1,),
                    source=f"judge:{i}") for i, q in enumerate(qs)], "readout"


def gym_items():
    import tempfile
    from pathlib import Path

    from jaxdm.envs.decision_gym import (DecisionGym, GymParams, NoisyAgent, run_episode,
                                         split_seed)
    from jaxdm.train.data import read_states, write_states
    env = DecisionGym()
    params = GymParams(variant="base", strict=True, split="train")
    _, records = run_episode(env, NoisyAgent(error_rate=0.25, seed=0), split_seed("train", 0),
                             params)
    rows = [r.to_dict() | {"split": "train"} for r in records]
    with tempfile.TemporaryDirectory() as d:
        states = read_states(write_states(Path(d) / "s.jsonl", rows))
    best = max(states, key=lambda s: max(it.n_options for it in s))
    return best, "likelihood"


def peak_rss_gb() -> float:
    # VmHWM: this process's own peak (ru_maxrss may carry a forking parent's across exec).
    with open("/proc/self/status") as f:
        kb = next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:"))
    return round(kb / 2**20, 2)


def first_layers(pre, layers: int):
    """The pretrained model cut to its first ``layers`` decoder layers (all when more)."""
    import jax
    if layers >= pre.config.num_layers:
        return pre
    return pre.__class__(**{**pre.__dict__,
                            "params": {**pre.params, "layers": jax.tree.map(
                                lambda x: x[:layers], pre.params["layers"])},
                            "config": pre.config.replace(num_layers=layers)})


def child(state: str, remat: bool, layers: int, budget: int, max_run_gb: float,
          lora_apply: str = "unmerged", layout: str = "rows", dtype: str = "float32") -> dict:
    import jax
    import jax.numpy as jnp

    from jaxdm.models.smollm2 import smollm2
    from jaxdm.models import lora
    from jaxdm.train import packing, sft
    pre = first_layers(smollm2(dtype), layers)
    its, mode = judge_items(budget) if state == "judge" else gym_items()
    batch, window, full_vocab, stats = packing.pack_items(packing.Encoder(pre, mode), its,
                                                          layout=layout)
    batch = jax.tree.map(jnp.asarray, batch)
    lcfg = lora.LoraConfig(32, 32.0)
    step, opt = sft.train_step_fn(pre.config.replace(remat=remat), lcfg, 0.5, 1e-4, 0.0,
                                   lora_apply)
    tr = lora.init_adapters(pre.params, lcfg, jax.random.key(0))
    ost = opt.init(tr)
    t0 = time.perf_counter()
    compiled = step.lower(tr, ost, pre.params, batch, window, full_vocab).compile()
    mem = compiled.memory_analysis()
    temp = float(mem.temp_size_in_bytes) / 2**30
    out = {"state": state, "remat": remat, "lora_apply": lora_apply, "layout": layout,
           "dtype": dtype, "layers": layers,
           "questions": len(its),
           "requests": stats["requests"], "tokens": stats["unique_tokens"],
           "compiled_temp_gb": round(temp, 3), "compile_s": round(time.perf_counter() - t0, 1)}
    if temp <= max_run_gb:
        t0 = time.perf_counter()
        res = compiled(tr, ost, pre.params, batch)
        out["loss"] = float(res[2])
        out["first_step_s"] = round(time.perf_counter() - t0, 2)
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(tr, ost, pre.params, batch))
        out["step_s"] = round(time.perf_counter() - t0, 2)
        out["peak_rss_gb"] = peak_rss_gb()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--states", default="judge,gym")
    ap.add_argument("--max-run-gb", type=float, default=12.0,
                    help="run the step only when XLA's temporary buffers fit this (GiB)")
    ap.add_argument("--child", nargs=5, metavar=("STATE", "REMAT", "LORA", "LAYOUT", "DTYPE"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--compare", choices=("remat", "lora", "layout", "dtype"), default="remat")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--budget", type=int, default=30)
    args = ap.parse_args(argv)
    if args.quick:
        args.states, args.layers, args.budget = "judge", 6, 12
    if args.child:
        print("CHILD " + json.dumps(child(args.child[0], args.child[1] == "on", args.layers,
                                          args.budget, args.max_run_gb, args.child[2],
                                          args.child[3], args.child[4])),
              flush=True)
        return
    if args.compare in VARIANTS:
        return compare(args, args.compare)
    for state in args.states.split(","):
        got = {remat: run_child(args, state, remat, "unmerged", "rows", "float32")
               for remat in ("off", "on")}
        off, on = got["off"], got["on"]
        if "compiled_temp_gb" in off and "compiled_temp_gb" in on:
            print(f"RESULT sft_memory_{state}_compiled: baseline {off['compiled_temp_gb']:.2f} "
                  f"GiB, jaxdm {on['compiled_temp_gb']:.2f} GiB, ratio "
                  f"{off['compiled_temp_gb'] / max(on['compiled_temp_gb'], 1e-9):.2f}x "
                  "(remat off vs on, XLA temporaries)")
        if "peak_rss_gb" in off and "peak_rss_gb" in on:
            print(f"RESULT sft_memory_{state}_rss: baseline {off['peak_rss_gb']:.2f} GiB, "
                  f"jaxdm {on['peak_rss_gb']:.2f} GiB, ratio "
                  f"{off['peak_rss_gb'] / on['peak_rss_gb']:.2f}x (remat off vs on, peak RSS)")


def run_child(args, state: str, remat: str, lora_apply: str, layout: str, dtype: str) -> dict:
    cmd = [sys.executable, __file__, "--child", state, remat, lora_apply, layout, dtype, "--layers",
           str(args.layers), "--budget", str(args.budget), "--max-run-gb", str(args.max_run_gb)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    line = [x for x in p.stdout.splitlines() if x.startswith("CHILD ")]
    if p.returncode or not line:
        got = {"state": state, "remat": remat == "on", "lora_apply": lora_apply, "layout": layout,
               "dtype": dtype, "error": f"exit {p.returncode}: {p.stderr.strip()[-300:]}"}
    else:
        got = json.loads(line[0][6:])
    print(json.dumps(got), flush=True)
    return got


# --compare: the variants (baseline first) as (LoRA application, layout, weights' dtype),
# remat on. "dtype": bf16 frozen weights (the kernels' bf16 products, fp32 accumulation, fp32
# residual stream) with fp32 adapters and optimiser state, against fp32 throughout.
VARIANTS = {"lora": {"merged": ("merged", "rows", "float32"),
                     "unmerged": ("unmerged", "rows", "float32")},
            "layout": {"rows": ("unmerged", "rows", "float32"),
                       "packed": ("unmerged", "packed", "float32")},
            "dtype": {"float32": ("unmerged", "packed", "float32"),
                      "bfloat16": ("unmerged", "packed", "bfloat16")}}


def compare(args, what: str) -> None:
    import statistics
    variants = VARIANTS[what]
    base_name, ours_name = variants
    for state in args.states.split(","):
        runs: dict[str, list[dict]] = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, (lora_apply, layout, dtype) in variants.items():
                # alternated: the machine's load hits both alike
                runs[name].append(run_child(args, state, "on", lora_apply, layout, dtype))
        ok = {h: [r for r in rs if "step_s" in r] for h, rs in runs.items()}
        if not all(ok.values()):
            print(f"RESULT sft_{what}_{state}: a side failed; see the lines above")
            continue
        med = {h: {k: statistics.median(r[k] for r in rs)
                   for k in ("step_s", "peak_rss_gb", "compiled_temp_gb")}
               for h, rs in ok.items()}
        m, u = med[base_name], med[ours_name]
        tokens = "/".join(str(ok[h][0]["tokens"]) for h in variants)
        print(f"RESULT sft_{what}_{state}_step: baseline {m['step_s']:.2f} s, jaxdm "
              f"{u['step_s']:.2f} s, ratio {m['step_s'] / u['step_s']:.2f}x ({base_name} vs "
              f"{ours_name}, remat on, {tokens} tokens, median of {len(ok[ours_name])})")
        print(f"RESULT sft_{what}_{state}_rss: baseline {m['peak_rss_gb']:.2f} GiB, jaxdm "
              f"{u['peak_rss_gb']:.2f} GiB, ratio {m['peak_rss_gb'] / u['peak_rss_gb']:.2f}x "
              "(peak RSS of the whole process)")
        print(f"RESULT sft_{what}_{state}_compiled: baseline {m['compiled_temp_gb']:.2f} GiB, "
              f"jaxdm {u['compiled_temp_gb']:.2f} GiB, ratio "
              f"{m['compiled_temp_gb'] / max(u['compiled_temp_gb'], 1e-9):.2f}x (XLA temporaries)")


if __name__ == "__main__":
    main()
