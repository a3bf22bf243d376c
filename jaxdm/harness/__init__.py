"""The harness (seed 003): an agent LLM sharing control with a decision model.

- ``jaxdm.harness.llm``: agent LLMs behind one interface (``SimulatedLLM``, ``RemoteLLM``,
  ``LocalLLM``), each call reporting tokens, price, latency and failures;
- ``jaxdm.harness.modes``: delegations (point, mode, threshold) and the five modes;
- ``jaxdm.harness.agent``: the agent loop over DECISION GYM with the eight decision points;
- ``jaxdm.harness.dm``: harness decision models (key-reading ``NoisyOracle``, BM25 shortlist);
- ``jaxdm.harness.fit``: calibration per point, ``fit_threshold``, the drift monitor;
- ``jaxdm.harness.run``: configs, ``jaxdm harness shadow|fit|run|compare``, reports, figures.
"""
from jaxdm.harness.agent import AgentSettings, DecisionRecord, Episode, Harness
from jaxdm.harness.dm import BM25Shortlist, NoisyOracle, make_dm
from jaxdm.harness.llm import (PROFILES, STRONG, WEAK, AgentLLM, LLMProfile, LLMReply,
                               LLMRequest, RemoteLLM, SimulatedLLM)
from jaxdm.harness.modes import MODES, Delegation, all_delegations

__all__ = ["AgentSettings", "DecisionRecord", "Episode", "Harness", "BM25Shortlist",
           "NoisyOracle", "make_dm", "PROFILES", "STRONG", "WEAK", "AgentLLM", "LLMProfile",
           "LLMReply", "LLMRequest", "RemoteLLM", "SimulatedLLM", "MODES", "Delegation",
           "all_delegations"]
