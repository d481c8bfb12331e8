"""The whole config: one group per concern, field names unique across the groups (the flags omit the group)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from icrl.config.env import EnvConfig
from icrl.config.errors import ConfigError
from icrl.config.explore import ExploreConfig
from icrl.config.loss import LossConfig
from icrl.config.model import ModelConfig
from icrl.config.run import AsyncConfig, EvalConfig, RunConfig
from icrl.config.training import OptimConfig, ReplayConfig, ScheduleConfig


@dataclass(frozen=True)
class ExperimentConfig:
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

    def validate(self, check_device: bool = True) -> ExperimentConfig:
        """Raise ConfigError naming the fields of the first impossible value or combination.
        `check_device=False` skips whether --device exists here (a run's config read to evaluate elsewhere),
        and checks the memory of acting only, not of an update (`memory_error`)."""
        from icrl.config.validation import combination_error, device_error, field_errors, memory_error

        errors = field_errors(self)  # every field's type and range first: the combination checks assume them
        if errors:
            raise ConfigError(errors[0] + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""))
        self.env.kwargs  # noqa: B018 - parses the JSON, raising a clear error
        error = (combination_error(self) or memory_error(self, update=check_device)
                 or (device_error(self.run.device) if check_device else None))
        if error is not None:
            raise ConfigError(error)
        return self

    @property
    def compiles(self) -> bool:
        """Whether the learner compiles its loss: `OptimConfig.compile`, or where unset its rule (big Transformer
        batches, >= 1,000 planned updates, >= 10,000 where updates are captured as CUDA graphs; the field's
        docstring has the measurement)."""
        if self.optim.compile is not None:
            return self.optim.compile
        planned = self.planned_updates
        tokens = self.optim.batch_size * (self.model.context + 1)
        return (self.model.traj_encoder == "transformer" and tokens >= 4096
                and planned >= (10_000 if self.runs_captured else 1_000))

    @property
    def planned_updates(self) -> int:
        """The updates the budget plans for (`epoch_updates` per whole epoch): what the rules that scale with
        a run's length read; the run itself counts the replay's real windows (icrl.run.components)."""
        return (self.schedule.env_steps // max(self.schedule.steps_per_epoch, 1)) * self.epoch_updates

    @property
    def resolved_warmup(self) -> int:
        """`optim.warmup_updates`, or where unset WARMUP_FRACTION of the planned updates, at most WARMUP_UPDATES
        (at least 1)."""
        from icrl.config.training import WARMUP_FRACTION, WARMUP_UPDATES

        if self.optim.warmup_updates is not None:
            return self.optim.warmup_updates
        return max(1, min(WARMUP_UPDATES, round(WARMUP_FRACTION * self.planned_updates)))

    @property
    def runs_captured(self) -> bool:
        """Whether this config's updates would be captured as CUDA graphs here: a CUDA `--device` (or `auto`
        where torch sees a GPU) with `cuda_graphs` (icrl.agent.graphs; data-parallel runs stay eager)."""
        import torch

        d = self.run.device
        cuda = d.startswith("cuda") or (d == "auto" and torch.cuda.is_available())
        return cuda and self.optim.cuda_graphs

    @property
    def epoch_updates(self) -> int:
        """Updates per epoch where a fixed number is needed (offline epochs, the asynchronous learner's default
        ratio, plans): --updates-per-epoch, or `replay_ratio`'s count for full training windows (context + 1
        timesteps). `icrl train` counts the replay's real windows instead (icrl.run.components.UpdateBudget)."""
        s = self.schedule
        if s.updates_per_epoch is not None:
            return s.updates_per_epoch
        return max(1, round(s.replay_ratio * s.steps_per_epoch / (self.optim.batch_size * (self.model.context + 1))))

    def replace(self, **fields: Any) -> ExperimentConfig:
        """A copy with the named fields changed, wherever they live: field names are unique across the
        groups, so `cfg.replace(lr=3e-4, run_dir="runs/a")` needs no group (unknown names raise ConfigError)."""
        owners = field_groups()
        unknown = sorted(set(fields) - set(owners))
        if unknown:
            raise ConfigError(f"ExperimentConfig has no field {', '.join(unknown)} (see `icrl train --help`)")
        by_group: dict[str, dict[str, Any]] = {}
        for name, value in fields.items():
            by_group.setdefault(owners[name], {})[name] = value
        new = dataclasses.replace(
            self, **{g: dataclasses.replace(getattr(self, g), **values) for g, values in by_group.items()}
        )
        from icrl.config.validation import field_errors

        errors = field_errors(new, only=set(fields))  # a wrong type or range now, in one line, as the CLI says it
        if errors:
            raise ConfigError(errors[0] + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""))
        return new

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> ExperimentConfig:
        """The config a run's config.json holds. Fields are found by name, whichever group the file puts
        them in, so config.json files of older versions (one `train` group) still load, and fields added
        since take their defaults."""
        try:
            raw = json.loads(text)
        except RecursionError as e:  # json's parser recurses once per level of nesting
            raise ConfigError("the config is nested too deeply to parse; a config.json holds one level of "
                              f"groups ({', '.join(GROUPS)}) of plain values") from e
        if not isinstance(raw, dict) or not all(isinstance(v, dict) for v in raw.values()):
            raise ConfigError(f"expected a JSON object of config groups ({', '.join(GROUPS)})")
        fields = {k: tuple(v) if isinstance(v, list) else v for group in raw.values() for k, v in group.items()}
        return cls().replace(**fields)  # JSON has no tuples: lists become tuples


GROUPS: dict[str, type] = {
    "env": EnvConfig, "model": ModelConfig, "loss": LossConfig, "explore": ExploreConfig, "optim": OptimConfig,
    "replay": ReplayConfig, "schedule": ScheduleConfig, "eval": EvalConfig, "run": RunConfig,
    "asynchronous": AsyncConfig,
}


def field_groups() -> dict[str, str]:
    """Every field name of ExperimentConfig -> the group holding it (names are unique across groups)."""
    return {f.name: group for group, cls in GROUPS.items() for f in dataclasses.fields(cls)}


def apply_overrides(cfg: ExperimentConfig, sets: list[str]) -> ExperimentConfig:
    """`["field=value", ...]` (or `group.field=value`) applied to a config (value parsed as JSON, else kept
    as a string; JSON lists become tuples). Used by the benchmark scripts' `--set`; raises ConfigError naming
    a bad key."""
    owners = field_groups()
    for item in sets:
        key, _, text = item.partition("=")
        group, _, name = key.rpartition(".")
        if name not in owners or group not in ("", owners[name]):
            raise ConfigError(f"--set {item!r}: expected field=value naming a field of ExperimentConfig")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        cfg = cfg.replace(**{name: tuple(value) if isinstance(value, list) else value})
    return cfg
