"""Held-out tasks for the learning suite: envs written the way a user writes their own (plain Gymnasium, nothing from
icrl, no `recommended_*` hints), which no default of the library was tuned on. The suite (benchmarks/learning_suite.py)
trains on them with `--env benchmarks.heldout_envs:NAME` at the library's defaults, so a change of a default is
judged on tasks it was not chosen for as well as on the ones it was.

`GaussianArms` is meta-RL unlike the built-in Bernoulli bandit: Gaussian rewards whose noise hides the arms' means,
three arms, and a per-pull observation that says nothing about them; the agent must explore, then commit, within
one rollout.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class GaussianArms(gym.Env):
    """`arms` arms whose means mu_i ~ N(0, 1) are hidden and redrawn at every reset; a pull of arm i pays
    mu_i + N(0, noise^2); `horizon` pulls per episode (the episode ends, terminated, after the last).

    Observation: Box(1,) = pulls left / horizon. `info["success"]` at the end: 1.0 when the last `horizon // 4`
    pulls all went to the best arm (the agent found it and committed), else 0.0. Reference returns (horizon 40,
    3 arms, noise 1): always the best arm 40 x E[max of 3 N(0, 1)] = 33.9; random pulls 0.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, arms: int = 3, horizon: int = 40, noise: float = 1.0) -> None:
        if arms < 2 or horizon < 1 or noise < 0:
            raise ValueError(f"GaussianArms needs arms >= 2, horizon >= 1, noise >= 0; got {arms}, {horizon}, {noise}")
        self.arms, self.horizon, self.noise = int(arms), int(horizon), float(noise)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(self.arms)
        self.means = np.zeros(self.arms)
        self.t = 0
        self.last_pulls: list[int] = []

    def _obs(self) -> np.ndarray:
        return np.array([(self.horizon - self.t) / self.horizon], np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.means = self.np_random.normal(0.0, 1.0, self.arms)
        self.t, self.last_pulls = 0, []
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        arm = int(action)
        if not 0 <= arm < self.arms:
            raise ValueError(f"GaussianArms action must be in [0, {self.arms}), got {arm}")
        reward = float(self.means[arm] + self.noise * self.np_random.normal())
        self.t += 1
        if self.t > self.horizon - max(1, self.horizon // 4):
            self.last_pulls.append(arm)
        done = self.t >= self.horizon
        info = {"success": float(all(a == int(np.argmax(self.means)) for a in self.last_pulls))} if done else {}
        return self._obs(), reward, done, False, info
