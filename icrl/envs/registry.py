"""The built-in tasks, each declared once: `TASKS` (name -> `Task`) and the prefix families `ENV_FAMILIES`.

A `Task` holds the env (a class or factory: `make_env` builds one copy) and its family (memory, goal, meta,
multi-task). A task written on arrays (an `icrl.envs.batched.ArrayTask`) also has a batched form: every copy
stepped at once by `BatchedTaskEnv`, the same timesteps as one-copy envs in a SyncVectorEnv. The keyword
arguments a task takes are read from its signature, so the batched path accepts exactly what one copy does
(`render_mode` excepted: a vector env that renders keeps its one-copy envs). `make_env`, `make_vector_env`,
`icrl envs` and the tests read this module.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal, NamedTuple

import gymnasium as gym

from icrl.envs.batched import ArrayTask, BatchedTaskEnv
from icrl.envs.tasks.atari import AtariMulti, atari_env_names, make_atari  # imports without ale-py
from icrl.envs.tasks.babyai import babyai_env_names, make_babyai  # imports without minigrid
from icrl.envs.tasks.bandit import BernoulliBandit
from icrl.envs.tasks.crafter_env import CrafterEnv  # imports without crafter; building one needs it
from icrl.envs.tasks.frozen_lake import MetaFrozenLake
from icrl.envs.tasks.goal_grid import GoalGrid
from icrl.envs.tasks.half_cheetah_vel import HalfCheetahVel  # imports without mujoco; building one needs it
from icrl.envs.tasks.key_door import DarkKeyToDoor
from icrl.envs.tasks.mazerunner import MazeRunner
from icrl.envs.tasks.metaworld_envs import make_metaworld, metaworld_env_names  # imports without metaworld
from icrl.envs.tasks.package_delivery import PackageDelivery
from icrl.envs.tasks.popgym_envs import popgym_builtin_envs
from icrl.envs.tasks.procgen import ProcgenGames, make_procgen, procgen_env_names  # imports without procgen
from icrl.envs.tasks.recall import CueRecall
from icrl.envs.tasks.tmaze import TMaze, TMazeActive
from icrl.envs.tasks.xland import make_xland, xland_env_names  # imports without jax / xminigrid
from icrl.envs.tasks.xland_vector import make_xland_vector

Family = Literal["memory", "goal", "meta", "multi-task"]
# per-copy kwargs a batched form does not take: rendering needs the per-copy envs
_PER_COPY_ONLY = frozenset({"render_mode"})


class Task(NamedTuple):
    """A built-in task: `make(**env_kwargs)` builds one copy (an `ArrayTask` class: every copy at once too)."""

    make: Callable[..., gym.Env]
    family: Family

    @property
    def on_arrays(self) -> bool:
        """The task is written on arrays: `BatchedTaskEnv` steps every copy at once."""
        return isinstance(self.make, type) and issubclass(self.make, ArrayTask)

    def kwargs(self) -> frozenset[str] | None:
        """The keyword arguments `make` takes (its signature), None where it takes any (**kwargs)."""
        params = inspect.signature(self.make).parameters.values()
        if any(p.kind is p.VAR_KEYWORD for p in params):
            return None
        return frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))

    def batched_kwargs(self) -> frozenset[str]:
        """The keyword arguments the batched form takes: the per-copy env's, but `render_mode` (none without one)."""
        accepted = self.kwargs() if self.on_arrays else None
        return frozenset() if accepted is None else accepted - _PER_COPY_ONLY

    def summary(self) -> str:
        """The first line of the per-copy env's docstring (`icrl envs`)."""
        doc = (self.make.__doc__ or "").strip().splitlines()
        return doc[0] if doc else ""


# Name -> task. Other modules may add their tasks here.
TASKS: dict[str, Task] = {
    "tmaze": Task(TMaze, "memory"),
    "tmaze_active": Task(TMazeActive, "memory"),
    "cue_recall": Task(CueRecall, "memory"),
    "meta_frozen_lake": Task(MetaFrozenLake, "meta"),
    "dark_key_door": Task(DarkKeyToDoor, "meta"),
    "bandit": Task(BernoulliBandit, "meta"),
    "half_cheetah_vel": Task(HalfCheetahVel, "meta"),
    "crafter": Task(CrafterEnv, "goal"),
    "atari_multi": Task(AtariMulti, "multi-task"),
    "procgen_multi": Task(ProcgenGames, "multi-task"),
    "goal_grid": Task(GoalGrid, "goal"),
    "mazerunner": Task(MazeRunner, "goal"),
    "package_delivery": Task(PackageDelivery, "goal"),
    # "popgym/<EnvClassName>" and "popgym_multi" when popgym is installed
    **{name: Task(make, "multi-task" if name == "popgym_multi" else "memory")
       for name, make in popgym_builtin_envs().items()},
}


class _Factories(Mapping[str, Callable[..., gym.Env]]):
    """Name -> per-copy factory of every task of `TASKS` (a view: it follows TASKS)."""

    def __getitem__(self, name: str) -> Callable[..., gym.Env]:
        return TASKS[name].make

    def __iter__(self) -> Iterator[str]:
        return iter(TASKS)

    def __len__(self) -> int:
        return len(TASKS)


BUILTIN_ENVS: Mapping[str, Callable[..., gym.Env]] = _Factories()


def has_batched_form(name: str, kwargs: dict[str, Any]) -> bool:
    """Built-in task `name` with `kwargs` has a batched form, for rollouts of one episode or several (a kwarg
    it does not take: no, and the per-copy env reports it as usual)."""
    task = TASKS.get(name)
    return task is not None and task.on_arrays and set(kwargs) <= task.batched_kwargs()


def batched_env(
    name: str, kwargs: dict[str, Any], num_envs: int, episodes_per_rollout: int = 1,
    rollout_horizon: int | None = None,
) -> BatchedTaskEnv | None:
    """The batched form of built-in task `name` with `kwargs` and the rollout settings of `TimestepWrapper`,
    or None where there is none."""
    if not has_batched_form(name, kwargs):
        return None
    task = TASKS[name].make(**kwargs)
    assert isinstance(task, ArrayTask)
    return BatchedTaskEnv(task, num_envs, episodes_per_rollout, rollout_horizon)


class EnvFamily(NamedTuple):
    """Tasks named "<prefix><member>", resolved when built: `make(member, **env_kwargs)`; `members()` lists
    them (it may need the family's optional package, so `icrl envs` shows only `help` by default).
    `vector(member, env_kwargs, num_envs, episodes_per_rollout, rollout_horizon)`, where given, builds the
    family's own vector env (every copy stepped at once, as the batched built-in tasks) for `make_vector_env`
    (which builds the per-copy envs to render)."""

    make: Callable[..., gym.Env]
    members: Callable[[], list[str]]
    help: str
    vector: Callable[..., gym.vector.VectorEnv] | None = None


# Prefix -> family. Listed by `icrl envs` without importing the optional packages; `icrl envs metaworld` lists
# the members. "babyai/GoToLocal" calls make_babyai("GoToLocal", **env_kwargs).
ENV_FAMILIES: dict[str, EnvFamily] = {
    "metaworld/": EnvFamily(
        make_metaworld,
        metaworld_env_names,
        "Meta-World ML1/<task>, ML10 (kwarg split='test'); extra icrl[metaworld]; icrl envs metaworld",
    ),
    "babyai/": EnvFamily(
        make_babyai, babyai_env_names, "BabyAI levels, language missions; extra icrl[minigrid]; icrl envs babyai"
    ),
    "atari/": EnvFamily(
        make_atari, atari_env_names, "Atari 2600 games (ALE, full 18 actions); extra icrl[atari]; icrl envs atari"
    ),
    "procgen/": EnvFamily(
        make_procgen, procgen_env_names,
        "Procgen games (64x64 RGB, 15 actions), a level per rollout; procgen2 + gym3 --no-deps (docs/tasks.md); "
        "icrl envs procgen",
    ),
    "xland/": EnvFamily(
        make_xland, xland_env_names,
        "XLand-MiniGrid (JAX), a ruleset per rollout, copies stepped at once; extra icrl[jax]; icrl envs xland",
        vector=make_xland_vector,
    ),
}
