"""Teacher-augmented GRPO trainer (seed 000, Algorithm 1; Table 7 defaults).

One iteration:
  1. π_old ← π_θ; take the next ``tasks_per_iter`` training tasks (a data cursor over task
     seeds) and roll out ``group_size`` episodes per task (``jaxdm.rl.rollout``).
  2. Score every executed action with the configured teacher (Oracle, local decision model,
     remote endpoint; question Progress|Value × context Hindsight|Prefix). A failed score
     (exception, timeout, unparsable output) is *missing*: counted, logged, never fatal.
  3. Advantages: outcome-only GRPO, GRPO + teacher (A_out + λ(s − s̄_u)), or GiGPO.
  4. Old and reference log-probs, then PPO mini-batch updates (optax AdamW + global-norm
     clip) of the clipped/dual-clipped surrogate with k3 KL and entropy bonus, jitted, under
     a ("data", "model") mesh so one code path serves CPU, GPU and TPU slices.
  5. JSONL metrics, progress bar, periodic orbax checkpoints (params, optimizer, PRNG key,
     iteration, data cursor, host RNG); ``resume=True`` continues bit-exactly.
Evaluation runs held-out tasks with seeds 0, 1, 2 and prints a Table-3-style table.
"""
from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdm import config as cfgmod
from jaxdm import runlog
from jaxdm.rl import advantages as advmod
from jaxdm.rl import losses, sharding
from jaxdm.rl.checkpoint import Checkpointer, numpy_rng_from_state, numpy_rng_state
from jaxdm.rl.policy import GenerativePolicy, OptionScoringPolicy
from jaxdm.rl.rollout import EpisodeRecord, LocalVectorEnv, rollout
from jaxdm.rl import text as rltext

__all__ = ["ModelSection", "EnvSection", "PolicySection", "TeacherSection", "AlgoSection",
           "OptimSection", "TrainConfig", "Trainer", "ADVANTAGE_ESTIMATORS", "score_actions",
           "build_advantages", "ENV_FACTORIES"]

ADVANTAGE_ESTIMATORS = ("grpo", "teacher", "gigpo")
ENV_FACTORIES = {
    "toy_ordering": "jaxdm.envs.toy:make_ordering_env",
    "toy_pick": "jaxdm.envs.toy:make_pick_env",
    "alfworld": "jaxdm.rl.env_factories:alfworld_env",
    "webshop": "jaxdm.rl.env_factories:webshop_env",
}


# ---------------------------------------------------------------------------------------
# Config (Table 7 defaults; ALFWorld values where the paper gives a pair).
# ---------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ModelSection:
    """The policy model: an HF folder (``path``) or a tiny random decoder for CPU runs."""

    path: str | None = None
    dtype: str = "float32"
    init_seed: int = 0
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16


@dataclasses.dataclass(frozen=True)
class EnvSection:
    """Environment: a registered name or an explicit ``module:callable`` factory."""

    name: str = "toy_ordering"
    factory: str | None = None
    kwargs: dict = dataclasses.field(default_factory=dict)
    eval_kwargs: dict = dataclasses.field(default_factory=dict)  # held-out split overrides
    num_workers: int = 0  # 0: step in-process; >0: VectorEnv worker processes
    step_timeout: float = 60.0


@dataclasses.dataclass(frozen=True)
class PolicySection:
    form: Literal["generative", "option"] = "generative"
    history: int = 2
    max_prompt_tokens: int = 2048
    max_response_tokens: int = 512
    max_option_tokens: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    normalize_options: bool = True


@dataclasses.dataclass(frozen=True)
class TeacherSection:
    kind: Literal["none", "oracle", "local", "remote"] = "oracle"
    question: Literal["progress", "value"] = "progress"
    context: Literal["hindsight", "prefix"] = "hindsight"
    noise: float = 0.0           # oracle
    seed: int = 0                # oracle noise seed
    path: str | None = None      # local: HF folder (None: the packaged SmolLM2)
    base_url: str = ""           # remote
    model: str = ""
    api_key_env: str | None = None
    interface: Literal["constrained", "prompted"] = "constrained"
    timeout: float = 30.0
    price_per_1k_in: float | None = None
    price_per_1k_out: float | None = None


@dataclasses.dataclass(frozen=True)
class AlgoSection:
    advantage: Literal["grpo", "teacher", "gigpo"] = "teacher"
    lam: float = 0.5
    eps: float = 1e-6
    invalid_penalty: float = 0.1
    gigpo_gamma: float = 0.95
    gigpo_weight: float = 1.0
    clip_eps: float = 0.2
    dual_clip: float = 3.0
    kl_coef: float = 0.01
    entropy_coef: float = 0.001
    aggregation: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"] = \
        "token-mean"
    mini_batch: int = 256
    ppo_epochs: int = 1


@dataclasses.dataclass(frozen=True)
class OptimSection:
    lr: float = 1e-6
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    b1: float = 0.9
    b2: float = 0.999


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything a teacher-GRPO run needs (defaults: seed 000 Table 7, ALFWorld column)."""

    seed: int = 0
    iterations: int = 150
    tasks_per_iter: int = 16
    group_size: int = 8
    max_actions: int = 30
    train_task_offset: int = 0
    eval_task_offset: int = 1_000_000
    eval_tasks: int = 0          # held-out tasks per evaluation (0: no evaluation)
    eval_every: int = 0          # also evaluate every N iterations (0: only at the end)
    eval_seeds: tuple[int, ...] = (0, 1, 2)
    eval_greedy: bool = False
    checkpoint_every: int = 10
    keep_checkpoints: int = 3
    out_dir: str = "runs/teacher_grpo"
    mesh_data: int = -1
    mesh_model: int = 1
    progress: bool = True
    # Two-half rollout pipeline: generate for one half while the other half's envs step
    # (jaxdm.rl.rollout.rollout(pipeline=True)); pays off when env steps are not cheap.
    rollout_pipeline: bool = False
    model: ModelSection = ModelSection()
    env: EnvSection = EnvSection()
    policy: PolicySection = PolicySection()
    teacher: TeacherSection = TeacherSection()
    algo: AlgoSection = AlgoSection()
    optim: OptimSection = OptimSection()

    def __post_init__(self):
        if self.algo.advantage not in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"algo.advantage must be one of {ADVANTAGE_ESTIMATORS}")
        if self.algo.advantage == "teacher" and self.teacher.kind == "none":
            raise ValueError("algo.advantage='teacher' needs a teacher (teacher.kind != 'none')")
        for name in ("iterations", "tasks_per_iter", "group_size", "max_actions"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.algo.mini_batch < 1 or self.algo.ppo_epochs < 1:
            raise ValueError("algo.mini_batch and algo.ppo_epochs must be >= 1")


# ---------------------------------------------------------------------------------------
# Teacher scoring (failures become missing scores).
# ---------------------------------------------------------------------------------------
def build_teacher(section: TeacherSection):
    if section.kind == "none":
        return None
    if section.kind == "oracle":
        from jaxdm.decision.oracle import Oracle

        return Oracle(noise=section.noise, seed=section.seed)
    if section.kind == "remote":
        from jaxdm.decision.remote import Remote

        return Remote(section.base_url, section.model, interface=section.interface,
                      api_key_env=section.api_key_env, timeout=section.timeout,
                      price_per_1k_in=section.price_per_1k_in,
                      price_per_1k_out=section.price_per_1k_out)
    if section.kind == "local":
        from jaxdm.decision.local import LocalReadout
        from jaxdm.models import loading

        if section.path:
            pretrained = loading.load_pretrained(section.path)
        else:
            from jaxdm.models.smollm2 import smollm2

            pretrained = smollm2()
        return LocalReadout(pretrained)
    raise ValueError(f"unknown teacher kind {section.kind!r}")


def score_actions(teacher, trajectories: Sequence[Any], *, question: str, context: str,
                  max_actions: int) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """Teacher scores [B, T] and their validity mask for every executed action.

    Any failure (the backend raising, a wrong number of results, ``ok`` False, a non-finite
    score) leaves that score missing (mask False); counts and costs go to the stats.
    """
    from jaxdm import roles

    b = len(trajectories)
    scores = np.zeros((b, max_actions), np.float32)
    ok = np.zeros((b, max_actions), bool)
    stats = {"teacher/requests": 0.0, "teacher/missing": 0.0, "teacher/errors": 0.0,
             "teacher/tokens_in": 0.0, "teacher/tokens_out": 0.0, "teacher/usd": 0.0,
             "teacher/seconds": 0.0}
    requests, owners = [], []
    for i, traj in enumerate(trajectories):
        if not traj.steps:
            continue
        reqs = roles.judge_requests(traj, question=question, context=context,
                                    traj_id=traj.metadata.get("id", i))
        for t, r in enumerate(reqs[:max_actions]):
            requests.append(r)
            owners.append((i, t))
    stats["teacher/requests"] = float(len(requests))
    if teacher is None or not requests:
        stats["teacher/missing"] = float(len(requests)) if teacher is not None else 0.0
        return scores, ok, stats
    try:
        results = teacher.score(requests)
        if len(results) != len(requests):
            raise RuntimeError(f"teacher returned {len(results)} results for "
                               f"{len(requests)} requests")
    except Exception as e:  # noqa: BLE001 - a teacher failure must never stop training
        stats["teacher/errors"] = 1.0
        stats["teacher/missing"] = float(len(requests))
        stats["teacher/last_error"] = f"{type(e).__name__}: {e}"[:300]
        return scores, ok, stats
    for (i, t), r in zip(owners, results):
        cost = getattr(r, "cost", None)
        if cost is not None:
            stats["teacher/tokens_in"] += cost.tokens_in
            stats["teacher/tokens_out"] += cost.tokens_out
            stats["teacher/usd"] += cost.usd or 0.0
            stats["teacher/seconds"] += cost.seconds
        s = getattr(r, "score", None)
        if getattr(r, "ok", False) and s is not None and math.isfinite(s) and 0.0 <= s <= 1.0:
            scores[i, t], ok[i, t] = s, True
        else:
            stats["teacher/missing"] += 1
    return scores, ok, stats


# ---------------------------------------------------------------------------------------
# Advantages from episode records.
# ---------------------------------------------------------------------------------------
def episode_arrays(episodes: Sequence[EpisodeRecord], max_actions: int, penalty: float):
    """mask [B, T], returns R_{i,t} [B, T], step rewards [B, T], outcome [B], group ids [B]."""
    b = len(episodes)
    mask = np.zeros((b, max_actions), bool)
    returns = np.zeros((b, max_actions), np.float32)
    step_r = np.zeros((b, max_actions), np.float32)
    invalid = np.zeros((b, max_actions), bool)
    outcome = np.zeros((b,), np.float32)
    groups = np.zeros((b,), np.int32)
    for i, ep in enumerate(episodes):
        n = min(len(ep.actions), max_actions)
        mask[i, :n] = True
        outcome[i] = ep.reward
        groups[i] = ep.group
        for t, a in enumerate(ep.actions[:n]):
            invalid[i, t] = not a.valid
        returns[i, :n] = ep.reward - penalty * invalid[i, :n]
        step_r[i, :n] = -penalty * invalid[i, :n]
        if n:
            step_r[i, n - 1] += ep.reward
    return mask, returns, step_r, outcome, groups, invalid


def build_advantages(algo: AlgoSection, episodes: Sequence[EpisodeRecord], *, num_groups: int,
                     max_actions: int, scores: np.ndarray | None = None,
                     score_ok: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Advantages [B, T] and mask [B, T] for the configured estimator."""
    mask, returns, step_r, outcome, groups, _ = episode_arrays(episodes, max_actions,
                                                               algo.invalid_penalty)
    a_out = advmod.grpo_outcome_advantages(returns, groups, mask, num_groups=num_groups,
                                           eps=algo.eps)
    if algo.advantage == "grpo":
        adv = a_out
    elif algo.advantage == "teacher":
        if scores is None or score_ok is None:
            raise ValueError("teacher advantages need scores and score_ok")
        adv = advmod.teacher_advantages(a_out, scores, groups, mask, num_groups=num_groups,
                                        lam=algo.lam, score_mask=score_ok)
    elif algo.advantage == "gigpo":
        obs = [[a.observation for a in ep.actions] for ep in episodes]
        anchors, n_anchors = advmod.anchor_ids_from_observations(obs, groups, mask)
        adv = advmod.gigpo_advantages(outcome, step_r, anchors, groups, mask,
                                      num_groups=num_groups, num_anchors=bucket_int(n_anchors),
                                      gamma=algo.gigpo_gamma, step_weight=algo.gigpo_weight,
                                      eps=algo.eps)
    else:
        raise ValueError(f"unknown advantage estimator {algo.advantage!r}; "
                         f"known: {ADVANTAGE_ESTIMATORS}")
    return np.asarray(adv), mask


def bucket_int(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


# ---------------------------------------------------------------------------------------
# The jitted train step.
# ---------------------------------------------------------------------------------------
def make_optimizer(optim: OptimSection) -> optax.GradientTransformation:
    return optax.chain(optax.clip_by_global_norm(optim.max_grad_norm),
                       optax.adamw(optim.lr, b1=optim.b1, b2=optim.b2,
                                   weight_decay=optim.weight_decay))


_STEP_CACHE: dict[tuple, Any] = {}


def cached_train_step(policy, optim: OptimSection, algo: AlgoSection):
    """``make_train_step`` shared by every trainer with the same static setup.

    The step depends only on the policy's ``static_key``, the optimizer settings and the
    algorithm settings, so trainers built in one process (resume, evaluation, tests) reuse
    one compilation instead of tracing a fresh closure each.
    """
    loss_key = (algo.clip_eps, algo.dual_clip, algo.kl_coef, algo.entropy_coef,
                algo.aggregation)
    key = (policy.static_key, optim, loss_key)
    if key not in _STEP_CACHE:
        _STEP_CACHE[key] = (make_train_step(policy, make_optimizer(optim), algo),
                            make_logp_fn(policy))
    return _STEP_CACHE[key]


def make_train_step(policy, tx: optax.GradientTransformation, algo: AlgoSection):
    """jit(step)(params, opt_state, batch, old_logp, ref_logp, adv) → (params, opt, metrics).

    ``adv`` [M] is one advantage per action; it is broadcast to every token the action
    generated (all L tokens of the row for the generative form, the one option "token" for
    the option form).
    """
    use_kl = algo.kl_coef != 0.0

    def loss_fn(params, batch, old_logp, ref_logp, adv):
        logp, ent, mask = policy.logp_and_entropy(params, batch)
        adv_tok = advmod.broadcast_to_tokens(adv[:, None], jnp.zeros(mask.shape, jnp.int32),
                                             mask)
        return losses.ppo_loss(logp, old_logp, ref_logp if use_kl else None, adv_tok, mask,
                               clip_eps=algo.clip_eps, dual_clip=algo.dual_clip,
                               kl_coef=algo.kl_coef, entropy=ent,
                               entropy_coef=algo.entropy_coef, aggregation=algo.aggregation)

    def step(params, opt_state, batch, old_logp, ref_logp, adv):
        (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            params, batch, old_logp, ref_logp, adv)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        metrics = dict(metrics, **{"optim/grad_norm": optax.tree.norm(grads)})
        return params, opt_state, metrics

    return jax.jit(step)


def make_logp_fn(policy):
    return jax.jit(lambda params, batch: policy.logp_and_entropy(params, batch)[0])


# ---------------------------------------------------------------------------------------
# Trainer.
# ---------------------------------------------------------------------------------------
def _env_factory(section: EnvSection, split_kwargs: Mapping[str, Any]):
    from jaxdm.envs.vector import EnvFactory

    target = section.factory or ENV_FACTORIES.get(section.name)
    if target is None:
        raise ValueError(f"unknown env {section.name!r}: give env.factory='module:callable' or "
                         f"one of {sorted(ENV_FACTORIES)}")
    return EnvFactory(target, dict(section.kwargs) | dict(split_kwargs))


def _collect_texts(env, seeds: Sequence[int], budget: int) -> list[str]:
    """Texts a closed-vocabulary tokenizer must cover: random-policy episodes + templates."""
    texts = [rltext.option_context("g", "o", [("o", "a")], 1, 2),
             rltext.policy_prompt("g", "o", ["a"], [("o", "a")], 1), "<think> </think>",
             "<action> </action>", rltext.INVALID_COMMAND]
    for s in seeds:
        rng = np.random.default_rng(s)
        obs, state = env.reset(int(s))
        info = env.reset_info(state, env.default_params) if hasattr(env, "reset_info") else {}
        texts += [obs, str(info.get("goal", "")), *info.get("admissible_actions", [])]
        acts = list(info.get("admissible_actions", []))
        for _ in range(budget):
            if not acts:
                break
            a = acts[rng.integers(len(acts))]
            obs, state, _, done, info = env.step(0, state, a)
            texts += [obs, *info.get("admissible_actions", [])]
            acts = list(info.get("admissible_actions", []))
            if done:
                break
    return texts


class Trainer:
    """Runs Algorithm 1 for a ``TrainConfig`` (see module docstring)."""

    def __init__(self, cfg: TrainConfig, *, mesh=None, log: bool = True):
        self.cfg = cfg
        self.out = Path(cfg.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.log = log
        self.mesh = mesh if mesh is not None else sharding.make_mesh(cfg.mesh_data,
                                                                     cfg.mesh_model)
        data_size = self.mesh.devices.shape[0]
        if cfg.algo.mini_batch % data_size:
            raise ValueError(f"algo.mini_batch={cfg.algo.mini_batch} must divide by the mesh "
                             f"data axis ({data_size} devices)")
        self.train_factory = _env_factory(cfg.env, {})
        self.eval_factory = _env_factory(cfg.env, cfg.env.eval_kwargs)
        self._build_model()
        self.teacher = build_teacher(cfg.teacher) if cfg.algo.advantage == "teacher" else None
        self.tx = make_optimizer(cfg.optim)
        self.opt_state = sharding.shard_params(self.tx.init(self.params), self.mesh)
        self.train_step, self.logp_fn = cached_train_step(self.policy, cfg.optim, cfg.algo)
        # the key lives replicated on the mesh like the params (jit refuses mixed devices)
        self.key = jax.device_put(jax.random.key(cfg.seed), sharding.replicated(self.mesh))
        self.host_rng = np.random.default_rng(cfg.seed)
        self.iteration = 0
        self.cursor = 0
        b = cfg.tasks_per_iter * cfg.group_size
        self.venv = self._make_venv(self.train_factory, b, cfg.group_size)
        self._eval_venv = None
        self.checkpointer = Checkpointer(self.out / "checkpoints",
                                         max_to_keep=cfg.keep_checkpoints)

    # ---- construction -------------------------------------------------------------------
    def _build_model(self) -> None:
        cfg, m = self.cfg, self.cfg.model
        from jaxdm.models import decoder
        from jaxdm.models.config import ModelConfig

        if m.path:
            from jaxdm.models.loading import load_pretrained

            pre = load_pretrained(m.path, dtype=m.dtype)
            params, mcfg = pre.params, pre.config
            tokenizer = rltext.HFTokenizer(pre.tokenizer)
        else:
            env = self.train_factory()
            eval_env = self.eval_factory()
            texts = _collect_texts(env, range(64), cfg.max_actions)
            texts += _collect_texts(eval_env, range(10**6, 10**6 + 64), cfg.max_actions)
            tokenizer = rltext.WordTokenizer.from_texts(texts)
            mcfg = ModelConfig(vocab_size=tokenizer.vocab_size, hidden_size=m.hidden_size,
                               intermediate_size=m.intermediate_size, num_layers=m.num_layers,
                               num_heads=m.num_heads, num_kv_heads=m.num_kv_heads,
                               head_dim=m.head_dim, tie_embeddings=True, dtype=m.dtype)
            params = decoder.init_params(mcfg, jax.random.key(m.init_seed))
        self.model_config, self.tokenizer = mcfg, tokenizer
        p = cfg.policy
        if p.form == "option":
            self.policy = OptionScoringPolicy(
                mcfg, tokenizer, history=p.history, max_context_tokens=p.max_prompt_tokens,
                max_option_tokens=p.max_option_tokens, normalize=p.normalize_options,
                temperature=p.temperature)
        else:
            self.policy = GenerativePolicy(
                mcfg, tokenizer, history=p.history, max_prompt_tokens=p.max_prompt_tokens,
                max_response_tokens=p.max_response_tokens, temperature=p.temperature,
                top_p=p.top_p, with_entropy=cfg.algo.entropy_coef != 0.0)
        self.params = sharding.shard_params(params, self.mesh)
        # The frozen reference policy is the initial policy (rebuilt identically on resume).
        self.ref_params = self.params

    def _make_venv(self, factory, num_envs: int, group_size: int):
        e = self.cfg.env
        if e.num_workers <= 0:
            return LocalVectorEnv(factory(), num_envs, group_size=group_size)
        from jaxdm.envs.vector import VectorEnv

        return VectorEnv(factory, num_envs, num_workers=e.num_workers, group_size=group_size,
                         step_timeout=e.step_timeout, max_steps=self.cfg.max_actions,
                         env_name=e.name)

    # ---- checkpoints --------------------------------------------------------------------
    def _state(self) -> dict[str, Any]:
        return {"params": self.params, "opt_state": self.opt_state,
                "key": jax.random.key_data(self.key)}

    def save(self) -> None:
        host = {"iteration": self.iteration, "cursor": self.cursor,
                "host_rng": numpy_rng_state(self.host_rng)}
        self.checkpointer.save(self.iteration, self._state(), host)

    def restore(self, step: int | None = None) -> bool:
        """Restore the latest (or given) checkpoint; False when there is none."""
        if step is None and self.checkpointer.latest_step() is None:
            return False
        state, host, _ = self.checkpointer.restore(self._state(), step)
        self.params, self.opt_state = state["params"], state["opt_state"]
        self.key = jax.device_put(jax.random.wrap_key_data(state["key"]),
                                  sharding.replicated(self.mesh))
        self.iteration, self.cursor = int(host["iteration"]), int(host["cursor"])
        self.host_rng = numpy_rng_from_state(host["host_rng"])
        return True

    # ---- one iteration ------------------------------------------------------------------
    def _put_batch(self, tree):
        def place(x):
            x = np.asarray(x)
            return jax.device_put(x, sharding.batch_sharding(self.mesh, x.ndim))
        return jax.tree.map(place, tree)

    def iteration_step(self) -> dict[str, Any]:
        """Run one iteration of Algorithm 1; returns its metrics."""
        cfg = self.cfg
        t_start = time.perf_counter()
        self.key, k_roll = jax.random.split(self.key)
        seed = cfg.train_task_offset + self.cursor
        res = rollout(self.policy, self.params, self.venv, seed=seed, key=k_roll,
                      max_actions=cfg.max_actions, env_name=cfg.env.name,
                      pipeline=cfg.rollout_pipeline)
        self.cursor += cfg.tasks_per_iter
        eps = res.episodes
        trajs = res.trajectories()

        t0 = time.perf_counter()
        scores = ok = None
        t_stats: dict[str, Any] = {}
        if self.teacher is not None:
            scores, ok, t_stats = score_actions(self.teacher, trajs,
                                                question=cfg.teacher.question,
                                                context=cfg.teacher.context,
                                                max_actions=cfg.max_actions)
        teacher_s = time.perf_counter() - t0

        adv, mask = build_advantages(cfg.algo, eps, num_groups=cfg.tasks_per_iter,
                                     max_actions=cfg.max_actions, scores=scores, score_ok=ok)
        t0 = time.perf_counter()
        ppo = self._update(eps, adv, mask)
        update_s = time.perf_counter() - t0
        self.iteration += 1

        n_act = np.array([len(e.actions) for e in eps])
        invalid = np.array([not a.valid for e in eps for a in e.actions], bool)
        a_exec = adv[mask]
        metrics: dict[str, Any] = {
            "iteration": self.iteration,
            "train/success": float(np.mean([e.success for e in eps])),
            "train/reward": float(np.mean([e.reward for e in eps])),
            "train/actions": float(n_act.mean()),
            "train/invalid_frac": float(invalid.mean()) if invalid.size else 0.0,
            "train/truncated_frac": float(np.mean([e.truncated for e in eps])),
            "adv/mean": float(a_exec.mean()) if a_exec.size else 0.0,
            "adv/std": float(a_exec.std()) if a_exec.size else 0.0,
            "adv/min": float(a_exec.min()) if a_exec.size else 0.0,
            "adv/max": float(a_exec.max()) if a_exec.size else 0.0,
            "adv/nonzero_frac": float((a_exec != 0).mean()) if a_exec.size else 0.0,
            "time/generation": res.generation_s, "time/env": res.env_s,
            "time/env_overlapped": res.overlap_s,
            "time/teacher": teacher_s, "time/update": update_s,
            "time/iteration": time.perf_counter() - t_start,
        }
        if ok is not None:
            s = scores[ok]
            metrics.update({"teacher/score_mean": float(s.mean()) if s.size else None,
                            "teacher/score_std": float(s.std()) if s.size else None})
            metrics.update(t_stats)
        metrics.update(ppo)
        return metrics

    def _update(self, eps: Sequence[EpisodeRecord], adv: np.ndarray, mask: np.ndarray
                ) -> dict[str, float]:
        cfg = self.cfg
        units, unit_adv, unit_logp = [], [], []
        for i, ep in enumerate(eps):
            for t, a in enumerate(ep.actions[: cfg.max_actions]):
                units.append(a.out.unit)
                unit_adv.append(adv[i, t])
                unit_logp.append(a.out.logp)
        n = len(units)
        if n == 0:
            return {"ppo/updates": 0.0}
        m = cfg.algo.mini_batch
        n_mb = -(-n // m)
        order = self.host_rng.permutation(n)
        pad = n_mb * m - n
        # padded slots reuse unit 0 but carry a False row mask (encoded by pad_to below)
        mbs, recorded = [], []
        for b in range(n_mb):
            idx = order[b * m:(b + 1) * m]
            mb_units = [units[j] for j in idx]
            batch = self.policy.training_batch(mb_units, m)
            a = np.zeros((m,), np.float32)
            a[:len(idx)] = np.asarray(unit_adv, np.float32)[idx]
            lp = np.zeros((m, 1), np.float32)
            lp[:len(idx), 0] = np.asarray(unit_logp, np.float32)[idx]
            batch = self._put_batch(batch)
            mbs.append((batch, self._put_batch(a)))
            recorded.append(self._put_batch(lp))
        # π_old and π_ref log-probs before any update of this iteration. The option form's
        # sampling log-prob comes from the same jitted function and params, so it *is* the
        # recomputed π_old (checked in tests); the generative sampler's numerics differ, so
        # π_old is recomputed there, as veRL does.
        if getattr(self.policy, "form", "") == "option":
            olds = recorded
        else:
            olds = [self.logp_fn(self.params, bt) for bt, _ in mbs]
        refs = [self.logp_fn(self.ref_params, bt) if cfg.algo.kl_coef else o
                for (bt, _), o in zip(mbs, olds)]
        sums: dict[str, float] = {}
        count = 0
        for _ in range(cfg.algo.ppo_epochs):
            for (batch, a), old, ref in zip(mbs, olds, refs):
                self.params, self.opt_state, met = self.train_step(
                    self.params, self.opt_state, batch, old, ref, a)
                for k, v in met.items():
                    sums[k] = sums.get(k, 0.0) + float(v)
                count += 1
        tokens = sums.get("ppo/tokens", 0.0)
        out = {"ppo/updates": float(count), "ppo/padding": float(pad)}
        for k in ("loss/total", "loss/pg", "loss/kl", "loss/entropy", "optim/grad_norm"):
            out[k] = sums.get(k, 0.0) / count
        for k in ("ppo/clip_frac", "ppo/approx_kl", "ppo/kl_ref", "ppo/entropy"):
            out[k] = sums.get(k + "/sum", 0.0) / max(tokens, 1.0)
        out["ppo/dual_clip_frac"] = sums.get("ppo/dual_clip_frac", 0.0) / count
        return out

    # ---- evaluation ---------------------------------------------------------------------
    def evaluate(self, num_tasks: int | None = None) -> dict[str, Any]:
        """Success per task type and overall on held-out tasks, one run per eval seed."""
        cfg = self.cfg
        num_tasks = num_tasks or cfg.eval_tasks
        if num_tasks < 1:
            raise ValueError("evaluate needs num_tasks >= 1 (cfg.eval_tasks)")
        if self._eval_venv is None or self._eval_venv.num_envs != num_tasks:
            self._eval_venv = self._make_venv(self.eval_factory, num_tasks, 1)
        per_seed: list[dict[str, float]] = []
        for s in cfg.eval_seeds:
            res = rollout(self.policy, self.params, self._eval_venv,
                          seed=cfg.eval_task_offset, key=jax.random.key(s),
                          max_actions=cfg.max_actions, greedy=cfg.eval_greedy,
                          env_name=cfg.env.name, pipeline=cfg.rollout_pipeline)
            by_type: dict[str, list[bool]] = {}
            for e in res.episodes:
                by_type.setdefault(e.task_type or "all", []).append(e.success)
            row = {t: 100.0 * float(np.mean(v)) for t, v in sorted(by_type.items())}
            row["All"] = 100.0 * float(np.mean([e.success for e in res.episodes]))
            per_seed.append(row)
        types = list(per_seed[0])
        summary = {f"eval/{t}": float(np.mean([r[t] for r in per_seed])) for t in types}
        summary.update({f"eval/{t}_std": float(np.std([r[t] for r in per_seed]))
                        for t in types})
        summary["eval/table"] = runlog.format_table(
            [{"type": t, "success %": f"{summary[f'eval/{t}']:.1f} ± "
                                     f"{summary[f'eval/{t}_std']:.1f}"} for t in types],
            ["type", "success %"])
        return summary

    # ---- the loop -----------------------------------------------------------------------
    def run(self, *, resume: bool = False, iterations: int | None = None,
            stop_after: int | None = None) -> list[dict[str, Any]]:
        """Train to ``iterations`` (default cfg.iterations); returns the metric records.

        ``stop_after`` stops after that many iterations *of this call* (simulates a killed
        run; the exit checkpoint is still written).
        """
        cfg = self.cfg
        total = iterations or cfg.iterations
        resumed = self.restore() if resume else False
        writer = runlog.MetricsWriter(self.out / "metrics.jsonl",
                                      resume_step=self.iteration if resumed else None)
        if not resumed:
            cfgmod.dump_yaml(cfg, self.out / "config.yaml")
        bar = runlog.Progress(total, "teacher-grpo", initial=self.iteration,
                              enabled=cfg.progress and self.log,
                              keys=("train/success", "train/reward", "loss/total"))
        records = []
        done_here = 0
        try:
            while self.iteration < total:
                met = self.iteration_step()
                if cfg.eval_tasks and cfg.eval_every and self.iteration % cfg.eval_every == 0 \
                        and self.iteration < total:
                    met.update({k: v for k, v in self.evaluate().items() if k != "eval/table"})
                records.append(writer.write(self.iteration, met))
                bar.update(met)
                done_here += 1
                if cfg.checkpoint_every and self.iteration % cfg.checkpoint_every == 0:
                    self.save()
                if stop_after is not None and done_here >= stop_after:
                    break
            bar.close()
            if self.iteration >= total and cfg.eval_tasks:
                ev = self.evaluate()
                if self.log:
                    print(f"\nEvaluation after {self.iteration} iterations "
                          f"(seeds {list(cfg.eval_seeds)}, {cfg.eval_tasks} held-out tasks):\n"
                          f"{ev['eval/table']}", flush=True)
                final = {k: v for k, v in ev.items() if k != "eval/table"}
                final["iteration"] = self.iteration
                records.append(writer.write(self.iteration, final))
        finally:
            bar.close()
            writer.close()
            if self.checkpointer.latest_step() != self.iteration and self.iteration > 0:
                self.save()
        self.plot()
        return records

    def plot(self) -> Path | None:
        """Learning curves of this run's metrics file as ``out_dir/curves.png``."""
        path = self.out / "metrics.jsonl"
        recs = [r for r in runlog.read_metrics(path) if "train/success" in r] \
            if path.exists() else []
        if not recs:
            return None
        keys = [k for k in ("train/success", "train/reward", "adv/std", "loss/total",
                            "ppo/entropy", "teacher/score_mean") if k in recs[-1]]
        return runlog.plot_curves({self.cfg.algo.advantage: recs}, keys,
                                  self.out / "curves.png", x="iteration",
                                  title=f"{self.cfg.env.name}: {self.cfg.algo.advantage}")

    def close(self) -> None:
        for v in (self.venv, self._eval_venv):
            if v is not None:
                v.close()
        self.checkpointer.close()
