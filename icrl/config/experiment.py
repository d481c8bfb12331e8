"""The whole config: one group per concern (`ConfigGroups`), field names unique across the groups (the flags omit
the group), with its checks, `replace` and its config.json form."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from icrl.config.env import EnvConfig
from icrl.config.errors import ConfigError
from icrl.config.explore import ExploreConfig
from icrl.config.groups import ConfigGroups
from icrl.config.loss import LossConfig
from icrl.config.model import ModelConfig
from icrl.config.run import AsyncConfig, EvalConfig, RunConfig
from icrl.config.training import OptimConfig, ReplayConfig, ScheduleConfig
from icrl.config.validation import combination_error, device_error, field_errors, memory_error


@dataclass(frozen=True)
class ExperimentConfig(ConfigGroups):
    def validate(self, check_device: bool = True) -> ExperimentConfig:
        """Raise ConfigError naming the fields of the first impossible value or combination.
        `check_device=False` skips whether --device exists here (a run's config read to evaluate elsewhere),
        and checks the memory of acting only, not of an update (`memory_error`)."""
        errors = field_errors(self)  # every field's type and range first: the combination checks assume them
        if errors:
            raise ConfigError(errors[0] + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""))
        self.env.kwargs  # noqa: B018 - parses the JSON, raising a clear error
        error = (combination_error(self) or memory_error(self, update=check_device)
                 or (device_error(self.run.device) if check_device else None))
        if error is not None:
            raise ConfigError(error)
        return self

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
        since take their defaults, or, for a field whose default changed after it was added, the value every run
        written without it had (`ABSENT_MEANS`): an older run and its checkpoints load as they were trained."""
        try:
            raw = json.loads(text)
        except RecursionError as e:  # json's parser recurses once per level of nesting
            raise ConfigError("the config is nested too deeply to parse; a config.json holds one level of "
                              f"groups ({', '.join(GROUPS)}) of plain values") from e
        if not isinstance(raw, dict) or not all(isinstance(v, dict) for v in raw.values()):
            raise ConfigError(f"expected a JSON object of config groups ({', '.join(GROUPS)})")
        fields = {k: tuple(v) if isinstance(v, list) else v for group in raw.values() for k, v in group.items()}
        return cls().replace(**{**ABSENT_MEANS, **fields})  # JSON has no tuples: lists become tuples


ABSENT_MEANS: dict[str, Any] = {
    "reward_action_input": False,  # added off; the default since 2026-12-07 (docs/method.md)
}
"""Fields whose default changed after config.json files were written without them -> the value those runs had.
A hand-written config file (`--config FILE`) that leaves such a field out gets that value too; name it to choose."""


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
            raise ConfigError(f"{item!r}: expected field=value naming a field of ExperimentConfig")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        cfg = cfg.replace(**{name: tuple(value) if isinstance(value, list) else value})
    return cfg
