"""GoalGrid: the smallest sparse multi-goal task, where hindsight instruction relabeling makes the difference.

An open `size` × `size` room, no walls and no memory needed: the agent sees its cell and an instruction of
`num_goals` distinct cells to visit in order (1 reward per sub-goal reached in order, success when all are).
A random walk almost never completes a 3-cell instruction before the time limit, so without relabeling the
agent gets almost no reward to learn from; with it, every walk is a success for the cells it did visit.
It plays the role of bit-flipping in the HER paper: a sanity check of the relabeling machinery that runs
in CPU seconds (tests/learning/test_learning.py), before MazeRunner and Package Delivery add exploration and memory.

Goal-conditioned under docs/CONTRACTS.md: token of cell (r, c) = r * size + c + 1; every step achieves the
cell the agent stands on (achieved_slots = 1); the reset achieves nothing.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from icrl.envs.tasks.grid import position_rows, position_space
from icrl.envs.tasks.instruction import InstructionTask

MOVES = ((0, -1), (-1, 0), (0, 1), (1, 0))  # left, up, right, down
_MOVES = np.array(MOVES, np.int64)  # [4, 2] (d_row, d_col)


class GoalGrid(InstructionTask):
    """Visit `num_goals` cells of an open room in the order the instruction gives.

    Kwargs:
      size: side of the room (>= 2).
      num_goals: instruction length k (distinct cells, never the start cell; 1 <= k < size**2).
      time_limit: steps before truncation (default 3 * size * num_goals).
      obs_mode: "onehot" (default) or "xy" position observation.
      render_mode: "ansi" (the room as text) or None.
    Observation: {"pos": position, "goal": int64 [k] tokens, completed sub-goals zeroed}.
    Every reset samples a new start cell and instruction.
    """

    metadata = {"render_modes": ["ansi"], "achieved_slots": 1}

    def __init__(
        self, size: int = 5, num_goals: int = 3, time_limit: int | None = None, obs_mode: str = "onehot",
        render_mode: str | None = None,
    ):
        if size < 2 or not 1 <= num_goals < size**2:
            raise ValueError(
                f"GoalGrid needs size >= 2 and 1 <= num_goals < size**2, got {size} and {num_goals}"
            )
        self.size, self.num_goals, self.obs_mode = int(size), int(num_goals), obs_mode
        self.time_limit = int(time_limit) if time_limit is not None else 3 * self.size * self.num_goals
        if self.time_limit < 1:
            raise ValueError(f"time_limit must be >= 1, got {time_limit}")
        self.render_mode = render_mode
        self.metadata = {**self.metadata, "goal_vocab": self.size**2}
        self.observation_space = gym.spaces.Dict(
            {
                "pos": position_space(self.size, obs_mode, "GoalGrid"),
                "goal": gym.spaces.Box(0, self.size**2, (self.num_goals,), np.int64),
            }
        )
        self.action_space = gym.spaces.Discrete(4)
        self._copies(1)

    def _allocate(self, n: int) -> None:
        super()._allocate(n)
        self._pos = np.zeros((n, 2), np.int64)  # [N, 2] (row, col)

    def _draw_tasks(self, rows: np.ndarray) -> None:
        for i in rows.tolist():  # a start cell and the instruction's cells, distinct; token = cell + 1
            cells = self._rng(i).choice(self.size**2, size=self.num_goals + 1, replace=False)
            self._pos[i] = divmod(int(cells[0]), self.size)
            self._set_instruction(i, cells[1:] + 1)

    def _draw_episodes(self, rows: np.ndarray) -> None:
        self._draw_tasks(rows)  # every reset a new start and instruction

    def _obs(self) -> dict[str, np.ndarray]:
        return {"goal": self._goal(), "pos": position_rows(self._pos, self.size, self.obs_mode)}

    def _act(self, actions: np.ndarray) -> np.ndarray:
        self._pos = np.clip(self._pos + _MOVES[actions], 0, self.size - 1)  # walls stop the agent
        return self._pos[:, 0] * self.size + self._pos[:, 1] + 1  # every step achieves the agent's cell

    def _ansi(self) -> str:
        rows = [["." for _ in range(self.size)] for _ in range(self.size)]
        for i, g in enumerate(self._goal()[0].tolist()):
            if g:
                r, c = divmod(g - 1, self.size)
                rows[r][c] = str(i + 1)
        rows[self._pos[0, 0]][self._pos[0, 1]] = "A"
        return "\n".join("".join(r) for r in rows)
