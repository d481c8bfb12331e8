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

from icrl.envs.tasks.grid import move, position_obs, position_space
from icrl.envs.tasks.instruction import InstructionProgress, score_step

MOVES = ((0, -1), (-1, 0), (0, 1), (1, 0))  # left, up, right, down


class GoalGrid(gym.Env):
    """Visit `num_goals` cells of an open room in the order the instruction gives.

    Kwargs:
      size: side of the room (>= 2).
      num_goals: instruction length k (distinct cells, never the start cell; 1 <= k < size**2).
      time_limit: steps before truncation (default 3 * size * num_goals).
      obs_mode: "onehot" (default) or "xy" position observation.
    Observation: {"pos": position, "goal": int64 [k] tokens, completed sub-goals zeroed}.
    Every reset samples a new start cell and instruction.
    """

    metadata = {"render_modes": ["ansi"], "achieved_slots": 1}

    def __init__(
        self, size: int = 5, num_goals: int = 3, time_limit: int | None = None, obs_mode: str = "onehot"
    ):
        if size < 2 or not 1 <= num_goals < size**2:
            raise ValueError(
                f"GoalGrid needs size >= 2 and 1 <= num_goals < size**2, got {size} and {num_goals}"
            )
        self.size, self.num_goals, self.obs_mode = int(size), int(num_goals), obs_mode
        self.time_limit = int(time_limit) if time_limit is not None else 3 * self.size * self.num_goals
        if self.time_limit < 1:
            raise ValueError(f"time_limit must be >= 1, got {time_limit}")
        self.metadata = {**self.metadata, "goal_vocab": self.size**2}
        self.observation_space = gym.spaces.Dict(
            {
                "pos": position_space(self.size, obs_mode, "GoalGrid"),
                "goal": gym.spaces.Box(0, self.size**2, (self.num_goals,), np.int64),
            }
        )
        self.action_space = gym.spaces.Discrete(4)
        self.pos, self.t = (0, 0), 0
        self.progress = InstructionProgress([1] * self.num_goals, self.num_goals)  # replaced at reset

    def token(self, pos: tuple[int, int]) -> int:
        return pos[0] * self.size + pos[1] + 1

    def _obs(self) -> dict:
        return {"pos": position_obs(self.pos, self.size, self.obs_mode), "goal": self.progress.goal()}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        cells = self.np_random.choice(self.size**2, size=self.num_goals + 1, replace=False)
        self.pos = divmod(int(cells[0]), self.size)
        self.progress = InstructionProgress(cells[1:] + 1, self.num_goals)  # tokens: cell + 1
        self.t = 0
        return self._obs(), {"achieved": []}

    def step(self, action: int) -> tuple[dict, float, bool, bool, dict]:
        self.pos = move(self.pos, MOVES[int(action)], self.size)
        self.t += 1
        reward, terminated, truncated, info = score_step(
            self.progress, [self.token(self.pos)], self.t, self.time_limit
        )
        return self._obs(), reward, terminated, truncated, info

    def render(self) -> str:
        rows = [["." for _ in range(self.size)] for _ in range(self.size)]
        for i, g in enumerate(self.progress.goal()):
            if g:
                r, c = divmod(int(g) - 1, self.size)
                rows[r][c] = str(i + 1)
        rows[self.pos[0]][self.pos[1]] = "A"
        return "\n".join("".join(r) for r in rows)
