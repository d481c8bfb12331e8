"""Exploration during collection (docs/design.md §5): per-env randomised, decaying over training, shaped in time.

ε at env i, training step n (steps of that env copy) and rollout step t is built from three parts
(`icrl.config.ExploreConfig` documents each field):

    ε_i(n, t) = scale_i · shape(anneal(n), t)

* `anneal`: linear from `eps_start` to `eps_end` over `eps_anneal_steps` steps of each env copy, so the
  schedule is the same whatever the number of parallel envs (the official AMAGO counts per actor too).
* `scale_i`: a uniform [0, 1) draw per env and rollout (`per_env_scale`), so every batch mixes nearly
  greedy and very exploratory rollouts and the anneal length matters much less.
* `shape`: `flat`; `bilevel` (the paper's two-level schedule: linear within a rollout from the annealed
  start-of-rollout ε to the annealed end-of-rollout ε); or `window` (the annealed ε near the start and the
  end of a fixed-horizon rollout, a small fixed ε between: T-Maze explores at the junction, where the
  memory question is asked, and not in the corridor, where one wrong step loses the episode).

Whether the action being perturbed is sampled from the policy or its mode is the acting side's choice
(`ExploreConfig.train_actions`, read by `icrl.agent.model.AgentPolicy`). The schedule is a function of the
env-step counter alone, so restoring the counter on resume restores it exactly.
"""

from __future__ import annotations

from typing import TypeVar, overload

import numpy as np

from icrl.config import ExploreConfig
from icrl.types import ActionSpec

_T = TypeVar("_T")


@overload
def linear_schedule(start: float, end: float, steps: int, t: int) -> float: ...
@overload
def linear_schedule(start: np.ndarray, end: np.ndarray, steps: int, t: int) -> np.ndarray: ...
def linear_schedule(start: float | np.ndarray, end: float | np.ndarray, steps: int, t: int) -> float | np.ndarray:
    frac = min(max(t, 0) / max(steps, 1), 1.0)
    return start + frac * (end - start)


def _resolved(value: _T | None, name: str) -> _T:
    """A field of a resolved `ExploreConfig` that the schedule needs; a clear error where it is unset."""
    if value is None:
        raise ValueError(f"exploration needs ExploreConfig.{name}, which is unset: pass a resolved config")
    return value


class Exploration:
    """ε-greedy (discrete: uniform random action; multi-binary: random bit flips) or Gaussian noise."""

    def __init__(self, cfg: ExploreConfig, spec: ActionSpec, num_envs: int, seed: int) -> None:
        """`cfg`: a resolved ExploreConfig (`icrl.config.resolve(...).explore`), whose fields the schedule reads."""
        unset = [name for name in ("train_actions", "eps_start", "eps_end", "eps_anneal_steps", "per_env_scale",
                                   "eps_shape", "noise_start", "noise_end") if getattr(cfg, name) is None]
        if unset:
            raise ValueError(f"exploration needs a resolved ExploreConfig (icrl.config.resolve); unset: {unset}")
        self.cfg, self.spec, self.num_envs = cfg, spec, num_envs
        self.rng = np.random.default_rng(seed)
        self.scale = self._draw_scales(num_envs)  # [N]

    def _draw_scales(self, n: int) -> np.ndarray:
        return self.rng.uniform(0.0, 1.0, size=n) if self.cfg.per_env_scale else np.ones(n)

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

    def steps_per_env(self, env_steps: int) -> int:
        """Steps of each env copy after `env_steps` steps of this collector (the copies step in lockstep)."""
        return env_steps // max(self.num_envs, 1)

    def level(self, env_steps: int) -> float:
        """The annealed ε (discrete) or noise std (continuous) at the start of a rollout, before the per-env
        scale, after `env_steps` steps of this collector (all its env copies together)."""
        c = self.cfg
        n = self.steps_per_env(env_steps)
        steps = _resolved(c.eps_anneal_steps, "eps_anneal_steps")
        if self.spec.kind == "continuous":
            start, end = _resolved(c.noise_start, "noise_start"), _resolved(c.noise_end, "noise_end")
            return linear_schedule(start, end, steps, n)
        return linear_schedule(_resolved(c.eps_start, "eps_start"), _resolved(c.eps_end, "eps_end"), steps, n)

    def per_env_level(self, env_steps: int, time: np.ndarray) -> np.ndarray:
        """[N] exploration level of every env at its current rollout step `time` [N]."""
        c = self.cfg
        start = self.level(env_steps)
        t = np.asarray(time, dtype=np.float64)
        if c.eps_shape == "bilevel":
            end = linear_schedule(_resolved(c.bilevel_end_start, "bilevel_end_start"),
                                  _resolved(c.bilevel_end_end, "bilevel_end_end"),
                                  _resolved(c.eps_anneal_steps, "eps_anneal_steps"),
                                  self.steps_per_env(env_steps))
            frac = np.clip(t / _resolved(c.shape_horizon, "shape_horizon"), 0.0, 1.0)
            return self.scale * (start + frac * (end - start))
        level = self.scale * start
        if c.eps_shape == "window":
            horizon = _resolved(c.shape_horizon, "shape_horizon")
            first, last = _resolved(c.window_start, "window_start"), _resolved(c.window_end, "window_end")
            ends = (t < first) | ((t > horizon - last) & (t <= horizon))
            level = np.where(ends, level, _resolved(c.window_eps, "window_eps"))
        return level

    def new_rollouts(self, mask: np.ndarray) -> None:
        """Redraw the scale of every env starting a new rollout (mask [N] bool)."""
        n = int(mask.sum())
        if n:
            self.scale[mask] = self._draw_scales(n)

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
