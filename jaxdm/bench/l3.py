"""AGENT DECISION BENCH L3: the decision model takes over a running agent (seed 003 §3).

The decision model makes every tool choice of a running DECISION GYM agent (base / Shift /
Hard, test split) and every action of a native-engine ALFWorld agent (held-out floor plans,
``valid_unseen``); the agent LLM (the harness's ``SimulatedLLM`` by default, any
``jaxdm.harness.llm.make_llm`` spec) writes the parameters; no threshold: the harness's
REPLACE mode on the ``tool`` / ``next_action`` decision point. Choices are executed.

Per environment it reports task success, cost (USD: the agent LLM's calls plus the decision
model's own price where it reports one, plus ``dm_price_per_call``), time (the harness's
``Episode.seconds``: simulated / measured model time plus the harness's measured overhead),
decision-model calls, agent-LLM calls, decision-model failures (the harness hands a failed
decision to the LLM and counts it; a constrained readout cannot show 69 tools, so its tool
choices all fail: reported, not hidden), and the step-level accuracy of the model's own
choices against the answer keys (keyed steps only: ALFWorld keys every state by re-planning;
DECISION GYM leaves a state without a key once the task cannot be completed any more).

The episodes' env steps run where ``workers`` says (the bench's ``env:`` section: inline,
worker processes or Ray actors, ``jaxdm.harness.pool``); the decision model and the agent LLM
stay in this process, so every backend gives the same rows.

Stated choice: an episode's irreversible error ends it (DECISION GYM strict mode), so its
``irreversible_errors`` is 0 or 1.

Failures that are not the method's: an episode in which an agent-LLM call failed or a
decision-model answer did not come back (an outage: the backend raised something other than a
refusal, or returned a failed answer; ``dm_lost`` counts them) is *flagged*: its success is
not the decision model's, so it is left out of task success, cost, time and step accuracy,
counted (``flagged``), and a resumed bench runs it again. A question the model refuses
(``ValueError`` / ``TypeError``: it cannot show that many options) is the model's own failure
(the LLM decides, counted in ``dm_failures``; its step record is ``refused``).
"""
from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable, Mapping, Sequence

from jaxdm.envs.alfworld import AlfWorldEnv, AlfWorldParams
from jaxdm.envs.decision_gym import DecisionGym, GymParams
from jaxdm.harness.agent import AgentConfig, Harness
from jaxdm.harness.llm import make_llm
from jaxdm.harness.modes import Delegation
from jaxdm.harness.pool import EnvWorkersConfig, EpisodeRunner
from jaxdm.harness.textenv import TextEnvHarness
from jaxdm.registry import Registry
from jaxdm.runlog import MAX_FAILED_SHARE

GYM_VARIANTS = ("base", "shift", "hard")
DEFAULT_LLM: Mapping[str, Any] = {"kind": "simulated", "profile": "strong"}


@dataclasses.dataclass(frozen=True)
class L3Env:
    """One L3 environment: ``point``, the decision point the model takes over (its choices are
    executed); ``make(env_name, cfg)`` -> (picklable env factory, params, task seeds);
    ``harness(env_name, llm, dm, settings)`` -> the harness that plays it (REPLACE on
    ``point``, everything else with the LLM)."""

    point: str
    make: Callable[[str, "L3Config"], tuple[Any, Any, list[int]]]
    harness: Callable[[str, Any, Any, AgentConfig], Any]


def _gym_env(env_name: str, cfg: "L3Config") -> tuple[Any, Any, list[int]]:
    params = GymParams(variant=env_name, strict=True, max_steps=cfg.gym_max_steps,
                       split=cfg.gym_split)
    return DecisionGym, params, list(range(cfg.tasks))


def _gym_harness(env_name: str, llm: Any, dm: Any, settings: AgentConfig) -> Harness:
    return Harness(llm, dm, [Delegation("tool", "replace")], settings)


def _alfworld_env(env_name: str, cfg: "L3Config") -> tuple[Any, Any, list[int]]:
    params = AlfWorldParams(split=cfg.alfworld_split, max_steps=cfg.alfworld_max_steps)
    return functools.partial(AlfWorldEnv, params), params, list(range(cfg.tasks))


def _alfworld_harness(env_name: str, llm: Any, dm: Any,
                      settings: AgentConfig) -> TextEnvHarness:
    return TextEnvHarness(llm, dm, [Delegation("next_action", "replace")], settings,
                          adapter="alfworld")


# The L3 environments, in the bench's order: DECISION GYM base / Shift / Hard, then ALFWorld.
L3_ENVS: Registry[L3Env] = Registry("L3 env")
for _variant in GYM_VARIANTS:
    L3_ENVS.register(_variant, L3Env("tool", _gym_env, _gym_harness))
L3_ENVS.register("alfworld", L3Env("next_action", _alfworld_env, _alfworld_harness))


@dataclasses.dataclass(frozen=True)
class L3Config:
    """envs: names of ``L3_ENVS``; tasks: tasks per env (indices 0..tasks-1 of the test
    split, or of ALFWorld's ``alfworld_split``); llm: the agent LLM spec."""

    envs: tuple[str, ...] = tuple(L3_ENVS)
    tasks: int = 20
    llm: Mapping[str, Any] = dataclasses.field(default_factory=lambda: dict(DEFAULT_LLM))
    gym_split: str = "test"
    gym_max_steps: int = 30
    alfworld_split: str = "valid_unseen"
    alfworld_max_steps: int = 30
    dm_price_per_call: float = 0.0
    dm_latency_s: float = 0.0

    def __post_init__(self):
        if not self.envs:
            raise ValueError(f"envs: no L3 env given; known: {L3_ENVS.names()}")
        for env_name in self.envs:
            L3_ENVS.validate(env_name, field="envs")
        if not isinstance(self.tasks, int) or self.tasks < 1:
            raise ValueError(f"L3 tasks must be a positive int, got {self.tasks!r}")
        for k in ("gym_max_steps", "alfworld_max_steps"):
            if not isinstance(getattr(self, k), int) or getattr(self, k) < 1:
                raise ValueError(f"L3 {k} must be a positive int, got {getattr(self, k)!r}")


def takeover_harness(env_name: str, llm: Any, dm: Any, *, dm_price_per_call: float = 0.0,
                     dm_latency_s: float = 0.0):
    """The L3 harness for one env of ``L3_ENVS``: REPLACE on ``tool`` (DECISION GYM) or
    ``next_action`` (ALFWorld), everything else with the LLM."""
    env = L3_ENVS.get(env_name)
    settings = AgentConfig(dm_price_per_call=dm_price_per_call, dm_latency_s=dm_latency_s)
    return env.harness(env_name, llm, dm, settings)


def make_env(env_name: str, cfg: L3Config) -> tuple[Any, Any, list[int]]:
    """(env factory, params, task seeds) of one L3 environment; the factory is picklable (env
    workers build their env with it)."""
    return L3_ENVS.get(env_name).make(env_name, cfg)


def irreversible_errors(ep: Any) -> int:
    """Irreversible errors of a harness episode (strict mode: the first one ends it)."""
    return int(ep.end == "irreversible_error")


class WatchedModel:
    """The decision model as the harness sees it, counting answers that did not come back
    (``lost``: a raise other than a refusal, or a failed result) apart from refusals
    (``ValueError`` / ``TypeError``). A batch that raises is asked again one question at a
    time by the harness, so only a one-question raise counts. Also counts what the bench
    reports per call: ``questions`` asked, ``tokens_in`` (the answers' ``Cost``) and
    ``seconds`` (measured around the model's calls, not the harness's simulated latency)."""

    def __init__(self, dm: Any):
        self.dm = dm
        self.lost = 0
        self.questions, self.tokens_in, self.seconds = 0, 0, 0.0

    def __getattr__(self, name):
        return getattr(self.dm, name)

    def usage(self) -> tuple[int, int, float]:
        """(questions, tokens_in, seconds) so far (``episode_row`` takes the difference)."""
        return self.questions, self.tokens_in, self.seconds

    def choose(self, questions):
        """Answer ``questions`` with the wrapped decision model and count what it cost: seconds,
        questions, input tokens, and answers lost (None, not ok, or a one-question call that
        raised); returns the wrapped model's results unchanged, and re-raises its errors."""
        t0 = time.perf_counter()
        try:
            results = self.dm.choose(questions)
        except (ValueError, TypeError):
            raise
        except Exception:
            if len(questions) == 1:
                self.lost += 1
            raise
        finally:
            self.seconds += time.perf_counter() - t0
        self.questions += len(questions)
        self.tokens_in += sum(int(getattr(getattr(r, "cost", None), "tokens_in", 0) or 0)
                              for r in results if r is not None)
        self.lost += sum(1 for r in results if r is None or not getattr(r, "ok", False))
        return results


def episode_row(env_name: str, ep: Any, dm_lost: int = 0,
                usage: tuple[int, int, float] = (0, 0, 0.0)) -> dict[str, Any]:
    """The bench's row of one L3 episode; ``usage``: the decision model's (questions,
    tokens_in, seconds) in it (``WatchedModel.usage`` differences)."""
    point = L3_ENVS.get(env_name).point
    own = [r for r in ep.decisions if r.point == point and r.who == "dm"]
    keyed = [r for r in own if r.answer is not None and r.choice is not None]
    row = {"env": env_name, **ep.summary(),
           "irreversible_errors": irreversible_errors(ep),
           "dm_decisions": len(own), "dm_keyed": len(keyed),
           "dm_correct": sum(bool(r.correct) for r in keyed), "dm_lost": int(dm_lost),
           "dm_questions": int(usage[0]), "dm_tokens_in": int(usage[1]),
           "dm_seconds": float(usage[2])}
    row["flagged"] = bool(row["llm_failures"] or dm_lost)
    return row


def step_records(env_name: str, ep: Any, flagged: bool = False) -> list[dict[str, Any]]:
    """One bench record (``jaxdm.bench.metrics`` shape) per keyed takeover decision: the
    model's own choice (or its failure, then the LLM's choice executed) against the key. In a
    flagged episode a failure is a lost answer (left out of accuracy), else a refusal."""
    point = L3_ENVS.get(env_name).point
    out = []
    for r in ep.decisions:
        if r.point != point or r.answer is None or r.who == "implied":
            continue
        failed = r.dm_choice is None
        out.append({"level": "l3", "kind": env_name, "category": env_name,
                    "correct": bool(not failed and r.dm_choice in r.answer),
                    "confidence": None if failed else r.confidence, "failed": failed,
                    "refused": failed and not flagged,
                    "error": "decision model failed (the LLM decided)" if failed else None,
                    "after_error": None, "must_ask": None, "n_options": r.n_options,
                    # the option texts stay in the harness: the index only
                    "choice": None if failed else int(r.dm_choice), "chosen": None,
                    "answer": [int(i) for i in r.answer],
                    # tokens and seconds are counted per episode (episode_row's dm_*)
                    "tokens_in": 0, "usd": r.cost_usd, "seed": int(ep.seed)})
    return out


def run_l3(dm: Any, cfg: L3Config, *, llm_factory: Callable[[], Any] | None = None,
           on_episode: Callable[[dict], None] | None = None,
           only: Sequence[int] | None = None,
           workers: EnvWorkersConfig = EnvWorkersConfig(),
           max_failed_share: float = MAX_FAILED_SHARE) -> tuple[list[dict], list[dict]]:
    """Run every L3 env with ``dm`` taking over; (step records, episode rows). ``only``: the
    task seeds to run (a resumed bench re-running its flagged episodes), default all.
    ``workers``: where the env steps run (``jaxdm.harness.pool``; the model and the agent LLM
    stay in this process, and the rows are the same on every backend); more than
    ``max_failed_share`` of the episodes lost to env workers (each run again) raises
    ``EnvWorkersFailed``."""
    if llm_factory is None:
        spec = dict(cfg.llm)
        llm_factory = lambda: make_llm(spec)  # noqa: E731
    records, rows = [], []
    for env_name in cfg.envs:
        factory, params, seeds = make_env(env_name, cfg)
        if only is not None:
            seeds = [s for s in seeds if s in set(only)]
        llm = llm_factory()

        def harness_for(seed: int, env_name=env_name, llm=llm):
            # its own WatchedModel: an episode's counts are its own while others run with it
            return takeover_harness(env_name, llm, WatchedModel(dm),
                                    dm_price_per_call=cfg.dm_price_per_call,
                                    dm_latency_s=cfg.dm_latency_s)

        runner = EpisodeRunner(workers, factory, params, env_name=env_name,
                               max_failed_share=max_failed_share)
        for seed, h, ep in runner.play(seeds, harness_for):
            row = episode_row(env_name, ep, h.dm.lost, h.dm.usage())
            rows.append(row)
            records.extend(step_records(env_name, ep, row["flagged"]))
            if on_episode is not None:
                on_episode(row)
    return records, rows


def summarize_episodes(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Task success, cost, time and calls over the episode rows that are not flagged (means
    per task; sums noted); ``flagged``: episodes left out (an agent-LLM call or a
    decision-model answer failed), ``llm_failures`` / ``dm_lost`` over all rows."""
    flagged = [r for r in rows if r.get("flagged")]
    lost = {"flagged": len(flagged), "llm_failures": sum(r["llm_failures"] for r in rows),
            "dm_lost": sum(r.get("dm_lost", 0) for r in rows)}
    rows = [r for r in rows if not r.get("flagged")]
    n = len(rows)
    if n == 0:
        return {"n": 0, **lost}
    keyed = sum(r["dm_keyed"] for r in rows)
    return {"n": n, **lost, "success": sum(r["success"] for r in rows) / n,
            "cost_per_task": sum(r["cost"] for r in rows) / n,
            "seconds_per_task": sum(r["seconds"] for r in rows) / n,
            "dm_calls": sum(r["dm_calls"] for r in rows),
            "llm_calls": sum(r["llm_calls"] for r in rows),
            "dm_failures": sum(r["dm_failures"] for r in rows),
            "irreversible_errors": sum(r["irreversible_errors"] for r in rows),
            "step_accuracy": sum(r["dm_correct"] for r in rows) / keyed if keyed else None,
            "steps": sum(r["steps"] for r in rows)}


def breakdown(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``summarize_episodes`` over all rows and per env."""
    out = {"all": summarize_episodes(rows)}
    for env_name in dict.fromkeys(r["env"] for r in rows):
        out[env_name] = summarize_episodes([r for r in rows if r["env"] == env_name])
    return out


__all__ = ["L3Config", "L3Env", "L3_ENVS", "GYM_VARIANTS", "takeover_harness", "make_env", "run_l3",
           "episode_row", "step_records", "summarize_episodes", "breakdown",
           "irreversible_errors", "WatchedModel"]
