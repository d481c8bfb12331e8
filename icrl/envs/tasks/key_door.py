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

from icrl.envs.batched import ArrayTask, StepArrays
from icrl.envs.tasks.grid import position_rows, position_space

UP, DOWN, LEFT, RIGHT, STAY = 0, 1, 2, 3, 4
_MOVES = np.array([(-1, 0), (1, 0), (0, -1), (0, 1), (0, 0)], np.int64)  # [5, 2] (d_row, d_col) per action


class DarkKeyToDoor(ArrayTask):
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
        self._copies(1)

    def _allocate(self, n: int) -> None:
        self.key = np.zeros((n, 2), np.int64)  # [N, 2] the hidden task
        self.door = np.full((n, 2), self.size - 1, np.int64)  # [N, 2]
        self._pos = np.zeros((n, 2), np.int64)  # [N, 2]
        self.has_key = np.zeros(n, bool)  # [N]

    def _draw_tasks(self, rows: np.ndarray) -> None:
        for i in rows.tolist():  # the key and the door, then the first episode's start
            a, b = self._rng(i).choice(self.size**2, size=2, replace=False)
            self.key[i], self.door[i] = divmod(int(a), self.size), divmod(int(b), self.size)
        self._draw_episodes(rows)

    def _draw_episodes(self, rows: np.ndarray) -> None:
        """Every episode's start: a random cell that is neither the key nor the door (a fixed start: the one
        nearest the centre)."""
        n = self.size
        for i in rows.tolist():
            taken = {int(self.key[i, 0]) * n + int(self.key[i, 1]), int(self.door[i, 0]) * n + int(self.door[i, 1])}
            free = np.array([c for c in range(n * n) if c not in taken])
            if self.random_start:
                cell = int(self._rng(i).choice(free))
            else:
                dist = np.abs(np.stack(divmod(free, n), 1) - (n - 1) / 2).sum(1)
                cell = int(free[int(np.argmin(dist))])
            self._pos[i] = divmod(cell, n)

    def _reset_rows(self, rows: np.ndarray) -> None:
        self.has_key[rows] = False  # the key is dropped between episodes (the start is drawn with the episode)

    def _obs(self) -> dict[str, np.ndarray]:
        return {"obs": position_rows(self._pos, self.size, self.obs_mode)}

    def _step_arrays(self, actions: np.ndarray) -> StepArrays:
        self._pos = np.clip(self._pos + _MOVES[actions], 0, self.size - 1)  # walls stop the agent
        pick = ~self.has_key & (self._pos == self.key).all(1)  # +1 the first time the key cell is reached
        opened = self.has_key & (self._pos == self.door).all(1)  # the door with the key: +1, the end
        self.has_key |= pick
        truncated = ~opened & (self._time >= self.episode_length)
        success = np.where(opened, 1.0, np.where(truncated, 0.0, np.nan))
        return StepArrays((pick | opened).astype(np.float64), opened, success, truncated)

    def _ansi(self) -> str:
        (kr, kc), (dr, dc), (ar, ac) = self.key[0], self.door[0], self._pos[0]
        rows = []
        for r in range(self.size):
            row = ["."] * self.size
            if r == kr and not self.has_key[0]:
                row[kc] = "K"
            if r == dr:
                row[dc] = "D"
            if r == ar:
                row[ac] = "A"
            rows.append("".join(row))
        return "\n".join(rows) + f"\nt={int(self._time[0])} has_key={bool(self.has_key[0])}"

    def _frame(self, cell: int = 12) -> np.ndarray:
        """[size * cell, size * cell, 3] uint8: floor grey, key yellow (until picked up), door brown (green
        once the key is held), agent blue. Shows what the agent does not see."""
        img = np.full((self.size, self.size, 3), 60, np.uint8)
        if not self.has_key[0]:
            img[tuple(self.key[0])] = (240, 210, 40)
        img[tuple(self.door[0])] = (80, 200, 80) if self.has_key[0] else (150, 90, 40)
        img[tuple(self._pos[0])] = (40, 90, 230)
        frame = np.kron(img, np.ones((cell, cell, 1), np.uint8))
        frame[::cell, :] = frame[:, ::cell] = 30
        return frame
