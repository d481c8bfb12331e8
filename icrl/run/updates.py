"""The learning phase: training windows, the replay loader and a run of gradient updates; `icrl train` and
the asynchronous learner share them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import torch

from icrl.agent.learner import Learner
from icrl.config import ExperimentConfig
from icrl.data import ReplayLoader, make_loader
from icrl.run.timer import Timer
from icrl.types import ActionSpec


def training_window(cfg: ExperimentConfig) -> int:
    """Timesteps per training window: the acting context (`max_seq_len`) plus one.

    The critic learns Q(s_t) from the TD target at s_{t+1}, so the window must hold a full context *and*
    the step after it. With windows of only `max_seq_len` timesteps, a rollout of exactly context + 1
    timesteps (T-Maze's corridor + junction + final observation) is cut one way or the other: either the
    cue at t = 0 or the junction's transition to the final state falls outside every window, and the
    junction's value can never be learned from memory. The Transformer's banded mask keeps each
    position's receptive field at `max_seq_len`, exactly what acting sees.
    """
    return cfg.model.context + 1


def _shape(key: str, space: gym.Space) -> tuple[int, ...]:
    """The shape of one of the agent's observation entries (Boxes, TimestepWrapper's; a Box always has one)."""
    if space.shape is None:
        raise TypeError(f"observation entry {key!r} is a {type(space).__name__} without a shape, not a Box")
    return tuple(space.shape)


def make_train_loader(
    cfg: ExperimentConfig, replay_root: Path, spec: ActionSpec, device: torch.device, seed: int,
    obs_space: gym.spaces.Dict | None = None, **kwargs
) -> ReplayLoader:
    """The learner's endless batches from the replay (`train` and the asynchronous learner share it);
    files whose observations do not fit `obs_space` (the agent's) are skipped with a warning; `kwargs` go to
    `make_loader` (e.g. `auto_refresh`)."""
    if obs_space is not None:
        kwargs["obs_shapes"] = {key: _shape(key, space) for key, space in obs_space.spaces.items()}
    return make_loader(
        replay_root,
        batch_size=cfg.optim.batch_size,
        max_seq_len=training_window(cfg),
        action_spec=spec,
        seed=seed,
        num_workers=cfg.replay.num_workers,
        pin_memory=device.type == "cuda",
        offline_fraction=cfg.replay.offline_fraction,
        **kwargs,
    )


class UpdateBudget:
    """How many updates an epoch of `icrl train` makes: --updates-per-epoch when set, else as many as train
    `replay_ratio` timesteps per timestep collected. Each update trains batch_size x world windows, and a
    window of a rollout of T timesteps holds min(T, training window) of them, so the count follows the
    replay's real rollout lengths (short episodes: more updates, each cheaper), not the context. The budget
    accrues from the first epoch that may update; the remainder carries over (a resumed run starts with none:
    at most one update's difference). Every rank computes the same count from the shared replay."""

    def __init__(self, cfg: ExperimentConfig, world_size: int = 1) -> None:
        self.fixed = cfg.schedule.updates_per_epoch
        self.ratio, self.window = cfg.schedule.replay_ratio, training_window(cfg)
        self.windows_per_update = cfg.optim.batch_size * world_size
        self.carry = 0.0  # timesteps still to train on

    def updates(self, env_steps: int, rollout_lengths: list[int]) -> int:
        """The updates for an epoch that collected `env_steps` (all ranks), given the timesteps of every
        rollout the sampler draws from."""
        if self.fixed is not None:
            return self.fixed
        if not rollout_lengths:
            return 0
        self.carry += self.ratio * env_steps
        per_update = self.windows_per_update * sum(min(t, self.window) for t in rollout_lengths) / len(rollout_lengths)
        n = int(self.carry // per_update)
        self.carry -= n * per_update
        return n


class LazyLoader:
    """The train loader, opened at the first update rather than at the start: the replay may still be empty
    then, and a loader's sample stream starts when it is opened."""

    def __init__(self, open_loader: Callable[[], ReplayLoader]) -> None:
        self._open = open_loader
        self.loader: ReplayLoader | None = None

    def get(self) -> ReplayLoader:
        if self.loader is None:
            self.loader = self._open()
        return self.loader

    def refresh(self) -> None:
        """Make newly written rollouts visible now (not at a timing-dependent moment); no-op before opening."""
        if self.loader is not None:
            self.loader.refresh()

    def close(self) -> None:
        if self.loader is not None:
            self.loader.close()


def run_updates(learner: Learner, loader: ReplayLoader, num_updates: int, timer: Timer) -> dict[str, float]:
    """`num_updates` gradient steps on fresh batches; returns the means of their metrics (`Learner.read_metrics`:
    the one host read of the epoch). Timed into `timer`'s "sample" and "update" phases; an update does not wait
    for the device, so on a GPU the next batch is sampled while the last update runs, and the final read
    (waiting for the device) counts as updating."""
    for _ in range(num_updates):
        with timer("sample"):
            batch = next(loader)
        with timer("update"):
            learner.update(batch)
    with timer("update"):
        return learner.read_metrics()
