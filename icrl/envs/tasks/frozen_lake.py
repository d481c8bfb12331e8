"""Meta Frozen Lake (the meta-RL FrozenLake of AMAGO, Grigsby et al. 2024, §5 / appendix).

Every task is a new random lake: a `size` × `size` grid of frozen cells and holes with a start and a goal,
resampled until the goal is reachable from the start (breadth-first search). The agent sees only its own
position, never the map, so it must learn where the holes are from its own experience: the first episode
is exploration, later episodes of the same task (a multi-episode rollout, `--episodes-per-rollout k`) can
walk straight to the goal. Hard mode also hides a per-task random permutation of the four actions, which
the agent has to identify too.

Layout (ansi render): `S` start, `G` goal, `H` hole, `.` frozen, `A` agent. Actions as in Gymnasium's
FrozenLake: 0 left, 1 down, 2 right, 3 up (before the hard-mode permutation); moving into the border
leaves the agent where it is. No slipping.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import gymnasium as gym
import numpy as np

from icrl.envs.batched import ArrayTask, StepArrays
from icrl.envs.tasks.grid import position_rows, position_space

LEFT, DOWN, RIGHT, UP = 0, 1, 2, 3
_MOVES = {LEFT: (0, -1), DOWN: (1, 0), RIGHT: (0, 1), UP: (-1, 0)}  # (d_row, d_col)
_MOVE_ROWS = np.array([_MOVES[m] for m in range(4)], np.int64)  # [4, 2]


def lake_is_solvable(holes: np.ndarray, start: tuple[int, int], goal: tuple[int, int]) -> bool:
    """Whether `goal` is reachable from `start` through non-hole cells (4-neighbour BFS).

    holes: [H, W] bool."""
    h, w = holes.shape
    if holes[start] or holes[goal]:
        return False
    seen = np.zeros_like(holes, dtype=bool)
    seen[start] = True
    queue = deque([start])
    while queue:
        r, c = queue.popleft()
        if (r, c) == goal:
            return True
        for dr, dc in _MOVES.values():
            nr, nc = r + dr, c + dc
            if 0 <= nr < h and 0 <= nc < w and not seen[nr, nc] and not holes[nr, nc]:
                seen[nr, nc] = True
                queue.append((nr, nc))
    return False


class MetaFrozenLake(ArrayTask):
    """A hidden random lake per task; observation = the agent's position only (not the map).

    kwargs:
      size: side of the square grid (>= 2).
      hard: also hide a per-task random permutation of the 4 actions (AMAGO's "hard mode").
      hole_prob: probability of each non-start, non-goal cell being a hole (lakes are resampled until
        solvable).
      max_episode_steps: time limit of one episode (default 2 * size**2); reaching it truncates, success 0.
      random_corners: False (default, as Gymnasium/AMAGO): start top-left, goal bottom-right. True: start and
        goal are two distinct random cells, also hidden task parameters.
      obs_mode: "xy" (default): Box(2,) = (row, col) / (size - 1); "onehot": Box(size**2,) one-hot cell.

    Rewards: 1 for reaching the goal (terminated, success 1); falling into a hole terminates with reward 0
    (success 0); the time limit truncates (success 0). `info["success"]` is set on the last step only.
    The lake (and the hard-mode permutation) is a hidden task parameter: `reset()` with `options=None` or
    `{"new_task": True}` (or a seed) samples a new task, `{"new_task": False}` keeps it. Use it with
    `icrl train --env meta_frozen_lake --episodes-per-rollout k` so one rollout sees k episodes of one lake.
    """

    metadata: dict[str, Any] = {"render_modes": ["ansi", "rgb_array"], "render_fps": 4}

    def __init__(
        self,
        size: int = 5,
        hard: bool = False,
        hole_prob: float = 0.2,
        max_episode_steps: int | None = None,
        random_corners: bool = False,
        obs_mode: str = "xy",
        render_mode: str | None = None,
    ):
        if int(size) < 2:
            raise ValueError(f"MetaFrozenLake size must be >= 2, got {size}")
        if not 0.0 <= float(hole_prob) < 1.0:
            raise ValueError(f"MetaFrozenLake hole_prob must be in [0, 1), got {hole_prob}")
        self.size = int(size)
        self.hard = bool(hard)
        self.hole_prob = float(hole_prob)
        self.max_episode_steps = 2 * self.size**2 if max_episode_steps is None else int(max_episode_steps)
        if self.max_episode_steps < 1:
            raise ValueError(f"MetaFrozenLake max_episode_steps must be >= 1, got {max_episode_steps}")
        self.random_corners = bool(random_corners)
        self.obs_mode = obs_mode
        self.render_mode = render_mode
        self.observation_space = position_space(self.size, obs_mode, "MetaFrozenLake")
        self.action_space = gym.spaces.Discrete(4)
        self._copies(1)

    def _allocate(self, n: int) -> None:
        s = self.size
        self.holes = np.zeros((n, s, s), bool)  # [N, S, S] the hidden task: True = hole
        self.start = np.zeros((n, 2), np.int64)  # [N, 2] (row, col)
        self.goal = np.full((n, 2), s - 1, np.int64)  # [N, 2]
        self.action_map = np.tile(np.arange(4), (n, 1))  # [N, 4] agent action -> move
        self._pos = np.zeros((n, 2), np.int64)  # [N, 2]

    def _draw_tasks(self, rows: np.ndarray) -> None:
        n = self.size
        for i in rows.tolist():
            rng = self._rng(i)
            while True:  # lakes drawn until solvable
                if self.random_corners:
                    a, b = rng.choice(n * n, size=2, replace=False)
                    start, goal = divmod(int(a), n), divmod(int(b), n)
                else:
                    start, goal = (0, 0), (n - 1, n - 1)
                holes = rng.random((n, n)) < self.hole_prob
                holes[start] = holes[goal] = False
                if lake_is_solvable(holes, start, goal):
                    break
            self.holes[i], self.start[i], self.goal[i] = holes, start, goal
            self.action_map[i] = rng.permutation(4) if self.hard else np.arange(4)

    def _reset_rows(self, rows: np.ndarray) -> None:
        self._pos[rows] = self.start[rows]

    def _obs(self) -> dict[str, np.ndarray]:
        return {"obs": position_rows(self._pos, self.size, self.obs_mode)}  # a Box: TimestepWrapper's key "obs"

    def _step_arrays(self, actions: np.ndarray) -> StepArrays:
        rows = np.arange(self.num_copies)
        move = _MOVE_ROWS[self.action_map[rows, actions]]  # [N, 2]
        self._pos = np.clip(self._pos + move, 0, self.size - 1)  # the border stops the agent
        at_goal = (self._pos == self.goal).all(1)
        in_hole = ~at_goal & self.holes[rows, self._pos[:, 0], self._pos[:, 1]]
        terminated = at_goal | in_hole
        truncated = ~terminated & (self._time >= self.max_episode_steps)
        success = np.where(at_goal, 1.0, np.where(in_hole | truncated, 0.0, np.nan))
        return StepArrays(at_goal.astype(np.float64), terminated, success, truncated)

    def _ansi(self) -> str:
        (sr, sc), (gr, gc), (ar, ac) = self.start[0], self.goal[0], self._pos[0]
        rows = []
        for r in range(self.size):
            row = ["H" if self.holes[0, r, c] else "." for c in range(self.size)]
            row[sc] = "S" if r == sr else row[sc]
            row[gc] = "G" if r == gr else row[gc]
            if r == ar:
                row[ac] = "A"
            rows.append("".join(row))
        perm = f" actions={self.action_map[0].tolist()}" if self.hard else ""
        return "\n".join(rows) + f"\nt={int(self._time[0])}{perm}"

    def _frame(self, cell: int = 16) -> np.ndarray:
        """[size * cell, size * cell, 3] uint8: ice light blue, holes dark, start grey, goal green, agent
        blue (red once in a hole)."""
        holes, pos = self.holes[0], tuple(self._pos[0])
        img = np.zeros((self.size, self.size, 3), np.uint8)
        img[:] = (200, 230, 250)
        img[holes] = (20, 30, 60)
        img[tuple(self.start[0])] = (170, 170, 170)
        img[tuple(self.goal[0])] = (80, 200, 80)
        img[pos] = (230, 60, 40) if holes[pos] else (40, 90, 230)
        frame = np.kron(img, np.ones((cell, cell, 1), np.uint8))
        frame[::cell, :] = frame[:, ::cell] = 255  # grid lines
        return frame
