"""Env side of icrl: the timestep wrapper, built-in tasks, env factories and the vectorised collector."""

from icrl.envs.collect import Collector, Policy, RandomPolicy
from icrl.envs.make import make_env, make_vector_env, make_wrapped_env
from icrl.envs.registry import BUILTIN_ENVS
from icrl.envs.tasks.tmaze import TMaze
from icrl.envs.wrapper import TimestepWrapper, action_to_vector, agent_action_space, agent_to_env_action

__all__ = [
    "BUILTIN_ENVS",
    "Collector",
    "Policy",
    "RandomPolicy",
    "TMaze",
    "TimestepWrapper",
    "action_to_vector",
    "agent_action_space",
    "agent_to_env_action",
    "make_env",
    "make_vector_env",
    "make_wrapped_env",
]
