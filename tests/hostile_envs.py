"""User envs that break the Gymnasium contract (issue 20), named on the command line as `hostile_envs:<factory>`
(tests/ on the path): each is a 2-action corridor whose `kind` misbehaves from step `at` on."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

KINDS = ("raise_reset", "raise_step", "none_reward", "array_reward", "str_reward", "object_obs", "huge_reward",
         "bad_tuple")


class HostileEnv(gym.Env):
    """`kind`: raise in reset / step, return None, an array or a string as the reward, an object as the
    observation, a reward of 1e300 (finite in float64, inf in float32), or a 3-tuple from step."""

    def __init__(self, kind: str = "raise_step", at: int = 2, length: int = 4) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        self.kind, self.at, self.length = kind, int(at), int(length)
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if self.kind == "raise_reset":
            raise RuntimeError("the user's reset is broken")
        self._t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self._t += 1
        obs, reward = np.full(2, self._t / self.length, np.float32), 0.1
        if self._t >= self.at:
            if self.kind == "raise_step":
                raise KeyError("the user's step is broken")
            reward = {"none_reward": None, "array_reward": np.ones(3), "str_reward": "1",
                      "huge_reward": 1e300}.get(self.kind, reward)
            if self.kind == "object_obs":
                obs = object()
            if self.kind == "bad_tuple":
                return obs, reward, False
        return obs, reward, self._t >= self.length, False, {}
