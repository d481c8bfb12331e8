"""Every hyperparameter, in frozen dataclasses with one docstring per field (CleanRL style), one module per
concern (env, model, loss, explore, training, run) assembled by `experiment.ExperimentConfig`.

`tyro` turns `ExperimentConfig` into the `icrl train` command line; `presets` are plain functions that return
configs; a field's range is declared on it (`bounds.bounded`), and `validation` checks every field's type and range
and the combinations `ExperimentConfig.validate` refuses. `resolve(cfg, task)` is the one place unset fields get
their values (the user's, else the task's recommendation, else the library's) and derived values are set; nothing
mutates a parsed config.
"""

from icrl.config.env import EnvConfig
from icrl.config.errors import ConfigError
from icrl.config.experiment import GROUPS, ExperimentConfig, apply_overrides, field_groups
from icrl.config.explore import EXPLORE_DEFAULTS, ExploreConfig
from icrl.config.loss import DEFAULT_GAMMAS, LossConfig
from icrl.config.model import ModelConfig
from icrl.config.resolve import TaskDefaults, resolve
from icrl.config.run import AsyncConfig, EvalConfig, RunConfig
from icrl.config.training import OptimConfig, ReplayConfig, ScheduleConfig

__all__ = [
    "DEFAULT_GAMMAS", "EXPLORE_DEFAULTS", "GROUPS", "AsyncConfig", "ConfigError", "EnvConfig", "EvalConfig",
    "ExperimentConfig", "ExploreConfig", "LossConfig", "ModelConfig", "OptimConfig", "ReplayConfig", "RunConfig",
    "ScheduleConfig", "TaskDefaults", "apply_overrides", "field_groups", "resolve",
]
