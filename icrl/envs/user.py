"""Envs handed to icrl as Python objects, and envs named by a run directory.

Two directions, one rule each:

* **In** (`icrl.train(cfg, env=...)`): a Gymnasium id or icrl name, a `gymnasium.Env` subclass, a zero-arg
  factory, an env made by `gymnasium.make` (re-created from its spec), or a `gymnasium.vector.VectorEnv`.
  `resolve_env` turns any of them into the name recorded in config.json plus the factories icrl builds its own
  copies with (each wrapped in `TimestepWrapper`, in a SAME_STEP vector env: users never meet those internals).
  What can be rebuilt by name later is recorded as such ("builtin", "gymnasium", "import"); a class defined in a
  script or a lambda is recorded as "none".
* **Out** (`icrl eval`, `icrl collect`, `icrl export-minari`, `icrl.load`): a run directory is data, not code.
  `run_env_config` builds an env from a run's config.json only when its name is a built-in task or an id
  already registered with Gymnasium; a `module:factory` name (e.g. `"os:system"`) is imported and called
  only when the user names an env on the command line (`--env`) or opts in (`--trust-run-env`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
from dataclasses import dataclass
from typing import Any, Callable

import gymnasium as gym

from icrl.config.errors import flag, setting, speaks_cli
from icrl.envs.make import make_env
from icrl.envs.registry import ENV_FAMILIES, TASKS
from icrl.envs.wrapper import TimestepWrapper

EnvFactory = Callable[..., gym.Env]
# make_vec's own keys in a vector env's spec.kwargs; the rest are the sub-env's kwargs
_VECTOR_KEYS = ("num_envs", "vectorization_mode", "vector_kwargs")


class RunEnvError(ValueError):
    """A run directory names an env icrl will not build on its own; the message says how to give one."""


@dataclass(frozen=True)
class EnvSource:
    """A resolved `env=` argument: the name config.json records, how to build copies, how to rebuild."""

    name: str
    factories: tuple[EnvFactory, ...] | None = None  # None: build by name (make_env)
    rebuild: str = "builtin"  # "builtin" | "gymnasium" | "import" | "none"
    parallel_envs: int | None = None  # a vector env's num_envs
    asynchronous: bool | None = None  # a vector env's kind
    env_kwargs: dict[str, Any] | None = None  # a vector env's sub-env kwargs (from its spec)

    def record(self, env_kwargs: dict[str, Any]) -> dict[str, Any]:
        """The "env" entry of RUN_DIR/spaces.json."""
        return {"name": self.name, "kwargs": env_kwargs, "rebuild": self.rebuild}

    def env_fields(self, env_kwargs: str) -> dict[str, Any]:
        """The `EnvConfig` fields a run takes from this source, as plain data (the run applies them): `env`, the
        recorded name; a vector env's parallel_envs and async_envs, and its sub-envs' kwargs as `env_kwargs`
        when the config's own (`env_kwargs`, its JSON text) are empty."""
        fields: dict[str, Any] = {"env": self.name}
        if self.parallel_envs is not None:
            fields.update(parallel_envs=self.parallel_envs, async_envs=bool(self.asynchronous))
        if self.env_kwargs and env_kwargs.strip() in ("", "{}"):
            fields["env_kwargs"] = json.dumps(self.env_kwargs)
        return fields


def is_builtin_name(name: str) -> bool:
    return name in TASKS or name in ("popgym_multi",) or name.startswith(("popgym/", *ENV_FAMILIES))


def is_safe_env_name(name: str) -> bool:
    """Names icrl builds from a run directory without running code the directory names: built-in tasks (and
    their families) and plain ids, which only ever look up what installed packages registered with Gymnasium.
    The `module:factory` form imports and calls code."""
    return isinstance(name, str) and (is_builtin_name(name) or ":" not in name)


def rebuild_kind(name: str) -> str:
    """How a recorded env name can be built again: "builtin", "gymnasium", "import" or "none"."""
    if is_builtin_name(name):
        return "builtin"
    module, colon, attr = name.partition(":")
    if "<" in name or "(" in name or (colon and module == "__main__"):
        return "none"  # a script's class, a lambda, a partial, a vector env's own env_fns
    return "import" if colon else "gymnasium"


def _callable_source(fn: Any) -> EnvSource:
    """A class or factory: recorded as `module:qualname`, rebuildable when that name finds this object."""
    target = fn.func if hasattr(fn, "func") and hasattr(fn, "args") else fn  # functools.partial
    module = getattr(target, "__module__", None) or "?"
    qualname = getattr(target, "__qualname__", None) or type(target).__qualname__
    name = f"{module}:{qualname}"
    found = getattr(sys.modules.get(module), qualname, None) if "." not in qualname else None
    plain = found is fn and module != "__main__"
    if not plain and rebuild_kind(name) != "none":  # the name would find something else: mark it
        name += "(partial)" if target is not fn else "(object)"
    return EnvSource(name, (fn,), "import" if plain else "none")


@dataclass(frozen=True)
class SubEnv:
    """One of a user's vector env's `env_fns`, called as icrl calls every factory (with the run's env kwargs).
    The closure was made with its kwargs (`gymnasium.make_vec(id, **kwargs)`), so the run's kwargs, recorded
    from the same spec, are not passed again; other kwargs cannot reach it and are refused."""

    fn: Callable[[], gym.Env]
    kwargs: dict[str, Any]

    def __call__(self, **kwargs: Any) -> gym.Env:
        if kwargs and kwargs != self.kwargs:
            raise ValueError(
                f"env_kwargs {kwargs} differ from those the vector env's sub-envs were made with ({self.kwargs}): "
                "make the vector env with them (gymnasium.make_vec(id, **kwargs)) or pass the id and env_kwargs"
            )
        return self.fn()


def _vector_source(venv: gym.vector.VectorEnv) -> EnvSource:
    """A user's vector env: icrl rebuilds its sub-envs from `env_fns` (Sync/AsyncVectorEnv) or from its
    registered id, each wrapped and with SAME_STEP autoreset; the env passed in is closed."""
    spec = venv.spec
    kwargs = {k: v for k, v in (spec.kwargs if spec is not None else {}).items() if k not in _VECTOR_KEYS}
    wrappers = kwargs.pop("wrappers", None)
    try:
        json.dumps(kwargs)
        by_id = spec is not None and spec.id in gym.registry and not wrappers
    except TypeError:
        by_id = False
    fns = getattr(venv, "env_fns", None)
    n, asynchronous = venv.num_envs, isinstance(venv, gym.vector.AsyncVectorEnv)
    if fns:
        what = spec.id if spec is not None else "env_fns"
        name = spec.id if by_id and spec is not None else f"<{type(venv).__name__} of {what}>"
        venv.close()
        subs = tuple(SubEnv(fn, kwargs if by_id else {}) for fn in fns)  # the closures hold their kwargs already
        return EnvSource(name, subs, "gymnasium" if by_id else "none", n, asynchronous, kwargs if by_id else None)
    if by_id and spec is not None:  # by_id implies a spec
        venv.close()
        return EnvSource(spec.id, None, "gymnasium", n, False, kwargs)
    raise ValueError(
        f"env={type(venv).__name__}: icrl steps its own copies of the sub-envs (wrapped for in-context RL, "
        "SAME_STEP autoreset), and this vector env has neither env_fns nor a registered id to build them from; "
        "pass a gymnasium.vector.SyncVectorEnv / AsyncVectorEnv (gymnasium.make_vec), a Gymnasium id, the env "
        "class, or a zero-arg factory of one env"
    )


def _instance_source(env: gym.Env) -> EnvSource:
    """An env instance (SB3's habit): icrl needs several copies (training and evaluation envs), so it
    re-creates the instance from its Gymnasium spec: by id with its kwargs and time limit when nothing else
    was added, else `gymnasium.make(spec)` (its wrappers too; not rebuildable by name). The instance itself
    is left to the caller. One without a spec (a class of one's own, made directly) is refused with the
    forms that work."""
    spec, name = env.spec, type(env.unwrapped).__name__
    if spec is None or spec.id not in gym.registry:
        raise ValueError(
            f"env= is an instance of {name} without a registered Gymnasium spec, and icrl builds several copies "
            f"(training and evaluation envs): pass the class, env={name}, a zero-arg factory, env=lambda: "
            f"{name}(...) (wrappers inside it), or gymnasium.make's result for a registered id"
        )
    kwargs = {k: v for k, v in spec.kwargs.items() if k != "render_mode"}  # copies train without a window
    if spec.max_episode_steps != gym.spec(spec.id).max_episode_steps:
        kwargs["max_episode_steps"] = spec.max_episode_steps
    try:
        json.dumps(kwargs)
        plain = not spec.additional_wrappers
    except TypeError:
        plain = False
    if plain:
        return EnvSource(spec.id, None, "gymnasium", env_kwargs=kwargs)
    return EnvSource(f"<{spec.id} with wrappers>", (functools.partial(gym.make, spec),), "none")


def resolve_env(env: Any) -> EnvSource:
    """Any accepted `env=` value -> EnvSource; ValueError with the accepted forms for anything else."""
    if isinstance(env, str):
        return EnvSource(env, None, rebuild_kind(env))
    if isinstance(env, gym.vector.VectorEnv):
        return _vector_source(env)
    if isinstance(env, TimestepWrapper) or (isinstance(env, type) and issubclass(env, TimestepWrapper)):
        raise ValueError("env= is a TimestepWrapper: pass the plain env (or its class), icrl wraps it")
    if isinstance(env, gym.Env):
        return _instance_source(env)
    if isinstance(env, type) and not issubclass(env, gym.Env):
        raise ValueError(f"env={env.__qualname__} is a class but not a gymnasium.Env subclass")
    if callable(env):
        return _callable_source(env)
    raise ValueError(
        f"env={env!r}: expected a Gymnasium id or icrl task name, a gymnasium.Env subclass, a zero-arg factory "
        "returning a gymnasium.Env, or a gymnasium.vector.VectorEnv"
    )


def env_spaces(env: Any, env_kwargs: dict[str, Any] | None = None) -> tuple[gym.Space, gym.Space]:
    """(observation space, action space) of an env given in any accepted form, or an env instance. A name or
    factory is built once and closed; this is the caller's explicit choice (`icrl.load(RUN, env=...)`)."""
    if isinstance(env, gym.vector.VectorEnv):
        return env.single_observation_space, env.single_action_space
    if isinstance(env, gym.Env):
        return env.observation_space, env.action_space
    src = resolve_env(env)
    built = make_env(src.name, env_kwargs) if src.factories is None else src.factories[0](**(env_kwargs or {}))
    try:
        return built.observation_space, built.action_space
    finally:
        built.close()


# ------------------------------------------------------------------------------------ envs of a run dir
@dataclass(frozen=True)
class EnvOverride:
    """What the user said about the env of a run they act in (`icrl eval/collect/export-minari`, `icrl.load`)."""

    env: str | None = None
    """--env: build this env instead of the run's (any form `icrl train --env` takes; it is the user's)."""
    env_kwargs: str | None = None
    """--env-kwargs: JSON kwargs for the env instead of the run's."""
    trust_run_env: bool = False
    """--trust-run-env: build the run's env even when config.json names code to import and call."""


def _pass_env(name: str) -> str:
    """The way to hand icrl an env by hand, worded for the reader: `--env NAME` on the command line; in Python
    `env=` the env itself (its class or factory) or its name."""
    if speaks_cli():
        return f"pass {setting('env', name)}"
    return f"pass {setting('env', name)} (or the env's class or factory itself)"


def run_env_config(cfg: Any, run_dir: Any, override: EnvOverride = EnvOverride()) -> Any:
    """The run's config with the env the user chose; RunEnvError (one line) when it names code and the user
    neither named an env nor opted in. Call it before anything builds an env from a run's config."""
    e = cfg.env
    if override.env_kwargs is not None:
        e = dataclasses.replace(e, env_kwargs=override.env_kwargs)
        e.kwargs  # noqa: B018 - a clear error for bad JSON
    if override.env is not None:
        return dataclasses.replace(cfg, env=dataclasses.replace(e, env=override.env))
    if rebuild_kind(e.env) == "none":
        raise RunEnvError(
            f"{run_dir} was trained on {e.env!r}, an env given to icrl.train as a Python object that cannot be "
            f"rebuilt from its name: {_pass_env('package.module:factory')} (and {flag('env_kwargs')})"
        )
    if not override.trust_run_env and not is_safe_env_name(e.env):
        raise RunEnvError(
            f"{run_dir}/config.json names the env {e.env!r}, code that icrl would import and call; a run directory "
            f"is data, so icrl does not run it: {_pass_env(e.env)} to build it anyway (or {setting('trust_run_env')}), "
            "or another env with the same spaces"
        )
    return dataclasses.replace(cfg, env=e)
