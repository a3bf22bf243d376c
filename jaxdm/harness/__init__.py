"""The harness (seed 003): an agent LLM sharing control with a decision model.

- ``jaxdm.harness.llm``: agent LLMs behind one interface (``SimulatedLLM``, ``RemoteLLM``,
  ``LocalLLM``), each call reporting tokens, price, latency and failures;
- ``jaxdm.harness.modes``: delegations (point, mode, threshold) and the five modes;
- ``jaxdm.harness.agent``: the agent loop over DECISION GYM with the eight decision points;
  ``jaxdm.harness.textenv``: the ``next_action`` loop for ALFWorld (no tools);
- ``jaxdm.harness.dm``: harness decision models (key-reading ``NoisyOracle``, BM25 shortlist);
- ``jaxdm.harness.fit``: calibration per point, ``fit_threshold``, the drift monitor;
- ``jaxdm harness shadow|fit|run|compare``, one module per job: ``config`` (the checked
  config and ``load``), ``journal`` (what a run folder holds, claiming it, ``--resume``),
  ``passes`` (a pass of episodes with its failure accounting, rows, summaries), ``shadow``,
  ``thresholds`` (``fit``), ``arms`` (``run``), ``compare`` (Stage 1 / 2), ``report`` (report.md
  and the figures) and ``cli``;
- ``jaxdm.harness.llm_call``: one agent-LLM call (request, reply, tool-call parsing);
  ``jaxdm.harness.errors``: ``HarnessError``.
"""
from jaxdm.harness.agent import (BACKEND_COST_ONLY, AgentConfig, DecisionRecord, Episode,
                                 Harness)
from jaxdm.harness.dm import BM25Shortlist, NoisyOracle, make_dm
from jaxdm.harness.llm import PROFILES, STRONG, WEAK, LLMProfile, RemoteLLM, SimulatedLLM
from jaxdm.harness.llm_call import AgentLLM, LLMReply, LLMRequest
from jaxdm.harness.local import LocalLLM
from jaxdm.harness.modes import MODES, Delegation, all_delegations
from jaxdm.harness.fit import DriftMonitor, fit_threshold
from jaxdm.harness.textenv import TextEnvHarness

__all__ = ["AgentConfig", "BACKEND_COST_ONLY", "DecisionRecord", "Episode", "Harness",
           "BM25Shortlist", "NoisyOracle", "make_dm", "PROFILES", "STRONG", "WEAK", "AgentLLM",
           "LLMProfile", "LLMReply", "LLMRequest", "RemoteLLM", "SimulatedLLM", "LocalLLM",
           "MODES", "Delegation", "all_delegations", "fit_threshold", "DriftMonitor",
           "TextEnvHarness"]
