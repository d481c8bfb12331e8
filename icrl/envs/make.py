"""Build envs by name, so configs and CLIs can name any task with one string.

Three forms, tried in this order: a built-in icrl task (`icrl.envs.registry`: a task of `TASKS`, or a member
of a family of `ENV_FAMILIES` such as "babyai/GoToLocal", resolved by its prefix), a registered Gymnasium id
(`gym.make`), or `"package.module:factory"` (imported and called). Vector envs use picklable thunks so the
asynchronous (subprocess) vector env works with every form.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import os
import re
import sys
from typing import Any, Callable, Sequence

import gymnasium as gym

from icrl.config import EnvConfig
from icrl.config.errors import first_line
from icrl.config.resolve import TaskDefaults
from icrl.envs.kwarg_errors import check_kwarg_types, explain_constructor_error
from icrl.envs.registry import ENV_FAMILIES, TASKS, batched_env, has_batched_form
from icrl.envs.wrapper import EnvError, TimestepWrapper


def _forms_help() -> str:
    families = ", ".join(p + "<name>" for p in ("popgym/", *ENV_FAMILIES))
    return (
        "Use a built-in task (`icrl envs` lists them; families: " + families + "), a registered Gymnasium id "
        "such as 'CartPole-v1' (or 'module:EnvId' to import the package that registers it), or "
        "'package.module:factory' naming a callable that returns a gymnasium.Env."
    )


def _unknown_env(name: str) -> ValueError:
    """A short 'Unknown env' error: close matches, the three forms, and where the full list is."""
    known = [*TASKS, *(k for k in gym.registry if "/" not in k)]
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.75)
    hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
    return ValueError(f"Unknown env {name!r}.{hint} {_forms_help()}")


# Optional packages of the built-in tasks that exist only when the package is installed.
_EXTRA_ONLY_NAMES = {"popgym/": "popgym", "popgym_multi": "popgym"}


def _missing_extra(name: str) -> Exception | None:
    """Why a name of an optional family is not among the built-in tasks: its package is missing (ImportError),
    or it is installed and has no such env (a typo: ValueError with close matches), or None."""
    for prefix, extra in _EXTRA_ONLY_NAMES.items():
        if name == prefix or (prefix.endswith("/") and name.startswith(prefix)):
            members = [k for k in TASKS if k.startswith(prefix)] if prefix.endswith("/") else []
            if not members:  # the package is not installed (or does not import): no member was registered
                return ImportError(f"env {name!r} needs the optional package {extra}: pip install 'icrl[{extra}]'")
            close = difflib.get_close_matches(name, members, n=3, cutoff=0.6)
            hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
            return ValueError(f"Unknown env {name!r}: {extra} (installed) has no env {name[len(prefix):]!r}.{hint} "
                              f"`icrl envs` lists the {len(members)} {prefix}<name> envs")
    return None


def _gym_make(name: str, **kwargs: Any) -> gym.Env:
    """gym.make, with a missing simulator (gymnasium's DependencyNotInstalled, not an ImportError) turned into
    an ImportError that names the icrl extra, keeping gymnasium's own text."""
    try:
        return gym.make(name, **kwargs)
    except gym.error.DependencyNotInstalled as e:
        extra = " (or: pip install 'icrl[mujoco]')" if "mujoco" in str(e).lower() else ""
        raise ImportError(f"env {name!r}: {e}{extra}") from e


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
    except (ImportError, OSError):  # a missing optional package, file or download: its own message says what to do
        raise
    except (ValueError, KeyError, IndexError, AttributeError, AssertionError, ArithmeticError, MemoryError) as e:
        raise explain_constructor_error(name, kwargs, e) from e
    except Exception as e:  # noqa: BLE001 - whatever else the user's constructor raised: one line, their traceback kept
        import traceback

        said = f": {first_line(e, limit=300)}" if str(e).strip() else ""
        raise EnvError(f"env {name!r} could not be built: its constructor raised {type(e).__name__}{said}; fix the env",
                       "".join(traceback.format_exception(e))) from e


def _import_module(module_name: str):
    """Import the module of 'module:factory'. Like `python -m icrl`, the `icrl` console script also finds
    modules in the working directory (its sys.path starts at the script's folder instead)."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        cwd = os.getcwd()
        top = module_name.partition(".")[0]
        if e.name != top or cwd in sys.path or "" in sys.path or not _in_dir(cwd, top):
            raise
        sys.path.append(cwd)
        return importlib.import_module(module_name)


def _where(e: BaseException) -> str:
    """' at FILE line N': where a user's module failed (a SyntaxError's own line, else the innermost frame)."""
    if isinstance(e, SyntaxError) and e.filename:
        return f" at {e.filename} line {e.lineno}"
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return f" at {tb.tb_frame.f_code.co_filename} line {tb.tb_lineno}" if tb is not None else ""


def _in_dir(folder: str, top: str) -> bool:
    return os.path.isfile(os.path.join(folder, top + ".py")) or os.path.isdir(os.path.join(folder, top))


def _resolve_factory(name: str) -> Callable[..., gym.Env] | None:
    """'package.module:factory' -> the callable, or None when it is not that form."""
    if ":" not in name:
        return None
    module_name, _, attr = name.partition(":")
    if module_name == "__main__" and not hasattr(sys.modules.get("__main__"), attr):
        raise ValueError(
            f"env {name!r} names {attr!r} in the running script (__main__), which has no such name: an env class "
            "defined in a script is passed as a Python object, icrl.train(cfg, env=MyEnv); on the command line "
            f"name it package.module:factory (a run trained on one: icrl eval RUN --env package.module:factory, "
            "or icrl.load(RUN) for the policy alone)"
        )
    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", module_name):  # '../x', 'a/b', '.x': not a module path
        raise ValueError(f"Unknown env {name!r}: {module_name!r} is not a module name (dotted Python names, "
                         f"e.g. package.module:factory). {_forms_help()}")
    try:
        module = _import_module(module_name)
    except ImportError as e:
        raise ValueError(f"Unknown env {name!r}: cannot import module {module_name!r} ({e}). {_forms_help()}") from e
    except Exception as e:  # the user's module does not parse, or raises while it is imported
        raise ValueError(f"env {name!r}: importing module {module_name!r} failed{_where(e)} with "
                         f"{type(e).__name__}: {e}; fix the module (`python -c 'import {module_name}'` shows the "
                         "traceback)") from e
    factory = getattr(module, attr, None)
    if factory is None and "." not in attr and not _registers_envs(module_name):  # a typo in the name after ':'
        names = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n, None))]
        close = difflib.get_close_matches(attr, names, n=3, cutoff=0.6)
        if close:
            raise ValueError(f"Unknown env {name!r}: module {module_name!r} has no {attr!r}. Did you mean "
                             f"{' or '.join(repr(f'{module_name}:{c}') for c in close)}?")
    return factory if callable(factory) else None


def _registers_envs(module_name: str) -> bool:
    """Whether importing `module_name` registered Gymnasium ids under it ('module:EnvId' names an id then)."""
    return any(spec.entry_point and str(spec.entry_point).startswith(module_name) for spec in gym.registry.values())


def make_env(name: str, env_kwargs: dict[str, Any] | None = None) -> gym.Env:
    """Create one (unwrapped by icrl) env from a built-in name, a gymnasium id or 'module:factory'."""
    kwargs = dict(env_kwargs or {})
    if name in TASKS:
        return _call(TASKS[name].make, name, kwargs)
    for prefix, family in ENV_FAMILIES.items():
        if name.startswith(prefix):
            return _call(functools.partial(family.make, name[len(prefix) :]), name, kwargs)
    if name in gym.registry:
        return _call(functools.partial(_gym_make, name), name, kwargs)
    missing = _missing_extra(name)
    if missing is not None:
        raise missing
    if ":" not in name and re.fullmatch(r"[\w.-]+(/[\w.-]+)?-v\d+", name):
        try:  # keeps gymnasium's own advice ("use Taxi-v4", "Did you mean: `CartPole`?")
            gym.spec(name)
        except (gym.error.DeprecatedEnv, gym.error.VersionNotFound) as e:  # the family exists: its text says it
            raise ValueError(f"Unknown env {name!r}: {e}") from e
        except gym.error.Error as e:
            raise ValueError(f"Unknown env {name!r}: {e} {_forms_help()}") from e
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
            return _call(functools.partial(_gym_make, env_id), name, kwargs)
    raise _unknown_env(name)


def make_wrapped_env(
    name: str,
    env_kwargs: dict[str, Any] | None = None,
    episodes_per_rollout: int = 1,
    rollout_horizon: int | None = None,
    factory: Callable[..., gym.Env] | None = None,
) -> TimestepWrapper:
    """`make_env` + `TimestepWrapper`. Module-level so `functools.partial` of it pickles for subprocesses.

    `factory` (a user's env class or factory, `icrl.train(cfg, env=...)`) replaces the lookup by name; it is
    called with `env_kwargs`, and `name` only labels errors."""
    if factory is None:
        env = make_env(name, env_kwargs)
    else:
        env = _call(factory, name, dict(env_kwargs or {}))
        if isinstance(env, TimestepWrapper):
            raise ValueError(f"env {name!r} is already a TimestepWrapper: pass the plain env, icrl wraps it")
        if not isinstance(env, gym.Env):
            raise ValueError(f"env factory {name!r} returned {type(env).__name__}, not a gymnasium.Env")
    return TimestepWrapper(env, episodes_per_rollout=episodes_per_rollout, rollout_horizon=rollout_horizon)


def make_vector_env(
    name: str,
    env_kwargs: dict[str, Any] | None,
    num_envs: int,
    *,
    asynchronous: bool = False,
    episodes_per_rollout: int = 1,
    rollout_horizon: int | None = None,
    factories: Sequence[Callable[..., gym.Env]] | None = None,
    native: bool = True,
) -> gym.vector.VectorEnv:
    """`num_envs` TimestepWrapper'd copies in a Sync or Async vector env with SAME_STEP autoreset.

    `factories`: build the copies with these callables (copy i uses factories[i % len]) instead of by name.
    The env is built once here first, so a bad name or kwarg fails in this process with a clear message
    instead of inside a worker.
    `native`: a built-in task written on arrays (`icrl.envs.registry.Task.on_arrays`: the same timesteps, rewards
    and infos under the same seed and rollout settings, every copy stepped at once) gets its batched form, and so
    does a family member whose family has a vector form (`EnvFamily.vector`: "xland/"); False always builds
    one-copy envs in a Sync or Async vector env.
    """
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    fns = list(factories) if factories else [None]
    make_wrapped_env(name, env_kwargs, episodes_per_rollout, rollout_horizon, fns[0]).close()  # bad kwargs: here
    if native and not factories:
        batched: gym.vector.VectorEnv | None = batched_env(name, dict(env_kwargs or {}), num_envs,
                                                           episodes_per_rollout, rollout_horizon)
        if batched is None:
            batched = _family_vector_env(name, dict(env_kwargs or {}), num_envs, episodes_per_rollout,
                                         rollout_horizon)
        if batched is not None:
            return batched
    kwargs = dict(env_kwargs or {})
    thunks = [
        functools.partial(make_wrapped_env, name, kwargs, episodes_per_rollout, rollout_horizon, fns[i % len(fns)])
        for i in range(num_envs)
    ]
    cls = QuietAsyncVectorEnv if asynchronous else gym.vector.SyncVectorEnv
    return cls(thunks, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def _family_vector(name: str, kwargs: dict[str, Any]) -> tuple[str, Callable[..., gym.vector.VectorEnv]] | None:
    """(member, its family's vector-env builder) where `name` has a vector form: not when rendering, which
    needs the per-copy envs."""
    if kwargs.get("render_mode") is not None:
        return None
    for prefix, family in ENV_FAMILIES.items():
        if name.startswith(prefix) and family.vector is not None:
            return name[len(prefix):], family.vector
    return None


def _family_vector_env(name: str, kwargs: dict[str, Any], num_envs: int, episodes_per_rollout: int,
                       rollout_horizon: int | None) -> gym.vector.VectorEnv | None:
    """The vector form of a family member (`EnvFamily.vector`), or None where it has none."""
    found = _family_vector(name, kwargs)
    return None if found is None else found[1](found[0], kwargs, num_envs, episodes_per_rollout, rollout_horizon)


def steps_copies_at_once(name: str, env_kwargs: dict[str, Any] | None) -> bool:
    """Whether `make_vector_env` builds `name` as one env stepping every copy at once (a batched built-in task,
    or a family's vector form): there a copy costs a row of arrays instead of an env of its own."""
    kwargs = dict(env_kwargs or {})
    return has_batched_form(name, kwargs) or _family_vector(name, kwargs) is not None


class QuietAsyncVectorEnv(gym.vector.AsyncVectorEnv):
    """An AsyncVectorEnv that re-raises a worker's exception without gymnasium printing each worker's
    traceback as warnings first: icrl reports it in one line, and an env's own traceback travels inside the
    EnvError (`user_traceback`) to where the command line writes it to a file."""

    def _raise_if_errors(self, successes: Any) -> None:
        level, gym.logger.min_level = gym.logger.min_level, gym.logger.ERROR + 1
        try:
            super()._raise_if_errors(successes)
        finally:
            gym.logger.min_level = level


def task_recommendation(
    hook: str, name: str, env_kwargs: dict[str, Any] | None = None, factory: Any = None
) -> Any:
    """What a task recommends for itself through the attribute `hook` of its factory, or None.

    Hooks (each called with the env kwargs, read without building the env; for a class a staticmethod or
    classmethod): `recommended_exploration(**kw) -> dict` (`ExploreConfig` field -> value) and
    `recommended_context(**kw) -> int` (the timesteps of memory the task needs: T-Maze's whole rollout) and
    `recommended_budget(**kw) -> int` (the env steps a run needs: T-Maze's grow with its corridor).
    `factory` (an env class or factory the user passed) is asked first; then built-in names and
    'module:factory' forms are looked up. Gymnasium ids have none.
    """
    if factory is None and name in TASKS:
        factory = TASKS[name].make
    if factory is None and ":" in name and not any(name.startswith(p) for p in ENV_FAMILIES):
        try:
            factory = _resolve_factory(name)
        except ValueError:
            factory = None
    fn = getattr(factory, hook, None)
    if not callable(fn):
        return None
    try:
        return fn(**dict(env_kwargs or {}))
    except Exception:  # noqa: BLE001 - advisory only: building the env reports a bad kwarg in one clear line
        return None


def task_exploration(name: str, env_kwargs: dict[str, Any] | None = None, factory: Any = None) -> dict[str, Any]:
    """The exploration a task recommends for itself (`ExploreConfig` field -> value), or {}."""
    return dict(task_recommendation("recommended_exploration", name, env_kwargs, factory) or {})


def task_context(name: str, env_kwargs: dict[str, Any] | None = None, factory: Any = None) -> int | None:
    """The context (`ModelConfig.max_seq_len`) a task recommends for itself, or None."""
    rec = task_recommendation("recommended_context", name, env_kwargs, factory)
    return rec if type(rec) is int and rec >= 2 else None


def task_budget(name: str, env_kwargs: dict[str, Any] | None = None, factory: Any = None) -> int | None:
    """The env steps (`ScheduleConfig.total_env_steps`) a task recommends for a run, or None."""
    rec = task_recommendation("recommended_budget", name, env_kwargs, factory)
    return rec if type(rec) is int and rec >= 1 else None


def task_defaults(name: str, env_kwargs: dict[str, Any] | None = None, factory: Any = None) -> TaskDefaults:
    """Everything a task recommends for a run (its exploration, its episode's context, its budget), as the plain
    data `icrl.config.resolve.resolve` takes."""
    return TaskDefaults(exploration=task_exploration(name, env_kwargs, factory),
                        context=task_context(name, env_kwargs, factory), budget=task_budget(name, env_kwargs, factory))


def make_run_envs(e: EnvConfig, num_envs: int, *, asynchronous: bool = False,
                  factories: Sequence[Any] | None = None) -> gym.vector.VectorEnv:
    """`num_envs` copies of the run's env, each rollout `episodes_per_rollout` episodes (icrl.envs.make)."""
    return make_vector_env(e.env, e.kwargs, num_envs, asynchronous=asynchronous, factories=factories,
                           episodes_per_rollout=e.episodes_per_rollout, rollout_horizon=e.rollout_horizon)
