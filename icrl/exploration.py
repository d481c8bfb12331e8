"""Exploration during collection (DESIGN §5): per-env randomised, decaying over training.

Each env copy draws its own scale in [0, 1] at the start of every rollout, so at any moment the
batch mixes nearly greedy and very exploratory rollouts. The schedule is a function of the env-step
counter alone, so restoring the counter on resume restores the schedule exactly.
"""

from __future__ import annotations

import numpy as np

from icrl.config import ExploreConfig
from icrl.types import ActionSpec


def linear_schedule(start: float, end: float, steps: int, t: int) -> float:
    frac = min(max(t, 0) / max(steps, 1), 1.0)
    return start + frac * (end - start)


class Exploration:
    """ε-greedy (discrete: uniform random action; multi-binary: random bit flips) or Gaussian noise."""

    def __init__(self, cfg: ExploreConfig, spec: ActionSpec, num_envs: int, seed: int) -> None:
        self.cfg, self.spec = cfg, spec
        self.rng = np.random.default_rng(seed)
        self.scale = self.rng.uniform(0.0, 1.0, size=num_envs)  # [N]

    def state_dict(self) -> dict:
        """Per-env scales and the numpy generator state, JSON-compatible (the schedule itself is a function
        of the env-step counter, which the collector's state carries)."""
        return {"scale": self.scale.tolist(), "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        scale = np.asarray(state["scale"], dtype=np.float64)
        if scale.shape != self.scale.shape:
            raise ValueError(f"exploration state has {scale.shape[0]} env scales, this run has {self.scale.shape[0]}")
        self.scale = scale
        self.rng.bit_generator.state = state["rng"]

    def level(self, env_steps: int) -> float:
        """The global ε (discrete) or noise std (continuous) at this point of training."""
        c = self.cfg
        if self.spec.kind == "continuous":
            return linear_schedule(c.noise_start, c.noise_end, c.eps_anneal_steps, env_steps)
        return linear_schedule(c.eps_start, c.eps_end, c.eps_anneal_steps, env_steps)

    def per_env_level(self, env_steps: int, time: np.ndarray) -> np.ndarray:
        """[N] exploration level of every env at its current rollout step `time` [N]."""
        level = self.level(env_steps) * self.scale
        if self.cfg.bilevel:
            c = self.cfg
            frac = np.clip(np.asarray(time, dtype=np.float64) / max(c.rollout_decay_steps, 1), 0.0, 1.0)
            level = level * (1.0 + frac * (c.bilevel_min - 1.0))
        return level

    def new_rollouts(self, mask: np.ndarray) -> None:
        """Redraw the scale of every env starting a new rollout (mask [N] bool)."""
        n = int(mask.sum())
        if n:
            self.scale[mask] = self.rng.uniform(0.0, 1.0, size=n)

    def __call__(self, actions: np.ndarray, env_steps: int, time: np.ndarray) -> np.ndarray:
        """Perturb storage-format actions ([N] int64 | [N, D] float32 | [N, D] int8)."""
        level = self.per_env_level(env_steps, time)  # [N]
        n = len(level)
        actions = actions.copy()
        if self.spec.kind == "discrete":
            explore = self.rng.uniform(size=n) < level
            # uniform over all actions (a reported bug in another implementation drew them from a normal)
            actions[explore] = self.rng.integers(0, self.spec.dim, size=int(explore.sum()))
        elif self.spec.kind == "multibinary":
            flip = self.rng.uniform(size=actions.shape) < level[:, None]
            actions = np.where(flip, 1 - actions, actions).astype(actions.dtype)
        else:
            noise = self.rng.normal(size=actions.shape) * level[:, None]
            actions = np.clip(actions + noise, -1.0, 1.0).astype(np.float32)
        return actions
