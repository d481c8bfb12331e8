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


class CueRecall(gym.Env):
    """Recall a ±1 cue after `delay` blank steps; kwargs: delay (int), continuous (bool)."""

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
        self._cue, self._t = 1.0, 0

    @staticmethod
    def recommended_context(delay: int = 5, **_: Any) -> int:
        """The whole episode: the answer (step `delay`) must still see the cue of step 0."""
        return int(delay) + 1

    def _obs(self) -> np.ndarray:
        first = self._t == 0
        return np.array([self._cue if first else 0.0, float(first), float(self._t == self.delay)], np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._cue = float(self.np_random.choice([-1.0, 1.0]))
        self._t = 0
        return self._obs(), {}

    def step(self, action):
        if self._t < self.delay:
            self._t += 1
            return self._obs(), 0.0, False, False, {}
        if self.continuous:
            answer = float(np.clip(np.asarray(action, dtype=np.float64).reshape(-1)[0], -1.0, 1.0))
            reward = 1.0 - abs(answer - self._cue) / 2.0
            success = abs(answer - self._cue) < 0.2
        else:
            answer = 1.0 if int(action) == 1 else -1.0
            reward = float(answer == self._cue)
            success = reward == 1.0
        return self._obs(), reward, True, False, {"success": float(success)}
