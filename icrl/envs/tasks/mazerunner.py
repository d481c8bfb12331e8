"""MazeRunner (AMAGO, Grigsby et al. 2024, appendix C.4): a goal-conditioned maze without pixels.

An adaptation of Memory Maze (Pasukonis et al. 2022) that needs no 3D simulator: every task is a new random
perfect maze (a spanning tree of corridors carved by a randomised depth-first search) and an instruction of
`num_goals` distinct cells to visit in order. The agent never sees the map, only local sensing: its own
position, how far it could walk in each of the four directions before hitting a wall, and the episode's
elapsed time (the sensors of the official env). To follow the instruction it must explore the maze and
remember its layout and where it has been; the reward is sparse (1 per sub-goal reached in order), so
from scratch the task mainly tests exploration with memory, and it is the benchmark of AMAGO's hindsight
instruction relabeling: every step "achieves" the cell the agent stands on, so any rollout can be
relabelled into a success for the instruction made of cells it actually visited.

Goal-conditioned under docs/CONTRACTS.md ("Goal-conditioned tasks"): the goal token of cell (r, c) is
r * size + c + 1 (vocabulary size**2); one step achieves exactly one token (achieved_slots = 1); the reset
achieves nothing. Differences from the official env: the maze is a perfect maze (the official generator
leaves loops and an open spawn area at the bottom), the agent starts at the bottom-centre corridor cell,
and the time limit truncates (bootstrapped) instead of terminating.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from icrl.envs.tasks.grid import RenderModes, wants_new_task
from icrl.envs.tasks.instruction import InstructionProgress, score_step

LEFT, UP, RIGHT, DOWN, STAY = 0, 1, 2, 3, 4  # the official env's order: west, north, east, south, no-op
MOVES = {LEFT: (0, -1), UP: (-1, 0), RIGHT: (0, 1), DOWN: (1, 0), STAY: (0, 0)}  # (d_row, d_col)
_GOAL_COLOURS = np.array(
    [(230, 60, 40), (250, 170, 30), (40, 180, 90), (160, 70, 200), (30, 170, 200)], np.uint8
)


def default_time_limit(size: int) -> int:
    """The AMAGO settings (250 steps for 11x11, 400 for 15x15), linear in between and beyond (>= 50)."""
    return max(50, (75 * int(size) - 325) // 2)


def carve_maze(size: int, rng: np.random.Generator) -> np.ndarray:
    """A random perfect maze: [size, size] bool, True = wall.

    Open cells are the (odd, odd) "rooms" plus the passages a randomised depth-first search (recursive
    backtracker) knocks through between neighbouring rooms, so the open cells form a tree: all connected,
    no loops. The border is wall. `size` must be odd and >= 5."""
    rooms = size // 2  # rooms per side
    walls = np.ones((size, size), dtype=bool)
    visited = np.zeros((rooms, rooms), dtype=bool)
    r0, c0 = (int(x) for x in rng.integers(rooms, size=2))
    visited[r0, c0] = True
    walls[2 * r0 + 1, 2 * c0 + 1] = False
    stack = [(r0, c0)]
    while stack:
        r, c = stack[-1]
        options = [
            (r + dr, c + dc)
            for dr, dc in ((0, -1), (-1, 0), (0, 1), (1, 0))
            if 0 <= r + dr < rooms and 0 <= c + dc < rooms and not visited[r + dr, c + dc]
        ]
        if not options:
            stack.pop()
            continue
        nr, nc = options[int(rng.integers(len(options)))]
        visited[nr, nc] = True
        walls[2 * nr + 1, 2 * nc + 1] = False
        walls[r + nr + 1, c + nc + 1] = False  # the passage between the two rooms
        stack.append((nr, nc))
    return walls


def free_run(walls: np.ndarray, pos: tuple[int, int], delta: tuple[int, int]) -> int:
    """How many open cells lie in a straight line from `pos` in direction `delta` before the first wall."""
    r, c = pos[0] + delta[0], pos[1] + delta[1]
    n = 0
    while not walls[r, c]:  # the border is wall, so this stops inside the grid
        n += 1
        r, c = r + delta[0], c + delta[1]
    return n


class MazeRunner(RenderModes, gym.Env):
    """Visit `num_goals` cells of a hidden random maze in the instructed order, sensing only locally.

    kwargs:
      size: side of the square maze, odd and >= 5 (default 15, as in AMAGO; 9 gives a 9x9 maze).
      num_goals: instruction length k (default 3): k distinct open cells other than the start.
      time_limit: steps per episode (default `default_time_limit(size)`: 250 for 11, 400 for 15, 100 for 7);
        reaching it truncates with `info["success"] = 0`.
      randomized_actions: also hide a per-task permutation of the 5 actions ("rewired" actions in AMAGO).

    Actions Discrete(5): 0 west, 1 north, 2 east, 3 south, 4 stay (before the permutation); a move into a
    wall leaves the agent where it is. Observation Dict:
      "goal": Box(0, size**2, (k,), int64): the instruction's cell tokens (r * size + c + 1) in order, each
        zeroed once reached, so the current sub-goal is the first non-zero token.
      "obs": Box(0, 1, (7,), float32): row / (size-1), col / (size-1), the free run west, north, east and
        south / (size-2), elapsed steps / time_limit.
    Reward 1 when the agent steps onto the current sub-goal; the last one terminates with
    `info["success"] = 1`. Every step's `info["achieved"]` is [token of the agent's cell] (the reset's is
    empty). The maze, the goals (and the permutation) are the hidden task: `reset()` with `options=None` or
    `{"new_task": True}` (or a seed) samples a new one, `{"new_task": False}` keeps it.
    """

    metadata: dict[str, Any] = {"render_modes": ["ansi", "rgb_array"], "render_fps": 8}

    def __init__(
        self,
        size: int = 15,
        num_goals: int = 3,
        time_limit: int | None = None,
        randomized_actions: bool = False,
        render_mode: str | None = None,
    ):
        size = int(size)
        if size < 5 or size % 2 == 0:
            raise ValueError(
                f"MazeRunner size must be odd and >= 5 (corridors sit on odd rows/columns inside a wall "
                f"border), got {size}; use e.g. {max(5, size + 1 - size % 2)}"
            )
        rooms = size // 2
        open_cells = 2 * rooms * rooms - 1  # rooms plus the passages of a spanning tree
        if not 1 <= int(num_goals) <= open_cells - 1:
            raise ValueError(
                f"MazeRunner num_goals must be in [1, {open_cells - 1}] for size {size} (distinct open cells "
                f"other than the start), got {num_goals}"
            )
        self.size = size
        self.num_goals = int(num_goals)
        self.time_limit = default_time_limit(size) if time_limit is None else int(time_limit)
        if self.time_limit < 1:
            raise ValueError(f"MazeRunner time_limit must be >= 1, got {time_limit}")
        self.randomized_actions = bool(randomized_actions)
        self.render_mode = render_mode
        vocab = size * size
        self.metadata = {**type(self).metadata, "goal_vocab": vocab, "achieved_slots": 1}
        self.observation_space = gym.spaces.Dict(
            {
                "goal": gym.spaces.Box(0, vocab, (self.num_goals,), np.int64),
                "obs": gym.spaces.Box(0.0, 1.0, (7,), np.float32),
            }
        )
        self.action_space = gym.spaces.Discrete(5)
        centre = size // 2 if (size // 2) % 2 == 1 else size // 2 - 1  # an odd column: a room
        self.start = (size - 2, centre)
        # Task (hidden): walls [size, size] bool, goal cells (k), action permutation (agent action -> move).
        self.walls = np.ones((size, size), dtype=bool)
        self.goals: list[tuple[int, int]] = []
        self.action_map = np.arange(5)
        self._has_task = False
        # Episode state
        self._pos = self.start
        self._t = 0
        self._progress = InstructionProgress([1] * self.num_goals, self.num_goals)  # the real one at reset

    # --------------------------------------------------------------------------------------------- task
    def token(self, cell: tuple[int, int]) -> int:
        """The goal token naming `cell`."""
        return int(cell[0]) * self.size + int(cell[1]) + 1

    def _sample_task(self) -> None:
        rng = self.np_random
        self.walls = carve_maze(self.size, rng)
        candidates = [(int(r), int(c)) for r, c in np.argwhere(~self.walls) if (r, c) != self.start]
        picks = rng.choice(len(candidates), size=self.num_goals, replace=False)
        self.goals = [candidates[int(i)] for i in picks]
        self.action_map = rng.permutation(5) if self.randomized_actions else np.arange(5)
        self._has_task = True

    def _obs(self) -> dict[str, np.ndarray]:
        n = self.size
        runs = [free_run(self.walls, self._pos, MOVES[m]) for m in (LEFT, UP, RIGHT, DOWN)]
        vec = [self._pos[0] / (n - 1), self._pos[1] / (n - 1), *(x / (n - 2) for x in runs)]
        vec.append(self._t / self.time_limit)
        return {"goal": self._progress.goal(), "obs": np.asarray(vec, dtype=np.float32)}

    # ---------------------------------------------------------------------------------------------- API
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        if wants_new_task(options, seed, self._has_task):
            self._sample_task()
        self._pos, self._t = self.start, 0
        self._progress = InstructionProgress([self.token(g) for g in self.goals], self.num_goals)
        return self._obs(), {"achieved": []}

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        action = int(action)
        if not 0 <= action < 5:
            raise ValueError(f"MazeRunner action must be in [0, 5), got {action}")
        self._t += 1
        dr, dc = MOVES[int(self.action_map[action])]
        target = (self._pos[0] + dr, self._pos[1] + dc)
        if not self.walls[target]:  # the border is wall, so target stays inside the grid
            self._pos = target
        reward, terminated, truncated, info = score_step(
            self._progress, [self.token(self._pos)], self._t, self.time_limit
        )
        return self._obs(), reward, terminated, truncated, info

    # ------------------------------------------------------------------------------------------- render
    def _ansi(self) -> str:
        grid = np.where(self.walls, "#", ".").astype("<U1")
        grid[self.start] = "S"
        for i, g in enumerate(self.goals):
            if i >= self._progress.current:
                grid[g] = str(i + 1) if i < 9 else "G"
        grid[self._pos] = "A"
        perm = f" actions={self.action_map.tolist()}" if self.randomized_actions else ""
        return (
            "\n".join("".join(row) for row in grid)
            + f"\nt={self._t} next_goal={self._progress.current + 1}{perm}"
        )

    def _frame(self, cell: int = 16) -> np.ndarray:
        """[size * cell, size * cell, 3] uint8: walls dark, corridors light, start grey, goals still to
        reach coloured by their order, agent blue."""
        img = np.full((self.size, self.size, 3), 235, np.uint8)
        img[self.walls] = (40, 40, 50)
        img[self.start] = (170, 170, 170)
        for i, g in enumerate(self.goals):
            if i >= self._progress.current:
                img[g] = _GOAL_COLOURS[i % len(_GOAL_COLOURS)]
        img[self._pos] = (40, 90, 230)
        return np.kron(img, np.ones((cell, cell, 1), np.uint8))
