"""Passive T-Maze (Ni et al. 2023, "When do Transformers shine in RL?"; used by AMAGO, DESIGN §9).

A pure memory test: the goal (up or down) is shown only in the very first observation; the agent must walk
`length` cells right along a featureless corridor and, at the junction, recall that one bit. Credit
assignment is trivial (walking right is always right), so the task isolates recall over `length` steps.

Layout: cells 0 .. length-1 are the corridor, cell `length` is the junction. Start in cell 0.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

UP, DOWN, LEFT, RIGHT = 0, 1, 2, 3


class TMaze(gym.Env):
    """Passive T-Maze with observation `[cue_up, cue_down, in_corridor, at_junction]` (float32).

    Rewards: +1 for choosing the cued end at the junction, 0 for the other end, and `-1/horizon` for every
    step that does not move the agent forward (bumping a wall, moving left, up/down in the corridor,
    right at the junction). With the default horizon `length + 1` only the optimal path (right × length,
    then the cued direction) finishes in time, and its return is exactly 1.0.
    The goal is a hidden task parameter: `reset(options={"new_task": False})` keeps it (meta-RL rollouts).
    """

    metadata = {"render_modes": ["ansi", "rgb_array"], "render_fps": 4}

    def __init__(self, length: int = 10, horizon: int | None = None, render_mode: str | None = None):
        if int(length) < 1:
            raise ValueError(f"TMaze length must be >= 1, got {length}")
        self.length = int(length)
        self.horizon = self.length + 1 if horizon is None else int(horizon)
        if self.horizon < self.length + 1:
            raise ValueError(
                f"TMaze horizon {self.horizon} is shorter than the optimal path ({self.length + 1} steps)"
            )
        self.penalty = 1.0 / self.horizon
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Box(0.0, 1.0, (4,), np.float32)
        self.action_space = gym.spaces.Discrete(4)
        self.goal_up = True
        self._pos = 0
        self._t = 0

    def _obs(self) -> np.ndarray:
        obs = np.zeros(4, dtype=np.float32)  # [cue_up, cue_down, in_corridor, at_junction]
        if self._t == 0:
            obs[0 if self.goal_up else 1] = 1.0
        if self._pos < self.length:
            obs[2] = 1.0
        else:
            obs[3] = 1.0
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        new_task = True if options is None else bool(options.get("new_task", True))
        if new_task or seed is not None:
            self.goal_up = bool(self.np_random.integers(2) == 0)
        self._pos, self._t = 0, 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        action = int(action)
        if not 0 <= action < 4:
            raise ValueError(f"TMaze action must be in [0, 4), got {action}")
        self._t += 1
        reward, terminated, info = 0.0, False, {}
        if self._pos == self.length and action in (UP, DOWN):
            correct = (action == UP) == self.goal_up
            reward = 1.0 if correct else 0.0
            terminated = True
            info["success"] = float(correct)
        elif self._pos < self.length and action == RIGHT:
            self._pos += 1
        else:
            if action == LEFT and self._pos > 0:
                self._pos -= 1
            reward = -self.penalty
        truncated = not terminated and self._t >= self.horizon
        if truncated:
            info["success"] = 0.0
        return self._obs(), reward, terminated, truncated, info

    def render(self) -> str | np.ndarray | None:
        if self.render_mode == "rgb_array":
            return self._frame()
        if self.render_mode != "ansi":
            return None
        row = ["."] * self.length + ["+"]
        row[self._pos] = "A"
        return "".join(row) + f"  goal={'up' if self.goal_up else 'down'} t={self._t}"

    def _frame(self, cell: int = 12) -> np.ndarray:
        """[3 * cell, (length + 1) * cell, 3] uint8: the corridor in the middle row, the two ends above and
        below the junction (the cued one tinted green), the agent in blue, and the cue above (green) or
        below (orange) the start cell only at t=0, as the agent sees it."""
        img = np.full((3, self.length + 1, 3), 30, np.uint8)  # walls
        img[1, :] = 170  # corridor and junction
        img[0, self.length] = img[2, self.length] = 220  # the two ends
        img[0 if self.goal_up else 2, self.length] = (150, 220, 150)
        if self._t == 0:  # the cue, above or below the start cell
            img[0 if self.goal_up else 2, 0] = (60, 200, 60) if self.goal_up else (240, 150, 40)
        img[1, self._pos] = (40, 90, 230)
        return np.kron(img, np.ones((cell, cell, 1), np.uint8))

