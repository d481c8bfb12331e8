"""Dark Key-To-Door (Algorithm Distillation, Laskin et al. 2022; used by AMAGO, Grigsby et al. 2024).

A dark `size` × `size` room: the agent sees only its own position. Each task hides a key and a door at two
distinct random cells. Reaching the key gives +1 (once per episode); reaching the door after having picked
up the key gives +1 and ends the episode; the door without the key gives nothing. Episodes last at most
`episode_length` steps, and the agent starts every episode at a new random cell (Algorithm Distillation's
protocol), so it cannot replay one memorised action sequence: it has to remember *where* the key and the
door are. The best return of an episode is 2.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from icrl.envs.tasks.grid import (
    RenderModes,
    move,
    position_obs,
    position_space,
    time_limit_reached,
    wants_new_task,
)

UP, DOWN, LEFT, RIGHT, STAY = 0, 1, 2, 3, 4
_MOVES = {UP: (-1, 0), DOWN: (1, 0), LEFT: (0, -1), RIGHT: (0, 1), STAY: (0, 0)}  # (d_row, d_col)


class DarkKeyToDoor(RenderModes, gym.Env):
    """Hidden key and door per task; observation = the agent's position only (the room is dark).

    kwargs:
      size: side of the square room (>= 2; default 9 as in Algorithm Distillation / AMAGO).
      episode_length: time limit of one episode (default 50); reaching it truncates, success 0.
      random_start: True (default): each episode starts at a uniformly random cell that is neither the key
        nor the door. False: start at the centre cell (or the nearest cell that is neither).
      obs_mode: "xy" (default): Box(2,) = (row, col) / (size - 1); "onehot": Box(size**2,) one-hot cell.

    Actions Discrete(5): 0 up, 1 down, 2 left, 3 right, 4 stay; moving into a wall leaves the agent where it
    is. Rewards: +1 the first time the key cell is reached in an episode, +1 for reaching the door while
    holding the key (terminated, `info["success"] = 1`); the door without the key gives 0 and the episode
    goes on. The time limit truncates with `info["success"] = 0`. `info["success"]` is set on the last step
    only. The key is dropped between episodes (each episode must fetch it again).

    Key and door are hidden task parameters: `reset()` with `options=None` or `{"new_task": True}` (or a
    seed) samples a new task, `{"new_task": False}` keeps it. Intended for long meta-RL rollouts of repeated
    episodes of one task, as in AMAGO: `icrl train --env dark_key_door --rollout-horizon 500` (500-step
    rollouts, i.e. about ten 50-step episodes of the same room, the policy adapting across them).
    """

    metadata: dict[str, Any] = {"render_modes": ["ansi", "rgb_array"], "render_fps": 8}

    def __init__(
        self,
        size: int = 9,
        episode_length: int = 50,
        random_start: bool = True,
        obs_mode: str = "xy",
        render_mode: str | None = None,
    ):
        if int(size) < 2:
            raise ValueError(f"DarkKeyToDoor size must be >= 2, got {size}")
        if int(episode_length) < 1:
            raise ValueError(f"DarkKeyToDoor episode_length must be >= 1, got {episode_length}")
        self.size = int(size)
        self.episode_length = int(episode_length)
        self.random_start = bool(random_start)
        self.obs_mode = obs_mode
        self.render_mode = render_mode
        self.observation_space = position_space(self.size, obs_mode, "DarkKeyToDoor")
        self.action_space = gym.spaces.Discrete(5)
        # Task (hidden)
        self.key = (0, 0)
        self.door = (self.size - 1, self.size - 1)
        self._has_task = False
        # Episode state
        self._pos = (0, 0)
        self.has_key = False
        self._t = 0

    def _cell(self, index: int) -> tuple[int, int]:
        r, c = divmod(int(index), self.size)
        return r, c

    def _sample_task(self) -> None:
        a, b = self.np_random.choice(self.size**2, size=2, replace=False)
        self.key, self.door = self._cell(a), self._cell(b)
        self._has_task = True

    def _sample_start(self) -> tuple[int, int]:
        n = self.size
        taken = {self.key[0] * n + self.key[1], self.door[0] * n + self.door[1]}
        free = np.array([i for i in range(n * n) if i not in taken])
        if self.random_start:
            return self._cell(self.np_random.choice(free))
        center = np.array([(n - 1) / 2, (n - 1) / 2])
        dist = [np.abs(np.array(self._cell(i)) - center).sum() for i in free]
        return self._cell(free[int(np.argmin(dist))])

    def _obs(self) -> np.ndarray:
        return position_obs(self._pos, self.size, self.obs_mode)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        if wants_new_task(options, seed, self._has_task):
            self._sample_task()
        self._pos = self._sample_start()
        self.has_key, self._t = False, 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        action = int(action)
        if not 0 <= action < 5:
            raise ValueError(f"DarkKeyToDoor action must be in [0, 5), got {action}")
        self._t += 1
        self._pos = move(self._pos, _MOVES[action], self.size)
        reward, terminated, info = 0.0, False, {}
        if self._pos == self.key and not self.has_key:
            self.has_key, reward = True, 1.0
        elif self._pos == self.door and self.has_key:
            reward, terminated, info["success"] = 1.0, True, 1.0
        truncated = time_limit_reached(terminated, self._t, self.episode_length, info)
        return self._obs(), reward, terminated, truncated, info

    def _ansi(self) -> str:
        rows = []
        for r in range(self.size):
            row = ["."] * self.size
            if r == self.key[0] and not self.has_key:
                row[self.key[1]] = "K"
            if r == self.door[0]:
                row[self.door[1]] = "D"
            if r == self._pos[0]:
                row[self._pos[1]] = "A"
            rows.append("".join(row))
        return "\n".join(rows) + f"\nt={self._t} has_key={self.has_key}"

    def _frame(self, cell: int = 12) -> np.ndarray:
        """[size * cell, size * cell, 3] uint8: floor grey, key yellow (until picked up), door brown (green
        once the key is held), agent blue. Shows what the agent does not see."""
        img = np.full((self.size, self.size, 3), 60, np.uint8)
        if not self.has_key:
            img[self.key] = (240, 210, 40)
        img[self.door] = (80, 200, 80) if self.has_key else (150, 90, 40)
        img[self._pos] = (40, 90, 230)
        frame = np.kron(img, np.ones((cell, cell, 1), np.uint8))
        frame[::cell, :] = frame[:, ::cell] = 30
        return frame
