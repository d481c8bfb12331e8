"""Build envs by name, so configs and CLIs can name any task with one string.

Three forms, tried in this order: a built-in icrl task (`BUILTIN_ENVS`, or a member of a family of
`ENV_FAMILIES` such as "babyai/GoToLocal", resolved by its prefix), a registered Gymnasium id
(`gym.make`), or `"package.module:factory"` (imported and called). Vector envs use picklable thunks so the
asynchronous (subprocess) vector env works with every form.
"""

from __future__ import annotations

import functools
import importlib
import re
from typing import Any, Callable, NamedTuple

import gymnasium as gym

from icrl.envs.babyai import babyai_env_names, make_babyai  # imports without minigrid; building one needs it
from icrl.envs.crafter_env import CrafterEnv  # imports without crafter; building one needs it
from icrl.envs.frozen_lake import MetaFrozenLake
from icrl.envs.goal_grid import GoalGrid
from icrl.envs.half_cheetah_vel import HalfCheetahVel  # imports without mujoco; building one needs it
from icrl.envs.key_door import DarkKeyToDoor
from icrl.envs.kwarg_errors import check_kwarg_types, explain_constructor_error
from icrl.envs.mazerunner import MazeRunner
from icrl.envs.metaworld_envs import make_metaworld, metaworld_env_names  # imports without metaworld
from icrl.envs.package_delivery import PackageDelivery
from icrl.envs.popgym_envs import popgym_builtin_envs
from icrl.envs.recall import CueRecall
from icrl.envs.tmaze import TMaze, TMazeActive
from icrl.envs.wrapper import TimestepWrapper

# Name -> factory(**env_kwargs). Other modules may add their tasks here.
BUILTIN_ENVS: dict[str, Callable[..., gym.Env]] = {
    "tmaze": TMaze,
    "tmaze_active": TMazeActive,
    "cue_recall": CueRecall,
    "meta_frozen_lake": MetaFrozenLake,
    "dark_key_door": DarkKeyToDoor,
    "half_cheetah_vel": HalfCheetahVel,
    "crafter": CrafterEnv,
    "goal_grid": GoalGrid,
    "mazerunner": MazeRunner,
    "package_delivery": PackageDelivery,
    **popgym_builtin_envs(),  # "popgym/<EnvClassName>" and "popgym_multi" when popgym is installed
}

class EnvFamily(NamedTuple):
    """Tasks named "<prefix><member>", resolved when built: `make(member, **env_kwargs)`; `members()` lists
    them (it may need the family's optional package, so `icrl envs` shows only `help` by default)."""

    make: Callable[..., gym.Env]
    members: Callable[[], list[str]]
    help: str


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
}


def _forms_help() -> str:
    return (
        "Use (1) a built-in name " + f"({', '.join(sorted(BUILTIN_ENVS))}) or family member "
        f"({', '.join(p + '<name>' for p in ENV_FAMILIES)}; `icrl envs FAMILY` lists them), "
        "(2) a registered gymnasium id such as 'CartPole-v1' (import the package that registers it, or write "
        "'module:EnvId'), or (3) 'package.module:factory' naming a callable that returns a gymnasium.Env."
    )


def _call(factory: Callable[..., gym.Env], name: str, kwargs: dict) -> gym.Env:
    """Call a factory, turning a rejected keyword or value into a ValueError that names it (icrl.envs.kwarg_errors)."""
    check_kwarg_types(factory, name, kwargs)
    try:
        return factory(**kwargs)
    except TypeError as e:
        msg = str(e)
        if "keyword argument" not in msg and "positional argument" not in msg:
            raise explain_constructor_error(name, kwargs, e) from e
        bad = re.findall(r"keyword argument '([^']+)'", msg)
        which = f"{bad[0]!r}" if bad else f"one of {sorted(kwargs)}"
        raise ValueError(f"env {name!r} does not accept the keyword argument {which}: {msg}") from e
    except ImportError:  # a missing optional package: its own message says what to install
        raise
    except (ValueError, KeyError, IndexError, AttributeError, AssertionError, ArithmeticError, MemoryError) as e:
        raise explain_constructor_error(name, kwargs, e) from e


def _resolve_factory(name: str) -> Callable[..., gym.Env] | None:
    """'package.module:factory' -> the callable, or None when it is not that form."""
    if ":" not in name:
        return None
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(
            f"Unknown env {name!r}: cannot import module {module_name!r} ({e}). {_forms_help()}"
        ) from e
    factory = getattr(module, attr, None)
    return factory if callable(factory) else None


def make_env(name: str, env_kwargs: dict[str, Any] | None = None) -> gym.Env:
    """Create one (unwrapped by icrl) env from a built-in name, a gymnasium id or 'module:factory'."""
    kwargs = dict(env_kwargs or {})
    if name in BUILTIN_ENVS:
        return _call(BUILTIN_ENVS[name], name, kwargs)
    for prefix, family in ENV_FAMILIES.items():
        if name.startswith(prefix):
            return _call(functools.partial(family.make, name[len(prefix) :]), name, kwargs)
    if name in gym.registry:
        return _call(functools.partial(gym.make, name), name, kwargs)
    factory = _resolve_factory(name)
    if factory is not None:
        env = _call(factory, name, kwargs)
        if not isinstance(env, gym.Env):
            raise ValueError(f"factory {name!r} returned {type(env).__name__}, not a gymnasium.Env")
        return env
    if ":" in name:
        # 'module:EnvId' - the module import above may have registered the id.
        env_id = name.partition(":")[2]
        if env_id in gym.registry:
            return _call(functools.partial(gym.make, env_id), name, kwargs)
    raise ValueError(f"Unknown env {name!r}. {_forms_help()}")


def make_wrapped_env(
    name: str,
    env_kwargs: dict[str, Any] | None = None,
    episodes_per_rollout: int = 1,
    rollout_horizon: int | None = None,
) -> TimestepWrapper:
    """`make_env` + `TimestepWrapper`. Module-level so `functools.partial` of it pickles for subprocesses."""
    return TimestepWrapper(
        make_env(name, env_kwargs), episodes_per_rollout=episodes_per_rollout, rollout_horizon=rollout_horizon
    )


def make_vector_env(
    name: str,
    env_kwargs: dict[str, Any] | None,
    num_envs: int,
    *,
    asynchronous: bool = False,
    episodes_per_rollout: int = 1,
    rollout_horizon: int | None = None,
) -> gym.vector.VectorEnv:
    """`num_envs` TimestepWrapper'd copies in a Sync or Async vector env with SAME_STEP autoreset.

    The env is built once here first, so a bad name or kwarg fails in this process with a clear message
    instead of inside a worker.
    """
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    make_wrapped_env(name, env_kwargs, episodes_per_rollout, rollout_horizon).close()
    kwargs = dict(env_kwargs or {})
    thunk = functools.partial(make_wrapped_env, name, kwargs, episodes_per_rollout, rollout_horizon)
    cls = gym.vector.AsyncVectorEnv if asynchronous else gym.vector.SyncVectorEnv
    return cls([thunk] * num_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
