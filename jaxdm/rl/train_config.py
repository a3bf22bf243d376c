"""The trainer's typed config (``TrainConfig``), validated against the stage registries.

Defaults follow seed 000 Table 7 (ALFWorld column where the paper gives a pair). Validation
reads the registries (each a ``jaxdm.registry.Registry``), so every name lives in one place:
``algo.advantage`` must be a registered estimator (``jaxdm.rl.estimators.ESTIMATORS``) whose
signals (``jaxdm.rl.signals.SIGNALS``) are configured; ``teacher.kind`` is ``"none"``, a
``jaxdm.decision.BACKEND_KINDS`` kind or a ``jaxdm.rl.lvopd.TEACHER_POLICIES`` one, and
``teacher.question`` a ``jaxdm.roles.judge.QUESTION_BUILDERS`` name; ``algo.terms`` names
registered loss terms (``jaxdm.rl.terms.LOSS_TERMS``) whose signals are configured too;
``critic.kind`` is ``"none"`` or a ``jaxdm.rl.critic.CRITIC_KINDS`` kind, ``policy.kind`` a
``jaxdm.rl.build.POLICY_KINDS`` one, ``algo.lvopd_gate`` a ``jaxdm.rl.distill.GATES`` gate,
``algo.aggregation`` a ``jaxdm.rl.losses.AGGREGATIONS`` mode and ``env.backend`` a
``jaxdm.envs.vector.WORKER_BACKENDS`` backend. Each error names the config
key to change and lists the known names.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

from jaxdm.decision import BACKEND_KINDS
from jaxdm.envs.vector import check_env_pool
from jaxdm.rl.advantages import LVRL_NORMALIZATIONS
from jaxdm.rl.build import check_policy_kind
from jaxdm.rl.critic import CRITIC_KINDS
from jaxdm.rl.distill import GATES
from jaxdm.rl.estimators import ESTIMATORS
from jaxdm.rl.losses import AGGREGATIONS
from jaxdm.rl.lvopd import TEACHER_POLICIES
from jaxdm.rl.signals import SIGNALS
from jaxdm.rl.terms import LOSS_TERMS, LossConfig, signals_needed
from jaxdm.roles.judge import QUESTION_BUILDERS
from jaxdm.runlog import MAX_FAILED_SHARE, check_failed_share

__all__ = ["ModelSection", "EnvSection", "check_env_pool", "PolicySection", "TeacherSection",
           "CriticSection",
           "AlgoSection", "OptimSection", "TrainConfig", "RUN_CHANGING_EXEMPT"]


@dataclasses.dataclass(frozen=True)
class ModelSection:
    """The policy model: an HF folder (``path``) or a tiny random decoder for CPU runs."""

    path: str | None = None
    dtype: str = "float32"
    # Recompute each decoder layer in the backward pass (``ModelConfig.remat``): the update
    # keeps one layer's activations instead of all of them. Measured on full-depth SmolLM2
    # GRPO (benchmarks/RESULTS.md, 2026-12-07): peak RSS 8.68 -> 4.44 GiB and the iteration
    # 9.87 -> 8.68 s (less memory traffic outweighs the recompute); multi-turn 15+ -> 6.25 GiB.
    remat: bool = True
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
    num_workers: int = 0  # 0: step in-process; >0: VectorEnv workers
    step_timeout: float = 60.0
    # The workers' backend: "process" (this host) or "ray" (Ray actors, on any node of a Ray
    # cluster; pip install 'jaxdm[ray]'); ``ray``: VectorEnv's Ray backend options
    # (jaxdm.envs.vector.RAY_BACKEND_OPTIONS: address, num_cpus, resources, actor_options).
    backend: str = "process"
    ray: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        check_env_pool(self.backend, self.num_workers, self.ray, "env")


@dataclasses.dataclass(frozen=True)
class PolicySection:
    # A jaxdm.rl.build.POLICY_KINDS name: "text" (a decoder on text envs, ``form``) or
    # "symbolic_mlp" (an MLP on a pure-JAX env's observation rows, ``mlp_hidden``).
    """The policy: section of a train config: the policy kind (jaxdm.rl.build.POLICY_KINDS) and
    form, how much history and how many prompt / response / option tokens it sees, its sampling
    temperature and top-p, and the MLP's hidden sizes for symbolic_mlp."""
    kind: str = "text"
    form: Literal["generative", "option"] = "generative"
    history: int = 2
    max_prompt_tokens: int = 2048
    max_response_tokens: int = 512
    max_option_tokens: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    normalize_options: bool = True
    mlp_hidden: tuple[int, ...] = (128, 128)


@dataclasses.dataclass(frozen=True)
class TeacherSection:
    """The judge behind the ``teacher_scores`` signal; ``kind`` is a make_backend kind.

    ``max_failed_share``: stop the run when more than this share of an iteration's teacher
    requests fail after ``retries`` rounds of asking the failed ones again (an iteration whose
    every request failed always stops it; None: never). The same key and rule as
    ``jaxdm screen``, ``jaxdm bench`` and the harness.
    """

    kind: str = "oracle"
    question: str = "progress"   # a jaxdm.roles.judge.QUESTION_BUILDERS name
    context: Literal["hindsight", "prefix"] = "hindsight"
    noise: float = 0.0           # oracle
    seed: int = 0                # oracle noise seed
    path: str | None = None      # local_readout / local_likelihood / prompted: HF folder
    base_url: str = ""           # remote
    model: str = ""
    api_key_env: str | None = None
    interface: Literal["constrained", "prompted"] = "constrained"
    timeout: float = 30.0
    price_per_1k_in: float | None = None
    price_per_1k_out: float | None = None
    max_failed_share: float | None = MAX_FAILED_SHARE
    retries: int = 1

    def __post_init__(self):
        QUESTION_BUILDERS.validate(self.question, field="teacher.question")
        # 'none', a decision backend kind, or [LVOPD] a teacher policy only the teacher_topk
        # signal uses (jaxdm.rl.lvopd)
        TEACHER_POLICIES.validate(self.kind, field="teacher.kind", also=("none", *BACKEND_KINDS),
                                  what="teacher kind")
        if self.max_failed_share is not None:  # None: never stop
            check_failed_share(self.max_failed_share, "teacher.max_failed_share")
        if self.retries < 0:
            raise ValueError(f"teacher.retries must be >= 0, got {self.retries}")


@dataclasses.dataclass(frozen=True)
class CriticSection:
    """PPO's learned critic (``jaxdm.rl.critic``): a small separate decoder + value head
    (``decoder``, text policies) or an MLP on the observation rows (``mlp``, symbolic policy);
    ``kind`` is ``"none"`` or a ``jaxdm.rl.critic.CRITIC_KINDS`` name."""

    kind: str = "none"
    init_seed: int = 0
    hidden_size: int = 32
    intermediate_size: int = 64
    num_layers: int = 1
    num_heads: int = 2
    num_kv_heads: int = 1
    head_dim: int = 16
    lr: float | None = None      # None: optim.lr
    value_coef: float = 0.5      # weight of the "value" loss term
    value_clip: float = 0.2      # <= 0: unclipped value loss


@dataclasses.dataclass(frozen=True)
class AlgoSection:
    """The algo: section: the advantage estimator (jaxdm.rl.estimators.ESTIMATORS) and its
    settings (teacher weight lam, GiGPO gamma and weight, GAE gamma and lambda, LVRL
    normalisation), the invalid-action penalty, PPO's clips, KL and entropy coefficients,
    token aggregation, mini-batch size and epochs, and extra loss terms with their weights."""
    advantage: str = "teacher"
    lam: float = 0.5
    eps: float = 1e-6
    invalid_penalty: float = 0.1
    gigpo_gamma: float = 0.95
    gigpo_weight: float = 1.0
    gamma: float = 1.0           # gae discount
    gae_lam: float = 0.95
    gae_normalize: bool = True
    lvrl_normalize: str = "rms"  # "none" | "rms" (advantages.LVRL_NORMALIZATIONS)
    clip_eps: float = 0.2
    dual_clip: float = 3.0
    kl_coef: float = 0.01
    entropy_coef: float = 0.001
    aggregation: str = "token-mean"  # a jaxdm.rl.losses.AGGREGATIONS mode
    mini_batch: int = 256
    ppo_epochs: int = 1
    terms: dict = dataclasses.field(default_factory=dict)  # extra loss terms: name -> weight
    # LVOPD's distillation gate (a jaxdm.rl.distill.GATES name: lvopd | pure | trajectory),
    # computed over the whole iteration batch; read when "lvopd" is in terms.
    lvopd_gate: str = "lvopd"
    # The top-k reverse KL with the tail bucket (jaxdm.kernels: the mass outside the student's
    # top-k as one more outcome, a divergence over proper distributions); off: SPEC §6's loss.
    lvopd_tail_bucket: bool = False
    # The gate inside the kernel: only the tokens with gate > 0 go through the distillation's
    # streaming head (jaxdm.kernels gate= / capacity=; each mini-batch's capacity a power of
    # two, so few programs compile). Its KL metric is then over the gated tokens only
    # (lvopd/kl_mean_gated), the gated-off tokens' KL is never computed.
    lvopd_gate_in_kernel: bool = False


@dataclasses.dataclass(frozen=True)
class OptimSection:
    """The optim: section: AdamW's learning rate, weight decay and betas, and the global
    gradient-norm clip."""
    lr: float = 1e-6
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    b1: float = 0.9
    b2: float = 0.999


# Keys a resumed run may change (they do not change what the run computes).
RUN_CHANGING_EXEMPT = ("iterations", "progress", "out_dir", "checkpoint_every",
                       "keep_checkpoints", "eval_every", "on_nonfinite_checkpoint",
                       "env.num_workers", "env.step_timeout", "env.backend", "env.ray",
                       "teacher.timeout",
                       "teacher.max_failed_share", "teacher.retries", "teacher.api_key_env")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything a run needs (defaults: seed 000 Table 7, ALFWorld column)."""

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
    eval_cutoffs: tuple[int, ...] = (5, 10, 15, 20, 25, 30)  # completion within k actions
    checkpoint_every: int = 10
    keep_checkpoints: int = 3
    out_dir: str = "runs/teacher_grpo"
    mesh_data: int = -1
    mesh_model: int = 1
    progress: bool = True
    # Two-half rollout pipeline: generate for one half while the other half's envs step
    # (jaxdm.rl.rollout.rollout(pipeline=True)); pays off when env steps are not cheap.
    rollout_pipeline: bool = False
    # [MULTIHOST] one process on N devices acts (rollouts, evaluation) on a replicated copy of
    # the policy on its first device, as every process of a multi-process run does, and updates
    # with the N-device program: the one-process reference of an N-process run (to the last
    # bit; jaxdm.rl.distributed). Multi-process runs always act on such a copy.
    act_on_local_copy: bool = False
    # A restored checkpoint holding NaN/inf tensors: "fail" (refuse) or "warn" (continue).
    on_nonfinite_checkpoint: Literal["fail", "warn"] = "fail"
    model: ModelSection = ModelSection()
    env: EnvSection = EnvSection()
    policy: PolicySection = PolicySection()
    teacher: TeacherSection = TeacherSection()
    critic: CriticSection = CriticSection()
    value: dict = dataclasses.field(default_factory=dict)  # LVRL value model (jaxdm.rl.values)
    algo: AlgoSection = AlgoSection()
    optim: OptimSection = OptimSection()

    def __post_init__(self):
        CRITIC_KINDS.validate(self.critic.kind, field="critic.kind", also=("none",))
        ESTIMATORS.validate(self.algo.advantage, field="algo.advantage")
        for name, w in self.algo.terms.items():
            term = LOSS_TERMS.get(name, field="algo.terms")
            if name in ("ppo", "value"):
                raise ValueError(f"algo.terms.{name}: set by the config (ppo: 1; value: "
                                 f"critic.value_coef), not in algo.terms")
            if not isinstance(w, (int, float)) or isinstance(w, bool) or not math.isfinite(w):
                raise ValueError(f"algo.terms.{name}: weight must be a finite number, got {w!r}")
            if term.needs_critic and self.critic.kind == "none":
                raise ValueError(f"algo.terms.{name} needs a critic: set critic.kind")
        for need in signals_needed(self):
            SIGNALS.get(need).check(self)
        check_policy_kind(self)  # the policy kind's rollout serves env / estimator / value
        GATES.validate(self.algo.lvopd_gate, field="algo.lvopd_gate")
        AGGREGATIONS.validate(self.algo.aggregation, field="algo.aggregation")
        if self.algo.lvrl_normalize not in LVRL_NORMALIZATIONS:
            raise ValueError(f"algo.lvrl_normalize must be one of {LVRL_NORMALIZATIONS}, got "
                             f"{self.algo.lvrl_normalize!r}")
        for name in ("iterations", "tasks_per_iter", "group_size", "max_actions"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.algo.mini_batch < 1 or self.algo.ppo_epochs < 1:
            raise ValueError("algo.mini_batch and algo.ppo_epochs must be >= 1")
        if any(k < 1 for k in self.eval_cutoffs):
            raise ValueError(f"eval_cutoffs must be >= 1, got {list(self.eval_cutoffs)}")

    def loss_config(self):
        """The frozen ``LossConfig`` of this run (the compiled step's cache key part)."""
        terms = [("ppo", 1.0)]
        if self.critic.kind != "none":
            terms.append(("value", float(self.critic.value_coef)))
        terms += [(k, float(w)) for k, w in sorted(self.algo.terms.items())]
        a = self.algo
        return LossConfig(terms=tuple(terms), clip_eps=a.clip_eps, dual_clip=a.dual_clip,
                          kl_coef=a.kl_coef, entropy_coef=a.entropy_coef,
                          aggregation=a.aggregation, value_clip=self.critic.value_clip,
                          distill_tail=bool(a.lvopd_tail_bucket),
                          distill_gate_in_kernel=bool(a.lvopd_gate_in_kernel))


def nested_items(d: Any, prefix: str = "") -> dict[str, Any]:
    """Flat {"a.b": value} view of a nested dict (for comparing run settings)."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and k not in ("kwargs", "eval_kwargs", "value", "terms"):
            out.update(nested_items(v, key + "."))
        else:
            out[key] = v
    return out
