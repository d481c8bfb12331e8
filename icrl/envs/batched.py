"""The built-in fast tasks, each written once: its rules on arrays of N copies (`ArrayTask`), a Gymnasium env as
one copy, and `BatchedTaskEnv`, every copy at once in one `gymnasium.vector.VectorEnv`, no per-copy Python.

A `SyncVectorEnv` of `TimestepWrapper`'d envs costs ~30 µs per copy and step in Python (the vector loop, the
wrapper's checks and clock, the task's own step), which at 128 copies is more time than the policy's step
(docs/results.md, acting). A task here keeps its state in [N] arrays and steps every copy at once; as a
`gym.Env` (`TMaze(length=10)`) it is the same code with N = 1.

`BatchedTaskEnv` gives exactly what `make_vector_env` gives with the one-copy envs, under the same seed and
rollout settings: the same timesteps (`{"obs", "prev_action", "prev_reward", "time", "reset"}`, dtypes
included), rewards, terminations, truncations, SAME_STEP autoresets and infos (`final_obs`, `final_info`,
`success`, `episode_end`), and the same task draws, because copy i draws its hidden task from its own
generator, seeded as gymnasium seeds the copies of a `SyncVectorEnv` (seed + i)
(tests/unit/test_batched_envs.py steps both side by side). Multi-episode rollouts (`episodes_per_rollout` k or
`rollout_horizon` H, docs/design.md §2) follow `TimestepWrapper`: an inner episode's final timestep, then a
bridge step (the action ignored, the next episode of the same task starts with reset flag 1, time counting on),
the rollout ending as its k-th episode does or truncated at H. The time, episode index and previous action are
`RolloutClocks` (icrl.envs.clock), the array form of the wrapper's `RolloutClock`.

Goal-conditioned tasks (docs/CONTRACTS.md) add the timestep entry "achieved" ([N, K] int64, -1 padded) and the
info key "achieved" (each copy's list of tokens, as every reset and step of the one-copy env reports it).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
from gymnasium.utils import seeding
from gymnasium.vector.utils import batch_space

from icrl.envs.clock import RolloutClocks
from icrl.envs.tasks.grid import wants_new_task
from icrl.envs.wrapper import TimestepWrapper
from icrl.types import box_to_env


class StepArrays(NamedTuple):
    """What a step of the copies gives, every copy at once."""

    reward: np.ndarray  # [N] float64
    terminated: np.ndarray  # [N] bool
    success: np.ndarray  # [N] float64, NaN where the copy reports none
    truncated: np.ndarray | None = None  # [N] bool (None: the task never truncates)
    achieved: np.ndarray | None = None  # [N, K] int64, -1 padded: goal tasks' tokens this step achieved


class CopyArrays(ABC):
    """The state of N copies of a task in arrays and the rules that step them all: what `BatchedTaskEnv` steps.

    A task implements `_allocate(n)` (its state arrays), `_draw_tasks(rows)` (a new hidden task for the rows
    (indices), drawn from `self._rng(i)`), `_reset_rows(rows)` (the episode's state), `_obs()` (the
    observation's flattened keys, as TimestepWrapper names them -> [N, ...] arrays of the current state, fresh
    each call) and `_step_arrays(actions)` -> `StepArrays` on the env's own actions [N(, D)]; a task whose
    reset with `options={"new_task": False}` draws something overrides `_draw_episodes(rows)`. `self._time`
    [N] is each copy's step count since its episode's reset, kept by the caller.
    """

    num_copies = 0

    def _copies(self, n: int) -> CopyArrays:
        """Hold the state of `n` copies (each unseeded until its owner seeds it)."""
        self.num_copies = int(n)
        self._rngs: list[np.random.Generator | None] = [None] * self.num_copies
        self._time = np.zeros(self.num_copies, np.int64)  # [N]
        self._allocate(self.num_copies)
        return self

    def _rng(self, i: int) -> np.random.Generator:
        rng = self._rngs[i]
        assert rng is not None, "reset seeds every copy's generator"
        return rng

    @abstractmethod
    def _allocate(self, n: int) -> None:
        """The task's state arrays for `n` copies."""

    @abstractmethod
    def _draw_tasks(self, rows: np.ndarray) -> None:
        """A new hidden task for `rows`, drawn from `self._rng(i)`."""

    def _draw_episodes(self, rows: np.ndarray) -> None:  # noqa: B027 - optional: most tasks keep theirs
        """The draws of `reset(options={"new_task": False})` for `rows`: none by default (the copy keeps its
        hidden task and draws nothing)."""

    @abstractmethod
    def _reset_rows(self, rows: np.ndarray) -> None:
        """The episode's state of `rows` at its reset (the hidden task already drawn)."""

    @abstractmethod
    def _obs(self) -> dict[str, np.ndarray]:
        """The observation's flattened keys -> [N, ...] arrays of the current state, fresh each call."""

    @abstractmethod
    def _step_arrays(self, actions: np.ndarray) -> StepArrays:
        """Every copy's step on its env actions [N(, D)]."""


_RENDERERS = {"rgb_array": "_frame", "ansi": "_ansi"}  # render_mode -> the ArrayTask method that draws it


class ArrayTask(CopyArrays, gym.Env):
    """A built-in task written once, on arrays (`CopyArrays`); as a `gym.Env`, one copy: Gymnasium's `reset` and
    `step` run the array rules on row 0, with the env's own `np_random` as that row's generator, and
    `render()` draws it (`_frame()` for render_mode "rgb_array", `_ansi()` for "ansi").

    A hidden task is drawn at the first reset, a seeded one, and every reset unless `options={"new_task":
    False}` (the next episode of the same task, meta-RL rollouts). Infos: `success` on the step that ends an
    episode (where the task reports one); goal tasks (`metadata["achieved_slots"]`) `achieved`, the tokens of
    each step (`[]` at a reset). A subclass's `__init__` checks its parameters, sets its spaces and ends with
    `self._copies(1)`.
    """

    render_mode: str | None = None
    _has_task = False

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self._one_copy("reset")
        self._rngs[0] = self.np_random
        row = np.zeros(1, np.int64)
        if wants_new_task(options, seed, self._has_task):
            self._draw_tasks(row)
        else:
            self._draw_episodes(row)
        self._has_task = True
        self._reset_rows(row)
        self._time[0] = 0
        return self._row_obs(), ({"achieved": []} if self.metadata.get("achieved_slots") else {})

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        self._one_copy("step")
        space = self.action_space
        if isinstance(space, gym.spaces.Discrete):
            a = int(action)
            if not 0 <= a < int(space.n):
                raise ValueError(f"{type(self).__name__} action must be in [0, {int(space.n)}), got {a}")
            actions = np.array([a], np.int64)  # [1]
        else:
            actions = np.asarray(action, space.dtype).reshape(1, -1)  # [1, D]
        self._time += 1
        out = self._step_arrays(actions)
        info: dict[str, Any] = {}
        if out.achieved is not None:
            info["achieved"] = [t for t in out.achieved[0].tolist() if t >= 0]
        if not np.isnan(out.success[0]):
            info["success"] = float(out.success[0])
        truncated = out.truncated is not None and bool(out.truncated[0])
        return self._row_obs(), float(out.reward[0]), bool(out.terminated[0]), truncated, info

    def _copies(self, n: int) -> ArrayTask:
        """`CopyArrays._copies`, after checking `render_mode` against the modes the task declares."""
        modes = self.metadata.get("render_modes", [])
        if self.render_mode is not None and self.render_mode not in modes:
            raise ValueError(f"{type(self).__name__} render_mode must be one of {modes} or None, got "
                             f"{self.render_mode!r}")
        super()._copies(n)
        return self

    def render(self) -> str | np.ndarray | None:
        """Row 0 drawn in `render_mode`: the task's `_frame()` for "rgb_array" (an [H, W, 3] uint8 image),
        `_ansi()` for "ansi" (text); None without a mode. A task declares in `metadata["render_modes"]` the modes
        it draws (checked when it is built)."""
        if self.render_mode is None:
            return None
        return getattr(self, _RENDERERS[self.render_mode])()

    def _one_copy(self, what: str) -> None:
        if self.num_copies != 1:
            raise RuntimeError(f"{type(self).__name__}.{what}: this instance holds {self.num_copies} copies, "
                               "stepped by BatchedTaskEnv; build another for a one-copy env")

    def _row_obs(self) -> Any:
        """Row 0's observation, as the observation space holds it (a Dict's keys, else the Box)."""
        obs = self._obs()
        if isinstance(self.observation_space, gym.spaces.Dict):
            return {k: obs[k][0] for k in self.observation_space.spaces}
        return obs["obs"][0]


class BatchedTaskEnv(gym.vector.VectorEnv):
    """N copies of a task on arrays (`copies`) as one vector env: spaces, seeding, timesteps, rollouts of one
    or several episodes, SAME_STEP autoreset. `proto` (default: `copies` itself, an `ArrayTask`) is the one-copy
    env whose spaces, action conversion and attributes (`get_attr`) the copies share."""

    def __init__(
        self, copies: CopyArrays, num_envs: int, episodes_per_rollout: int = 1, rollout_horizon: int | None = None,
        proto: gym.Env | None = None,
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if proto is None:
            assert isinstance(copies, gym.Env), "a CopyArrays that is not an env needs its one-copy env as proto"
            proto = copies
        # the one-copy env's spaces, action conversions and rollout settings (checked there), built once
        wrapped = TimestepWrapper(proto, episodes_per_rollout, rollout_horizon)
        self.copies = copies._copies(num_envs)
        self._proto = wrapped
        self.num_envs = int(num_envs)
        self.single_observation_space = wrapped.observation_space
        self.single_action_space = wrapped.action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.metadata = {**getattr(proto, "metadata", {}), "autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
        self.spec = None
        self.render_mode = None
        self.action_spec = wrapped.action_spec
        space = wrapped.observation_space
        assert isinstance(space, gym.spaces.Dict)
        self._obs_keys = list(space["obs"].spaces)  # type: ignore[attr-defined]  # flattened keys
        self._keys = list(space.spaces)
        self._slots = wrapped.achieved_slots  # K > 0: a goal task, "achieved" in timesteps and infos
        self._clock = RolloutClocks(self.action_spec, self.num_envs, wrapped.episodes_per_rollout,
                                    wrapped.rollout_horizon)  # the timesteps' time, episode, previous action
        self._pending = np.zeros(self.num_envs, bool)  # [N] the last timestep ended an inner episode
        self._started = False

    # ----------------------------------------------------------------------------- what the copies share
    def get_attr(self, name: str) -> tuple[Any, ...]:
        """An attribute of the wrapped one-copy env, once per copy (as `SyncVectorEnv.get_attr`): the copies
        differ only in state, so the prototype answers for all (`env_observation_space`, `spec`, ...)."""
        return (getattr(self._proto, name),) * self.num_envs

    def _seed_rows(self, seed: int | list[int | None] | None) -> None:
        """Gymnasium's `Env.reset(seed=...)` for every copy: a new generator where a seed is given (int:
        seed + i, as `SyncVectorEnv`), the existing one otherwise (a fresh unseeded one the first time)."""
        seeds: list[int | None]
        if isinstance(seed, int):
            seeds = [seed + i for i in range(self.num_envs)]
        else:
            seeds = [None] * self.num_envs if seed is None else list(seed)
        if len(seeds) != self.num_envs:
            raise ValueError(f"{len(seeds)} seeds for {self.num_envs} envs")
        rngs = self.copies._rngs
        for i, s in enumerate(seeds):
            if s is not None or rngs[i] is None:
                rngs[i], _ = seeding.np_random(s)

    def _start_rows(self, rows: np.ndarray, new_task: bool) -> None:
        """The one-copy wrapper's reset of the copies `rows` (indices): a new task (its hard reset) or the
        next episode of the same task (a bridge step's `reset(options={"new_task": False})`)."""
        if new_task:
            self.copies._draw_tasks(rows)
        else:
            self.copies._draw_episodes(rows)
        self.copies._reset_rows(rows)
        self.copies._time[rows] = 0
        self._clock.start(rows, new_task)
        self._pending[rows] = False

    def _timestep(self, reward: np.ndarray, reset: np.ndarray, achieved: np.ndarray | None = None) -> dict[str, Any]:
        """The batched timestep of the current state: [N, ...] arrays, fresh each call. `achieved` [N, K]: the
        goal tokens of the step that led here (a reset achieves nothing: -1)."""
        keep = ~reset
        obs = self.copies._obs()
        ts = {"obs": {k: obs[k] for k in self._obs_keys}, **self._clock.timestep(reward, keep)}
        if self._slots:
            none = np.full((self.num_envs, self._slots), -1, np.int64)
            ts["achieved"] = none if achieved is None else np.where(keep[:, None], achieved, none)  # [N, K]
        return {k: ts[k] for k in self._keys}  # the observation space's key order, as a SyncVectorEnv's

    def _reset_info(self) -> dict[str, Any]:
        """What the one-copy env's reset reports: a goal task `achieved=[]`, the others nothing."""
        return {"achieved": []} if self._slots else {}

    # --------------------------------------------------------------------------------------------- API
    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        if options:
            raise ValueError(f"{type(self).__name__}.reset takes no options (got {sorted(options)})")
        self._seed_rows(seed)
        n = self.num_envs
        self._start_rows(np.arange(n), new_task=True)
        self._started = True
        info = {"achieved": _object_array([[] for _ in range(n)]), "_achieved": np.ones(n, bool)} if self._slots else {}
        return self._timestep(np.zeros(n), np.ones(n, bool)), info

    def step(self, actions: Any) -> tuple[dict[str, Any], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        if not self._started:
            raise RuntimeError(f"{type(self).__name__}.step before reset")
        stored, bridge = self._checked_actions(actions)
        self.copies._time += 1
        out = self.copies._step_arrays(self._env_actions(stored))  # the bridge rows' steps are undone below
        self._clock.acted(self.action_spec.to_vector(stored))  # a bridge's ignored action counts as a step
        if bridge.any():
            self._start_rows(np.flatnonzero(bridge), new_task=False)
        stepped = ~bridge
        inner_term = out.terminated & stepped
        inner_trunc = stepped & (False if out.truncated is None else out.truncated)
        terminated, truncated = self._rollout_ends(inner_term, inner_trunc)
        reward = np.where(bridge, 0.0, out.reward)
        obs = self._timestep(reward, bridge, out.achieved)
        success = np.where(bridge, np.nan, out.success)
        obs, info = self._infos(obs, reward, terminated | truncated, inner_term | inner_trunc, bridge, success,
                                out.achieved)
        return obs, reward, terminated, truncated, info

    def _checked_actions(self, actions: Any) -> tuple[np.ndarray, np.ndarray]:
        """The actions in storage form, and [N] bool: the rows whose action a bridge step ignores (their last
        timestep ended an inner episode), replaced by 0 here; the others' discrete ids checked."""
        spec = self.action_spec
        stored = spec.as_stored(np.asarray(actions).reshape(spec.storage_shape(self.num_envs)))
        bridge = self._pending.copy()
        if bridge.any():
            stored = stored.copy()  # never the caller's array
            stored[bridge] = 0
        if spec.kind == "discrete" and (stored.min() < 0 or stored.max() >= spec.dim):
            bad = int(stored[(stored < 0) | (stored >= spec.dim)][0])
            raise ValueError(f"{type(self).__name__}: discrete action {bad} outside [0, {spec.dim})")
        return stored, bridge

    def _env_actions(self, stored: np.ndarray) -> np.ndarray:
        """Stored actions [N(, D)] -> the env's own, as `agent_to_env_action` maps one copy's: a Discrete's
        ids shifted by its start, a Box's [-1, 1] mapped onto its bounds (`box_to_env`)."""
        space = self._proto.env_action_space
        if isinstance(space, gym.spaces.Discrete) and int(space.start):
            return stored + int(space.start)
        if isinstance(space, gym.spaces.Box):
            return box_to_env(space, stored)
        return stored

    def _rollout_ends(self, terminated: np.ndarray, truncated: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`TimestepWrapper.step`'s rule, every copy at once: (terminated, truncated) of the rollout, given
        those of the inner episodes (False for the bridge rows), after the clock moved. A rollout of k
        episodes ends as its k-th does; one with a horizon is truncated once time reaches it (a bridge step
        too); an inner episode that ends short of that makes the next step a bridge (`self._pending`)."""
        over = self._clock.rollout_over()  # [N]
        ended = terminated | truncated
        self._pending = ended & ~over
        if self._clock.rollout_horizon is not None:
            return np.zeros(self.num_envs, bool), over.copy()
        return terminated & over, truncated & over

    def _infos(
        self, obs: dict[str, Any], reward: np.ndarray, done: np.ndarray, ended: np.ndarray, bridge: np.ndarray,
        success: np.ndarray, achieved: np.ndarray | None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The vector info of a step, as SyncVectorEnv builds it from each copy's info, and the copies whose
        rollout ended (`done`: once per rollout) reset: their final timestep and info go into `final_obs` /
        `final_info`.
        Per-copy Python only for the rows whose info holds more than a goal task's tokens: an episode's end,
        a success, a bridge step."""
        tokens = _token_lists(achieved) if self._slots and achieved is not None else None
        info: dict[str, Any] = {}
        for i in np.flatnonzero(done | ended | bridge | ~np.isnan(success)).tolist():
            if bridge[i]:  # a bridge step returns what the next episode's reset reports
                step_info = self._reset_info()
            else:  # the per-copy task's info, the wrapper's `episode_end` added
                step_info = {"achieved": tokens[i]} if tokens is not None else {}
                if not np.isnan(success[i]):
                    step_info["success"] = float(success[i])
                if ended[i]:
                    step_info["episode_end"] = True
            if done[i]:
                info = self._add_info(info, {"final_obs": _row(obs, i), "final_info": step_info}, i)
            else:
                info = self._add_info(info, {k: v for k, v in step_info.items() if k != "achieved"}, i)
            if tokens is not None and (done[i] or bridge[i]):
                tokens[i] = []  # what a reset reports
        rows = np.flatnonzero(done)
        if rows.size:  # SAME_STEP autoreset: a new task
            self._start_rows(rows, new_task=True)
            obs = {k: _merge(obs[k], v, done) for k, v in self._timestep(reward, done).items()}
        if tokens is not None:  # SyncVectorEnv adds each copy's info in turn: keys of copy 0's first
            got = {"achieved": _object_array(tokens), "_achieved": np.ones(self.num_envs, bool)}
            info = {**info, **got} if done[0] else {**got, **info}
        return obs, info

    def close_extras(self, **kwargs: Any) -> None:
        self._proto.close()


def _token_lists(achieved: np.ndarray) -> list[list[int]]:
    """[N, K] int64 tokens, -1 padded -> each copy's list of tokens (info["achieved"] of the per-copy task)."""
    if achieved.shape[1] == 1:
        return [[t] if t >= 0 else [] for t in achieved[:, 0].tolist()]
    return [[t for t in row if t >= 0] for row in achieved.tolist()]


def _object_array(items: list) -> np.ndarray:
    """[N] object array holding `items` (lists stay list objects, as gymnasium's `_add_info` stores them)."""
    return np.fromiter(items, dtype=object, count=len(items))


def _row(value: Any, i: int) -> Any:
    """Copy i of a batched timestep entry (nested dict of [N, ...] arrays), as the per-copy env returns it."""
    if isinstance(value, dict):
        return {k: _row(v, i) for k, v in value.items()}
    return np.array(value[i])  # a 0-d array for the scalar entries, as TimestepWrapper gives them


def _merge(old: Any, new: Any, rows: np.ndarray) -> Any:
    """`old` with the copies in `rows` [N] bool replaced by `new`'s (nested dicts of [N, ...] arrays)."""
    if isinstance(old, dict):
        return {k: _merge(old[k], new[k], rows) for k in old}
    out = old.copy()
    out[rows] = new[rows]
    return out
