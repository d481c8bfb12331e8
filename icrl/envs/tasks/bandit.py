"""Bernoulli bandits: the meta-RL task whose optimal in-context strategy is known (RL², Duan et al. 2016).

Every rollout draws a new hidden task, the success probability p_i ~ U(0, 1) of each of `arms` arms, and
then lasts `horizon` pulls; a pull of arm i pays 1 with probability p_i. Nothing in the observation tells the
arms apart (it is the fraction of pulls left), so the agent can only learn which arm is good from its own
actions and rewards earlier in the rollout: the exploration / exploitation trade-off, in context.

With a uniform prior the Bayes-optimal strategy is known exactly, which places any learning curve on an
absolute scale (benchmarks/bandit_baselines.py computes it, with Thompson sampling, win-stay lose-shift and the
oracle that always pulls the best arm).

This module imports only numpy and Gymnasium (and works with Gymnasium 0.29 too), so the official AMAGO's
side of `benchmarks/parity.py` loads this very file by path and both libraries play the same task.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class BernoulliBandit(gym.Env):
    """`arms` Bernoulli arms with hidden p_i ~ U(0, 1), redrawn every reset; `horizon` pulls per episode.

    kwargs:
      arms: number of arms (>= 2).
      horizon: pulls per episode (>= 1); the episode ends (terminated) after the last one.

    Observation: Box(1,) = pulls left / horizon (the agent sees its previous action and reward through the
    timestep, as every icrl and AMAGO agent does). `info["regret"]` on the last step: horizon * max_i p_i minus
    the episode's expected reward given its pulls (sum of p of the arms pulled), the standard bandit regret.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, arms: int = 2, horizon: int = 50) -> None:
        if int(arms) < 2:
            raise ValueError(f"BernoulliBandit arms must be >= 2, got {arms}")
        if int(horizon) < 1:
            raise ValueError(f"BernoulliBandit horizon must be >= 1, got {horizon}")
        self.arms, self.horizon = int(arms), int(horizon)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(self.arms)
        self.probs = np.full(self.arms, 0.5)  # the hidden task
        self._t = 0
        self._expected = 0.0  # sum of p over the arms pulled so far

    @staticmethod
    def recommended_context(arms: int = 2, horizon: int = 50, **_: Any) -> int:
        """The whole episode: the last pull should see every earlier pull's outcome."""
        return int(horizon)

    def _obs(self) -> np.ndarray:
        return np.array([(self.horizon - self._t) / self.horizon], np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.probs = self.np_random.uniform(0.0, 1.0, self.arms)
        self._t, self._expected = 0, 0.0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        arm = int(np.asarray(action).reshape(()))
        if not 0 <= arm < self.arms:
            raise ValueError(f"BernoulliBandit action must be an arm in [0, {self.arms}), got {action!r}")
        if self._t >= self.horizon:
            raise RuntimeError("BernoulliBandit.step after the episode ended: call reset()")
        p = float(self.probs[arm])
        reward = float(self.np_random.random() < p)
        self._t += 1
        self._expected += p
        terminated = self._t >= self.horizon
        info = {"regret": self.horizon * float(self.probs.max()) - self._expected} if terminated else {}
        return self._obs(), reward, terminated, False, info
