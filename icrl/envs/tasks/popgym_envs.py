"""POPGym (Morad et al., ICLR 2023) partially observable tasks on Gymnasium 1.x, plus a multi-task mix.

`make_popgym("RepeatPreviousEasy")` builds any env of `popgym.envs.ALL` by its class name (or its registered
id, `"popgym-RepeatPreviousEasy-v0"`), passing keyword arguments to the class. The envs are used as
published: rewards scaled so that an episode's return lies in [-1, 1], no time limit added (every POPGym env
ends on its own: registered ids have `max_episode_steps=None`), and no `info["success"]` (POPGym defines no
success criterion, so none is invented). Two spaces are adapted so that `TimestepWrapper` accepts every env:

- a `Tuple` observation (the Autoencode envs) becomes a `Dict` keyed "0", "1", ... (`TupleToDictObs`);
- a `MultiDiscrete` action (Battleship, MineSweeper: a board cell) becomes one `Discrete(prod(nvec))`
  action, unravelled row-major (`FlatDiscreteAction`).

Every other space (Box with finite or infinite bounds, Discrete, MultiDiscrete observations; Discrete and
bounded Box actions) goes through `TimestepWrapper` unchanged. The six Labyrinth envs exist only when the
optional `mazelib` package is installed (`popgym.envs.ALL` leaves them out otherwise).

Every POPGym game has a fixed length that is part of the game (a deck, a number of rounds, CartPole's
200 steps); the few that report reaching it as `truncated` are adapted to report `terminated`
(`FixedLengthTermination`), as the official AMAGO does (`truncated_is_done=True`): bootstrapping past a
game's last step regresses on a state that is never trained, which cost the official code a regression
on POPGym (docs/design.md §10).

POPGym envs have no hidden task to keep: `reset(options={"new_task": False})` starts a fresh episode like any
reset (a new deck, a new bandit, ...), so in multi-episode rollouts each episode is a new instance.

`popgym_multi(names)` is a one-shot multi-task env: each rollout plays one POPGym task, sampled on reset (see
`PopGymMulti`).

popgym is an optional dependency (`pip install 'icrl[popgym]'`); it is imported only when an env is built.
"""

from __future__ import annotations

import difflib
import functools
from typing import Any, Callable, SupportsFloat

import gymnasium as gym
import numpy as np

from icrl.envs.wrapper import _flatten_obs_space

# A few short-episode, discrete-action Easy tasks of different kinds (memory, counting, bandit, card game).
DEFAULT_MULTI_TASKS = (
    "RepeatPreviousEasy",
    "RepeatFirstEasy",
    "CountRecallEasy",
    "AutoencodeEasy",
    "MultiarmedBanditEasy",
    "HigherLowerEasy",
)


# ------------------------------------------------------------------------------------------------- registry
def _import_popgym_envs():
    try:
        import popgym.envs  # noqa: PLC0415 - optional dependency, imported on use
    except ImportError as e:
        raise ImportError(
            "POPGym envs need the optional package popgym: pip install 'icrl[popgym]' (or pip install popgym)"
        ) from e
    return popgym.envs


def popgym_env_classes() -> dict[str, type[gym.Env]]:
    """Class name -> env class for every env of `popgym.envs.ALL` (empty when popgym is not installed)."""
    try:
        envs = _import_popgym_envs()
    except ImportError:
        return {}
    return {cls.__name__: cls for cls in envs.ALL}


def _all_specs() -> dict[type[gym.Env], dict[str, Any]]:
    """`popgym.envs.ALL` (the Easy/Medium/Hard suite) plus `ALL_BASE`, the parameterisable base classes
    ("RepeatPrevious", ...) whose constructor takes the keyword arguments the levels fix."""
    envs = _import_popgym_envs()
    return {**envs.ALL, **getattr(envs, "ALL_BASE", {})}


def _popgym_ids() -> dict[str, str]:
    """Registered id (e.g. 'popgym-RepeatPreviousEasy-v0') -> class name."""
    return {spec["id"]: cls.__name__ for cls, spec in _all_specs().items()}


def _labyrinth_hint(name: str) -> str:
    if "labyrinth" in name.lower():
        return " The Labyrinth envs need the optional package mazelib (pip install mazelib)."
    return ""


def resolve_popgym_name(name: str) -> str:
    """A POPGym class name or registered id -> the class name; ValueError naming the choices otherwise."""
    classes = {c.__name__: c for c in _all_specs()}
    if name in classes:
        return name
    ids = _popgym_ids()
    if name in ids:
        return ids[name]
    close = difflib.get_close_matches(name, list(classes) + list(ids), n=3, cutoff=0.6)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    raise ValueError(
        f"Unknown POPGym env {name!r}.{hint}{_labyrinth_hint(name)} Available ({len(classes)}): "
        f"{', '.join(sorted(classes))}"
    )


# ------------------------------------------------------------------------------------------------ wrappers
class TupleToDictObs(gym.ObservationWrapper):
    """`Tuple(s0, s1, ...)` observation -> `Dict({"0": s0, "1": s1, ...})` (nested Tuples too), so that
    `TimestepWrapper` can flatten it. Values are unchanged; only the container differs."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.observation_space = self._to_dict_space(env.observation_space)

    @classmethod
    def _to_dict_space(cls, space: gym.Space) -> gym.Space:
        if isinstance(space, gym.spaces.Tuple):
            return gym.spaces.Dict({str(i): cls._to_dict_space(s) for i, s in enumerate(space.spaces)})
        if isinstance(space, gym.spaces.Dict):
            return gym.spaces.Dict({k: cls._to_dict_space(s) for k, s in space.spaces.items()})
        return space

    @classmethod
    def _to_dict(cls, value: Any, space: gym.Space) -> Any:
        if isinstance(space, gym.spaces.Tuple):
            return {str(i): cls._to_dict(v, s) for i, (v, s) in enumerate(zip(value, space.spaces))}
        if isinstance(space, gym.spaces.Dict):
            return {k: cls._to_dict(value[k], s) for k, s in space.spaces.items()}
        return value

    def observation(self, observation: Any) -> Any:
        return self._to_dict(observation, self.env.observation_space)


class FlatDiscreteAction(gym.ActionWrapper):
    """`MultiDiscrete(nvec)` action -> `Discrete(prod(nvec))`: action k is `np.unravel_index(k, nvec)`
    (row-major: for a board, k = row * width + column), shifted by the space's `start`."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        space = env.action_space
        if not isinstance(space, gym.spaces.MultiDiscrete):
            raise ValueError(f"FlatDiscreteAction needs a MultiDiscrete action space, got {space!r}")
        self._nvec = np.asarray(space.nvec, dtype=np.int64)
        self._start = np.asarray(space.start, dtype=np.int64)
        self._num_actions = int(np.prod(self._nvec))
        self.action_space = gym.spaces.Discrete(self._num_actions)

    def action(self, action: Any) -> np.ndarray:
        k = int(np.asarray(action).reshape(()))
        if not 0 <= k < self._num_actions:
            raise ValueError(f"action {k} outside [0, {self._num_actions})")
        idx = np.asarray(np.unravel_index(k, self._nvec), dtype=np.int64).reshape(self._nvec.shape)
        return (idx + self._start).astype(self.env.action_space.dtype)


class FixedLengthTermination(gym.Wrapper):
    """`truncated` reported as `terminated`: the env's step limit is part of its task definition."""

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, bool(terminated or truncated), False, info


def _adapt_spaces(env: gym.Env) -> gym.Env:
    env = FixedLengthTermination(env)
    if isinstance(env.observation_space, gym.spaces.Tuple):
        env = TupleToDictObs(env)
    if isinstance(env.action_space, gym.spaces.MultiDiscrete):
        env = FlatDiscreteAction(env)
    return env


# ------------------------------------------------------------------------------------------------ factories
def make_popgym(name: str, **kwargs: Any) -> gym.Env:
    """Build the POPGym env `name` (class name such as "RepeatPreviousEasy", or its registered id) with
    `kwargs` passed to its class, with Tuple observations and MultiDiscrete actions adapted (module doc).

    The level classes (*Easy, *Medium, *Hard) take no arguments; the base classes ("RepeatPrevious",
    "Battleship", ...) take the ones the levels fix, e.g. `make_popgym("RepeatPrevious", k=8)`.
    """
    cls_name = resolve_popgym_name(name)
    cls = {c.__name__: c for c in _all_specs()}[cls_name]
    return _adapt_spaces(cls(**kwargs))


def popgym_context(name: str, **kwargs: Any) -> int | None:
    """The context a POPGym game needs: its whole episode (`max_episode_length` action steps, e.g. 51 for
    RepeatPreviousEasy, 831 for RepeatFirstHard), or None for the games without a fixed length."""
    cls = {c.__name__: c for c in _all_specs()}[resolve_popgym_name(name)]
    n = getattr(cls(**kwargs), "max_episode_length", None)
    return int(n) if isinstance(n, int) and n > 0 else None


def _popgym_factory(name: str) -> Callable[..., gym.Env]:
    factory = functools.partial(make_popgym, name)
    factory.recommended_context = functools.partial(popgym_context, name)  # type: ignore[attr-defined]
    return factory


def popgym_builtin_envs() -> dict[str, Callable[..., gym.Env]]:
    """The entries to register as built-in tasks: "popgym/<EnvClassName>" for every env of
    `popgym.envs.ALL`, plus "popgym_multi". Empty when popgym is not installed. The factories are
    `functools.partial`s of module-level functions, so they pickle for subprocess vector envs; each carries the
    game's `recommended_context` (icrl.envs.make.task_context)."""
    classes = popgym_env_classes()
    if not classes:
        return {}
    out: dict[str, Callable[..., gym.Env]] = {
        f"popgym/{name}": _popgym_factory(name) for name in sorted(classes)
    }
    out["popgym_multi"] = popgym_multi
    return out


# --------------------------------------------------------------------------------------------- multi-task
class PopGymMulti(gym.Env):
    """One-shot multi-task POPGym: every rollout plays one task sampled uniformly from `names`.

    - Task sampling: `reset(options={"new_task": True})` or `reset()` / `reset(options=None)` samples a task;
      `reset(options={"new_task": False})` keeps the current one (a new episode of it), so the episodes of a
      meta-RL rollout (`TimestepWrapper(episodes_per_rollout=k)`) all play the same task. A seeded reset
      reseeds the task sampler and every task env (each from its own seed drawn from `seed`).
    - Observations: each task's observation is converted as `TimestepWrapper` would (Discrete and
      MultiDiscrete one-hot, Box flattened, Dict/Tuple leaves concatenated in key order), flattened and
      zero-padded to the longest task's width: one float32 Box. **No task id is given**: the agent has to
      infer the task from what it sees and the rewards it gets in context.
    - Actions: one `Discrete(max n)` over the tasks' (flattened) discrete action spaces. An action id that
      is invalid for the current task (>= its n) is executed as action 0 (a fixed valid action); the
      returned info then holds `invalid_action=True`. Tasks with continuous actions (the Pendulum envs) are
      rejected.
    - Rewards, termination and the absence of a success signal are the task's own, except that
      `reward_scales` (task name -> factor, 1 for a task it leaves out) multiplies a task's every reward: a mix
      whose tasks' returns differ by hidden factors, the setting of AMAGO-2's scale-resistant update
      (`benchmarks/multitask_scale.py`). Every reset and step info
      holds `info["task"]`, the current task's class name (e.g. "RepeatFirstEasy": icrl logs return per task,
      docs/CONTRACTS.md), and `info["task_id"]`, its index into `names` (the agent never sees info).
    """

    metadata = {"render_modes": []}
    action_space: gym.spaces.Discrete  # set in __init__

    def __init__(
        self,
        names: list[str] | tuple[str, ...] | None = None,
        seed: int | None = None,
        task_kwargs: dict[str, dict[str, Any]] | None = None,
        reward_scales: dict[str, float] | None = None,
    ):
        names = list(DEFAULT_MULTI_TASKS if names is None else names)
        if not names:
            raise ValueError("popgym_multi needs at least one task name")
        names = [resolve_popgym_name(n) for n in names]
        if len(set(names)) != len(names):
            raise ValueError(f"popgym_multi task names must be distinct, got {names}")
        task_kwargs = dict(task_kwargs or {})
        unknown = set(task_kwargs) - set(names)
        if unknown:
            raise ValueError(f"task_kwargs names tasks not in names: {sorted(unknown)}")
        scales = {resolve_popgym_name(n): v for n, v in (reward_scales or {}).items()}
        unknown = set(scales) - set(names)
        if unknown:
            raise ValueError(f"reward_scales names tasks not in names: {sorted(unknown)}")
        bad = {n: v for n, v in scales.items() if not (isinstance(v, (int, float)) and np.isfinite(v) and v > 0)}
        if bad:
            raise ValueError(f"reward_scales must be finite numbers > 0, got {bad}")
        self.names = names
        self.reward_scales = [float(scales.get(n, 1.0)) for n in names]
        self.envs = [make_popgym(n, **task_kwargs.get(n, {})) for n in names]
        self._obs_fns: list[list[tuple[tuple[str, ...], Callable]]] = []
        lows, highs, self._n_actions = [], [], []
        for name, env in zip(names, self.envs):
            if not isinstance(env.action_space, gym.spaces.Discrete):
                raise ValueError(
                    f"popgym_multi needs discrete-action tasks; {name} has {env.action_space!r}"
                )
            self._n_actions.append(int(env.action_space.n))
            leaves = _flatten_obs_space(env.observation_space)
            self._obs_fns.append([(path, fn) for _, path, _, fn in leaves])
            lows.append(np.concatenate([box.low.astype(np.float32).reshape(-1) for _, _, box, _ in leaves]))
            highs.append(np.concatenate([box.high.astype(np.float32).reshape(-1) for _, _, box, _ in leaves]))
        self.obs_dim = max(len(low) for low in lows)
        low = np.zeros(self.obs_dim, np.float32)  # padding is 0, so 0 is inside every bound
        high = np.zeros(self.obs_dim, np.float32)
        for lo, hi in zip(lows, highs):
            low[: len(lo)] = np.minimum(low[: len(lo)], lo)
            high[: len(hi)] = np.maximum(high[: len(hi)], hi)
        self.observation_space = gym.spaces.Box(low, high, (self.obs_dim,), np.float32)
        self.action_space = gym.spaces.Discrete(max(self._n_actions))
        self.task = 0
        self._task_seeds: list[int | None] = [None] * len(self.envs)
        if seed is not None:
            self._seed(seed)

    def _seed(self, seed: int) -> None:
        super().reset(seed=seed)
        self._task_seeds = [int(s) for s in self.np_random.integers(0, 2**31 - 1, size=len(self.envs))]

    @property
    def task_name(self) -> str:
        return self.names[self.task]

    def _obs(self, raw: Any) -> np.ndarray:
        parts = []
        for path, fn in self._obs_fns[self.task]:
            value = raw
            for p in path:
                value = value[p]
            parts.append(np.asarray(fn(value), dtype=np.float32).reshape(-1))
        flat = np.concatenate(parts)
        out = np.zeros(self.obs_dim, np.float32)
        out[: len(flat)] = flat
        return out

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        if seed is not None:
            self._seed(seed)
        new_task = True if options is None else bool(options.get("new_task", True))
        if new_task or seed is not None:
            self.task = int(self.np_random.integers(len(self.envs)))
        env_seed, self._task_seeds[self.task] = self._task_seeds[self.task], None  # each seed used once
        raw, info = self.envs[self.task].reset(seed=env_seed)
        return self._obs(raw), {**info, **self._task_info()}

    def _task_info(self) -> dict[str, Any]:
        return {"task": self.task_name, "task_id": self.task}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        a = int(np.asarray(action).reshape(()))
        if not 0 <= a < self.action_space.n:
            raise ValueError(f"action {a} outside [0, {self.action_space.n})")
        invalid = a >= self._n_actions[self.task]
        raw, reward, terminated, truncated, info = self.envs[self.task].step(np.int64(0 if invalid else a))
        info = {**info, **self._task_info()}
        if invalid:
            info["invalid_action"] = True
        return self._obs(raw), float(reward) * self.reward_scales[self.task], bool(terminated), bool(truncated), info

    def close(self) -> None:
        for env in self.envs:
            env.close()


def popgym_multi(
    names: list[str] | None = None,
    seed: int | None = None,
    task_kwargs: dict[str, dict[str, Any]] | None = None,
    reward_scales: dict[str, float] | None = None,
) -> PopGymMulti:
    """One-shot multi-task POPGym env over `names` (class names or ids; default `DEFAULT_MULTI_TASKS`);
    `seed` seeds it at construction (a seeded `reset` does too); `task_kwargs` maps a name to its kwargs and
    `reward_scales` a name to a factor on its rewards."""
    return PopGymMulti(names, seed=seed, task_kwargs=task_kwargs, reward_scales=reward_scales)
