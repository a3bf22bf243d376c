"""jaxdm environments (imported as ``jaxdm.envs``).

Subpackages: ``alfworld`` (native engine + official adapter), ``webshop``, ``decision_gym``,
``babyai`` (JAX-native), ``toy``. ``VectorEnv`` runs any text environment in worker processes;
``recorder`` records every env loop's episodes (one record, one Trajectory builder).
"""
from jaxdm.envs.core import Environment, seed_of
from jaxdm.envs.recorder import EpisodeRecorder, RecordedBatch, play_episode, to_trajectory
from jaxdm.envs.vector import BatchStep, EnvFactory, VectorEnv
