"""CodeAct: a code-as-action environment of our own, shaped like AppWorld, that runs here.

``apps`` (simulated clock, notes, wallet, supervisor and api_docs apps), ``tasks`` (seeded
tasks with validation suites), ``sandbox`` (the persistent REPL in a limited child process)
and ``env`` (``CodeActEnv``, a ``jaxdm.envs.repl.ReplSessionEnv``).
"""
from jaxdm.envs.codeact.env import CodeActEnv, CodeActParams, make_codeact_env

__all__ = ["CodeActEnv", "CodeActParams", "make_codeact_env"]
