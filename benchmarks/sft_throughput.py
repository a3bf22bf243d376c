"""SFT throughput: jaxdm packed SFT vs transformers' torch training one sequence per question.

Same model (SmolLM2-135M-Instruct fp32; ``--layers k`` keeps its first k layers, so both sides
load the same truncated checkpoint, written by ``jaxdm.models.loading.save_pretrained``), same
examples, same loss, same update:

- examples: every action of N ALFWorld-shaped trajectories (``jaxdm.decision.synthetic``)
  judged under Hindsight + Progress (``jaxdm.roles.judge_requests``), label Yes for a
  milestone, No otherwise; the prompts and token ids are the ones ``LocalReadout`` scores;
- loss: CE + 0.5·SE against the one-hot target over (Yes, No) (``jaxdm.train.losses``),
  mean over a trajectory's questions; one AdamW step (lr 1e-4) per trajectory, all weights.

jaxdm: one packed forward + backward per trajectory (the context once, every question's few
tokens after it; ``jaxdm.train.packing``; ``--layout rows``, train-dm's default: the context
as a KV cache and the questions as rows over it; ``packed``: one row per context, which on 30
layers x 30 questions needed more than 15 GB in the backward pass and was OOM-killed here),
jitted (compile excluded: one warm-up step).
Baseline: per question one forward of its full prompt (``logits_to_keep=1``) and a backward,
gradients accumulated over the questions, then the optimiser step. The baseline's cost per
question does not depend on how many are trained together, so each round trains an evenly
spread subset (``--baseline-per-round``) and its rate is questions / second. Rounds alternate;
medians reported. Before training, the Yes probabilities both sides compute for the baseline's
questions are compared (max |diff|).

Tokens per question: tokens a step runs / questions it trains (jaxdm: trunk + suffixes;
baseline: the whole prompt per question).

  python benchmarks/sft_throughput.py            # 30 layers, 2 trajectories x 30 actions, 3 rounds
  python benchmarks/sft_throughput.py --quick    # 4 layers, 1 x 12 actions, 1 round (< 60 s)
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scoring_throughput import pick_torch_threads  # noqa: E402


def build_model(layers: int):
    import jax
    from jaxdm.models.loading import save_pretrained
    from jaxdm.models.smollm2 import smollm2
    pre = smollm2()
    if layers < pre.config.num_layers:
        params = dict(pre.params)
        params["layers"] = jax.tree.map(lambda x: x[:layers], pre.params["layers"])
        pre = pre.__class__(params=params, config=pre.config.replace(num_layers=layers),
                            tokenizer=pre.tokenizer, chat_template=pre.chat_template,
                            path=pre.path)
    folder = save_pretrained(tempfile.mkdtemp(prefix="sft-bench-") + "/model", pre.params,
                             pre.config, tokenizer=pre.tokenizer, source=pre.path)
    return pre, folder


def build_items(n_traj: int, n_actions: int):
    from jaxdm.decision.synthetic import alfworld_like_trajectory
    from jaxdm.roles import judge_requests
    from jaxdm.train.packing import SFTItem
    out = []
    for i in range(n_traj):
        traj = alfworld_like_trajectory(seed=i, n_actions=n_actions)
        items = []
        for j, q in enumerate(judge_requests(traj, question="progress", context="hindsight")):
            milestone = bool((q.meta.get("annotations") or {}).get("milestone"))
            items.append(SFTItem(q, (0,) if milestone else (1,), source=f"traj{i}:{j}"))
        out.append(items)
    return out


class TorchTrainer:
    def __init__(self, folder, lr: float, threads: int | None):
        import torch
        from transformers import LlamaForCausalLM
        self.torch = torch
        self.model = LlamaForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
        self.model.train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.0)
        if threads:
            torch.set_num_threads(threads)
        else:
            self.threads = pick_torch_threads(torch, self.model)

    def yes_probs(self, reqs) -> np.ndarray:
        torch = self.torch
        out = []
        with torch.inference_mode():
            for r in reqs:
                logits = self.model(torch.tensor([list(r.tokens)]), logits_to_keep=1).logits[0, -1]
                out.append(torch.softmax(logits[list(r.candidates[0])], -1)[0].item())
        return np.asarray(out)

    def step(self, reqs, targets: np.ndarray) -> float:
        """One update over the questions: per question forward + backward, then AdamW."""
        torch = self.torch
        self.opt.zero_grad(set_to_none=True)
        total = 0.0
        for r, t in zip(reqs, targets):
            logits = self.model(torch.tensor([list(r.tokens)]), logits_to_keep=1).logits[0, -1]
            logp = torch.log_softmax(logits[list(r.candidates[0])], -1)
            tt = torch.tensor(t, dtype=torch.float32)
            loss = -(tt * logp).sum() + 0.5 * ((logp.exp() - tt) ** 2).sum()
            (loss / len(reqs)).backward()
            total += float(loss.detach())
        self.opt.step()
        return total / len(reqs)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--trajectories", type=int, default=None)
    ap.add_argument("--actions", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--baseline-per-round", type=int, default=None)
    ap.add_argument("--torch-threads", type=int, default=None)
    ap.add_argument("--layout", choices=("rows", "packed"), default="rows",
                    help="scorer layout trained through (train-dm's default: rows)")
    args = ap.parse_args(argv)
    q = args.quick
    layers = args.layers or (4 if q else 30)
    n_traj = args.trajectories or (1 if q else 2)
    n_actions = args.actions or (12 if q else 30)
    rounds = args.rounds or (1 if q else 3)
    per_round = args.baseline_per_round or (3 if q else 6)

    import jax
    import jax.numpy as jnp
    from jaxdm.train import packing, sft

    pre, folder = build_model(layers)
    states = build_items(n_traj, n_actions)
    encoder = packing.Encoder(pre, mode="readout")
    packed = []
    for items in states:
        batch, window, full_vocab, stats = packing.pack_items(encoder, items,
                                                              layout=args.layout)
        packed.append((jax.tree.map(jnp.asarray, batch), window, full_vocab, stats))
    n_q = sum(len(s) for s in states)
    step_fn, optimizer = sft.train_step_fn(pre.config, None, 0.5, 1e-4, 0.0)
    params = pre.params
    opt_state = optimizer.init(params)

    # Agreement before training: Yes probabilities of the baseline's first questions.
    torch_tr = TorchTrainer(folder, 1e-4, args.torch_threads)
    reqs_all = [[encoder.requests(it)[0][0] for it in items] for items in states]
    flat_reqs = [r for rs in reqs_all for r in rs]
    check = list(range(min(3, len(flat_reqs))))
    b0, w0, fv0, _ = packed[0]
    jax_yes = np.exp(np.asarray(packing.option_scores(params, pre.config, b0, window=w0,
                                                      full_vocab=fv0)))
    jax_yes = jax_yes[:, 0] / jax_yes[:, :2].sum(-1)
    diff = float(np.max(np.abs(jax_yes[check] - torch_tr.yes_probs([flat_reqs[i]
                                                                     for i in check]))))

    t0 = time.perf_counter()
    for b, w, fv, _ in packed:                                   # compile (excluded)
        out = step_fn(params, opt_state, params, b, w, fv)
        jax.block_until_ready(out[2])
    compile_s = time.perf_counter() - t0

    flat_t = np.asarray([[1.0, 0.0] if it.answer == (0,) else [0.0, 1.0]
                         for items in states for it in items])
    jax_rates, torch_rates = [], []
    for rnd in range(rounds):
        idx = [(rnd + i * max(len(flat_reqs) // per_round, 1)) % len(flat_reqs)
               for i in range(per_round)]
        t0 = time.perf_counter()
        torch_tr.step([flat_reqs[i] for i in idx], flat_t[idx])
        torch_rates.append(len(idx) / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        for b, w, fv, _ in packed:
            params, opt_state, loss, _, _ = step_fn(params, opt_state, params, b, w, fv)
        jax.block_until_ready(loss)
        jax_rates.append(n_q / (time.perf_counter() - t0))
        if not np.isfinite(float(loss)):
            raise SystemExit(f"jaxdm loss not finite in round {rnd}")

    uniq = sum(p[3]["unique_tokens"] for p in packed)
    req_tokens = sum(len(r.tokens) for r in flat_reqs)
    jt, bt = statistics.median(jax_rates), statistics.median(torch_rates)
    print(f"layout {args.layout}; model: SmolLM2-135M first {layers} layers (fp32); "
          f"{n_traj} trajectories x "
          f"{n_actions} actions = {n_q} questions; {rounds} rounds; baseline {per_round} "
          f"questions per round; torch threads {getattr(torch_tr, 'threads', args.torch_threads)}"
          f"; jaxdm compile {compile_s:.1f} s (excluded)")
    print(f"P(Yes) before training, jaxdm vs torch, max |diff| over {len(check)} questions: "
          f"{diff:.2e}")
    print(f"jaxdm rounds q/s: {[round(x, 2) for x in jax_rates]}; torch rounds q/s: "
          f"{[round(x, 3) for x in torch_rates]}")
    print(f"RESULT sft_questions_per_s: baseline {bt:.3f} q/s, jaxdm {jt:.3f} q/s, "
          f"ratio {jt / bt:.2f}x")
    print(f"RESULT sft_tokens_per_question: baseline {req_tokens / n_q:.1f} tokens, jaxdm "
          f"{uniq / n_q:.1f} tokens, ratio {(req_tokens / n_q) / (uniq / n_q):.2f}x")


if __name__ == "__main__":
    main()
