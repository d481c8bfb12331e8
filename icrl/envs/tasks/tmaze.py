"""Passive T-Maze (Ni et al. 2023, "When do Transformers shine in RL?"; used by AMAGO, docs/design.md §9).

A pure memory test: the goal (up or down) is shown only in the very first observation; the agent must walk
`length` cells right along a featureless corridor and, at the junction, recall that one bit. Credit
assignment is trivial (walking right is always right), so the task isolates recall over `length` steps.

Layout: cells 0 .. length-1 are the corridor, cell `length` is the junction. Start in cell 0.

Active T-Maze (`TMazeActive`, also from Ni et al. 2023): the cue is not shown for free. It is visible only
while the agent stands on the cue cell 0, and the agent starts one step to its right (cell 1), so it must
first walk LEFT to read the cue, then walk the corridor and choose - exploration for information, then
recall. Both variants share one implementation; they differ in start cell, when the cue is visible, and
which direction counts as progress. The rules are written once, on arrays of copies (icrl.envs.batched): a
`TMaze` is one copy, `make_vector_env` steps many at once.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from icrl.envs.batched import ArrayTask, StepArrays

UP, DOWN, LEFT, RIGHT = 0, 1, 2, 3


class TMaze(ArrayTask):
    """Passive T-Maze with observation `[cue_up, cue_down, in_corridor, at_junction]` (float32).

    Rewards: +1 for choosing the cued end at the junction, 0 for the other end, and `-1/horizon` for every
    step that does not move the agent forward (bumping a wall, moving left, up/down in the corridor,
    right at the junction). With the default horizon `length + 1` only the optimal path (right × length,
    then the cued direction) finishes in time, and its return is exactly 1.0.
    The goal is a hidden task parameter: `reset(options={"new_task": False})` keeps it (meta-RL rollouts).
    """

    metadata = {"render_modes": ["ansi", "rgb_array"], "render_fps": 4}
    start_pos = 0  # the cell the agent starts in
    active = False  # the cue is visible only on cell 0 (TMazeActive), not at the first step

    def __init__(self, length: int = 10, horizon: int | None = None, render_mode: str | None = None):
        if int(length) < 1:
            raise ValueError(f"TMaze length must be >= 1, got {length}")
        self.length = int(length)
        optimal = self.optimal_steps
        self.horizon = optimal if horizon is None else int(horizon)
        if self.horizon < optimal:
            raise ValueError(
                f"{type(self).__name__} horizon {self.horizon} is shorter than the optimal path "
                f"({optimal} steps)"
            )
        self.penalty = 1.0 / self.horizon
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Box(0.0, 1.0, (4,), np.float32)
        self.action_space = gym.spaces.Discrete(4)
        self._copies(1)

    @property
    def optimal_steps(self) -> int:
        """Length of the optimal path: right x length, then the choice (active: left to the cue first)."""
        return self.length + 1 + self.start_pos

    def _allocate(self, n: int) -> None:
        self.goal_up = np.ones(n, bool)  # [N] the hidden task
        self._pos = np.full(n, self.start_pos, np.int64)  # [N] cell
        self._seen_cue = np.zeros(n, bool)  # [N] the cue was visible (active: the cue cell was visited)

    def _cue_visible(self) -> np.ndarray:
        """[N] passive: the very first observation only; active: while on the cue cell."""
        return self._pos == 0 if self.active else self._time == 0

    def _draw_tasks(self, rows: np.ndarray) -> None:
        for i in rows.tolist():  # the next episode of the same task keeps its goal
            self.goal_up[i] = bool(self._rng(i).integers(2) == 0)

    def _reset_rows(self, rows: np.ndarray) -> None:
        self._pos[rows] = self.start_pos
        self._seen_cue[rows] = self.start_pos == 0  # the cue is seen where the agent starts

    def _obs(self) -> dict[str, np.ndarray]:
        obs = np.zeros((self.num_copies, 4), np.float32)  # [N, 4]: [cue_up, cue_down, in_corridor, at_junction]
        cue = self._cue_visible()
        obs[cue & self.goal_up, 0] = 1.0
        obs[cue & ~self.goal_up, 1] = 1.0
        corridor = self._pos < self.length
        obs[corridor, 2] = 1.0
        obs[~corridor, 3] = 1.0
        return {"obs": obs}  # a Box observation: TimestepWrapper's key "obs"

    def _step_arrays(self, actions: np.ndarray) -> StepArrays:
        choose = (self._pos == self.length) & ((actions == UP) | (actions == DOWN))  # [N] at the junction
        correct = (actions == UP) == self.goal_up
        progress = np.where(self._seen_cue, 1, -1) if self.active else 1  # before moving: RIGHT, or LEFT first
        old = self._pos.copy()
        move = ~choose
        self._pos += (move & (actions == RIGHT) & (self._pos < self.length)).astype(np.int64)
        self._pos -= (move & (actions == LEFT) & (old > 0)).astype(np.int64)
        # walls, up/down in the corridor, the wrong way, right at the end: penalised
        reward = np.where(choose, correct.astype(np.float64), 0.0)
        reward = np.where(move & (self._pos - old != progress), -self.penalty, reward)
        self._seen_cue |= move & self._cue_visible()
        # The step limit is part of the task (the official env ends every episode at its horizon): a
        # termination, not a truncation. Bootstrapping here would regress on a state that is never itself a
        # regression target (docs/design.md §10).
        timeout = ~choose & (self._time >= self.horizon)
        success = np.where(choose, correct.astype(np.float64), np.where(timeout, 0.0, np.nan))
        return StepArrays(reward, choose | timeout, success)

    @classmethod
    def recommended_exploration(cls, length: int = 10, horizon: int | None = None, **_: Any) -> dict[str, Any]:
        """Argmax training actions plus ε-greedy shaped as a window over the rollout: the annealed ε (1.0 ->
        0.01 over 100k steps per env, scaled per env) at the decision steps, and 0.5 / length elsewhere.

        One random step in the corridor loses the episode (the horizon leaves no spare step), so plain
        ε-greedy almost never reaches the junction of a long corridor and the critic never sees the choices
        that memory would explain. This is the official AMAGO recipe (`TMazeExploration` in its
        examples/04_tmaze.py) with its windows narrowed to the steps that decide: the junction (and, in the
        active variant, the first step, towards the cue). The official windows (the first step and the last
        four, `window_start=1, window_end=4`) explore at steps where any random move loses the episode:
        in a T-Maze-100 run only 46 of 152 stored rollouts reached the junction, 17 of them made a choice."""
        env = cls(length=length, horizon=horizon)
        return {
            "train_actions": "argmax",
            "eps_shape": "window",
            "shape_horizon": env.optimal_steps - 1,  # the junction's step index
            "window_start": env.start_pos,  # passive: none; active: the first step, towards the cue
            "window_end": 1,  # the junction
            "window_eps": 0.5 / env.length,
            "eps_start": 1.0,
            "eps_end": 0.01,
            "eps_anneal_steps": 100_000,
        }

    @classmethod
    def recommended_context(cls, length: int = 10, horizon: int | None = None, **_: Any) -> int:
        """The whole rollout: the last decision (at step horizon - 1) must still see the cue of step 0."""
        return cls(length=length, horizon=horizon).horizon

    @classmethod
    def recommended_budget(cls, length: int = 10, horizon: int | None = None, **_: Any) -> int:
        """Env steps for a run at the library's defaults: 2,000 per corridor cell, at least 100,000.

        The updates a corridor needs grow with it, and so do the env steps per update (the replay ratio
        counts timesteps: one update trains 24 whole rollouts). Measured at the defaults (docs/results.md):
        T-Maze 200 solved at 120,000 env steps, T-Maze 500 at 320,000 and 350,000 (seeds 0, 1) and T-Maze
        1,000 at 560,000 (seed 0), each within 40% of this budget; the library's flat 100,000 stopped
        T-Maze 500 after ~500 updates, long before it can be solved."""
        return max(100_000, 2_000 * cls(length=length, horizon=horizon).length)

    def _ansi(self) -> str:
        row = ["."] * self.length + ["+"]
        if self.start_pos > 0:
            row[0] = "c"  # the cue cell of the active variant
        row[int(self._pos[0])] = "A"
        return "".join(row) + f"  goal={'up' if self.goal_up[0] else 'down'} t={int(self._time[0])}"

    def _frame(self, cell: int = 12) -> np.ndarray:
        """[3 * cell, (length + 1) * cell, 3] uint8: the corridor in the middle row, the two ends above and
        below the junction (the cued one tinted green), the agent in blue, and the cue above (green) or
        below (orange) cell 0 only when the agent sees it (passive: at t=0; active: while on cell 0; the
        active variant's cue cell is drawn darker)."""
        up = bool(self.goal_up[0])
        img = np.full((3, self.length + 1, 3), 30, np.uint8)  # walls
        img[1, :] = 170  # corridor and junction
        img[0, self.length] = img[2, self.length] = 220  # the two ends
        img[0 if up else 2, self.length] = (150, 220, 150)
        if self.start_pos > 0:
            img[1, 0] = 120  # the active variant's cue cell
        if self._cue_visible()[0]:  # the cue, above or below cell 0
            img[0 if up else 2, 0] = (60, 200, 60) if up else (240, 150, 40)
        img[1, int(self._pos[0])] = (40, 90, 230)
        return np.kron(img, np.ones((cell, cell, 1), np.uint8))


class TMazeActive(TMaze):
    """Active T-Maze: same observation, actions and reward scheme as `TMaze`, but the cue must be fetched.

    Layout: cell 0 is the cue cell, cells 0 .. length-1 the corridor, cell `length` the junction; the agent
    starts in cell 1. The cue bit (`[cue_up, cue_down]`) is set only in observations taken while standing
    on cell 0 (every visit, not only the first); elsewhere the observation does not depend on the goal.

    Rewards: +1 for choosing the cued end at the junction, 0 for the other end, and `-1/horizon` for every
    step that does not move the agent one cell along the optimal route: LEFT until the cue cell has been
    visited, RIGHT after that. So walking right before reading the cue, walking left after it, bumping a
    wall, up/down in the corridor and right at the junction are all penalised. The optimal path (left,
    right x length, the cued direction) takes `length + 2` steps - the default horizon - and returns
    exactly 1.0; skipping the cue can only guess, and its right steps are penalised.
    """

    start_pos = 1
    active = True
