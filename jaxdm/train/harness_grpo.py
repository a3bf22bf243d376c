"""GRPO on the harness (seed 003 §training, App. D): the decision model decides, a fixed agent
LLM does the rest.

Each iteration draws ``tasks_per_iter`` DECISION GYM tasks (train split) and runs each
``group_size`` (G = 8) times through the harness with the decision model holding the tool
choice (REPLACE, as in L3: ``jaxdm.bench.l3.takeover_harness``; the fixed ``SimulatedLLM``
writes the parameters). The decision model is an ``OptionScoringPolicy`` (``jaxdm.rl``): it
*samples* its tool from π(option | question context) and the harness executes it. Every
episode gets the reward

    r = success − λ · max(0, C − N0) / N0 − η · E

with C the episode's agent-LLM calls, E its irreversible errors (DECISION GYM strict mode:
the first one ends the episode, so E ∈ {0, 1}), λ = 0.5, N0 = 10, η = 0.2 (the seed gives the
constants without the functional form; this is ours: a hinge on the calls above the budget
N0, scaled by N0). Advantages come from jaxdm.rl's registered ``grpo`` estimator (group =
the G episodes of one task) and the update is jaxdm.rl's registered ``ppo`` loss term through
``cached_train_step``: this module adds no second GRPO or PPO implementation, only the
harness rollout and the reward.

The iteration's metrics go to ``<out_dir>/metrics.jsonl`` as they are computed; ``evaluate``
runs the greedy decision model on held-out tasks (test split) and reports task success, mean
reward, LLM calls and irreversible errors.
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxdm.decision.types import Cost, MultipleChoice, choice_ok
from jaxdm.jsonl import append_records

LAMBDA, N0, ETA = 0.5, 10, 0.2


def harness_reward(success, llm_calls, irreversible_errors, *, lam: float = LAMBDA,
                   n0: float = N0, eta: float = ETA):
    """r = success − λ·max(0, C − N0)/N0 − η·E, elementwise over arrays of episodes (pure,
    jit-compatible). ``success`` is 0/1 (or bool), ``llm_calls`` C and
    ``irreversible_errors`` E are counts; shapes must match."""
    s = jnp.asarray(success, jnp.float32)
    c = jnp.asarray(llm_calls, jnp.float32)
    e = jnp.asarray(irreversible_errors, jnp.float32)
    if s.shape != c.shape or s.shape != e.shape:
        raise ValueError(f"harness_reward: success {s.shape}, llm_calls {c.shape} and "
                         f"irreversible_errors {e.shape} must have one shape")
    if n0 <= 0:
        raise ValueError(f"harness_reward: n0 must be > 0, got {n0}")
    return s - lam * jnp.maximum(0.0, c - n0) / n0 - eta * e


@dataclasses.dataclass(frozen=True)
class HarnessGRPOConfig:
    """model: "tiny" (a random decoder with a word tokenizer over DECISION GYM texts, for CPU
    runs and tests), "smollm2" or an HF folder (e.g. an exported SFT model)."""

    model: str = "tiny"
    iterations: int = 3
    tasks_per_iter: int = 4
    group_size: int = 8
    variant: str = "base"
    max_steps: int = 20
    llm: Mapping[str, Any] = dataclasses.field(
        default_factory=lambda: {"kind": "simulated", "profile": "strong"})
    lam: float = LAMBDA
    n0: int = N0
    eta: float = ETA
    lr: float = 1e-5
    clip_eps: float = 0.2
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    mini_batch: int = 64
    ppo_epochs: int = 1
    temperature: float = 1.0
    max_context_tokens: int = 512
    max_option_tokens: int = 12
    eval_tasks: int = 8
    seed: int = 0
    out_dir: str = "harness_grpo_out"
    # tiny model shape
    hidden_size: int = 64
    num_layers: int = 2

    def __post_init__(self):
        for k in ("iterations", "tasks_per_iter", "group_size", "max_steps", "mini_batch",
                  "ppo_epochs", "max_context_tokens", "max_option_tokens", "n0"):
            v = getattr(self, k)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"harness-grpo: {k} must be a positive int, got {v!r}")
        if self.eval_tasks < 0:
            raise ValueError(f"harness-grpo: eval_tasks must be >= 0, got {self.eval_tasks}")
        for k in ("lam", "eta", "lr", "clip_eps", "kl_coef", "entropy_coef", "temperature"):
            v = getattr(self, k)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"harness-grpo: {k} must be a finite number >= 0, got {v!r}")
        if self.temperature <= 0:
            raise ValueError("harness-grpo: temperature must be > 0")


class PolicyDM:
    """The option-scoring policy as a harness decision model: ``choose`` samples (or, greedy,
    takes the argmax of) π over the question's options and returns a one-hot distribution on
    that option (REPLACE executes it); every decision's training unit and sampling log-prob
    are kept in ``taken`` until the caller collects them."""

    def __init__(self, policy: Any, params: Any, key: jax.Array, *, budget: int,
                 greedy: bool = False, name: str = "policy"):
        self.policy, self.params, self.key = policy, params, key
        self.budget, self.greedy, self.name = budget, greedy, name
        self.taken: list[tuple[str, Any]] = []   # (context text, ActionOut)

    def choose(self, questions: Sequence[MultipleChoice]):
        from jaxdm.rl.policy import TurnInput

        turns = []
        for i, q in enumerate(questions):
            if not isinstance(q, MultipleChoice):
                raise TypeError(f"questions[{i}] is {type(q).__name__}, expected MultipleChoice")
            # the question's context already shows the conversation so far: no history
            # block, and no step counter (budget 0 leaves "of N" out)
            turns.append(TurnInput(goal=q.question, observation=q.context,
                                   admissible=tuple(q.options), history=(),
                                   steps_taken=0, budget=0))
        self.key, sub = jax.random.split(self.key)
        t0 = time.perf_counter()
        outs = self.policy.act(self.params, turns, sub, greedy=self.greedy)
        seconds = (time.perf_counter() - t0) / max(len(turns), 1)
        results = []
        for q, out in zip(questions, outs):
            c = out.unit["chosen"]
            self.taken.append((q.context, out))
            results.append(choice_ok([1.0 if j == c else 0.0 for j in range(len(q.options))],
                                     cost=Cost(seconds=seconds)))
        return results


def _tiny_model(cfg: HarnessGRPOConfig):
    from jaxdm.envs.decision_gym import DecisionGym, GymParams, render_context, tool_question
    from jaxdm.models import decoder
    from jaxdm.models.config import ModelConfig
    from jaxdm.rl import text as rltext

    env = DecisionGym()
    texts = [rltext.option_context("g", "o", [], 0, 1), "Which tool should the agent call next?"]
    for variant in ("base", "shift", "hard"):
        p = GymParams(variant=variant, split="train")
        for i in range(8):
            _, st = env.reset(i, p)
            ctx = render_context(st)
            texts += [ctx, *tool_question(st, p, ctx, require_key=False).options]
    tok = rltext.WordTokenizer.from_texts(texts)
    mcfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=cfg.hidden_size,
                       intermediate_size=2 * cfg.hidden_size, num_layers=cfg.num_layers,
                       num_heads=4, num_kv_heads=2, head_dim=cfg.hidden_size // 4,
                       tie_embeddings=True, dtype="float32")
    return decoder.init_params(mcfg, jax.random.key(cfg.seed)), mcfg, tok


def build_policy(cfg: HarnessGRPOConfig):
    """(OptionScoringPolicy, params) for ``cfg.model``."""
    from jaxdm.rl import text as rltext
    from jaxdm.rl.policy import OptionScoringPolicy

    if cfg.model == "tiny":
        params, mcfg, tok = _tiny_model(cfg)
    else:
        from jaxdm.models.lora import load_model
        pre = load_model(cfg.model)
        params, mcfg, tok = pre.params, pre.config, rltext.HFTokenizer(pre.tokenizer)
    policy = OptionScoringPolicy(mcfg, tok, history=0, max_context_tokens=cfg.max_context_tokens,
                                 max_option_tokens=cfg.max_option_tokens, max_options=128,
                                 temperature=cfg.temperature)
    return policy, params


def _episode_record(ep: Any, taken: Sequence[tuple[str, Any]], group: int, seed: int,
                    reward: float, budget: int):
    from jaxdm.rl.rollout import ActionRecord, EpisodeRecord

    actions = [ActionRecord(observation=ctx, out=out, command=out.action or "", reward=0.0,
                            annotations={}, env_valid=True) for ctx, out in taken]
    return EpisodeRecord(slot=0, group=group, task_seed=seed, goal="", task_type="gym",
                         budget=budget, actions=actions, reward=float(reward),
                         success=bool(ep.success), truncated=ep.end == "truncated")


def rollout(policy: Any, params: Any, cfg: HarnessGRPOConfig, split: str,
            indices: Sequence[int], key: jax.Array, *, group_size: int, greedy: bool = False):
    """Run each task index ``group_size`` times; (EpisodeRecords, per-episode rows)."""
    from jaxdm.bench.l3 import irreversible_errors, takeover_harness
    from jaxdm.envs.decision_gym import DecisionGym, GymParams
    from jaxdm.harness.llm import make_llm

    env = DecisionGym()
    params_env = GymParams(variant=cfg.variant, strict=True, max_steps=cfg.max_steps,
                           split=split)
    dm = PolicyDM(policy, params, key, budget=cfg.max_steps, greedy=greedy)
    harness = takeover_harness(cfg.variant, make_llm(dict(cfg.llm)), dm)
    records, rows = [], []
    for g, idx in enumerate(indices):
        for _ in range(group_size):
            dm.taken = []
            ep = harness.run_task(env, int(idx), params_env)
            e = irreversible_errors(ep)
            r = float(harness_reward(float(ep.success), ep.llm_calls, e, lam=cfg.lam,
                                     n0=cfg.n0, eta=cfg.eta))
            records.append(_episode_record(ep, dm.taken, g, int(idx), r, cfg.max_steps))
            rows.append({"task": int(idx), "success": bool(ep.success), "reward": r,
                         "llm_calls": ep.llm_calls, "dm_calls": ep.dm_calls,
                         "irreversible_errors": e, "steps": ep.steps, "end": ep.end})
    return records, rows


def _row_summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    n = max(len(rows), 1)
    return {"success": sum(r["success"] for r in rows) / n,
            "reward": sum(r["reward"] for r in rows) / n,
            "llm_calls": sum(r["llm_calls"] for r in rows) / n,
            "irreversible_errors": sum(r["irreversible_errors"] for r in rows) / n,
            "steps": sum(r["steps"] for r in rows) / n}


class HarnessGRPO:
    """The GRPO loop (module docstring); ``step()`` runs one iteration."""

    def __init__(self, cfg: HarnessGRPOConfig, policy: Any = None, params: Any = None):
        from jaxdm.rl.estimators import ESTIMATORS, bucket_int
        from jaxdm.rl.terms import LossConfig, StepSpec, cached_train_step
        from jaxdm.rl.train_config import AlgoSection, OptimSection

        self.cfg = cfg
        if policy is None:
            policy, params = build_policy(cfg)
        self.policy, self.params = policy, params
        self.ref_params = params
        self.algo = AlgoSection(advantage="grpo")
        self.estimator = ESTIMATORS["grpo"]
        self.num_groups = bucket_int(cfg.tasks_per_iter)
        spec = StepSpec(policy_key=policy.static_key, critic_config=None,
                        optim=OptimSection(lr=cfg.lr),
                        critic_lr=None,
                        loss=LossConfig(terms=(("ppo", 1.0),), clip_eps=cfg.clip_eps,
                                        kl_coef=cfg.kl_coef, entropy_coef=cfg.entropy_coef))
        self.train_step, self.logp_fn, txs = cached_train_step(policy, spec)
        self.opt_states = {"policy": txs["policy"].init(params)}
        self.key = jax.random.key(cfg.seed)
        self.iteration = 0
        self.out = Path(cfg.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)

    def _log(self, row: Mapping[str, Any]) -> None:
        append_records(self.out / "metrics.jsonl", [row])

    def step(self) -> dict[str, Any]:
        from jaxdm.envs.decision_gym.world import SPLIT_RANGES
        from jaxdm.rl.estimators import episode_batch

        cfg = self.cfg
        t0 = time.perf_counter()
        n_train = SPLIT_RANGES["train"][1] - SPLIT_RANGES["train"][0]
        rng = np.random.default_rng([cfg.seed, self.iteration])
        tasks = [int(i) for i in rng.choice(n_train, cfg.tasks_per_iter, replace=False)]
        self.key, k_roll = jax.random.split(self.key)
        eps, rows = rollout(self.policy, self.params, cfg, "train", tasks, k_roll,
                            group_size=cfg.group_size)
        t_roll = time.perf_counter() - t0
        max_actions = max(max(len(e.actions) for e in eps), 1)
        eb = episode_batch(eps, max_actions, penalty=0.0)
        adv = self.estimator.fn(eb, {}, self.algo, self.num_groups)
        met = self._update(eb, adv.adv)
        out = {"iteration": self.iteration + 1, "tasks": tasks, **_row_summary(rows),
               "decisions": len(eb.units),
               "nonzero_adv_share": float((np.abs(adv.adv[eb.mask]) > 1e-6).mean())
               if eb.mask.any() else 0.0,
               "rollout_s": round(t_roll, 2), "seconds": round(time.perf_counter() - t0, 2),
               **met}
        rewards = np.array([r["reward"] for r in rows]).reshape(len(tasks), cfg.group_size)
        out["groups_with_signal"] = int((rewards.std(axis=1) > 1e-9).sum())
        self.iteration += 1
        self._log(out)
        return out

    def _update(self, eb: Any, adv: np.ndarray) -> dict[str, float]:
        cfg, units = self.cfg, eb.units
        n = len(units)
        if n == 0:
            return {"ppo/updates": 0.0}
        unit_adv = adv[eb.unit_rows, eb.unit_cols]
        m = cfg.mini_batch
        order = np.random.default_rng([cfg.seed, self.iteration, 1]).permutation(n)
        batches = []
        for b in range(-(-n // m)):
            idx = order[b * m:(b + 1) * m]
            batch = {"policy": self.policy.training_batch([units[j] for j in idx], m)}
            a = np.zeros((m,), np.float32)
            a[:len(idx)] = unit_adv[idx]
            lp = np.zeros((m, 1), np.float32)
            lp[:len(idx), 0] = eb.unit_logp[idx]
            batch["adv"], batch["old_logp"] = a, lp
            batch["ref_logp"] = (self.logp_fn(self.ref_params, batch["policy"])
                                 if cfg.kl_coef else lp)
            batches.append(batch)
        sums: dict[str, float] = {}
        count = 0
        for epoch in range(cfg.ppo_epochs):
            for j, batch in enumerate(batches):
                new, self.opt_states, met = self.train_step({"policy": self.params},
                                                            self.opt_states, batch)
                met = {k: float(v) for k, v in met.items()}
                for k in ("loss/total", "optim/grad_norm"):
                    if k in met and not math.isfinite(met[k]):
                        raise FloatingPointError(
                            f"harness-grpo iteration {self.iteration + 1}: non-finite {k} = "
                            f"{met[k]} (epoch {epoch}, mini-batch {j}); parameters of the "
                            "previous step kept")
                self.params = new["policy"]
                for k, v in met.items():
                    sums[k] = sums.get(k, 0.0) + v
                count += 1
        return {"ppo/updates": float(count),
                **{k: sums[k] / count for k in sums
                   if k.startswith(("loss/", "optim/")) and not k.endswith(("/sum", "/count"))}}

    def evaluate(self, split: str = "test", tasks: int | None = None) -> dict[str, Any]:
        """Greedy decisions on ``tasks`` held-out tasks (indices 0..tasks-1 of ``split``)."""
        n = self.cfg.eval_tasks if tasks is None else tasks
        _, rows = rollout(self.policy, self.params, self.cfg, split, list(range(n)),
                          jax.random.key(0), group_size=1, greedy=True)
        return {"split": split, "tasks": n, **_row_summary(rows)}


def train(cfg: HarnessGRPOConfig, *, overwrite: bool = False) -> dict[str, Any]:
    """Evaluate, run ``cfg.iterations`` iterations, evaluate again; writes ``metrics.jsonl``
    and ``summary.json`` to ``cfg.out_dir``. An earlier run's files there are replaced only
    with ``overwrite`` (else FileExistsError): metrics would otherwise append to them."""
    from jaxdm.runlog import refuse_overwrite
    files = [Path(cfg.out_dir) / name for name in ("metrics.jsonl", "summary.json")]
    refuse_overwrite(files, overwrite=overwrite)
    for f in files:
        f.unlink(missing_ok=True)
    t0 = time.perf_counter()
    g = HarnessGRPO(cfg)
    before = g.evaluate() if cfg.eval_tasks else None
    g._log({"eval": "before", **(before or {})})
    its = [g.step() for _ in range(cfg.iterations)]
    after = g.evaluate() if cfg.eval_tasks else None
    g._log({"eval": "after", **(after or {})})
    summary = {"config": {k: (dict(v) if isinstance(v, Mapping) else v)
                          for k, v in dataclasses.asdict(cfg).items()},
               "before": before, "after": after, "iterations": its,
               "seconds": round(time.perf_counter() - t0, 1)}
    (Path(cfg.out_dir) / "summary.json").write_text(json.dumps(summary, indent=2),
                                                    encoding="utf-8")
    return summary


__all__ = ["harness_reward", "HarnessGRPOConfig", "HarnessGRPO", "PolicyDM", "build_policy",
           "rollout", "train", "LAMBDA", "N0", "ETA"]
