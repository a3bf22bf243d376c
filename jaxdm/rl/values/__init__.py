"""LVRL (seed 001): LLM value functions for step credit.

- ``context``: per-step rollout summaries (deterministic / LLM) and the group-context text;
- ``models``: value models for the interior states of a trajectory (``readout`` through any
  decision backend, one packed pass per trajectory with ``LocalReadout``; ``list``, one JSON
  list per trajectory through a text generator; ``oracle``, the env's own value + noise);
- ``signal``: the ``values`` signal [B, T + 1] with its row mask, metrics and value curves;
- ``estimator``: anchored value differences with a per-row GRPO fallback;
- ``curves``: value curves of a handful of evaluation trajectories at every evaluation;
- ``trainer_signal``: registers the trainer's ``values`` signal (``jaxdm.rl.signals``) built
  from the config's ``value:`` section (imported here, so the signal exists on first use).
"""
from jaxdm.rl.values.context import (SUMMARISERS, RolloutSummary, StepSummary,
                                     render_group_context, summarize_deterministic,
                                     summarize_group, summarize_llm)
from jaxdm.rl.values.curves import evaluation_value_curves
from jaxdm.rl.values.estimator import LVRL_NORMALIZATIONS, lvrl_step_advantages
from jaxdm.rl.values.generation import Generation, HttpChatGenerator, LocalGenerator
from jaxdm.rl.values.models import (ORACLE_VALUES, ListValueModel,
                                    OracleValueModel, ReadoutValueModel, ValueQuery,
                                    ValueResult, parse_value_list, state_context,
                                    state_question)
from jaxdm.rl.values.signal import ValuesSignal, plot_value_curves, values_signal
from jaxdm.rl.values.trainer_signal import (VALUE_MODELS, ValueModelKind, check_value_spec,
                                            value_model_from_spec)

__all__ = [
    "SUMMARISERS", "RolloutSummary", "StepSummary", "render_group_context",
    "summarize_deterministic", "summarize_group", "summarize_llm", "LVRL_NORMALIZATIONS",
    "lvrl_step_advantages", "Generation", "HttpChatGenerator", "LocalGenerator",
    "ORACLE_VALUES", "VALUE_MODELS", "ListValueModel", "OracleValueModel",
    "ReadoutValueModel", "ValueQuery", "ValueResult", "parse_value_list", "state_context",
    "state_question", "ValuesSignal", "plot_value_curves", "values_signal",
    "check_value_spec", "value_model_from_spec", "evaluation_value_curves", "ValueModelKind",
]
