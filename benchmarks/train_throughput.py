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

The floor (issue 38, goal 1; ``RESULT train_<workload>_floor``): the FLOPs the jaxdm step
must compute (``step_floor``: projections forward, remat and dx; LoRA; attention over visible
keys only; the head at the read slots; AdamW) at the best matmul rate measured in the jaxdm
child right after its steps at the projections' shapes (XLA's dot, jaxdm's matmul kernel and,
where the benchmark extra installed torch, oneDNN), with the floor's parts.

Peak RSS is each child's VmHWM (its own peak). Objectives differ as stated (ours reads the
Yes/No distribution, TRL's the full vocabulary); the comparison is what each library needs
to train these questions once.

GRPO (``--workload grpo``, issue 38 goal 2): one iteration (rollout + update) on a
single-turn task both libraries run, each side in its own process, alternated rounds:

- Task: the first action of a BabyAI text episode (``first_action_env``, room 7, task seeds
  0, 1, ...). The prompt is the generative policy's (``jaxdm.rl.text.policy_prompt``: goal,
  observation, the 7 action words; reasoning in <think>, the action in <action>), the same
  text for both; reward 1 when the completion parses (``parse_action``) to the BabyAI
  solver's first action, else 0 (``completion_reward``; ours gets it from the env, TRL from
  its reward function: the same function). ``--prompts`` P prompts x ``--group`` G
  completions per iteration, at most ``--completion-tokens`` L new tokens, temperature 1.0,
  top-p 1, full fine-tune on both sides (the jaxdm RL trainer trains every weight), AdamW
  lr 1e-6, grad-norm clip 1.0, no KL (beta 0), no entropy term, one optimiser step per
  iteration on the whole P x G batch, token-mean loss (TRL's ``dapo``).
- jaxdm: ``jaxdm.rl.trainer.Trainer`` on a ``TrainConfig`` (policy generative,
  ``max_actions: 1``, ``algo.advantage: grpo``, ``mini_batch`` = P x G), one
  ``iteration_step()`` per iteration (the KV-cache sampler, the GRPO estimator, pi_old
  recomputed, one PPO step); its ``time/update`` is the update share, the rest of the
  iteration the rollout (``time/generation``: the sampler alone).
- TRL: ``GRPOTrainer`` with ``GRPOConfig(use_cpu=True, num_generations=G,
  per_device_train_batch_size=P*G, gradient_accumulation_steps=1, max_completion_length=L,
  ...)``; seconds per iteration from ``on_step_end`` intervals; ``model.generate`` is timed
  for the rollout share.
- Beside them, ours only: a multi-turn BabyAI iteration (``--turns`` actions per episode,
  history 2, GRPO on the episode's success, one PPO step per P x G actions), same model,
  P and G.

Medians of iterations after the first ``--warmup`` (the first compiles on our side).

  python benchmarks/train_throughput.py              # full depth, 2 rounds
  python benchmarks/train_throughput.py --quick      # 4 layers, budget 12, 1 round
  python benchmarks/train_throughput.py --workload grpo           # full depth, 2 rounds
  python benchmarks/train_throughput.py --workload grpo --quick   # 2 layers, P 1, G 2, L 8,
                                                                  # 2 iterations, no multi-turn
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
from sft_memory import first_layers, gym_items, judge_items, peak_rss_gb  # noqa: E402


def workload_items(workload: str, budget: int):
    """(items, mode) of an SFT workload: "judge", every action of the judge trajectory as a
    Yes/No readout question; "tool", the 69-option DECISION GYM tool question alone
    (``sft_memory.gym_items``' state, option likelihood)."""
    if workload == "judge":
        return judge_items(budget)
    its, mode = gym_items()
    return [max(its, key=lambda it: it.n_options)], mode


def trl_rows(budget: int, workload: str = "judge") -> list[dict]:
    """TRL's dataset (built here, in the parent: the TRL child then holds no JAX model).
    judge: per question our Encoder's prompt ids + the label id, loss on the label. tool:
    TRL's standard SFT of the question: our prompt + the correct option's tokens (its
    likelihood request), loss on the option tokens (our step reads all 69 options)."""
    from jaxdm.models.smollm2 import smollm2
    from jaxdm.train import packing
    its, mode = workload_items(workload, budget)
    enc = packing.Encoder(smollm2(), mode)
    rows = []
    for it in its:
        reqs, how = enc.requests(it)
        if how == "readout":
            prompt = list(reqs[0].tokens)
            rows.append({"input_ids": prompt + [enc.yes_no[it.answer[0]]],
                         "completion_mask": [0] * len(prompt) + [1]})
            continue
        req = reqs[it.answer[0]]              # the correct option's request
        mask = [0] * len(req.tokens)
        for p in req.answer_positions:        # the option's tokens follow these positions
            mask[p + 1] = 1
        rows.append({"input_ids": list(req.tokens), "completion_mask": mask})
    return rows


def jaxdm_child(layers: int, budget: int, steps: int, dtype: str,
                workload: str = "judge", full: bool = False) -> dict:
    import jax
    import jax.numpy as jnp

    from jaxdm.models import lora
    from jaxdm.models.smollm2 import smollm2
    from jaxdm.train import packing, sft
    pre = first_layers(smollm2(dtype), layers)
    its, mode = workload_items(workload, budget)
    batch, window, full_vocab, stats = packing.pack_items(packing.Encoder(pre, mode), its)
    batch = jax.tree.map(jnp.asarray, batch)
    lcfg = None if full else lora.LoraConfig(32, 32.0)
    step, opt = sft.train_step_fn(pre.config.replace(remat=True), lcfg, 0.5, 1e-4, 0.0,
                                  donate=True)  # as train-dm runs it
    step = sft.StepPrograms(step)
    tr = (sft.master_weights(pre.params) if full  # train-dm's own full fine-tune state
          else lora.init_adapters(pre.params, lcfg, jax.random.key(0)))
    ost = opt.init(tr)
    times, losses = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        tr, ost, loss, _, _ = jax.block_until_ready(step(tr, ost, pre.params, batch, window,
                                                         full_vocab))
        times.append(time.perf_counter() - t0)
        losses.append(float(loss))
    step_s = statistics.median(times[1:])
    rss = peak_rss_gb()  # before the floor's own arrays
    scoring = batch.scoring
    read_rows = int(jnp.sum(scoring.answer_mask))
    floor = step_floor(pre.config, lcfg, scoring, stats["unique_tokens"], read_rows,
                       pre.config.vocab_size if full_vocab else 2, dtype, step_s,
                       all_params=sum(int(x.size) for x in jax.tree.leaves(pre.params)))
    return {"side": "jaxdm", "questions": len(its), "tokens": stats["unique_tokens"],
            "step_s": round(step_s, 3), "first_step_s": round(times[0], 2),
            "questions_per_s": len(its) / step_s, "tokens_per_s": stats["unique_tokens"] / step_s,
            "losses": losses, "peak_rss_gb": rss, "floor": floor}


def visible_pairs(scoring) -> int:
    """(query, key) pairs the packed batch's attention must compute per head: each trunk's
    causal pairs, then per suffix token the trunk tokens it sees and its own request's earlier
    tokens and itself."""
    import numpy as np
    pairs = 0
    for g in range(scoring.trunk_tokens.shape[0]):
        t = int(scoring.trunk_len[g])
        pairs += t * (t + 1) // 2
        seg, vis = np.asarray(scoring.suffix_segments[g]), np.asarray(scoring.suffix_visible[g])
        for r in np.unique(seg[seg > 0]):
            at = np.flatnonzero(seg == r)
            pairs += int(np.sum(vis[at])) + len(at) * (len(at) + 1) // 2
    return pairs


def step_floor(config, lcfg, scoring, tokens: int, read_rows: int, read_vocab: int,
               dtype: str, step_s: float, all_params: int = 0) -> dict:
    """The SFT step's floor (issue 38 goal 1): the FLOPs it must compute, timed at the best
    dense-matmul rate this process reaches at the projections' shapes in its precision (XLA's
    dot and jaxdm's matmul kernel, measured right after the steps; torch's oneDNN too where
    torch is installed), and the step's multiple of it. FLOPs: the projections forward, again
    for the remat recompute, and their dx backward (6·N per token; a full fine-tune, lcfg
    None, adds dW: 8·N); LoRA's products (x·A, (x·A)·B forward twice, their dx, dA and dB:
    8·r·(I + O) per projection and token); attention over visible keys only (per pair and
    query head 2·H per product: QK and PV forward twice, and five products backward); the head
    at the positions the loss reads (forward and dx). Attention, LoRA and the head are timed
    at the best projection rate (one figure for "a matmul here"). AdamW is memory-bound: 28
    bytes per trainable parameter (LoRA's factors, or ``all_params`` for a full fine-tune:
    fp32 weight, gradient and two moments read, three written) at the bandwidth of a
    streaming add measured here."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxdm.models.cpu import matmul as cpu_matmul
    d, f, hd = config.hidden_size, config.intermediate_size, config.head_dim
    kv = config.num_kv_heads * hd
    shapes = {"q/o": (d, config.num_heads * hd), "k/v": (d, kv), "gate/up": (d, f),
              "down": (f, d)}
    per_layer = {"q/o": 2, "k/v": 2, "gate/up": 2, "down": 1}   # products of each shape
    dt = jnp.bfloat16 if dtype == "bfloat16" else jnp.float32
    rng = np.random.default_rng(0)
    rates = {}
    for name, (k, n) in shapes.items():
        x = jnp.asarray(rng.normal(size=(tokens, k)), dt)
        w = jnp.asarray(rng.normal(size=(k, n)), dt)
        xla = jax.jit(lambda x, w: jnp.matmul(x, w, preferred_element_type=jnp.float32))
        fns = {"xla": xla}
        if cpu_matmul.supports(x, w) and cpu_matmul.enabled(w.dtype):
            fns["kernel"] = jax.jit(cpu_matmul.matmul)
        best = 0.0
        for fn in fns.values():
            jax.block_until_ready(fn(x, w))
            times = []
            for _ in range(7):
                t0 = time.perf_counter()
                jax.block_until_ready(fn(x, w))
                times.append(time.perf_counter() - t0)
            best = max(best, 2 * tokens * k * n / statistics.median(times))
        rates[name] = best
    try:  # oneDNN through torch where the benchmark extra installed it, timed after XLA's
        # (its threads spin a while after each call and slow XLA's)
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        tdt = torch.bfloat16 if dtype == "bfloat16" else torch.float32
        for name, (k, n) in shapes.items():
            x, w = torch.randn(tokens, k, dtype=tdt), torch.randn(k, n, dtype=tdt)
            torch.matmul(x, w)
            times = []
            for _ in range(7):
                t0 = time.perf_counter()
                torch.matmul(x, w)
                times.append(time.perf_counter() - t0)
            rates[name] = max(rates[name], 2 * tokens * k * n / statistics.median(times))
    top = max(rates.values())
    layers = config.num_layers
    products = 3 if lcfg else 4  # forward, remat recompute, dx (and a full fine-tune's dW)
    proj = {name: products * 2 * tokens * k * n * per_layer[name] * layers
            for name, (k, n) in shapes.items()}
    r = lcfg.rank if lcfg else 0
    lora = 8 * r * tokens * layers * sum((k + n) * per_layer[name]
                                         for name, (k, n) in shapes.items())
    attention = visible_pairs(scoring) * config.num_heads * 2 * hd * 9 * layers
    head = 2 * 2 * read_rows * d * read_vocab
    trainable = (r * layers * sum((k + n) * per_layer[name] for name, (k, n) in shapes.items())
                 if lcfg else all_params)
    seconds = {"matmul": sum(proj[n] / rates[n] for n in proj), "lora": lora / top,
               "attention": attention / top, "head": head / top,
               "optimiser": 28 * trainable / stream_bandwidth()}
    floor = sum(seconds.values())
    return {"floor_s": floor, "multiple": step_s / floor, "seconds": seconds,
            "gflops": {n: round(v / 1e9, 1) for n, v in rates.items()},
            "tflop": round((sum(proj.values()) + lora + attention + head) / 1e12, 3)}


def stream_bandwidth(n: int = 1 << 25) -> float:
    """Bytes per second of a jitted fp32 ``a + b`` over n elements (two read, one written),
    the median of 7 calls: the memory rate an optimiser update reaches at best."""
    import jax
    import jax.numpy as jnp
    a, b = jnp.ones((n,), jnp.float32), jnp.full((n,), 2.0, jnp.float32)
    add = jax.jit(lambda a, b: a + b, donate_argnums=0)  # in place: no fresh pages
    a = jax.block_until_ready(add(a, b))
    times = []
    for _ in range(7):
        t0 = time.perf_counter()
        a = jax.block_until_ready(add(a, b))
        times.append(time.perf_counter() - t0)
    return 12 * n / statistics.median(times)


def trl_child(layers: int, rows_file: str, steps: int, dtype: str, full: bool = False) -> dict:
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
                         processing_class=tok, peft_config=None if full else peft,
                         callbacks=[Clock()])
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


# ---------------------------------------------------------------------------------------
# GRPO: one iteration on the first BabyAI action, jaxdm's RL trainer vs TRL's GRPOTrainer.
# ---------------------------------------------------------------------------------------
ROOM_SIZE = 7
GRPO_SIDES = ("trl", "jaxdm", "jaxdm_multiturn")


def action_reward(action: str | None, expert: str | None) -> float:
    """1.0 when the parsed action is the solver's first action, else 0.0 (an unparsable
    completion, ``None``, earns 0: the trainer's invalid penalty is set to 0 to match)."""
    return 1.0 if action is not None and expert is not None and action == expert else 0.0


def completion_reward(text: str, expert: str | None) -> float:
    """The reward of one completion's text: its <action> (``jaxdm.rl.text.parse_action``,
    the generative policy's parser) scored by ``action_reward``."""
    from jaxdm.rl.text import parse_action
    action, valid = parse_action(text)
    return action_reward(action if valid else None, expert)


def expert_first_action(core) -> str | None:
    """The BabyAI solver's first action word for an episode's initial state (None: no plan)."""
    from jaxdm.envs.babyai.solver import solve
    from jaxdm.envs.babyai.text import ACTION_WORDS
    plan = solve(core)
    return ACTION_WORDS[int(plan[0])] if plan else None


def first_action_env(room_size: int = ROOM_SIZE):
    """``env.factory`` of the single-turn task (``train_throughput:first_action_env``): a
    BabyAI text episode cut to its first action, rewarded by ``action_reward`` against the
    solver's first action. The Environment subclass is defined here so that importing this
    script for its argument parsing does not import the env stack."""
    from jaxdm.envs.babyai import make_text_env
    from jaxdm.envs.babyai.text import ACTION_WORDS
    from jaxdm.envs.core import Environment
    from jaxdm.rl.text import INVALID_COMMAND

    class FirstActionEnv(Environment):
        """One turn of BabyAI text: the episode's first observation, one action, done."""

        name = "babyai_first_action"

        def __init__(self):
            self.inner = make_text_env("train", room_size, max_steps=1)

        @property
        def default_params(self):
            """The inner BabyAI env's params."""
            return self.inner.default_params

        def reset_env(self, key, params):
            """(first BabyAI observation, (BabyAI state, the solver's first action))."""
            obs, state = self.inner.reset_env(key, params)
            return obs, (state, expert_first_action(state.core))

        def reset_info(self, state, params=None):
            """The BabyAI reset facts, a budget of one action and the expected action."""
            return {**self.inner.reset_info(state[0], params), "budget": 1, "expert": state[1]}

        def step_env(self, key, state, action, params):
            """The one step: reward ``action_reward`` (``INVALID_COMMAND``: None), done."""
            inner, expert = state
            r = action_reward(None if action == INVALID_COMMAND else action, expert)
            info = {"admissible_actions": list(ACTION_WORDS), "valid": action in ACTION_WORDS,
                    "won": r == 1.0, "milestone": False, "no_op": False,
                    "goal": self.inner.reset_info(inner)["goal"], "terminated": True,
                    "truncated": False}
            return inner.observation, state, r, True, info

    return FirstActionEnv()


def first_action_tasks(seeds) -> list[dict]:
    """Per task seed: the generative policy's prompt text for the first BabyAI observation
    (what our trainer renders: ``policy_prompt`` with no history) and the solver's action."""
    from jaxdm.rl.text import policy_prompt
    env = first_action_env()
    rows = []
    for s in seeds:
        obs, state = env.reset(int(s))
        info = env.reset_info(state)
        rows.append({"prompt": policy_prompt(info["goal"], obs, info["admissible_actions"],
                                             [], 0),
                     "expert": info["expert"], "seed": int(s)})
    return rows


def grpo_config(args, *, multi_turn: bool, out_dir: str, model_path: str) -> dict:
    """The jaxdm TrainConfig (as a dict) of one GRPO iteration: the single-turn first-action
    task, or (``multi_turn``) BabyAI text episodes of ``args.turns`` actions."""
    pg = args.prompts * args.group
    env = ({"name": "babyai", "factory": "jaxdm.envs.babyai:make_text_env",
            "kwargs": {"split": "train", "room_size": ROOM_SIZE, "max_steps": args.turns}}
           if multi_turn else
           {"name": "babyai_first_action", "factory": "train_throughput:first_action_env",
            "kwargs": {"room_size": ROOM_SIZE}})
    return {
        "seed": 0, "iterations": args.iterations, "tasks_per_iter": args.prompts,
        "group_size": args.group, "max_actions": args.turns if multi_turn else 1,
        "checkpoint_every": 0, "mesh_data": 1, "out_dir": out_dir, "progress": False,
        "model": {"path": model_path, "dtype": "float32", "remat": bool(args.remat)},
        "env": env,
        "policy": {"form": "generative", "history": 2 if multi_turn else 0,
                   "max_prompt_tokens": 1024, "max_response_tokens": args.completion_tokens,
                   "temperature": 1.0, "top_p": 1.0},
        "teacher": {"kind": "none"},
        # One optimiser step per iteration over the whole batch (the mini-batch holds every
        # action of a single-turn iteration); no KL, no entropy: TRL's defaults.
        # (multi-turn: one step per P x G actions, so several steps per iteration).
        "algo": {"advantage": "grpo", "mini_batch": pg,
                 "ppo_epochs": 1, "kl_coef": 0.0, "entropy_coef": 0.0, "invalid_penalty": 0.0,
                 "clip_eps": 0.2, "aggregation": "token-mean"},
        "optim": {"lr": 1e-6, "weight_decay": 0.0, "max_grad_norm": 1.0},
    }


def jaxdm_grpo_child(args, model_path: str, multi_turn: bool) -> dict:
    import jax

    from jaxdm import config as cfgmod
    from jaxdm.rl.trainer import TrainConfig, Trainer
    with tempfile.TemporaryDirectory() as out:
        cfg = cfgmod.from_dict(TrainConfig, grpo_config(args, multi_turn=multi_turn,
                                                        out_dir=out, model_path=model_path))
        trainer = Trainer(cfg, log=False)
        lengths: list[int] = []
        sample = trainer.policy.generate_fn

        def counted(*a, **kw):  # the completion lengths (the trainer's metrics omit them)
            res = sample(*a, **kw)
            lengths.extend(len(t) for t in res.tokens)
            return res

        trainer.policy.generate_fn = counted
        old_logp_s: list[float] = []
        logp = trainer.logp_fn

        def timed_logp(*a):  # the update's pi_old / pi_ref forward passes, for the breakdown
            t0 = time.perf_counter()
            out = jax.block_until_ready(logp(*a))
            old_logp_s.append(time.perf_counter() - t0)
            return out

        trainer.logp_fn = timed_logp
        its = []
        for _ in range(args.iterations):
            n0, k0 = len(lengths), len(old_logp_s)
            t0 = time.perf_counter()
            m = trainer.iteration_step()
            took = time.perf_counter() - t0
            its.append({"s": took, "rollout_s": took - m["time/update"],
                        "generation_s": m["time/generation"], "update_s": m["time/update"],
                        "old_logp_s": sum(old_logp_s[k0:]), "completions": len(lengths) - n0,
                        "completion_tokens": sum(lengths[n0:]), "reward": m["train/reward"]})
        trainer.close()
    return grpo_summary("jaxdm_multiturn" if multi_turn else "jaxdm", its, args.warmup)


def grpo_summary(side: str, its: list[dict], warmup: int) -> dict:
    """Medians over the iterations after ``warmup`` (all when there are no more)."""
    kept = its[warmup:] or its
    med = {k: statistics.median(i[k] for i in kept) for k in its[0]}
    return {"side": side, "iteration_s": round(med["s"], 3),
            "first_iteration_s": round(its[0]["s"], 2),
            "completions_per_s": med["completions"] / med["s"],
            "completion_tokens_per_s": med["completion_tokens"] / med["s"],
            "completions": med["completions"],
            "mean_completion_tokens": round(med["completion_tokens"] / max(med["completions"], 1),
                                            1),
            "rollout_s": round(med["rollout_s"], 3), "update_s": round(med["update_s"], 3),
            "generation_s": round(med["generation_s"], 3),
            "old_logp_s": round(med.get("old_logp_s", 0.0), 3),
            "reward": round(statistics.mean(i["reward"] for i in its), 3),
            "iterations": [round(i["s"], 2) for i in its], "peak_rss_gb": peak_rss_gb()}


def trl_grpo_child(args, model_path: str, tasks_file: str) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    tasks = json.loads(Path(tasks_file).read_text())
    model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(model_path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    gen_s: list[float] = []
    generate = model.generate

    def timed_generate(*a, **kw):  # the rollout share of each step
        t0 = time.perf_counter()
        try:
            return generate(*a, **kw)
        finally:
            gen_s.append(time.perf_counter() - t0)

    model.generate = timed_generate
    marks: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, a, state, control, **kw):
            marks.append(time.perf_counter())

    def reward(prompts, completions, expert, **kw):
        return [completion_reward(c, e) for c, e in zip(completions, expert)]

    out = Path(f"/tmp/jaxdm_trl_grpo_{int(time.time() * 1e6)}")
    pg = args.prompts * args.group
    cfg = GRPOConfig(output_dir=str(out), max_steps=args.iterations, use_cpu=True,
                     num_generations=args.group, per_device_train_batch_size=pg,
                     gradient_accumulation_steps=1, num_iterations=1,
                     max_completion_length=args.completion_tokens, temperature=1.0, top_p=1.0,
                     beta=0.0, epsilon=0.2, loss_type="dapo", learning_rate=1e-6,
                     lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
                     max_grad_norm=1.0, shuffle_dataset=False, logging_steps=1, report_to=[],
                     save_strategy="no", dataloader_num_workers=0, disable_tqdm=True, seed=0,
                     bf16=False)
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=cfg,
                          train_dataset=Dataset.from_list(tasks), processing_class=tok,
                          callbacks=[Clock()])
    t0 = time.perf_counter()
    try:
        trainer.train()
    finally:
        shutil.rmtree(out, ignore_errors=True)  # nothing is saved there (save_strategy "no")
    logs = [h for h in trainer.state.log_history if "reward" in h]
    gaps = [b - a for a, b in zip([t0] + marks, marks)]
    its = [{"s": g, "rollout_s": gs, "generation_s": gs, "update_s": g - gs,
            "old_logp_s": 0.0, "completions": pg,
            "completion_tokens": h.get("completions/mean_length", 0.0) * pg,
            "reward": h["reward"]} for g, gs, h in zip(gaps, gen_s, logs)]
    got = grpo_summary("trl", its, args.warmup)
    got["torch_threads"] = torch.get_num_threads()
    return got


def cut_model_folder(layers: int, into: str) -> str:
    """The packaged SmolLM2 HF folder, or (``layers`` < 30) a copy cut to its first layers
    (``save_pretrained``), which both sides load."""
    from jaxdm.models.loading import save_pretrained
    from jaxdm.models.smollm2 import smollm2, smollm2_path
    path = smollm2_path()
    pre = smollm2()
    if layers >= pre.config.num_layers:
        return str(path)
    cut = first_layers(pre, layers)
    return str(save_pretrained(Path(into) / f"smollm2_{layers}_layers", cut.params, cut.config,
                               source=path))


def run_grpo_child(args, side: str, model_path: str, tasks_file: str) -> dict:
    return child_result(side, [sys.executable, __file__, "--workload", "grpo", "--child", side,
                               "--model-path", model_path, "--rows", tasks_file,
                               *grpo_argv(args)])


def child_result(side: str, cmd: list[str]) -> dict:
    """Run one side in its own process (its own peak RSS) and return its CHILD line's record,
    or an error record with the tail of its stderr; printed as it arrives."""
    p = subprocess.run(cmd, capture_output=True, text=True)
    line = [x for x in p.stdout.splitlines() if x.startswith("CHILD ")]
    got = (json.loads(line[0][6:]) if line and not p.returncode else
           {"side": side, "error": f"exit {p.returncode}: {p.stderr.strip()[-900:]}"})
    print(json.dumps(got), flush=True)
    return got


def grpo_argv(args) -> list[str]:
    """The GRPO settings as child-process arguments."""
    return ["--prompts", str(args.prompts), "--group", str(args.group), "--completion-tokens",
            str(args.completion_tokens), "--iterations", str(args.iterations), "--warmup",
            str(args.warmup), "--turns", str(args.turns)] + (["--remat"] if args.remat else [])


def grpo_results(args, t: dict, j: dict) -> None:
    """The RESULT lines of TRL (``t``) against jaxdm (``j``): medians of their rounds."""
    what = (f"{args.layers} layers fp32 full fine-tune, first BabyAI action, {args.prompts} "
            f"prompts x G {args.group}, <= {args.completion_tokens} new tokens (mean "
            f"{t['mean_completion_tokens']:.1f} TRL, {j['mean_completion_tokens']:.1f} jaxdm); "
            f"rollout/update s TRL {t['rollout_s']:.2f}/{t['update_s']:.2f}, jaxdm "
            f"{j['rollout_s']:.2f}/{j['update_s']:.2f} (of which the pi_old forward "
            f"{j['old_logp_s']:.2f})")
    print(f"RESULT grpo_iteration_s: baseline {t['iteration_s']:.3f} s, jaxdm "
          f"{j['iteration_s']:.3f} s, ratio {t['iteration_s'] / j['iteration_s']:.2f}x "
          f"(TRL GRPOTrainer vs jaxdm Trainer, {what})")
    ratio = j["completions_per_s"] / t["completions_per_s"]
    print(f"RESULT grpo_completions_per_s: baseline {t['completions_per_s']:.3f}, jaxdm "
          f"{j['completions_per_s']:.3f}, ratio {ratio:.2f}x (completion tokens/s "
          f"{t['completion_tokens_per_s']:.1f} vs {j['completion_tokens_per_s']:.1f})")
    print(f"RESULT grpo_peak_rss: baseline {t['peak_rss_gb']:.2f} GiB, jaxdm "
          f"{j['peak_rss_gb']:.2f} GiB, ratio {t['peak_rss_gb'] / j['peak_rss_gb']:.2f}x "
          "(each side's own process)")


def grpo_main(args) -> None:
    sides = [s for s in args.sides if s != "jaxdm_multiturn" or args.turns]
    runs: dict[str, list[dict]] = {s: [] for s in sides}
    n_tasks = args.prompts * args.iterations
    with tempfile.TemporaryDirectory() as tmp:
        model_path = cut_model_folder(args.layers, tmp)
        tasks_file = str(Path(tmp) / "tasks.json")
        Path(tasks_file).write_text(json.dumps(first_action_tasks(range(n_tasks))))
        for _ in range(args.rounds):
            for side in sides:  # alternated: the machine's load hits every side alike
                runs[side].append(run_grpo_child(args, side, model_path, tasks_file))
    ok = {s: [r for r in rs if "iteration_s" in r] for s, rs in runs.items()}
    keys = ("iteration_s", "completions_per_s", "completion_tokens_per_s", "peak_rss_gb",
            "rollout_s", "update_s", "old_logp_s", "mean_completion_tokens")
    med = {s: {k: statistics.median(r[k] for r in rs) for k in keys} for s, rs in ok.items()
           if rs}
    if not med.get("jaxdm"):
        print("RESULT grpo_iteration_s: the jaxdm side failed or was not run; see the lines above")
        return
    j = med["jaxdm"]
    if med.get("trl"):
        grpo_results(args, med["trl"], j)
    if med.get("jaxdm_multiturn"):  # ours only: beside the single-turn iteration
        m = med["jaxdm_multiturn"]
        print(f"RESULT grpo_multiturn_iteration_s: baseline {j['iteration_s']:.3f} s, jaxdm "
              f"{m['iteration_s']:.3f} s, ratio {m['iteration_s'] / j['iteration_s']:.2f}x "
              f"(ours only: single-turn iteration vs a multi-turn BabyAI iteration of "
              f"{args.turns} turns, history 2, same P and G; {m['completions_per_s']:.3f} "
              f"completions/s, rollout/update s {m['rollout_s']:.2f}/{m['update_s']:.2f}, "
              f"peak RSS {m['peak_rss_gb']:.2f} GiB)")


def run_child(args, side: str, rows_file: str) -> dict:
    return child_result(side, [sys.executable, __file__, "--workload", args.workload,
                               "--child", side, "--layers",
                               str(args.layers), "--budget", str(args.budget), "--steps",
                               str(args.steps), "--dtype", args.dtype, "--rows", rows_file]
                       + (["--full"] if args.full else []))


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, with ``--quick``'s reduced settings applied per workload."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--workload", default="sft", choices=("sft", "tool", "grpo"),
                    help="sft: the judge trajectory; tool: the 69-option DECISION GYM tool "
                         "question; grpo: one GRPO iteration")
    ap.add_argument("--child", choices=("jaxdm", "trl", "jaxdm_multiturn"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--budget", type=int, default=30)
    ap.add_argument("--steps", type=int, default=8, help="SFT steps per side and round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--prompts", type=int, default=2, help="GRPO: prompts per iteration")
    ap.add_argument("--group", type=int, default=4, help="GRPO: completions per prompt (G)")
    ap.add_argument("--completion-tokens", type=int, default=32,
                    help="GRPO: max new tokens per completion")
    ap.add_argument("--iterations", type=int, default=5, help="GRPO: iterations per side, round")
    ap.add_argument("--remat", action="store_true",
                    help="GRPO: jaxdm sides recompute each layer in the backward pass "
                         "(model.remat; bounds the multi-turn update's memory)")
    ap.add_argument("--warmup", type=int, default=1, help="GRPO: iterations left out of medians")
    ap.add_argument("--turns", type=int, default=3,
                    help="GRPO: actions per multi-turn episode (0: no multi-turn side)")
    ap.add_argument("--sides", default="trl,jaxdm,jaxdm_multiturn",
                    help="GRPO: which sides to run, comma-separated (RESULT lines need trl and "
                         "jaxdm; each child prints its own JSON line)")
    ap.add_argument("--full", action="store_true",
                    help="sft / tool: a full fine-tune on both sides (every weight trained; "
                         "train-dm in bf16 with fp32 master weights, TRL without PEFT)")
    ap.add_argument("--rows", help=argparse.SUPPRESS)
    ap.add_argument("--model-path", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.workload == "grpo" and args.dtype != "float32":
        ap.error("--workload grpo runs fp32 only (the RL trainer has no mixed-precision mode)")
    args.sides = tuple(x for x in args.sides.split(",") if x)
    unknown = sorted(set(args.sides) - set(GRPO_SIDES))
    if unknown or not args.sides:
        ap.error(f"--sides: unknown or no side(s) {unknown}; known: {list(GRPO_SIDES)}")
    if args.turns < 0:
        ap.error("--turns must be >= 0")
    for name in ("prompts", "group", "completion_tokens", "iterations", "rounds"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.group < 2:
        ap.error("--group must be >= 2 (GRPO normalises within a group)")
    if args.warmup < 0:
        ap.error("--warmup must be >= 0")
    args.items = "judge" if args.workload == "sft" else args.workload  # SFT items to train
    if args.quick and args.workload in ("sft", "tool"):
        args.layers, args.budget, args.steps, args.rounds = 4, 12, 5, 1
    elif args.quick:
        args.layers, args.prompts, args.group, args.completion_tokens = 2, 1, 2, 8
        args.iterations, args.warmup, args.turns, args.rounds = 2, 1, 0, 1
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.workload == "grpo":
        if args.child == "trl":
            got = trl_grpo_child(args, args.model_path, args.rows)
        elif args.child:
            got = jaxdm_grpo_child(args, args.model_path, args.child == "jaxdm_multiturn")
        else:
            return grpo_main(args)
        print("CHILD " + json.dumps(got), flush=True)
        return
    if args.child:
        got = (jaxdm_child(args.layers, args.budget, args.steps, args.dtype, args.items,
                           args.full)
               if args.child == "jaxdm" else
               trl_child(args.layers, args.rows, args.steps, args.dtype, args.full))
        print("CHILD " + json.dumps(got), flush=True)
        return
    runs: dict[str, list[dict]] = {"trl": [], "jaxdm": []}
    with tempfile.TemporaryDirectory() as tmp:
        rows_file = str(Path(tmp) / "trl_rows.json")
        Path(rows_file).write_text(json.dumps(trl_rows(args.budget, args.items)))
        for _ in range(args.rounds):
            for side in runs:  # alternated: the machine's load hits both alike
                runs[side].append(run_child(args, side, rows_file))
    workload = args.items
    ok = {s: [r for r in rs if "step_s" in r] for s, rs in runs.items()}
    if not all(ok.values()):
        print(f"RESULT train_{workload}_questions_per_s: a side failed; see the lines above")
        return
    med = {s: {k: statistics.median(r[k] for r in rs)
               for k in ("questions_per_s", "tokens_per_s", "peak_rss_gb", "step_s")}
           for s, rs in ok.items()}
    t, j = med["trl"], med["jaxdm"]
    if workload == "tool":
        what = (f"{args.layers} layers, {args.dtype}, the 69-option DECISION GYM tool question; "
                f"objectives differ: TRL trains prompt + correct option ({ok['trl'][0]['tokens']:.0f}"
                f" tokens, CE on its tokens), train-dm the whole option distribution (CE + 0.5 SE "
                f"over 69 option likelihoods, {ok['jaxdm'][0]['tokens']} tokens packed); step s "
                f"TRL {t['step_s']:.2f}, jaxdm {j['step_s']:.2f}")
    else:
        what = (f"{args.layers} layers, {args.dtype}, {ok['jaxdm'][0]['questions']}-question "
                f"judge trajectory; tokens per question {ok['trl'][0]['tokens']:.0f} (TRL) vs "
                f"{ok['jaxdm'][0]['tokens'] / ok['jaxdm'][0]['questions']:.1f} (jaxdm)")
    print(f"RESULT train_{workload}_questions_per_s: baseline {t['questions_per_s']:.3f}, jaxdm "
          f"{j['questions_per_s']:.3f}, ratio {j['questions_per_s'] / t['questions_per_s']:.1f}x "
          f"(TRL SFTTrainer {'full fine-tune' if args.full else '+ PEFT LoRA'} vs train-dm"
          f"{' full fine-tune' if args.full else ''}, {what})")
    print(f"RESULT train_{workload}_tokens_per_s: baseline {t['tokens_per_s']:.0f}, jaxdm "
          f"{j['tokens_per_s']:.0f}, ratio {j['tokens_per_s'] / t['tokens_per_s']:.2f}x "
          "(tokens run per second)")
    print(f"RESULT train_{workload}_peak_rss: baseline {t['peak_rss_gb']:.2f} GiB, jaxdm "
          f"{j['peak_rss_gb']:.2f} GiB, ratio {t['peak_rss_gb'] / j['peak_rss_gb']:.2f}x "
          "(each side's own process)")
    floors = [r["floor"] for r in ok["jaxdm"] if "floor" in r]
    if floors:
        fl = min(floors, key=lambda x: x["floor_s"])  # the best rates any round reached
        parts = ", ".join(f"{k} {v:.3f} s" for k, v in fl["seconds"].items())
        rates = ", ".join(f"{k} {v:.0f}" for k, v in fl["gflops"].items())
        print(f"RESULT train_{workload}_floor: baseline {fl['floor_s']:.3f} s, jaxdm "
              f"{j['step_s']:.3f} s, ratio {j['step_s'] / fl['floor_s']:.2f}x (the step's "
              f"multiple of its floor, goal <= 1.5x: {fl['tflop']} TFLOP at the best matmul "
              f"GFLOP/s here ({rates}); floor parts: {parts})")


if __name__ == "__main__":
    main()
