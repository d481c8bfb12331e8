"""One resolution of a config: `resolve(cfg, task)` gives every field a run needs and the user left unset (None)
its value, once, before the run is validated and its config.json written. config.json then records exactly what
ran, and resolving a resolved config changes nothing (a resumed run resolves to the same config).

A value comes from the first tier that has one: the user's flag (a set field is kept), what the task recommends
for itself (`TaskDefaults`, which the env layer asks of the task: `icrl.envs.make.task_defaults`), the library's
default. The derived values follow, in this order:

1. the env-step budget (`total_env_steps`): the task's, else DEFAULT_ENV_STEPS; a budget below one epoch makes
   the run one epoch of it (`steps_per_epoch`);
2. exploration (`ExploreConfig`): the task's, an ε anneal over ANNEAL_FRACTION of each env copy's share of the
   budget, EXPLORE_DEFAULTS, and a `window` shape's `window_eps` from its horizon;
3. the context (`max_seq_len`): the rollout the task's recommended episode context makes, else DEFAULT_CONTEXT;
4. the loss's long-context rule (`n_step`, `popart_max_ratio`), from the context and the exploration's shape;
5. the learner's warm-up (`warmup_updates`) and whether it compiles its loss (`compile`), from the planned updates;
6. the actor's entropy bonus (`entropy_coeff`), from the kind of the action space (`discrete`), which is known only
   once the envs exist: the run builder resolves once with the task's recommendations, before anything is built,
   and again with `discrete` when the envs are there, before config.json is written (`LossConfig.entropy_for`).

A resumed run (`recorded`: its config.json) keeps its exploration schedule, warm-up and entropy bonus wherever the
user left them unset (`kept_on_resume`), rather than deriving them again from a budget that may have grown, or from
a library default that may have changed since: ε anneals over the run's steps, and the loss is the one it trained
with.

The measurements behind each default: docs/results.md, "Where the defaults come from".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from icrl.config.env import EnvConfig
from icrl.config.errors import ConfigError
from icrl.config.experiment import ExperimentConfig
from icrl.config.explore import ANNEAL_FRACTION, EXPLORE_DEFAULTS, ExploreConfig
from icrl.config.loss import LONG_CONTEXT, LONG_CONTEXT_MAX_RATIO, TIMESTEPS_PER_N_STEP, LossConfig
from icrl.config.model import DEFAULT_CONTEXT
from icrl.config.training import DEFAULT_ENV_STEPS, WARMUP_FRACTION, WARMUP_UPDATES

# An unset `compile` is on for Transformer runs whose batches hold at least COMPILE_MIN_TIMESTEPS timesteps and
# that plan at least COMPILE_MIN_UPDATES updates (COMPILE_MIN_CAPTURED_UPDATES where updates are captured as CUDA
# graphs, which leave a compile less to save per update): there the ~30-60 s compile repays itself within minutes.
COMPILE_MIN_TIMESTEPS = 4096
COMPILE_MIN_UPDATES = 1_000
COMPILE_MIN_CAPTURED_UPDATES = 10_000


@dataclass(frozen=True)
class TaskDefaults:
    """What a task recommends for a run, as plain data (the env layer asks the task's hooks, docs/design.md §9);
    None or empty: no recommendation, the library's default."""

    exploration: Mapping[str, Any] = field(default_factory=dict)
    """`ExploreConfig` field -> value (`recommended_exploration`)."""
    context: int | None = None
    """The timesteps one episode's decisions must see back over (`recommended_context`); a rollout of several
    episodes, or of --rollout-horizon steps, needs the context of the whole rollout."""
    budget: int | None = None
    """The env steps a run needs (`recommended_budget`)."""


def resolve(cfg: ExperimentConfig, task: TaskDefaults | None = None, recorded: ExperimentConfig | None = None,
            *, on_cuda: bool = False, discrete: bool | None = None) -> ExperimentConfig:
    """`cfg` with every unset field a run needs resolved (this module's docstring lists them): the user's value,
    else (resuming) what the run `recorded`, else `task`'s recommendation, else the library's default, then the
    values derived from them. Idempotent. Without `task`: the library's defaults (a config built by hand, a test).
    `on_cuda`: the run's device is a CUDA device (the caller knows the machine; a config never asks it), where
    captured updates raise the compile threshold. `discrete`: whether the env's actions are Discrete (None: not
    known yet, and `entropy_coeff` stays unset unless resuming)."""
    task = task if task is not None else TaskDefaults()
    if recorded is not None:
        cfg = cfg.replace(**kept_on_resume(cfg, recorded))
    cfg = _budget(cfg, task.budget)
    steps_per_env = cfg.schedule.env_steps // max(cfg.env.parallel_envs, 1)
    cfg = dataclasses.replace(cfg, explore=_exploration(cfg.explore, task.exploration, steps_per_env))
    if cfg.model.max_seq_len is None:
        cfg = cfg.replace(max_seq_len=_rollout_context(task.context, cfg.env))
    cfg = dataclasses.replace(cfg, loss=_loss(cfg.loss, cfg.model.context, cfg.explore.eps_shape))
    cfg = cfg.replace(compile=_compiles(cfg, on_cuda), warmup_updates=_warmup(cfg))
    if discrete is not None and cfg.loss.entropy_coeff is None:
        cfg = cfg.replace(entropy_coeff=cfg.loss.entropy_for(discrete))
    return cfg


def kept_on_resume(cfg: ExperimentConfig, recorded: ExperimentConfig) -> dict[str, Any]:
    """The fields a resumed run keeps from its config.json (`recorded`), by name, wherever `cfg` leaves them unset:
    the exploration schedule and the warm-up, which derive from the budget, and the entropy bonus, which derives
    from the action space (not known before the envs exist, and the run dir is checked before that)."""
    kept = {f.name: getattr(recorded.explore, f.name) for f in dataclasses.fields(cfg.explore)
            if getattr(cfg.explore, f.name) is None and getattr(recorded.explore, f.name) is not None}
    if cfg.optim.warmup_updates is None and recorded.optim.warmup_updates is not None:
        kept["warmup_updates"] = recorded.optim.warmup_updates
    if cfg.loss.entropy_coeff is None and recorded.loss.entropy_coeff is not None:
        kept["entropy_coeff"] = recorded.loss.entropy_coeff
    return kept


def _budget(cfg: ExperimentConfig, recommended: int | None) -> ExperimentConfig:
    """The env-step budget, and a smoke run's single epoch (a budget below --steps-per-epoch)."""
    if cfg.schedule.total_env_steps is None:
        cfg = cfg.replace(total_env_steps=recommended or DEFAULT_ENV_STEPS)
    s = cfg.schedule
    return cfg.replace(steps_per_epoch=s.env_steps) if 0 < s.env_steps < s.steps_per_epoch else cfg


def _exploration(x: ExploreConfig, recommended: Mapping[str, Any], steps_per_env: int) -> ExploreConfig:
    """Unset fields from the task's recommendation (unless `task_recommendation` is off), an unset anneal over
    ANNEAL_FRACTION of each env copy's share of the budget (at most the library's), then EXPLORE_DEFAULTS."""
    rec = dict(recommended) if x.task_recommendation else {}
    unknown = sorted(set(rec) - set(EXPLORE_DEFAULTS))
    if unknown:
        raise ConfigError(f"the task's recommended exploration names unknown fields {unknown}")
    cap = EXPLORE_DEFAULTS["eps_anneal_steps"]
    rec.setdefault("eps_anneal_steps", max(1, min(cap, round(ANNEAL_FRACTION * steps_per_env))))
    values = {name: rec.get(name, default) if getattr(x, name) is None else getattr(x, name)
              for name, default in EXPLORE_DEFAULTS.items()}
    if values["eps_shape"] == "window" and values["window_eps"] is None and values["shape_horizon"]:
        values["window_eps"] = 0.5 / values["shape_horizon"]
    return dataclasses.replace(x, **values)


def _rollout_context(episode: int | None, e: EnvConfig) -> int:
    """The context that holds a whole rollout of the task's recommended `episode` context: K episodes of a
    meta-RL rollout, each with its final timestep (docs/design.md §2), or the first `--rollout-horizon` steps."""
    if episode is None:
        return DEFAULT_CONTEXT
    if e.rollout_horizon is not None:
        return e.rollout_horizon
    return episode if e.episodes_per_rollout == 1 else e.episodes_per_rollout * (episode + 1)


def _loss(lo: LossConfig, context: int, eps_shape: str | None) -> LossConfig:
    """Unset `n_step` and `popart_max_ratio` by the long-context rule: past LONG_CONTEXT timesteps PopArt's floor,
    and n-step returns (context // TIMESTEPS_PER_N_STEP) where the exploration is a `window` (greedy between)."""
    long = context > LONG_CONTEXT
    auto_n = max(1, context // TIMESTEPS_PER_N_STEP) if long and eps_shape == "window" else 1
    return dataclasses.replace(
        lo, n_step=auto_n if lo.n_step is None else lo.n_step,
        popart_max_ratio=(LONG_CONTEXT_MAX_RATIO if long else 0.0) if lo.popart_max_ratio is None
        else lo.popart_max_ratio,
    )


def _planned_updates(cfg: ExperimentConfig) -> int:
    """The updates the budget plans for (`epoch_updates` per whole epoch): what the rules that scale with a run's
    length read; the run itself counts the replay's real windows (icrl.run.schedule.UpdateBudget)."""
    return (cfg.schedule.env_steps // max(cfg.schedule.steps_per_epoch, 1)) * cfg.epoch_updates


def _warmup(cfg: ExperimentConfig) -> int:
    """`warmup_updates`, or WARMUP_FRACTION of the planned updates, at most WARMUP_UPDATES (at least 1)."""
    if cfg.optim.warmup_updates is not None:
        return cfg.optim.warmup_updates
    return max(1, min(WARMUP_UPDATES, round(WARMUP_FRACTION * _planned_updates(cfg))))


def _compiles(cfg: ExperimentConfig, on_cuda: bool) -> bool:
    """`compile`, or where unset: on for a Transformer run with big batches and many planned updates (the
    COMPILE_MIN_* thresholds; more where the updates are captured as CUDA graphs: a CUDA device with
    `cuda_graphs`, icrl.agent.graphs)."""
    if cfg.optim.compile is not None:
        return cfg.optim.compile
    tokens = cfg.optim.batch_size * cfg.model.training_window
    if cfg.model.traj_encoder != "transformer" or tokens < COMPILE_MIN_TIMESTEPS:
        return False
    captured = on_cuda and cfg.optim.cuda_graphs
    return _planned_updates(cfg) >= (COMPILE_MIN_CAPTURED_UPDATES if captured else COMPILE_MIN_UPDATES)
