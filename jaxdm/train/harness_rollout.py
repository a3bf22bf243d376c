"""GRPO on the harness (seed 003 §training, App. D) as the trainer's rollout kind ``harness``.

The decision model decides, a fixed agent LLM does the rest: each episode is one DECISION GYM
task run through the harness with the decision model holding the tool choice (REPLACE, as in
L3: ``jaxdm.bench.l3.takeover_harness``; the agent LLM, ``env.kwargs.llm``, a SimulatedLLM by
default, writes the parameters). The decision model is an ``OptionScoringPolicy``: it
*samples* its tool from π(option | question context) and the harness executes it. Every
episode gets the reward

    r = success − λ · max(0, C − N0) / N0 − η · E

with C the episode's agent-LLM calls, E its irreversible errors (DECISION GYM strict mode:
the first one ends the episode, so E ∈ {0, 1}), λ = 0.5, N0 = 10, η = 0.2 (the seed gives the
constants without the functional form; this is ours: a hinge on the calls above the budget
N0, scaled by N0).

Everything else is the trainer's (``jaxdm.rl.trainer``): the ``grpo`` estimator (group = the
``group_size`` episodes of one task), the ``ppo`` loss term, checkpoints and exact resume,
metrics JSONL, NaN guards, the held-out evaluation. Importing this module registers
``policy.kind: harness`` and its rollout kind (``jaxdm.rl.build.register_rollout_kind``);
``experiments/configs/teacher_grpo_harness.yaml`` is the preset. Config keys read here:

- ``env.name: decision_gym``; ``env.kwargs``: ``variant`` (base / shift / hard), ``llm``
  (a ``jaxdm.harness.llm.make_llm`` spec), ``lam``, ``n0``, ``eta``; ``env.eval_kwargs``:
  ``variant``, ``split`` (default ``test``);
- ``max_actions``: the gym's step budget; ``seed``: the task draw (iteration i plays
  ``tasks_per_iter`` distinct train-split tasks drawn by ``numpy.random.default_rng([seed,
  i])``); evaluation plays test-split tasks ``eval_task_offset + 0 .. eval_tasks - 1`` once per
  eval seed (greedy with ``eval_greedy``);
- ``model``: ``path`` (an HF / adapter folder or ``smollm2``) or the tiny random decoder with a
  word tokenizer over DECISION GYM texts; ``policy``: ``form: option``, ``max_prompt_tokens``
  (the question context's tokens), ``max_option_tokens``, ``temperature``.
"""
from __future__ import annotations

import math
import time
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxdm import runlog
from jaxdm.bench.l3 import GYM_VARIANTS, irreversible_errors, takeover_harness
from jaxdm.decision.types import Cost, MultipleChoice, choice_ok
from jaxdm.envs.decision_gym import DecisionGym, GymParams, render_context, tool_question
from jaxdm.envs.decision_gym.world import SPLIT_RANGES
from jaxdm.harness.llm import LLM_KINDS, make_llm
from jaxdm.rl import build
from jaxdm.rl import text as rltext
from jaxdm.rl.collect import RolloutKind
from jaxdm.rl.estimators import episode_batch
from jaxdm.rl.policy import OptionScoringPolicy, TurnInput
from jaxdm.rl.rollout import ActionRecord, EpisodeRecord

LAMBDA, N0, ETA = 0.5, 10, 0.2
ENV_NAME = "decision_gym"
KWARGS = {"variant": "base", "llm": {"kind": "simulated", "profile": "strong"},
          "lam": LAMBDA, "n0": N0, "eta": ETA}
EVAL_KWARGS = {"variant": None, "split": "test"}   # variant None: env.kwargs.variant


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


def harness_settings(cfg) -> dict[str, Any]:
    """``env.kwargs`` over the defaults ``KWARGS``, and the eval split's variant and split;
    ValueError naming the key (``env.kwargs.<k>`` / ``env.eval_kwargs.<k>``) when bad."""
    kw, ev = dict(cfg.env.kwargs), dict(cfg.env.eval_kwargs)
    for where, got, known in (("env.kwargs", kw, KWARGS), ("env.eval_kwargs", ev, EVAL_KWARGS)):
        unknown = sorted(set(got) - set(known))
        if unknown:
            raise ValueError(f"{where}.{unknown[0]}: not a setting of policy.kind=harness; "
                             f"known: {sorted(known)}")
    out = {**KWARGS, **kw}
    out["eval_variant"] = ev.get("variant") or out["variant"]
    out["eval_split"] = ev.get("split", EVAL_KWARGS["split"])
    for key, v in (("env.kwargs.variant", out["variant"]),
                   ("env.eval_kwargs.variant", out["eval_variant"])):
        if v not in GYM_VARIANTS:
            raise ValueError(f"{key}: {v!r} is not a DECISION GYM variant {list(GYM_VARIANTS)}")
    SPLIT_RANGES.validate(out["eval_split"], field="env.eval_kwargs.split")
    for k in ("lam", "eta"):
        v = out[k]
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) \
                or v < 0:
            raise ValueError(f"env.kwargs.{k}: must be a finite number >= 0, got {v!r}")
    if not isinstance(out["n0"], int) or isinstance(out["n0"], bool) or out["n0"] < 1:
        raise ValueError(f"env.kwargs.n0: must be a positive int, got {out['n0']!r}")
    llm = out["llm"]
    if not isinstance(llm, Mapping):
        raise ValueError(f"env.kwargs.llm: a make_llm spec (a mapping with a kind), got {llm!r}")
    LLM_KINDS.validate(llm.get("kind"), field="env.kwargs.llm.kind")
    if llm["kind"] == "simulated":  # cheap to build: its keys are checked now
        try:
            make_llm(dict(llm))
        except ValueError as e:  # HarnessError naming the spec's key
            raise ValueError(f"env.kwargs.llm: {e}") from None
    return out


def check_config(cfg) -> None:
    """What ``policy.kind: harness`` cannot serve, named by its config key."""
    harness_settings(cfg)
    if cfg.policy.form != "option":
        raise ValueError(f"policy.form: {cfg.policy.form!r}; policy.kind=harness scores the "
                         f"harness's options (form: option)")
    if cfg.algo.terms:
        raise ValueError(f"algo.terms: {sorted(cfg.algo.terms)} need signals the harness "
                         f"rollout does not record; policy.kind=harness trains ppo only")


class PolicyDM:
    """The option-scoring policy as a harness decision model: ``choose`` samples (or, greedy,
    takes the argmax of) π over the question's options and returns a one-hot distribution on
    that option (REPLACE executes it); every decision's training unit and sampling log-prob
    are kept in ``taken`` until the caller collects them; ``act_s`` sums the policy's time."""

    def __init__(self, policy: Any, params: Any, key: jax.Array, *, greedy: bool = False,
                 name: str = "policy"):
        self.policy, self.params, self.key = policy, params, key
        self.greedy, self.name = greedy, name
        self.taken: list[tuple[str, Any]] = []   # (context text, ActionOut)
        self.act_s = 0.0

    def choose(self, questions: Sequence[MultipleChoice]):
        """One ``choice_ok`` per question: one-hot on the sampled (greedy: argmax) option."""
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
        spent = time.perf_counter() - t0
        self.act_s += spent
        seconds = spent / max(len(turns), 1)
        results = []
        for q, out in zip(questions, outs):
            c = out.unit["chosen"]
            self.taken.append((q.context, out))
            results.append(choice_ok([1.0 if j == c else 0.0 for j in range(len(q.options))],
                                     cost=Cost(seconds=seconds)))
        return results


def vocabulary_texts() -> list[str]:
    """The texts the tiny model's word tokenizer covers: the policy's prompt template and the
    contexts and tool options of 8 train-split tasks of each variant."""
    env = DecisionGym()
    texts = [rltext.option_context("g", "o", [], 0, 1), "Which tool should the agent call next?"]
    for variant in GYM_VARIANTS:
        p = GymParams(variant=variant, split="train")
        for i in range(8):
            _, st = env.reset(i, p)
            ctx = render_context(st)
            texts += [ctx, *tool_question(st, p, ctx, require_key=False).options]
    return texts


def build_policy(cfg, train_factory=None, eval_factory=None):
    """(OptionScoringPolicy, params, model config, tokenizer) of ``policy.kind: harness``:
    ``model.path`` or the tiny decoder over ``vocabulary_texts``; no history block (the
    question's context is the conversation), up to 128 options (the gym's tool list)."""
    del train_factory, eval_factory  # the harness plays its own env
    params, mcfg, tok = build.decoder_model(cfg, vocabulary_texts)
    p = cfg.policy
    policy = OptionScoringPolicy(mcfg, tok, history=0, max_context_tokens=p.max_prompt_tokens,
                                 max_option_tokens=p.max_option_tokens, max_options=128,
                                 normalize=p.normalize_options, temperature=p.temperature)
    return policy, params, mcfg, tok


def iteration_tasks(seed: int, iteration: int, count: int) -> list[int]:
    """The ``count`` distinct train-split task indices iteration ``iteration`` (0-based)
    plays: ``default_rng([seed, iteration])``."""
    lo, hi = SPLIT_RANGES["train"]
    rng = np.random.default_rng([seed, iteration])
    return [int(i) for i in rng.choice(hi - lo, count, replace=False)]


def play(policy: Any, params: Any, settings: Mapping[str, Any], *, variant: str, split: str,
         max_steps: int, indices: Sequence[int], key: jax.Array, group_size: int,
         greedy: bool = False) -> tuple[list[EpisodeRecord], list[dict[str, Any]], float]:
    """Run each task index ``group_size`` times through the takeover harness; (one
    ``EpisodeRecord`` per episode, its row of harness counts, seconds in ``policy.act``).
    An episode the harness could not finish (``Episode.incomplete``: an LLM or model answer
    lost) is an errored record: the trainer masks it out and counts it in ``env/errors``."""
    env = DecisionGym()
    env_params = GymParams(variant=variant, strict=True, max_steps=max_steps, split=split)
    dm = PolicyDM(policy, params, key, greedy=greedy)
    harness = takeover_harness(variant, make_llm(dict(settings["llm"])), dm)
    records, rows = [], []
    for g, idx in enumerate(indices):
        for _ in range(group_size):
            dm.taken = []
            ep = harness.run_task(env, int(idx), env_params)
            e = irreversible_errors(ep)
            r = float(harness_reward(float(ep.success), ep.llm_calls, e, lam=settings["lam"],
                                     n0=settings["n0"], eta=settings["eta"]))
            actions = [ActionRecord(observation=ctx, out=out, command=out.action or "",
                                    reward=0.0, annotations={}, env_valid=True)
                       for ctx, out in dm.taken]
            records.append(EpisodeRecord(
                slot=len(records), group=g, task_seed=int(idx), goal="", task_type=variant,
                budget=max_steps, actions=actions, reward=r, success=bool(ep.success),
                truncated=ep.end == "truncated",
                error="incomplete: an answer was lost" if ep.incomplete else None))
            rows.append({"task": int(idx), "success": bool(ep.success), "reward": r,
                         "llm_calls": ep.llm_calls, "dm_calls": ep.dm_calls,
                         "irreversible_errors": e, "steps": ep.steps, "end": ep.end})
    return records, rows, dm.act_s


def row_summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Means over episodes: success, reward, llm_calls, irreversible_errors, steps."""
    n = max(len(rows), 1)
    return {k: float(sum(r[k] for r in rows) / n)
            for k in ("success", "reward", "llm_calls", "irreversible_errors", "steps")}


class HarnessCollector:
    """Rollout kind ``harness`` (module docstring): ``collect`` plays one iteration's
    ``tasks_per_iter`` x ``group_size`` episodes, ``evaluate`` the held-out tasks."""

    def __init__(self, cfg, policy):
        self.cfg, self.policy = cfg, policy
        self.settings = harness_settings(cfg)

    def collect(self, params, key, first_seed: int):
        """(EpisodeBatch, ``train/*`` / ``env/errors`` / ``time/*`` metrics) of the iteration
        whose data cursor is at ``first_seed``."""
        cfg, s = self.cfg, self.settings
        t0 = time.perf_counter()
        iteration = (first_seed - cfg.train_task_offset) // cfg.tasks_per_iter
        tasks = iteration_tasks(cfg.seed, iteration, cfg.tasks_per_iter)
        eps, rows, act_s = play(self.policy, params, s, variant=s["variant"], split="train",
                                max_steps=cfg.max_actions, indices=tasks, key=key,
                                group_size=cfg.group_size)
        # the longest episode's decisions: a harness step may ask more than one question
        eb = episode_batch(eps, max(max(len(e.actions) for e in eps), 1),
                           cfg.algo.invalid_penalty)
        kept = [r for r, e in zip(rows, eps) if not e.error]
        rewards = np.array([r["reward"] for r in rows]).reshape(len(tasks), cfg.group_size)
        summary = row_summary(kept)
        return eb, {
            **{f"train/{k}": v for k, v in summary.items()}, "train/tasks": tasks,
            "train/actions": float(np.mean([len(e.actions) for e in eps if not e.error] or
                                           [0.0])),
            "train/decisions": float(len(eb.units)),
            "train/invalid_frac": float(eb.invalid[eb.mask].mean()) if eb.mask.any() else 0.0,
            "train/truncated_frac": float(np.mean([e.truncated for e in eps if not e.error]
                                                  or [0.0])),
            "train/groups_with_signal": float((rewards.std(axis=1) > 1e-9).sum()),
            "env/errors": float(eb.errored.sum()),
            "time/generation": act_s, "time/env": time.perf_counter() - t0 - act_s,
            "time/env_overlapped": 0.0}

    def evaluate(self, params, num_tasks: int, **_options) -> dict[str, Any]:
        """``eval/All`` (success %), ``eval/All_<reward|llm_calls|irreversible_errors|
        steps>`` (means) and ``eval/All_std`` (success % over eval seeds) on tasks
        ``eval_task_offset + 0 .. num_tasks - 1`` of the eval split, once per eval seed; the
        host evaluation's options (value curves) do not apply."""
        cfg, s = self.cfg, self.settings
        indices = [cfg.eval_task_offset + i for i in range(num_tasks)]
        per_seed = []
        for seed in cfg.eval_seeds:
            _, rows, _ = play(self.policy, params, s, variant=s["eval_variant"],
                              split=s["eval_split"], max_steps=cfg.max_actions,
                              indices=indices, key=jax.random.key(seed), group_size=1,
                              greedy=cfg.eval_greedy)
            per_seed.append(row_summary(rows))
        mean = {k: float(np.mean([r[k] for r in per_seed])) for k in per_seed[0]}
        out = {"eval/All": 100.0 * mean["success"],
               "eval/All_std": float(np.std([100.0 * r["success"] for r in per_seed]))}
        out.update({f"eval/All_{k}": v for k, v in mean.items() if k != "success"})
        cols = [k for k in mean if k != "success"]
        out["eval/table"] = runlog.format_table(
            [{"type": f"{s['eval_variant']} ({s['eval_split']})",
              "success %": f"{out['eval/All']:.1f} ± {out['eval/All_std']:.1f}",
              **{k: f"{mean[k]:.3f}" for k in cols}}], ["type", "success %", *cols])
        return out

    def close(self) -> None:
        """Nothing held between iterations (the harness and its LLM are per call)."""


def _make(cfg, policy, parts):
    if parts["dist"].processes > 1:
        raise ValueError("policy.kind='harness': the harness rollout runs in one process")
    return HarnessCollector(cfg, policy)


build.register_rollout_kind(
    "harness", RolloutKind(_make, lambda: {ENV_NAME}, estimators=("grpo",), value_kinds=(),
                           env_factory=False, check=check_config),
    policy=build_policy)

__all__ = ["harness_reward", "harness_settings", "check_config", "PolicyDM",
           "vocabulary_texts", "build_policy", "iteration_tasks", "play", "row_summary",
           "HarnessCollector", "LAMBDA", "N0", "ETA", "KWARGS", "EVAL_KWARGS"]
