"""Hostile envs for tests/integration/test_probe.py, named on the command line as `probe_envs:<factory>` (tests/ on
the path).

Each is a tiny corridor that starts misbehaving at step `at`: NaN observations, NaN or infinite rewards.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class BadValueEnv(gym.Env):
    """A 2-action corridor of `length` steps whose `kind` output ("obs", "reward" or "inf_reward") turns
    non-finite from step `at` on; every other step is an ordinary finite transition."""

    def __init__(self, kind: str = "obs", at: int = 3, length: int = 4) -> None:
        if kind not in ("obs", "reward", "inf_reward"):
            raise ValueError(f"kind must be obs, reward or inf_reward, got {kind!r}")
        self.kind, self.at, self.length = kind, int(at), int(length)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._t = 0

    def _obs(self) -> np.ndarray:
        obs = np.array([self._t / self.length, 1.0], dtype=np.float32)
        if self.kind == "obs" and self._t >= self.at:
            obs[0] = np.nan
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._t = 0
        return self._obs(), {}

    def step(self, action):
        self._t += 1
        reward = 0.1 * float(action)
        if self._t >= self.at and self.kind != "obs":
            reward = float("nan") if self.kind == "reward" else float("inf")
        return self._obs(), reward, self._t >= self.length, False, {}
