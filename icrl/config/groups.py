"""The config's data: its ten groups, one per concern, and the values read across them. `ExperimentConfig`
(experiment.py) is this with its operations (validate, replace, config.json); the checks it runs (validation.py)
read only this, so the config's modules import one way."""

from __future__ import annotations

from dataclasses import dataclass, field

from icrl.config.env import EnvConfig
from icrl.config.explore import ExploreConfig
from icrl.config.loss import LossConfig
from icrl.config.model import ModelConfig
from icrl.config.run import AsyncConfig, EvalConfig, RunConfig
from icrl.config.training import OptimConfig, ReplayConfig, ScheduleConfig


@dataclass(frozen=True)
class ConfigGroups:
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    explore: ExploreConfig = field(default_factory=ExploreConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    run: RunConfig = field(default_factory=RunConfig)
    asynchronous: AsyncConfig = field(default_factory=AsyncConfig)

    @property
    def epoch_updates(self) -> int:
        """Updates per epoch where a fixed number is needed (offline epochs, the asynchronous learner's default
        ratio, plans): --updates-per-epoch, or `replay_ratio`'s count for full training windows
        (`ModelConfig.training_window`). `icrl train` counts the replay's real windows instead
        (icrl.run.schedule.UpdateBudget)."""
        s = self.schedule
        if s.updates_per_epoch is not None:
            return s.updates_per_epoch
        return max(1, round(s.replay_ratio * s.steps_per_epoch / (self.optim.batch_size * self.model.training_window)))
