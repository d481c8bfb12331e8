"""The schedule of a run: how its env-step budget becomes epochs, env steps per env and updates (`Plan`, said once
and recorded in RUN_DIR/plan.json), and how many updates each epoch of `icrl train` makes from the data it
collected (`UpdateBudget`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from icrl.agent.learner import Learner
from icrl.config import ExperimentConfig


@dataclass(frozen=True)
class Plan:
    """What an `icrl train` run will do, computed once from its resolved config and said once (`line`), in the
    numbers its metrics show: every process steps each of its envs `steps_per_env` times an epoch (whole vector
    steps of its share of `--steps-per-epoch`), for `epochs` epochs (the budget's whole epochs, at least one)."""

    asked: int  # --total-env-steps
    epochs: int
    processes: int
    envs: int  # per process
    steps_per_env: int  # per epoch
    updates_per_epoch: int | None  # --updates-per-epoch; None: the replay ratio's count
    replay_ratio: float
    window: int  # timesteps of a full training window
    updates: int  # planned: fixed, or the replay ratio's count for full windows
    warmup: int
    context: int  # timesteps the policy attends to
    compiled: bool  # the loss is torch.compile'd
    cuda_graphs: bool  # updates and acting steps replay CUDA graphs (off on a CPU)
    device: str

    @classmethod
    def of(cls, cfg: ExperimentConfig, world_size: int = 1, learner: Learner | None = None) -> Plan:
        """The plan of `cfg` (resolved) on `world_size` processes; `learner`: where it runs and how (else CPU,
        eager)."""
        s, n = cfg.schedule, cfg.env.parallel_envs
        epochs = max(1, s.env_steps // s.steps_per_epoch)
        return cls(asked=s.env_steps, epochs=epochs, processes=world_size, envs=n,
                   steps_per_env=-(-(s.steps_per_epoch // world_size) // n), updates_per_epoch=s.updates_per_epoch,
                   replay_ratio=s.replay_ratio, window=cfg.model.training_window, updates=epochs * cfg.epoch_updates,
                   warmup=int(cfg.optim.warmup_updates or 0), context=cfg.model.context,
                   compiled=bool(cfg.optim.compile), cuda_graphs=learner is not None and learner.graphed,
                   device=str(learner.device) if learner is not None else "cpu")

    def record(self) -> dict[str, Any]:
        """What RUN_DIR/plan.json holds: every number of the plan, none unset (config.json keeps what was asked)."""
        return {**dataclasses.asdict(self), "steps_per_epoch": self.steps_per_epoch, "env_steps": self.env_steps,
                "updates_per_epoch": self.updates // self.epochs,
                "updates_counted_by": "replay_ratio" if self.updates_per_epoch is None else "updates_per_epoch"}

    @property
    def steps_per_epoch(self) -> int:
        return self.processes * self.envs * self.steps_per_env

    @property
    def env_steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    def line(self) -> str:
        procs = f"{self.processes} processes x " if self.processes > 1 else ""
        epochs = f"{self.epochs:,} epoch{'s' if self.epochs > 1 else ''}"
        taken = f"{epochs} x {procs}{self.envs} envs x {self.steps_per_env:,} steps = {self.env_steps:,} env steps"
        if self.env_steps != self.asked:
            taken += f" (asked {self.asked:,}: whole epochs of whole steps of every env)"
        if self.updates_per_epoch is not None:
            updates = f"{self.updates_per_epoch:,} updates per epoch = {self.updates:,}"
        else:
            plural = "s" if self.updates != 1 else ""
            updates = (f"replay ratio {self.replay_ratio:g}: ~{self.updates:,} update{plural} for full windows of "
                       f"{self.window:,} timesteps, more where rollouts are shorter")
        warmup = f"{self.warmup:,} update{'s' if self.warmup != 1 else ''}"
        return f"icrl: plan: {taken}; {updates}; learning-rate warm-up {warmup}"


class UpdateBudget:
    """How many updates an epoch of `icrl train` makes: --updates-per-epoch when set, else as many as train
    `replay_ratio` timesteps per timestep collected. Each update trains batch_size x world windows, and a
    window of a rollout of T timesteps holds min(T, training window) of them, so the count follows the
    replay's real rollout lengths (short episodes: more updates, each cheaper), not the context. The budget
    accrues from the first epoch that may update; the remainder carries over (a resumed run starts with none:
    at most one update's difference). Every rank computes the same count from the shared replay."""

    def __init__(self, cfg: ExperimentConfig, world_size: int = 1) -> None:
        self.fixed = cfg.schedule.updates_per_epoch
        self.ratio, self.window = cfg.schedule.replay_ratio, cfg.model.training_window
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
