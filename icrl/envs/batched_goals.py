"""The goal-conditioned built-in tasks stepped as arrays (icrl.envs.batched): GoalGrid, MazeRunner, Package
Delivery.

Each class gives exactly what `make_vector_env` gives with the per-copy task under the same seed, the goal
contract's parts included (docs/CONTRACTS.md): the "goal" observation, the timestep's "achieved" entry and
every step's `info["achieved"]`. A task is generated at a copy's reset by the per-copy task's own code
(`BatchedTaskEnv._task_reset`: the prototype reset with that copy's generator, so the draws are the same
calls by construction) and copied into arrays; the steps are array code over all copies. The instruction's
progress (`InstructionProgress` in the per-copy task) is array state here: the current sub-goal's index per
copy, advanced by `InstructionProgress`'s rule for steps that achieve one token at most (achieved_slots = 1,
as all three tasks declare), and scored as `score_step` scores it. In a rollout of several episodes MazeRunner
and Package Delivery keep their maze or road and instruction (their `reset(options={"new_task": False})` draws
nothing); GoalGrid draws a new start and instruction at every reset, as its per-copy task does.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

import numpy as np

from icrl.envs.batched import BatchedTaskEnv, StepArrays, position_rows
from icrl.envs.tasks import goal_grid, mazerunner
from icrl.envs.tasks.goal_grid import GoalGrid
from icrl.envs.tasks.mazerunner import MazeRunner
from icrl.envs.tasks.package_delivery import (
    DROP_ACTIONS,
    FORWARD,
    PACKAGES_PER_ADDRESS,
    TURN_LEFT,
    TURN_RIGHT,
    PackageDelivery,
)

_GRID_MOVES = np.array(goal_grid.MOVES, np.int64)  # [4, 2] (d_row, d_col) of GoalGrid's actions
_MAZE_MOVES = np.array([mazerunner.MOVES[m] for m in range(5)], np.int64)  # [5, 2] of MazeRunner's moves


class BatchedGoalTask(BatchedTaskEnv):
    """The instruction side shared by the goal tasks: the instruction [N, k] (0 padded), its progress and
    the step's score. A subclass draws tasks (`_set_instruction` for each row), moves the copies in
    `_act(actions)` -> [N] int64, the token each copy's step achieved (-1: none), and adds its observation
    keys to `_goal()`."""

    def __init__(
        self, task: Any, num_envs: int, time_limit: int, episodes_per_rollout: int = 1,
        rollout_horizon: int | None = None,
    ) -> None:
        super().__init__(task, num_envs, episodes_per_rollout, rollout_horizon)
        if self._slots != 1:
            raise ValueError(f"the batched goal tasks score one achieved token per step, not {self._slots}")
        self.time_limit = int(time_limit)
        slots = int(self.single_observation_space["obs"]["goal"].shape[0])  # type: ignore[index]
        n = self.num_envs
        self._tokens = np.zeros((n, slots), np.int64)  # [N, k] the instruction, unused slots 0
        self._length = np.ones(n, np.int64)  # [N] goals in the instruction
        self._current = np.zeros(n, np.int64)  # [N] index of the current sub-goal
        self._slot = np.arange(slots)  # [k]

    def _set_instruction(self, i: int, tokens: Any) -> None:
        goals = [int(t) for t in tokens]
        self._tokens[i] = 0
        self._tokens[i, : len(goals)] = goals
        self._length[i] = len(goals)

    def _reset_rows(self, rows: np.ndarray) -> None:
        self._current[rows] = 0

    def _goal(self) -> np.ndarray:
        """[N, k] int64: the instructions with completed slots zeroed (`InstructionProgress.goal`)."""
        return np.where(self._slot >= self._current[:, None], self._tokens, 0)

    @abstractmethod
    def _act(self, actions: np.ndarray) -> np.ndarray:
        """Move every copy by its action; [N] int64: the token each copy's step achieved (0: none)."""

    def _step_arrays(self, actions: np.ndarray) -> StepArrays:
        token = self._act(actions)  # [N]
        current = np.minimum(self._current, self._slot.size - 1)
        hit = (self._current < self._length) & (self._tokens[np.arange(self.num_envs), current] == token)
        self._current += hit  # a step achieving one token completes one slot at most
        terminated = self._current >= self._length
        truncated = ~terminated & (self._time >= self.time_limit)
        success = np.where(terminated, 1.0, np.where(truncated, 0.0, np.nan))
        return StepArrays(hit.astype(np.float64), terminated, success, truncated, token[:, None])


class BatchedGoalGrid(BatchedGoalTask):
    """N GoalGrid rooms (`icrl.envs.tasks.goal_grid`), as arrays."""

    def __init__(
        self, num_envs: int, size: int = 5, num_goals: int = 3, time_limit: int | None = None,
        obs_mode: str = "onehot", episodes_per_rollout: int = 1, rollout_horizon: int | None = None,
    ) -> None:
        task = GoalGrid(size=size, num_goals=num_goals, time_limit=time_limit, obs_mode=obs_mode)
        super().__init__(task, num_envs, task.time_limit, episodes_per_rollout, rollout_horizon)
        self.size, self.obs_mode = task.size, task.obs_mode
        self._pos = np.zeros((self.num_envs, 2), np.int64)  # [N, 2] (row, col)

    def _draw_tasks(self, rows: np.ndarray) -> None:
        for i in rows.tolist():
            task = self._task_reset(i)
            self._pos[i] = task.pos
            self._set_instruction(i, task.progress.tokens)

    def _draw_episodes(self, rows: np.ndarray) -> None:
        self._draw_tasks(rows)  # GoalGrid.reset draws a start and an instruction whatever its options

    def _obs(self) -> dict[str, np.ndarray]:
        return {"goal": self._goal(), "pos": position_rows(self._pos, self.size, self.obs_mode)}

    def _act(self, actions: np.ndarray) -> np.ndarray:
        self._pos = np.clip(self._pos + _GRID_MOVES[actions], 0, self.size - 1)  # walls stop the agent
        return self._pos[:, 0] * self.size + self._pos[:, 1] + 1  # every step achieves the agent's cell


class BatchedMazeRunner(BatchedGoalTask):
    """N MazeRunner mazes (`icrl.envs.tasks.mazerunner`), as arrays: the walls [N, size, size] and the free
    runs of every cell, computed once per maze, so a step is a few gathers."""

    def __init__(
        self, num_envs: int, size: int = 15, num_goals: int = 3, time_limit: int | None = None,
        randomized_actions: bool = False, episodes_per_rollout: int = 1, rollout_horizon: int | None = None,
    ) -> None:
        task = MazeRunner(size=size, num_goals=num_goals, time_limit=time_limit,
                          randomized_actions=randomized_actions)
        super().__init__(task, num_envs, task.time_limit, episodes_per_rollout, rollout_horizon)
        n, s = self.num_envs, task.size
        self.size, self.start = s, task.start
        self._walls = np.ones((n, s, s), bool)  # [N, S, S] True = wall
        self._runs = np.zeros((n, s, s, 4), np.int64)  # [N, S, S, 4] free run west, north, east, south
        self._action_map = np.tile(np.arange(5), (n, 1))  # [N, 5] agent action -> move
        self._pos = np.tile(np.asarray(self.start, np.int64), (n, 1))  # [N, 2]

    def _draw_tasks(self, rows: np.ndarray) -> None:
        for i in rows.tolist():
            task = self._task_reset(i)
            self._walls[i] = task.walls
            self._action_map[i] = task.action_map
            self._set_instruction(i, [task.token(g) for g in task.goals])
        self._runs[rows] = free_runs(self._walls[rows])

    def _reset_rows(self, rows: np.ndarray) -> None:
        super()._reset_rows(rows)
        self._pos[rows] = self.start

    def _obs(self) -> dict[str, np.ndarray]:
        s = self.size
        runs = self._runs[np.arange(self.num_envs), self._pos[:, 0], self._pos[:, 1]]  # [N, 4]
        clock = (self._time / self.time_limit)[:, None]
        vec = np.concatenate([self._pos / (s - 1), runs / (s - 2), clock], 1)
        return {"goal": self._goal(), "obs": vec.astype(np.float32)}  # MazeRunner._obs, float64 then float32

    def _act(self, actions: np.ndarray) -> np.ndarray:
        rows = np.arange(self.num_envs)
        target = self._pos + _MAZE_MOVES[self._action_map[rows, actions]]  # the border is wall: stays inside
        blocked = self._walls[rows, target[:, 0], target[:, 1]]
        self._pos = np.where(blocked[:, None], self._pos, target)
        return self._pos[:, 0] * self.size + self._pos[:, 1] + 1  # every step achieves the agent's cell


def free_runs(walls: np.ndarray) -> np.ndarray:
    """[M, S, S] bool walls -> [M, S, S, 4] int64: from each cell, the open cells in a straight line west,
    north, east and south before the first wall (`mazerunner.free_run` of every cell; border cells, never
    stood on, get 0)."""
    m, s, _ = walls.shape
    runs = np.zeros((m, s, s, 4), np.int64)
    for k in range(1, s):
        runs[:, :, k, 0] = np.where(walls[:, :, k - 1], 0, runs[:, :, k - 1, 0] + 1)
        runs[:, k, :, 1] = np.where(walls[:, k - 1, :], 0, runs[:, k - 1, :, 1] + 1)
    for k in range(s - 2, -1, -1):
        runs[:, :, k, 2] = np.where(walls[:, :, k + 1], 0, runs[:, :, k + 1, 2] + 1)
        runs[:, k, :, 3] = np.where(walls[:, k + 1, :], 0, runs[:, k + 1, :, 3] + 1)
    return runs


class BatchedPackageDelivery(BatchedGoalTask):
    """N Package Delivery roads (`icrl.envs.tasks.package_delivery`), as arrays: the correct turn of every
    cell [N, length] (0 away from forks), the working drop action, position and packages left."""

    def __init__(
        self, num_envs: int, length: int = 30, min_packages: int = 2, max_packages: int = 4,
        time_limit: int = 180, episodes_per_rollout: int = 1, rollout_horizon: int | None = None,
    ) -> None:
        task = PackageDelivery(length=length, min_packages=min_packages, max_packages=max_packages,
                               time_limit=time_limit)
        super().__init__(task, num_envs, task.time_limit, episodes_per_rollout, rollout_horizon)
        n = self.num_envs
        self.length, self.max_packages = task.length, task.max_packages
        self._fork = np.zeros((n, self.length), np.int64)  # [N, L] TURN_LEFT / TURN_RIGHT at forks, else 0
        self._drop = np.zeros(n, np.int64)  # [N] the working drop action
        self._pos = np.zeros(n, np.int64)  # [N] cell
        self._packages = np.zeros(n, np.int64)  # [N] packages left in the van

    def _draw_tasks(self, rows: np.ndarray) -> None:
        for i in rows.tolist():
            task = self._task_reset(i)
            self._fork[i] = 0
            self._fork[i, list(task.forks)] = list(task.forks.values())
            self._drop[i] = task.drop_action
            self._set_instruction(i, task.addresses)

    def _reset_rows(self, rows: np.ndarray) -> None:
        super()._reset_rows(rows)
        self._pos[rows] = 0
        self._packages[rows] = PACKAGES_PER_ADDRESS * self._length[rows]

    def _obs(self) -> dict[str, np.ndarray]:
        at_fork = self._fork[np.arange(self.num_envs), self._pos] > 0
        packages = self._packages / (PACKAGES_PER_ADDRESS * self.max_packages)
        vec = np.stack([self._pos / (self.length - 1), packages, at_fork.astype(np.float64)], 1)
        return {"goal": self._goal(), "obs": vec.astype(np.float32)}  # PackageDelivery._obs: float64, float32

    def _act(self, actions: np.ndarray) -> np.ndarray:
        pos = self._pos
        fork = self._fork[np.arange(self.num_envs), pos]  # [N] the correct turn here, 0 away from forks
        at_fork = fork > 0
        turn = at_fork & ((actions == TURN_LEFT) | (actions == TURN_RIGHT))
        drop = ~at_fork & (actions >= DROP_ACTIONS[0]) & (actions <= DROP_ACTIONS[-1])  # nothing at a fork
        deliver = drop & (actions == self._drop) & (self._packages > 0) & (pos > 0)
        new = np.where(~at_fork & (actions == FORWARD), pos + 1, pos)
        new = np.where(turn, np.where(actions == fork, pos + 1, 0), new)  # the wrong side: back to the depot
        new = np.where(drop & ~deliver, 0, new)  # a failed drop: back to the depot
        self._packages -= deliver
        self._pos = new % self.length  # the end of the road wraps to the depot
        return np.where(deliver, pos, -1)  # a delivery achieves its address
