"""Cue recall: see a cue once, wait through blank steps, then answer it. The smallest memory test.

The cue c ∈ {-1, +1} is visible only at t=0; after `delay` blank steps the observation says "answer
now" and the episode's single reward depends on the answer. Every earlier action is ignored. Without
memory the best expected return is 0.5; with memory it is 1.0. The continuous variant (answer a ∈ [-1, 1],
reward 1 - |a - c| / 2) is a quick check of the continuous-action actor-critic; the discrete one
(answer 0 or 1) mirrors it.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from icrl.envs.batched import ArrayTask, StepArrays


class CueRecall(ArrayTask):
    """Recall a ±1 cue after `delay` blank steps; kwargs: delay (int), continuous (bool). Every reset draws a
    new cue."""

    metadata = {"render_modes": []}

    def __init__(self, delay: int = 5, continuous: bool = True) -> None:
        if delay < 0:
            raise ValueError(f"delay must be >= 0, got {delay}")
        self.delay, self.continuous = int(delay), bool(continuous)
        # [cue, is_first_step, answer_now]
        self.observation_space = gym.spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32)
        if continuous:
            self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
        else:
            self.action_space = gym.spaces.Discrete(2)
        self._copies(1)

    @staticmethod
    def recommended_context(delay: int = 5, **_: Any) -> int:
        """The whole episode: the answer (step `delay`) must still see the cue of step 0."""
        return int(delay) + 1

    def _allocate(self, n: int) -> None:
        self._cue = np.ones(n, np.float64)  # [N] ±1, the hidden task
        self._t = np.zeros(n, np.int64)  # [N] the task's own clock: it stops at the answer step

    def _draw_tasks(self, rows: np.ndarray) -> None:
        for i in rows.tolist():
            self._cue[i] = float(self._rng(i).choice([-1.0, 1.0]))

    def _draw_episodes(self, rows: np.ndarray) -> None:
        self._draw_tasks(rows)  # every episode a new cue

    def _reset_rows(self, rows: np.ndarray) -> None:
        self._t[rows] = 0

    def _obs(self) -> dict[str, np.ndarray]:
        first = self._t == 0
        obs = np.stack([np.where(first, self._cue, 0.0), first, self._t == self.delay], 1).astype(np.float32)
        return {"obs": obs}

    def _step_arrays(self, actions: np.ndarray) -> StepArrays:
        answering = self._t >= self.delay  # blank steps count on until t = delay, then the answer (every
        self._t += (~answering).astype(np.int64)  # earlier action is ignored)
        if self.continuous:
            answer = np.clip(actions.reshape(-1).astype(np.float64), -1.0, 1.0)
            reward = 1.0 - np.abs(answer - self._cue) / 2.0
            success = (np.abs(answer - self._cue) < 0.2).astype(np.float64)
        else:
            answer = np.where(actions == 1, 1.0, -1.0)
            reward = (answer == self._cue).astype(np.float64)
            success = reward.copy()
        reward = np.where(answering, reward, 0.0)
        success = np.where(answering, success, np.nan)
        return StepArrays(reward, answering.copy(), success)
