"""Questions trained per second: ``jaxdm train-dm``'s step against TRL's ``SFTTrainer`` + PEFT
LoRA on CPU torch, on the same judge questions, each side in its own process, alternated.

Workload (issue 38, goal 2): the longest of six ALFWorld noisy-expert trajectories (budget
30; ``sft_memory.judge_items``) judged under Hindsight + Progress, every action a Yes/No
question, SmolLM2-135M at full depth (``--layers`` to cut it), LoRA rank 32, alpha 32 on every
projection (q, k, v, o, gate, up, down), AdamW lr 1e-4, fp32 (``--dtype bfloat16``: jaxdm's bf16
frozen weights, TRL's bf16 autocast).

- jaxdm: one train-dm step trains every question of the trajectory (packed layout: the
  trajectory once, each question's few tokens after it; remat on; loss CE + 0.5 SE over the
  Yes/No readout). Step time: median of steps 2..N (the first compiles).
- TRL: one sequence per question, as TRL trains it: the same prompt token ids (our
  ``Encoder``'s request, the chat prompt ending in "Answer:") plus the label token, loss
  on the label token only (a pre-tokenised dataset with ``completion_mask``,
  ``completion_only_loss``: full-vocabulary CE on that token), batch 1, no packing (packing
  would mix questions of one trajectory into one causal row, so each would see the others).
  Seconds per question: median over steps 3..N of ``on_step_end`` intervals.

Peak RSS is each child's VmHWM (its own peak). Objectives differ as stated (ours reads the
Yes/No distribution, TRL's the full vocabulary); the comparison is what each library needs
to train these questions once.

  python benchmarks/train_throughput.py              # full depth, 2 rounds
  python benchmarks/train_throughput.py --quick      # 4 layers, budget 12, 1 round
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sft_memory import first_layers, judge_items, peak_rss_gb  # noqa: E402


def trl_rows(budget: int) -> list[dict]:
    """TRL's dataset: per question our Encoder's prompt ids + the label id, loss on the label
    (built here, in the parent: the TRL child then holds no JAX model)."""
    from jaxdm.models.smollm2 import smollm2
    from jaxdm.train import packing
    its, mode = judge_items(budget)
    enc = packing.Encoder(smollm2(), mode)
    rows = []
    for it in its:
        (req,), _ = enc.requests(it)
        prompt = list(req.tokens)
        rows.append({"input_ids": prompt + [enc.yes_no[it.answer[0]]],
                     "completion_mask": [0] * len(prompt) + [1]})
    return rows


def jaxdm_child(layers: int, budget: int, steps: int, dtype: str) -> dict:
    import jax
    import jax.numpy as jnp

    from jaxdm.models import lora
    from jaxdm.models.smollm2 import smollm2
    from jaxdm.train import packing, sft
    pre = first_layers(smollm2(dtype), layers)
    its, mode = judge_items(budget)
    batch, window, full_vocab, stats = packing.pack_items(packing.Encoder(pre, mode), its)
    batch = jax.tree.map(jnp.asarray, batch)
    lcfg = lora.LoraConfig(32, 32.0)
    step, opt = sft.train_step_fn(pre.config.replace(remat=True), lcfg, 0.5, 1e-4, 0.0)
    tr = lora.init_adapters(pre.params, lcfg, jax.random.key(0))
    ost = opt.init(tr)
    times, losses = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        tr, ost, loss, _, _ = jax.block_until_ready(step(tr, ost, pre.params, batch, window,
                                                         full_vocab))
        times.append(time.perf_counter() - t0)
        losses.append(float(loss))
    step_s = statistics.median(times[1:])
    return {"side": "jaxdm", "questions": len(its), "tokens": stats["unique_tokens"],
            "step_s": round(step_s, 3), "first_step_s": round(times[0], 2),
            "questions_per_s": len(its) / step_s, "tokens_per_s": stats["unique_tokens"] / step_s,
            "losses": losses, "peak_rss_gb": peak_rss_gb()}


def trl_child(layers: int, rows_file: str, steps: int, dtype: str) -> dict:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from jaxdm.models.smollm2 import smollm2_path
    rows = json.loads(Path(rows_file).read_text())
    rows = (rows * (-(-steps // len(rows))))[:steps]     # one question per step
    path = smollm2_path()
    model = AutoModelForCausalLM.from_pretrained(path, num_hidden_layers=layers,
                                                 torch_dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    marks: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            marks.append(time.perf_counter())

    out = Path(f"/tmp/jaxdm_trl_bench_{int(time.time() * 1e6)}")
    cfg = SFTConfig(output_dir=str(out), max_steps=steps, per_device_train_batch_size=1,
                    learning_rate=1e-4, lr_scheduler_type="constant", warmup_steps=0,
                    logging_steps=1, report_to=[], save_strategy="no", use_cpu=True,
                    bf16=dtype == "bfloat16", completion_only_loss=True, packing=False,
                    max_length=None, dataloader_num_workers=0, disable_tqdm=True, seed=0)
    peft = LoraConfig(r=32, lora_alpha=32, lora_dropout=0.0, task_type="CAUSAL_LM",
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                      "up_proj", "down_proj"])
    trainer = SFTTrainer(model=model, args=cfg, train_dataset=Dataset.from_list(rows),
                         processing_class=tok, peft_config=peft, callbacks=[Clock()])
    t0 = time.perf_counter()
    try:
        trainer.train()
    finally:
        shutil.rmtree(out, ignore_errors=True)  # nothing is saved there (save_strategy "no")
    gaps = [b - a for a, b in zip([t0] + marks, marks)]
    per_q = statistics.median(gaps[2:]) if len(gaps) > 2 else statistics.median(gaps)
    tokens = statistics.mean(len(r["input_ids"]) for r in rows)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {"side": "trl", "questions": 1, "tokens": round(tokens, 1), "step_s": round(per_q, 3),
            "questions_per_s": 1.0 / per_q, "tokens_per_s": tokens / per_q,
            "losses": losses[:8], "torch_threads": torch.get_num_threads(),
            "peak_rss_gb": peak_rss_gb()}


def run_child(args, side: str, rows_file: str) -> dict:
    cmd = [sys.executable, __file__, "--child", side, "--layers", str(args.layers), "--budget",
           str(args.budget), "--steps", str(args.steps), "--dtype", args.dtype,
           "--rows", rows_file]
    p = subprocess.run(cmd, capture_output=True, text=True)
    line = [x for x in p.stdout.splitlines() if x.startswith("CHILD ")]
    got = (json.loads(line[0][6:]) if line and not p.returncode else
           {"side": side, "error": f"exit {p.returncode}: {p.stderr.strip()[-600:]}"})
    print(json.dumps(got), flush=True)
    return got


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--child", choices=("jaxdm", "trl"), help=argparse.SUPPRESS)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--budget", type=int, default=30)
    ap.add_argument("--steps", type=int, default=8, help="steps per side and round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--rows", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        args.layers, args.budget, args.steps, args.rounds = 4, 12, 5, 1
    if args.child:
        got = (jaxdm_child(args.layers, args.budget, args.steps, args.dtype)
               if args.child == "jaxdm" else
               trl_child(args.layers, args.rows, args.steps, args.dtype))
        print("CHILD " + json.dumps(got), flush=True)
        return
    runs: dict[str, list[dict]] = {"trl": [], "jaxdm": []}
    with tempfile.TemporaryDirectory() as tmp:
        rows_file = str(Path(tmp) / "trl_rows.json")
        Path(rows_file).write_text(json.dumps(trl_rows(args.budget)))
        for _ in range(args.rounds):
            for side in runs:  # alternated: the machine's load hits both alike
                runs[side].append(run_child(args, side, rows_file))
    ok = {s: [r for r in rs if "step_s" in r] for s, rs in runs.items()}
    if not all(ok.values()):
        print("RESULT train_judge_questions_per_s: a side failed; see the lines above")
        return
    med = {s: {k: statistics.median(r[k] for r in rs)
               for k in ("questions_per_s", "tokens_per_s", "peak_rss_gb")}
           for s, rs in ok.items()}
    t, j = med["trl"], med["jaxdm"]
    what = (f"{args.layers} layers, {args.dtype}, {ok['jaxdm'][0]['questions']}-question judge "
            f"trajectory; tokens per question {ok['trl'][0]['tokens']:.0f} (TRL) vs "
            f"{ok['jaxdm'][0]['tokens'] / ok['jaxdm'][0]['questions']:.1f} (jaxdm)")
    print(f"RESULT train_judge_questions_per_s: baseline {t['questions_per_s']:.3f}, jaxdm "
          f"{j['questions_per_s']:.3f}, ratio {j['questions_per_s'] / t['questions_per_s']:.1f}x "
          f"(TRL SFTTrainer + PEFT LoRA vs train-dm, {what})")
    print(f"RESULT train_judge_tokens_per_s: baseline {t['tokens_per_s']:.0f}, jaxdm "
          f"{j['tokens_per_s']:.0f}, ratio {j['tokens_per_s'] / t['tokens_per_s']:.2f}x "
          "(tokens run per second)")
    print(f"RESULT train_judge_peak_rss: baseline {t['peak_rss_gb']:.2f} GiB, jaxdm "
          f"{j['peak_rss_gb']:.2f} GiB, ratio {t['peak_rss_gb'] / j['peak_rss_gb']:.2f}x "
          "(each side's own process)")


if __name__ == "__main__":
    main()
