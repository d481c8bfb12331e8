"""The meta-RL built-in tasks stepped as arrays (icrl.envs.batched): Meta Frozen Lake and Dark Key-To-Door.

Each class gives exactly what `make_vector_env` gives with the per-copy task under the same seed and rollout
settings (tests/unit/test_batched_envs.py), for rollouts of one episode or, as these tasks are meant to be
used, several episodes of one task (`episodes_per_rollout`, `rollout_horizon`). A new task (a lake; a key and a
door) is generated at a copy's hard reset by the per-copy task's own code (`BatchedTaskEnv._task_reset`: the
prototype reset with that copy's generator, so the draws are the same calls by construction) and copied into
arrays; the next episode of the same task keeps it, and Dark Key-To-Door's random start of that episode is
drawn by the per-copy code too. The steps are array code over all copies.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from icrl.envs.batched import BatchedTaskEnv, StepArrays, position_rows
from icrl.envs.tasks import frozen_lake, key_door
from icrl.envs.tasks.frozen_lake import MetaFrozenLake
from icrl.envs.tasks.key_door import DarkKeyToDoor

_LAKE_MOVES = np.array([frozen_lake._MOVES[m] for m in range(4)], np.int64)  # [4, 2] (d_row, d_col) per move
_ROOM_MOVES = np.array([key_door._MOVES[a] for a in range(5)], np.int64)  # [5, 2] of DarkKeyToDoor's actions


class BatchedMetaFrozenLake(BatchedTaskEnv):
    """N Meta Frozen Lakes (`icrl.envs.tasks.frozen_lake`), as arrays: the holes [N, size, size], start, goal
    and hard mode's action permutation of every copy's lake, and the agent's cell."""

    def __init__(
        self, num_envs: int, size: int = 5, hard: bool = False, hole_prob: float = 0.2,
        max_episode_steps: int | None = None, random_corners: bool = False, obs_mode: str = "xy",
        episodes_per_rollout: int = 1, rollout_horizon: int | None = None,
    ) -> None:
        task = MetaFrozenLake(size=size, hard=hard, hole_prob=hole_prob, max_episode_steps=max_episode_steps,
                              random_corners=random_corners, obs_mode=obs_mode)
        super().__init__(task, num_envs, episodes_per_rollout, rollout_horizon)
        n, s = self.num_envs, task.size
        self.size, self.obs_mode, self.max_episode_steps = s, task.obs_mode, task.max_episode_steps
        self._holes = np.zeros((n, s, s), bool)  # [N, S, S] the hidden task: True = hole
        self._start = np.zeros((n, 2), np.int64)  # [N, 2] (row, col)
        self._goal = np.zeros((n, 2), np.int64)  # [N, 2]
        self._action_map = np.tile(np.arange(4), (n, 1))  # [N, 4] agent action -> move
        self._pos = np.zeros((n, 2), np.int64)  # [N, 2]

    def _draw_tasks(self, rows: np.ndarray) -> None:
        for i in rows.tolist():  # MetaFrozenLake._sample_task: lakes drawn until solvable
            task = self._task_reset(i)
            self._holes[i] = task.holes
            self._start[i], self._goal[i] = task.start, task.goal
            self._action_map[i] = task.action_map

    def _reset_rows(self, rows: np.ndarray) -> None:
        self._pos[rows] = self._start[rows]

    def _obs(self) -> dict[str, np.ndarray]:
        return {"obs": position_rows(self._pos, self.size, self.obs_mode)}  # a Box: TimestepWrapper's key "obs"

    def _step_arrays(self, actions: np.ndarray) -> StepArrays:
        rows = np.arange(self.num_envs)
        move = _LAKE_MOVES[self._action_map[rows, actions]]  # [N, 2]
        self._pos = np.clip(self._pos + move, 0, self.size - 1)  # the border stops the agent
        at_goal = (self._pos == self._goal).all(1)
        in_hole = ~at_goal & self._holes[rows, self._pos[:, 0], self._pos[:, 1]]
        terminated = at_goal | in_hole
        truncated = ~terminated & (self._time >= self.max_episode_steps)
        success = np.where(at_goal, 1.0, np.where(in_hole | truncated, 0.0, np.nan))
        return StepArrays(at_goal.astype(np.float64), terminated, success, truncated)


class BatchedDarkKeyToDoor(BatchedTaskEnv):
    """N dark Key-To-Door rooms (`icrl.envs.tasks.key_door`), as arrays: every copy's key, door and start
    cell, the agent's cell and whether it holds the key."""

    def __init__(
        self, num_envs: int, size: int = 9, episode_length: int = 50, random_start: bool = True,
        obs_mode: str = "xy", episodes_per_rollout: int = 1, rollout_horizon: int | None = None,
    ) -> None:
        task = DarkKeyToDoor(size=size, episode_length=episode_length, random_start=random_start,
                             obs_mode=obs_mode)
        super().__init__(task, num_envs, episodes_per_rollout, rollout_horizon)
        n = self.num_envs
        self.size, self.obs_mode, self.random_start = task.size, task.obs_mode, task.random_start
        self.episode_length = task.episode_length
        self._key = np.zeros((n, 2), np.int64)  # [N, 2] the hidden task
        self._door = np.zeros((n, 2), np.int64)  # [N, 2]
        self._start = np.zeros((n, 2), np.int64)  # [N, 2] the episode's start cell
        self._pos = np.zeros((n, 2), np.int64)  # [N, 2]
        self._has_key = np.zeros(n, bool)  # [N]

    def _draw_tasks(self, rows: np.ndarray) -> None:
        for i in rows.tolist():  # DarkKeyToDoor.reset: the key and door, then the start
            task = self._task_reset(i)
            self._key[i], self._door[i], self._start[i] = task.key, task.door, task._pos

    def _draw_episodes(self, rows: np.ndarray) -> None:
        """The next episode of the same room starts at a new random cell, drawn by the per-copy task's reset
        with copy i's room put into it (a fixed start is the room's: the same cell again)."""
        if not self.random_start:
            return
        task: Any = self._proto.unwrapped
        for i in rows.tolist():
            task.key, task.door = tuple(map(int, self._key[i])), tuple(map(int, self._door[i]))
            task._has_task = True
            self._task_reset(i, {"new_task": False})
            self._start[i] = task._pos

    def _reset_rows(self, rows: np.ndarray) -> None:
        self._pos[rows] = self._start[rows]
        self._has_key[rows] = False  # the key is dropped between episodes

    def _obs(self) -> dict[str, np.ndarray]:
        return {"obs": position_rows(self._pos, self.size, self.obs_mode)}

    def _step_arrays(self, actions: np.ndarray) -> StepArrays:
        self._pos = np.clip(self._pos + _ROOM_MOVES[actions], 0, self.size - 1)  # walls stop the agent
        pick = ~self._has_key & (self._pos == self._key).all(1)  # +1 the first time the key cell is reached
        opened = self._has_key & (self._pos == self._door).all(1)  # the door with the key: +1, the end
        self._has_key |= pick
        truncated = ~opened & (self._time >= self.episode_length)
        success = np.where(opened, 1.0, np.where(truncated, 0.0, np.nan))
        return StepArrays((pick | opened).astype(np.float64), opened, success, truncated)
