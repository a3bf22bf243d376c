"""AppWorld over the official ``appworld`` package (its own venv: ``make appworld``).

``env``: ``AppWorldEnv``, a ``jaxdm.envs.repl.ReplSessionEnv`` whose sessions are
``AppWorld`` task worlds in worker processes of the appworld venv (``child.py``).
"""
from jaxdm.envs.appworld.env import AppWorldEnv, AppWorldParams, make_appworld_env

__all__ = ["AppWorldEnv", "AppWorldParams", "make_appworld_env"]
