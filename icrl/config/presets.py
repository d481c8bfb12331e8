"""Presets: plain functions that return a full `ExperimentConfig` for a task.

`icrl train --preset NAME [flags]` starts from the preset and applies the flags on top, so every value
stays visible in `--help` and in the run's config.json. Add a preset by writing a function and listing
it in `PRESETS`.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Any

from icrl.config import EnvConfig, ExperimentConfig, ExploreConfig, LossConfig, ModelConfig
from icrl.config.errors import ConfigError, flag


def _small_run(cfg: ExperimentConfig, run_dir: str, total_env_steps: int, eval_every: int,
               eval_rollouts: int) -> ExperimentConfig:
    """Short CPU runs: 200 env steps then 40 updates per epoch (0.2 updates per env step)."""
    return cfg.replace(
        run_dir=run_dir,
        total_env_steps=total_env_steps,
        steps_per_epoch=200,
        updates_per_epoch=40,
        batch_size=32,
        lr=3e-4,
        warmup_updates=50,
        eval_every=eval_every,
        eval_rollouts=eval_rollouts,
        log_every=eval_every,
    )


def tmaze(length: int = 20) -> ExperimentConfig:
    """Passive T-Maze: recall the cue shown at t=0 at the junction `length` steps later (~1 min on a laptop).

    The learning test runs exactly this preset, so the README's first command is known to work.
    """
    cfg = ExperimentConfig(
        env=EnvConfig(env="tmaze", env_kwargs=json.dumps({"length": length}), parallel_envs=8),
        # context and exploration: T-Maze's own recommendations (TMaze.recommended_context / _exploration)
        model=ModelConfig(d_model=32, layers=2, heads=2, head_hidden=64),
    )
    return _small_run(cfg, f"runs/tmaze{length}", max(10_000, 500 * length), eval_every=10, eval_rollouts=16)


def cue_recall(delay: int = 5, continuous: bool = True) -> ExperimentConfig:
    """Cue recall with continuous answers: the smallest continuous-action memory task (~20 s)."""
    cfg = ExperimentConfig(
        env=EnvConfig(env="cue_recall", env_kwargs=json.dumps({"delay": delay, "continuous": continuous}),
                      parallel_envs=8),
        model=ModelConfig(d_model=32, layers=1, heads=2, head_hidden=64),  # context: CueRecall.recommended_context
        loss=LossConfig(gammas=(0.9, 0.99)),
        explore=ExploreConfig(eps_anneal_steps=150),  # per env: 1,200 env steps of the 8 together
    )
    return _small_run(cfg, f"runs/cue_recall{delay}", total_env_steps=2400, eval_every=6, eval_rollouts=16)


def goal_grid(relabel: str = "all", size: int = 5, num_goals: int = 3) -> ExperimentConfig:
    """GoalGrid with hindsight relabeling: the sparse multi-goal sanity task (~1 min on a laptop).

    The relabeling learning test runs this preset with `relabel="all"` and `"none"` on the same budget.
    """
    cfg = ExperimentConfig(
        env=EnvConfig(env="goal_grid", env_kwargs=json.dumps({"size": size, "num_goals": num_goals}), parallel_envs=8),
        model=ModelConfig(d_model=32, layers=2, heads=2, max_seq_len=64, head_hidden=64, goal_dim=32),
        loss=LossConfig(entropy_coeff=0.02),
        explore=ExploreConfig(eps_start=0.5, eps_anneal_steps=500),  # per env: 4,000 env steps of the 8 together
    )
    cfg = _small_run(cfg, f"runs/goal_grid_{relabel}", total_env_steps=10_000, eval_every=10, eval_rollouts=32)
    return cfg.replace(relabel=relabel)


MULTITASK_VALUE_BOUND = 20_000.0
"""The multitask preset's two-hot bins span [-20,000, 20,000], spaced evenly in symlog (so as finely near 0.1 as
near 1,000, relatively): a game's returns may be scaled by a factor the agent is not told, and one range has to
hold them all. POPGym bounds every game's return to [-1, 1], times `reward_scale` 10 is [-10, 10]; the range
holds that times 1,000, and as much again. Measured on a POPGym mix with rewards x1, x10, x100 and x1,000 and on
the same mix unscaled, it scored the same on both (docs/results.md, multi-task). Returns beyond it, or another
--reward-scale, need --critic-min-value / --critic-max-value to match (TD targets outside the bins are clamped)."""

MULTITASK_GAMES = ("RepeatFirstEasy", "RepeatPreviousEasy", "HigherLowerEasy")
"""The multitask preset's POPGym games: 51 steps each, 2-4 actions."""


def multitask() -> ExperimentConfig:
    """AMAGO-2's multi-task recipe (Grigsby et al. 2024, the official `MultiTaskAgent`) on `popgym_multi`: a
    POPGym game drawn per rollout from `MULTITASK_GAMES`, with no task id in the observation (~6 min on a CPU).

    Scale-resistant learning for tasks whose returns differ: a two-hot (classification) critic over fixed value
    bins (`MULTITASK_VALUE_BOUND`), and an actor trained by filtered behaviour cloning alone (online 0, offline 1:
    no -Q term, whose size would follow each task's return scale); discrete actions as critic inputs
    (`discrete_action_input`: the critic's size does not grow with the largest game's action count); 3 sampled
    actions per state (the official value; used by an online term and continuous actions: V(s) of discrete actions
    is an exact sum).
    Metrics rows carry return per game (`return/<task>`, docs/api.md). Sized for a CPU: the other presets' model,
    two discounts and 64 bins (at d_model 64, the default 7 discounts made an update 5x slower than 2); the context
    holds a whole game (51 steps). Other games: `--env-kwargs '{"names": [...]}'` (`--max-seq-len` for longer ones);
    hidden factors on their rewards: `"reward_scales": {"<game>": 100, ...}` (benchmarks/multitask_scale.py).
    On one thread of a busy 2-core machine 2,000 env steps (320 updates) took 58 s, so the budget takes ~6 min.
    """
    cfg = ExperimentConfig(
        env=EnvConfig(env="popgym_multi", env_kwargs=json.dumps({"names": list(MULTITASK_GAMES)}), parallel_envs=8),
        model=ModelConfig(d_model=32, layers=2, heads=2, head_hidden=64, max_seq_len=52),
        loss=LossConfig(gammas=(0.9, 0.99), critic_kind="twohot", critic_bins=64,
                        critic_min_value=-MULTITASK_VALUE_BOUND, critic_max_value=MULTITASK_VALUE_BOUND,
                        online_coeff=0.0, offline_coeff=1.0, num_value_samples=3, discrete_action_input=True),
    )
    return _small_run(cfg, "runs/multitask", total_env_steps=10_000, eval_every=10, eval_rollouts=24)


def control() -> ExperimentConfig:
    """Fully observed control (Gymnasium's classic control, e.g. `--env Pendulum-v1`): CartPole-v1 by default,
    solved (greedy return 500 from 35,000 env steps on) in ~5 minutes on one CPU thread (docs/results.md, CartPole-v1).

    A task that needs no memory gets the memoryless `ff` encoder (one timestep per token, no sequence model), and
    settings that carry value many steps back within a few thousand updates: the library's τ = 0.003 (the official
    AMAGO's, for runs of tens of thousands of updates) moves the targets about τ x updates bootstrap steps, so after
    1,339 updates CartPole's critic saw ~3 steps ahead and its greedy policy fell in ~10 steps (eval return 10).
    τ = 0.02 and 5-step returns (the anneal has ended, so the windows' actions are nearly greedy) reach hundreds
    of steps, and batches of 8 windows make 3x the updates per env step at the same replay ratio. lr 1e-3 after
    100 warm-up updates (the library's 1e-4 after 500 suits tens of thousands of updates): Pendulum-v1 at 20,000
    env steps (756 updates) scored -1,338 with them and -217 with these. The run dir is the library's default
    (`runs/<env>-<seed>-<time>`), since the env is usually given on top."""
    cfg = ExperimentConfig(
        env=EnvConfig(env="CartPole-v1"),
        model=ModelConfig(traj_encoder="ff"),
        loss=LossConfig(tau=0.02, n_step=5),
    )
    return cfg.replace(total_env_steps=50_000, batch_size=8, lr=1e-3, warmup_updates=100)


PRESETS: dict[str, Callable[..., ExperimentConfig]] = {
    "tmaze": tmaze, "cue_recall": cue_recall, "goal_grid": goal_grid, "multitask": multitask, "control": control,
}


def preset_config(name: str, env_kwargs: dict[str, Any] | None = None) -> ExperimentConfig:
    """Preset `name` built for the env kwargs it is given: those the preset function takes as parameters
    (tmaze's `length`) reach it, so its budget and run dir follow them (`--preset tmaze --env-kwargs
    '{"length": 50}'` trains 25,000 env steps in runs/tmaze50), and the kwargs it does not take are kept in
    its env kwargs. Unknown names raise ConfigError."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(sorted(PRESETS))}")
    fn = PRESETS[name]
    params = inspect.signature(fn).parameters
    kwargs = dict(env_kwargs or {})
    try:
        cfg = fn(**{k: v for k, v in kwargs.items() if k in params})
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{flag('preset')} {name} cannot take {flag('env_kwargs')} {json.dumps(kwargs)}: {e}") from e
    if not kwargs:
        return cfg
    return cfg.replace(env_kwargs=json.dumps({**cfg.env.kwargs, **kwargs}))
