"""The explore group: exploration while collecting, and the library's defaults a task may override."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from icrl.config.bounds import bounded

# The library's exploration defaults: the official AMAGO's ε-greedy (ε from 1.0 to 0.05, annealed over each
# env copy's own steps, every env drawing its own scale of it per rollout, flat within a rollout). The
# anneal's 100,000 steps per env (10x shorter than the official 1M, which CPU-sized runs never reach) is a
# cap: a run with a budget anneals over ANNEAL_FRACTION of each env copy's share of it (`icrl.config.resolve`).
EXPLORE_DEFAULTS: dict[str, Any] = {
    "train_actions": "sample",
    "eps_start": 1.0,
    "eps_end": 0.05,
    "eps_anneal_steps": 100_000,
    "per_env_scale": True,
    "eps_shape": "flat",
    "shape_horizon": None,
    "bilevel_end_start": 0.8,
    "bilevel_end_end": 0.01,
    "window_start": 1,
    "window_end": 4,
    "window_eps": None,
    "noise_start": 0.5,
    "noise_end": 0.05,
}

ANNEAL_FRACTION = 0.5
"""Where no task or user sets `eps_anneal_steps`, ε (and continuous noise) anneals over this fraction of each env
copy's share of the run's env-step budget (at most EXPLORE_DEFAULTS' 100,000 steps per env), so every run
ends exploring at `eps_end`, as Stable-Baselines3's and CleanRL's `exploration_fraction` (0.1, 0.5) do
(docs/results.md, where the defaults come from)."""


@dataclass(frozen=True)
class ExploreConfig:
    """Exploration while collecting (docs/design.md §5, icrl.agent.exploration), built from composable parts:
    an anneal over each env's own steps, a per-env random scale, a shape over the step index inside a rollout,
    and argmax-or-sample training actions.

    Every field left unset (None) takes the task's recommendation when its env class ships one (a
    `recommended_exploration(**env_kwargs) -> dict` attribute, e.g. `icrl.envs.tasks.tmaze.TMaze`), else the
    library default (`EXPLORE_DEFAULTS`), when a run resolves its config (`icrl.config.resolve`); the run's
    config.json records the resolved values.
    """

    task_recommendation: bool = True
    """Let the task's recommended exploration fill the unset fields (False: library defaults only)."""
    train_actions: Literal["sample", "argmax"] | None = None
    """Training actions before exploration noise: sampled from the policy, or its mode (argmax / mean).
    Long chains of exact actions (T-Maze's corridor) need argmax: sampling at p = 0.999 per step still
    breaks a 100-step corridor. Unset: the task's choice, else `sample`."""
    eps_start: float | None = bounded(None, ge=0.0, le=1.0)
    """Discrete: ε at the start of training (unset: 1.0)."""
    eps_end: float | None = bounded(None, ge=0.0, le=1.0)
    """Discrete: ε once annealed (unset: 0.05)."""
    eps_anneal_steps: int | None = bounded(None, ge=1)
    """Steps *of each env copy* over which ε (and continuous noise) decays linearly; per env, so the schedule
    does not depend on the number of parallel envs. Unset: `ANNEAL_FRACTION` (half) of each env copy's share of
    --total-env-steps, at most 100,000 (the run's config.json records the number; with several data-parallel
    processes or collectors each copy's share is smaller, so the anneal covers more of the run)."""
    per_env_scale: bool | None = None
    """Each env draws its own uniform [0, 1) multiplier of ε per rollout, so a batch always mixes nearly
    greedy and very exploratory rollouts (unset: True)."""
    eps_shape: Literal["flat", "bilevel", "window"] | None = None
    """ε over the step index t inside a rollout. `flat`: the same at every step. `bilevel` (the AMAGO
    paper's two-level schedule): from the annealed ε at t = 0 linearly down to the annealed
    `bilevel_end_*` ε at t = `shape_horizon` (explore early, exploit late). `window`: the annealed ε in
    the first `window_start` steps and the last `window_end` steps up to `shape_horizon`, and the small
    fixed `window_eps` elsewhere (T-Maze: explore at the junction, not in the corridor). Unset: `flat`."""
    shape_horizon: int | None = bounded(None, ge=1)
    """`bilevel` and `window`: the rollout length the shape is laid over (required by those shapes)."""
    bilevel_end_start: float | None = bounded(None, ge=0.0, le=1.0)
    """`bilevel`: ε at a rollout's end at the start of training (unset: 0.8)."""
    bilevel_end_end: float | None = bounded(None, ge=0.0, le=1.0)
    """`bilevel`: ε at a rollout's end once annealed (unset: 0.01)."""
    window_start: int | None = bounded(None, ge=0)
    """`window`: the first this many steps (t < window_start) explore with the annealed ε (unset: 1)."""
    window_end: int | None = bounded(None, ge=0)
    """`window`: the last this many steps up to the horizon (shape_horizon - window_end < t <= shape_horizon)
    explore with the annealed ε (unset: 4; with 1 and 4 the shape is the official `TMazeExploration`)."""
    window_eps: float | None = bounded(None, ge=0.0, le=1.0)
    """`window`: ε between the two windows, not scaled or annealed (unset: 0.5 / shape_horizon)."""
    noise_start: float | None = bounded(None, ge=0.0)
    """Continuous: std of the Gaussian action noise at the start of training (unset: 0.5)."""
    noise_end: float | None = bounded(None, ge=0.0)
    """Continuous: std of the Gaussian action noise once annealed (unset: 0.05)."""
