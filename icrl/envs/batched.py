"""Built-in numpy tasks stepped as arrays: N copies in one `gymnasium.vector.VectorEnv`, no per-copy Python.

A `SyncVectorEnv` of `TimestepWrapper`'d envs costs ~30 µs per copy and step in Python (the vector loop, the
wrapper's checks and clock, the task's own step), which at 128 copies is more time than the policy's step
(docs/results.md, acting). The tasks here keep their state in arrays and step every copy at once.

Each class gives exactly what `make_vector_env` would give with the per-copy code, under the same seed:
the same timesteps (`{"obs", "prev_action", "prev_reward", "time", "reset"}`, dtypes included), rewards,
terminations, SAME_STEP autoresets and infos (`final_obs`, `final_info` with `success` / `episode_end`), and
the same task draws, because copy i draws its hidden task from its own generator, seeded as gymnasium seeds
the copies of a `SyncVectorEnv` (seed + i) and drawn with the same calls as the task's `reset`
(tests/unit/test_batched_envs.py steps both side by side). They cover single-episode rollouts, which is all
these tasks use; `make_vector_env` builds the per-copy env for anything else (meta-RL rollouts of several
episodes, a horizon, user factories).

The timestep rule of a single-episode rollout (docs/design.md §2, `RolloutClock`): time counts the actions
taken since the reset; the previous action and reward are those of the last step, zero at the reset, where
the reset flag is 1.

Goal-conditioned tasks (docs/CONTRACTS.md; their batched forms are in icrl.envs.batched_goals) add the
timestep entry "achieved" ([N, K] int64, -1 padded) and the info key "achieved" (each copy's list of tokens,
as every reset and step of the per-copy task reports it).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
from gymnasium.utils import seeding
from gymnasium.vector.utils import batch_space

from icrl.envs.tasks.recall import CueRecall
from icrl.envs.tasks.tmaze import DOWN, LEFT, RIGHT, UP, TMaze, TMazeActive
from icrl.envs.wrapper import TimestepWrapper


class StepArrays(NamedTuple):
    """What a batched task's step gives, every copy at once."""

    reward: np.ndarray  # [N] float64
    terminated: np.ndarray  # [N] bool
    success: np.ndarray  # [N] float64, NaN where the copy reports none
    truncated: np.ndarray | None = None  # [N] bool (None: the task never truncates)
    achieved: np.ndarray | None = None  # [N, K] int64, -1 padded: goal tasks' tokens this step achieved


class BatchedTaskEnv(gym.vector.VectorEnv):
    """The vector-env side shared by the batched tasks: spaces, seeding, timesteps, SAME_STEP autoreset.

    A task subclass keeps its state in [N] arrays and implements `_draw_tasks(rows)` (the hidden task of
    the rows just reset, drawn from `self._rngs[i]` as the per-copy env draws it), `_reset_rows(rows)`,
    `_obs()` (the observation's flattened keys, as TimestepWrapper names them -> [N, ...] arrays of the
    current state, fresh each call) and `_step_arrays(actions)` -> `StepArrays`.
    """

    def __init__(self, proto: gym.Env, num_envs: int) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        wrapped = TimestepWrapper(proto)  # the per-copy code's spaces and action conversions, built once
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
        self._rngs: list[np.random.Generator | None] = [None] * self.num_envs
        self._time = np.zeros(self.num_envs, np.int64)  # [N] actions taken since the copy's reset
        self._started = False

    # ----------------------------------------------------------------------------- what the copies share
    def get_attr(self, name: str) -> tuple[Any, ...]:
        """An attribute of the wrapped per-copy env, once per copy (as `SyncVectorEnv.get_attr`): the copies
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
        for i, s in enumerate(seeds):
            if s is not None or self._rngs[i] is None:
                self._rngs[i], _ = seeding.np_random(s)

    def _rng(self, i: int) -> np.random.Generator:
        rng = self._rngs[i]
        assert rng is not None, "reset seeds every copy's generator"
        return rng

    def _timestep(
        self, action_vec: np.ndarray, reward: np.ndarray, reset: np.ndarray,
        achieved: np.ndarray | None = None,
    ) -> dict[str, Any]:
        """The batched timestep of the current state: [N, ...] arrays, fresh each call. `achieved` [N, K]: the
        goal tokens of the step that led here (a reset achieves nothing: -1)."""
        keep = ~reset
        obs = self._obs()
        ts = {
            "obs": {k: obs[k] for k in self._obs_keys},
            "prev_action": np.where(keep[:, None], action_vec, np.float32(0.0)).astype(np.float32),  # [N, A]
            "prev_reward": np.where(keep, reward, 0.0).astype(np.float32),  # [N]
            "time": self._time.copy(),  # [N] int64
            "reset": reset.astype(np.int8),  # [N]
        }
        if self._slots:
            none = np.full((self.num_envs, self._slots), -1, np.int64)
            ts["achieved"] = none if achieved is None else np.where(keep[:, None], achieved, none)  # [N, K]
        return {k: ts[k] for k in self._keys}  # the observation space's key order, as a SyncVectorEnv's

    def _reset_info(self) -> dict[str, Any]:
        """The vector info of a reset of every copy: a goal task reports `achieved=[]` for each."""
        if not self._slots:
            return {}
        n = self.num_envs
        return {"achieved": _object_array([[] for _ in range(n)]), "_achieved": np.ones(n, bool)}

    # --------------------------------------------------------------------------------------------- API
    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        if options:
            raise ValueError(f"{type(self).__name__}.reset takes no options (got {sorted(options)})")
        self._seed_rows(seed)
        rows = np.arange(self.num_envs)
        self._draw_tasks(rows)
        self._reset_rows(rows)
        self._time[:] = 0
        self._started = True
        n, a = self.num_envs, self.action_spec.dim
        return self._timestep(np.zeros((n, a), np.float32), np.zeros(n), np.ones(n, bool)), self._reset_info()

    def step(self, actions: Any) -> tuple[dict[str, Any], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        if not self._started:
            raise RuntimeError(f"{type(self).__name__}.step before reset")
        spec = self.action_spec
        stored = spec.as_stored(np.asarray(actions).reshape(spec.storage_shape(self.num_envs)))
        if spec.kind == "discrete" and (stored.min() < 0 or stored.max() >= spec.dim):
            bad = int(stored[(stored < 0) | (stored >= spec.dim)][0])
            raise ValueError(f"{type(self).__name__}: discrete action {bad} outside [0, {spec.dim})")
        self._time += 1
        out = self._step_arrays(stored)
        truncated = np.zeros(self.num_envs, bool) if out.truncated is None else out.truncated
        action_vec = spec.to_vector(stored)  # [N, A]
        obs = self._timestep(action_vec, out.reward, np.zeros(self.num_envs, bool), out.achieved)
        # each copy's info["achieved"] (goal tasks): a list per copy, as the per-copy task reports it
        tokens = _token_lists(out.achieved) if self._slots and out.achieved is not None else None
        info: dict[str, Any] = {}
        done = np.flatnonzero(out.terminated | truncated)
        if done.size:
            obs, info = self._end_rows(done, obs, out, action_vec, tokens)
        if tokens is not None:  # SyncVectorEnv adds each copy's info in turn: keys of copy 0's first
            got = {"achieved": _object_array(tokens), "_achieved": np.ones(self.num_envs, bool)}
            info = {**info, **got} if done.size and done[0] == 0 else {**got, **info}
        return obs, out.reward, out.terminated, truncated, info

    def _end_rows(
        self, done: np.ndarray, obs: dict[str, Any], out: StepArrays, action_vec: np.ndarray,
        tokens: list | None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The copies in `done` ended their episode (rare: once per rollout): their final timestep and info go
        into `final_obs` / `final_info`, built as SyncVectorEnv builds them, and they are reset (SAME_STEP);
        their `tokens` entry becomes the reset's (none)."""
        info: dict[str, Any] = {}
        for i in done.tolist():
            final_ts = {k: _row(v, i) for k, v in obs.items()}
            final_info: dict[str, Any] = {}
            if tokens is not None:
                final_info["achieved"], tokens[i] = tokens[i], []
            if not np.isnan(out.success[i]):
                final_info["success"] = float(out.success[i])
            final_info["episode_end"] = True
            info = self._add_info(info, {"final_obs": final_ts, "final_info": final_info}, i)
        self._draw_tasks(done)
        self._reset_rows(done)
        self._time[done] = 0
        reset = np.zeros(self.num_envs, bool)
        reset[done] = True
        fresh = self._timestep(action_vec, out.reward, reset)
        return {k: _merge(obs[k], fresh[k], reset) for k in obs}, info

    def close_extras(self, **kwargs: Any) -> None:
        self._proto.close()

    # ------------------------------------------------------------------------------ the task's part
    def _draw_tasks(self, rows: np.ndarray) -> None:
        raise NotImplementedError

    def _reset_rows(self, rows: np.ndarray) -> None:
        raise NotImplementedError

    def _obs(self) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def _step_arrays(self, actions: np.ndarray) -> StepArrays:
        raise NotImplementedError

    def _task_reset(self, i: int) -> Any:
        """The per-copy task (the prototype's), reset with copy i's generator: its draws are copy i's, made
        by the per-copy code itself (used by tasks whose generation is long: mazes, instructions)."""
        task = self._proto.unwrapped
        task.np_random = self._rng(i)
        task.reset()
        return task


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


class BatchedTMaze(BatchedTaskEnv):
    """N Passive (or, `active=True`, Active) T-Mazes (`icrl.envs.tasks.tmaze`): the same rules, as arrays."""

    def __init__(self, num_envs: int, length: int = 10, horizon: int | None = None, active: bool = False) -> None:
        task = (TMazeActive if active else TMaze)(length=length, horizon=horizon)
        super().__init__(task, num_envs)
        self.active = active
        self.length, self.horizon, self.penalty, self.start_pos = task.length, task.horizon, task.penalty, task.start_pos
        n = self.num_envs
        self._goal_up = np.ones(n, bool)  # [N] the hidden task
        self._pos = np.full(n, self.start_pos, np.int64)  # [N] cell
        self._seen_cue = np.zeros(n, bool)  # [N] (active: the cue cell was visited)

    def _cue_visible(self) -> np.ndarray:
        return self._pos == 0 if self.active else self._time == 0  # [N]

    def _draw_tasks(self, rows: np.ndarray) -> None:
        for i in rows:  # TMaze.reset: goal_up = np_random.integers(2) == 0
            self._goal_up[i] = bool(self._rng(i).integers(2) == 0)

    def _reset_rows(self, rows: np.ndarray) -> None:
        self._pos[rows] = self.start_pos
        self._seen_cue[rows] = self.start_pos == 0  # TMaze.reset: the cue is seen where the agent starts

    def _obs(self) -> dict[str, np.ndarray]:
        n = self.num_envs
        obs = np.zeros((n, 4), np.float32)  # [N, 4]: [cue_up, cue_down, in_corridor, at_junction]
        cue = self._cue_visible()
        obs[cue & self._goal_up, 0] = 1.0
        obs[cue & ~self._goal_up, 1] = 1.0
        corridor = self._pos < self.length
        obs[corridor, 2] = 1.0
        obs[~corridor, 3] = 1.0
        return {"obs": obs}  # a Box observation: TimestepWrapper's key "obs"

    def _step_arrays(self, actions: np.ndarray) -> StepArrays:
        choose = (self._pos == self.length) & ((actions == UP) | (actions == DOWN))  # [N] at the junction
        correct = (actions == UP) == self._goal_up
        progress = np.where(self._seen_cue, 1, -1) if self.active else 1  # before moving
        old = self._pos.copy()
        move = ~choose
        self._pos += (move & (actions == RIGHT) & (self._pos < self.length)).astype(np.int64)
        self._pos -= (move & (actions == LEFT) & (old > 0)).astype(np.int64)
        reward = np.where(choose, correct.astype(np.float64), 0.0)
        reward = np.where(move & (self._pos - old != progress), -self.penalty, reward)
        self._seen_cue |= move & self._cue_visible()
        timeout = ~choose & (self._time >= self.horizon)
        terminated = choose | timeout
        success = np.where(choose, correct.astype(np.float64), np.where(timeout, 0.0, np.nan))
        return StepArrays(reward, terminated, success)


class BatchedCueRecall(BatchedTaskEnv):
    """N cue-recall tasks (`icrl.envs.tasks.recall.CueRecall`), discrete or continuous answers, as arrays."""

    def __init__(self, num_envs: int, delay: int = 5, continuous: bool = True) -> None:
        task = CueRecall(delay=delay, continuous=continuous)
        super().__init__(task, num_envs)
        self.delay, self.continuous = task.delay, task.continuous
        self._env_low, self._env_high = (-1.0, 1.0)
        if isinstance(task.action_space, gym.spaces.Box):
            self._env_low, self._env_high = float(task.action_space.low[0]), float(task.action_space.high[0])
        self._cue = np.ones(self.num_envs, np.float64)  # [N] ±1, the hidden task
        self._t = np.zeros(self.num_envs, np.int64)  # [N] the task's own clock: it stops at the answer step

    def _draw_tasks(self, rows: np.ndarray) -> None:
        for i in rows:  # CueRecall.reset: cue = np_random.choice([-1.0, 1.0])
            self._cue[i] = float(self._rng(i).choice([-1.0, 1.0]))

    def _reset_rows(self, rows: np.ndarray) -> None:
        self._t[rows] = 0

    def _obs(self) -> dict[str, np.ndarray]:
        first = self._t == 0
        obs = np.stack([np.where(first, self._cue, 0.0), first, self._t == self.delay], 1).astype(np.float32)
        return {"obs": obs}

    def _step_arrays(self, actions: np.ndarray) -> StepArrays:
        answering = self._t >= self.delay  # CueRecall.step: blank steps count on until t = delay, then answer
        self._t += (~answering).astype(np.int64)
        if self.continuous:
            u = np.clip(actions.reshape(-1).astype(np.float64), -1.0, 1.0)  # agent_to_env_action on [-1, 1]
            low, high = self._env_low, self._env_high
            env_a = np.clip(0.5 * (1.0 - u) * low + 0.5 * (1.0 + u) * high, low, high).astype(np.float32)
            answer = np.clip(env_a.astype(np.float64), -1.0, 1.0)
            reward = 1.0 - np.abs(answer - self._cue) / 2.0
            success = (np.abs(answer - self._cue) < 0.2).astype(np.float64)
        else:
            answer = np.where(actions == 1, 1.0, -1.0)
            reward = (answer == self._cue).astype(np.float64)
            success = reward.copy()
        reward = np.where(answering, reward, 0.0)
        success = np.where(answering, success, np.nan)
        return StepArrays(reward, answering.copy(), success)


# name -> the kwargs of the per-copy task the batched form takes (render_mode is not among them: a vector env
# that renders keeps its per-copy envs)
_ACCEPTED = {
    "tmaze": {"length", "horizon"},
    "tmaze_active": {"length", "horizon"},
    "cue_recall": {"delay", "continuous"},
    "goal_grid": {"size", "num_goals", "time_limit", "obs_mode"},
    "mazerunner": {"size", "num_goals", "time_limit", "randomized_actions"},
    "package_delivery": {"length", "min_packages", "max_packages", "time_limit"},
}


def has_batched_form(name: str, kwargs: dict[str, Any]) -> bool:
    """Built-in task `name` with `kwargs` has a batched form (a kwarg it does not take: no, and the per-copy
    env reports it as usual)."""
    return name in _ACCEPTED and set(kwargs) <= _ACCEPTED[name]


def batched_env(name: str, kwargs: dict[str, Any], num_envs: int) -> BatchedTaskEnv | None:
    """The batched form of built-in task `name` with `kwargs`, or None where there is none."""
    if not has_batched_form(name, kwargs):
        return None
    if name == "cue_recall":
        return BatchedCueRecall(num_envs, **kwargs)
    if name in ("tmaze", "tmaze_active"):
        return BatchedTMaze(num_envs, active=name == "tmaze_active", **kwargs)
    # deferred: batched_goals builds on this module's BatchedTaskEnv
    from icrl.envs.batched_goals import GOAL_TASKS

    return GOAL_TASKS[name](num_envs, **kwargs)
