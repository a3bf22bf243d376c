"""Roles and prompts: every prompt text jaxdm shows a decision model, as versioned templates.

A role turns environment data into typed questions (``jaxdm.decision.types``); one module per
role:

- ``jaxdm.roles.actor``: the **Actor** (``actor_request``): goal, past (observation, action)
  pairs, current observation and remaining budget; options are the admissible commands;
  question key ``next_action``; analysis variants (goal masking, dependency hint, example).
- ``jaxdm.roles.judge``: the **Judge / Teacher** (``judge_request`` / ``judge_requests``): the
  judging instructions, the goal and the trajectory entries under Prefix or Hindsight context,
  with context expansion; masking of outcomes and of WebShop's terminal page.
- ``jaxdm.roles.value``: the **Value** question (will the task succeed within the remaining
  budget), asked by judges and value models.
- ``jaxdm.roles.harness``: the harness's **decision points** (tool choice, parameter values,
  next action, memory, reflection, stop, routing, note read-back) as ``MultipleChoice``.

How a backend renders a question (system prompts, option labels, messages) lives in
``jaxdm.decision.render`` and is re-exported here; env-specific text lives in the envs
(``jaxdm.envs.alfworld.goals``, ``jaxdm.envs.webshop.env.TERMINAL_MASK``). The import graph
has no cycle: decision backends -> decision.render -> decision.types; roles -> decision.types,
decision.render, envs.
"""
from jaxdm.decision.render import (INTERFACES, LABELS, SYSTEM_PROMPTS, YES_NO, labels_for,
                                   render_messages, render_plain, user_message)
from jaxdm.roles.actor import (ACTOR_META_KEYS, ACTOR_VARIANTS, DEPENDENCY_HINT,
                               ORDERING_EXAMPLE, actor_context, actor_question, actor_request,
                               actor_request_at, mask_placement_subgoal)
from jaxdm.roles.common import PROMPT_VERSION
from jaxdm.roles.judge import (CONTEXTS, EXPANSIONS, JUDGE_META_KEYS, QUESTIONS,
                               WEBSHOP_TERMINAL_OBSERVATION, judge_context, judge_question,
                               judge_request, judge_requests)

__all__ = [
    "PROMPT_VERSION", "QUESTIONS", "CONTEXTS", "EXPANSIONS", "ACTOR_VARIANTS", "INTERFACES",
    "WEBSHOP_TERMINAL_OBSERVATION", "JUDGE_META_KEYS", "ACTOR_META_KEYS", "DEPENDENCY_HINT",
    "ORDERING_EXAMPLE", "SYSTEM_PROMPTS", "LABELS", "YES_NO", "judge_context", "judge_question",
    "judge_request", "judge_requests", "mask_placement_subgoal", "actor_context",
    "actor_question", "actor_request", "actor_request_at", "labels_for", "user_message",
    "render_messages", "render_plain",
]
