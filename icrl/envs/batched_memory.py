"""The memory tasks stepped as arrays (icrl.envs.batched): Passive and Active T-Maze, cue recall.

Each class gives exactly what `make_vector_env` gives with the per-copy task under the same seed and rollout
settings (tests/unit/test_batched_envs.py). In a rollout of several episodes a T-Maze keeps its goal (the
per-copy `reset(options={"new_task": False})` draws nothing), while cue recall draws a new cue at every
reset, as its per-copy task does.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from icrl.envs.batched import BatchedTaskEnv, StepArrays
from icrl.envs.tasks.recall import CueRecall
from icrl.envs.tasks.tmaze import DOWN, LEFT, RIGHT, UP, TMaze, TMazeActive


class BatchedTMaze(BatchedTaskEnv):
    """N Passive T-Mazes (`icrl.envs.tasks.tmaze`): the same rules, as arrays."""

    task_class: type[TMaze] = TMaze

    def __init__(
        self, num_envs: int, length: int = 10, horizon: int | None = None, episodes_per_rollout: int = 1,
        rollout_horizon: int | None = None,
    ) -> None:
        task = self.task_class(length=length, horizon=horizon)
        super().__init__(task, num_envs, episodes_per_rollout, rollout_horizon)
        self.active = isinstance(task, TMazeActive)
        self.length, self.horizon, self.penalty = task.length, task.horizon, task.penalty
        self.start_pos = task.start_pos
        n = self.num_envs
        self._goal_up = np.ones(n, bool)  # [N] the hidden task
        self._pos = np.full(n, self.start_pos, np.int64)  # [N] cell
        self._seen_cue = np.zeros(n, bool)  # [N] (active: the cue cell was visited)

    def _cue_visible(self) -> np.ndarray:
        return self._pos == 0 if self.active else self._time == 0  # [N]

    def _draw_tasks(self, rows: np.ndarray) -> None:
        for i in rows:  # TMaze.reset: goal_up = np_random.integers(2) == 0 (the next episode keeps it)
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


class BatchedTMazeActive(BatchedTMaze):
    """N Active T-Mazes (`TMazeActive`: the cue is fetched from cell 0), as arrays."""

    task_class = TMazeActive


class BatchedCueRecall(BatchedTaskEnv):
    """N cue-recall tasks (`icrl.envs.tasks.recall.CueRecall`), discrete or continuous answers, as arrays."""

    def __init__(
        self, num_envs: int, delay: int = 5, continuous: bool = True, episodes_per_rollout: int = 1,
        rollout_horizon: int | None = None,
    ) -> None:
        task = CueRecall(delay=delay, continuous=continuous)
        super().__init__(task, num_envs, episodes_per_rollout, rollout_horizon)
        self.delay, self.continuous = task.delay, task.continuous
        self._env_low, self._env_high = (-1.0, 1.0)
        if isinstance(task.action_space, gym.spaces.Box):
            self._env_low, self._env_high = float(task.action_space.low[0]), float(task.action_space.high[0])
        self._cue = np.ones(self.num_envs, np.float64)  # [N] ±1, the hidden task
        self._t = np.zeros(self.num_envs, np.int64)  # [N] the task's own clock: it stops at the answer step

    def _draw_tasks(self, rows: np.ndarray) -> None:
        for i in rows:  # CueRecall.reset: cue = np_random.choice([-1.0, 1.0])
            self._cue[i] = float(self._rng(i).choice([-1.0, 1.0]))

    def _draw_episodes(self, rows: np.ndarray) -> None:
        self._draw_tasks(rows)  # CueRecall.reset draws a cue whatever its options: every episode a new one

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
