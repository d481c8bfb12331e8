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

from icrl.envs.tasks.instruction import InstructionTask

LEFT, UP, RIGHT, DOWN, STAY = 0, 1, 2, 3, 4  # the official env's order: west, north, east, south, no-op
MOVES = {LEFT: (0, -1), UP: (-1, 0), RIGHT: (0, 1), DOWN: (1, 0), STAY: (0, 0)}  # (d_row, d_col)
_MOVES = np.array([MOVES[m] for m in range(5)], np.int64)  # [5, 2]
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


def free_runs(walls: np.ndarray) -> np.ndarray:
    """[M, S, S] bool walls -> [M, S, S, 4] int64: from each cell, the open cells in a straight line west,
    north, east and south before the first wall (border cells, never stood on, get 0)."""
    m, s, _ = walls.shape
    runs = np.zeros((m, s, s, 4), np.int64)
    for k in range(1, s):
        runs[:, :, k, 0] = np.where(walls[:, :, k - 1], 0, runs[:, :, k - 1, 0] + 1)
        runs[:, k, :, 1] = np.where(walls[:, k - 1, :], 0, runs[:, k - 1, :, 1] + 1)
    for k in range(s - 2, -1, -1):
        runs[:, :, k, 2] = np.where(walls[:, :, k + 1], 0, runs[:, :, k + 1, 2] + 1)
        runs[:, k, :, 3] = np.where(walls[:, k + 1, :], 0, runs[:, k + 1, :, 3] + 1)
    return runs


class MazeRunner(InstructionTask):
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
        self._copies(1)

    def token(self, cell: tuple[int, int]) -> int:
        """The goal token naming `cell`."""
        return int(cell[0]) * self.size + int(cell[1]) + 1

    def _allocate(self, n: int) -> None:
        super()._allocate(n)
        s = self.size
        self.walls = np.ones((n, s, s), bool)  # [N, S, S] the hidden task: True = wall
        self.goals = np.zeros((n, self.num_goals, 2), np.int64)  # [N, k, 2] the instruction's cells
        self.action_map = np.tile(np.arange(5), (n, 1))  # [N, 5] agent action -> move
        self._runs = np.zeros((n, s, s, 4), np.int64)  # [N, S, S, 4] free run west, north, east, south
        self._pos = np.tile(np.asarray(self.start, np.int64), (n, 1))  # [N, 2]

    def _draw_tasks(self, rows: np.ndarray) -> None:
        walls, goals, perms = [], [], []
        for i in rows.tolist():
            rng = self._rng(i)
            walls.append(carve_maze(self.size, rng))
            candidates = [(int(r), int(c)) for r, c in np.argwhere(~walls[-1]) if (r, c) != self.start]
            picks = rng.choice(len(candidates), size=self.num_goals, replace=False)
            goals.append([candidates[int(j)] for j in picks])
            perms.append(rng.permutation(5) if self.randomized_actions else np.arange(5))
        self.set_tasks(rows, np.stack(walls), np.array(goals, np.int64), np.stack(perms))

    def set_tasks(self, rows: np.ndarray, walls: np.ndarray, goals: np.ndarray, action_maps: np.ndarray) -> None:
        """The tasks of the copies `rows`: their mazes [R, size, size] (True = wall, a walled border), goal cells
        [R, num_goals, 2] in order and action permutations [R, 5]; each copy's next reset with
        `options={"new_task": False}` starts its task (a hand-built maze, as the tests use)."""
        self.walls[rows], self.goals[rows], self.action_map[rows] = walls, goals, action_maps
        self._runs[rows] = free_runs(self.walls[rows])  # every cell's free runs at once: a step is a few gathers
        for i in np.asarray(rows).tolist():
            self._set_instruction(i, [self.token(g) for g in self.goals[i]])

    def _reset_rows(self, rows: np.ndarray) -> None:
        super()._reset_rows(rows)
        self._pos[rows] = self.start

    def _obs(self) -> dict[str, np.ndarray]:
        s = self.size
        runs = self._runs[np.arange(self.num_copies), self._pos[:, 0], self._pos[:, 1]]  # [N, 4]
        clock = (self._time / self.time_limit)[:, None]
        vec = np.concatenate([self._pos / (s - 1), runs / (s - 2), clock], 1)
        return {"goal": self._goal(), "obs": vec.astype(np.float32)}

    def _act(self, actions: np.ndarray) -> np.ndarray:
        rows = np.arange(self.num_copies)
        target = self._pos + _MOVES[self.action_map[rows, actions]]  # the border is wall: stays inside
        blocked = self.walls[rows, target[:, 0], target[:, 1]]
        self._pos = np.where(blocked[:, None], self._pos, target)
        return self._pos[:, 0] * self.size + self._pos[:, 1] + 1  # every step achieves the agent's cell

    # ------------------------------------------------------------------------------------------- render
    def _ansi(self) -> str:
        grid = np.where(self.walls[0], "#", ".").astype("<U1")
        grid[self.start] = "S"
        current = int(self._current[0])
        for i, g in enumerate(self.goals[0].tolist()):
            if i >= current:
                grid[tuple(g)] = str(i + 1) if i < 9 else "G"
        grid[tuple(self._pos[0])] = "A"
        perm = f" actions={self.action_map[0].tolist()}" if self.randomized_actions else ""
        return "\n".join("".join(row) for row in grid) + f"\nt={int(self._time[0])} next_goal={current + 1}{perm}"

    def _frame(self, cell: int = 16) -> np.ndarray:
        """[size * cell, size * cell, 3] uint8: walls dark, corridors light, start grey, goals still to
        reach coloured by their order, agent blue."""
        img = np.full((self.size, self.size, 3), 235, np.uint8)
        img[self.walls[0]] = (40, 40, 50)
        img[self.start] = (170, 170, 170)
        for i, g in enumerate(self.goals[0].tolist()):
            if i >= self._current[0]:
                img[tuple(g)] = _GOAL_COLOURS[i % len(_GOAL_COLOURS)]
        img[tuple(self._pos[0])] = (40, 90, 230)
        return np.kron(img, np.ones((cell, cell, 1), np.uint8))
