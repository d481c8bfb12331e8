"""Where and how processes run (`run`), greedy evaluation (`eval`) and the asynchronous learner / collector
pair (`asynchronous`). Apart from the seed, nothing here changes what is learned."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from icrl.config.bounds import MAX_ROLLOUTS, bounded


@dataclass(frozen=True)
class EvalConfig:
    """Evaluation during training (and the defaults of `icrl eval`)."""

    eval_every: int = bounded(5, ge=1)
    """Evaluate every this many epochs (and after the last)."""
    eval_rollouts: int = bounded(32, ge=1, le=MAX_ROLLOUTS)
    """Rollouts per evaluation (results average over rollouts, not episodes)."""
    eval_max_steps: int = bounded(50_000, ge=1, le=10_000_000)
    """Evaluation stops a rollout after this many steps (counted as it stands, with a warning), so an env
    whose episodes never end cannot hang evaluation."""
    eval_greedy: bool = True
    """Evaluate the policy's most likely actions; off: actions sampled from the policy, as the official AMAGO
    evaluates by default (its `sample_actions_val`), so the two libraries' curves compare like for like."""
    stop_at_return: float | None = None
    """Stop the run once --stop-patience evaluations in a row reach this eval return (e.g. 0.95; unset: run
    the whole budget). The run ends as at its last epoch: checkpointed, final weights and plot written."""
    stop_patience: int = bounded(1, ge=1)
    """Evaluations in a row at or above --stop-at-return before the run stops."""


@dataclass(frozen=True)
class RunConfig:
    """Where and how this process runs: the run directory, seed, device, logging and checkpoints. Apart from
    the seed, nothing here changes what is learned, so most of it may change on --resume."""

    run_dir: str | None = None
    """Folder for metrics, replay, checkpoints and plots (unset: a new folder per run,
    runs/<env>-<seed>-<date>-<time>, printed at the start, so runs never collide; name one to resume it)."""
    seed: int = bounded(0, ge=0, le=2**63 - 1)
    """Seeds Python, numpy, torch, every env copy and every loader worker."""
    device: str = "auto"
    """`auto` (CUDA when available), `cpu`, `cuda`, `cuda:1`..."""
    threads: int = bounded(1, ge=0, le=1024)
    """torch CPU threads (0: torch's default). 1 is fastest for small models on shared cores: with env
    processes or other jobs on the machine, OpenMP threads oversubscribe the cores and an update gets
    several times slower. Raise it for large models on a CPU of your own."""
    resume: bool = False
    """Continue the run in --run-dir from its newest readable checkpoint: same counters, exploration level
    and RNG states, the replay buffer reused (rollouts in progress at the checkpoint are dropped). The
    config must match the run's config.json except for --total-env-steps (and run-only settings). Without
    it, a run dir that already holds a run is refused. Not a bit-exact continuation: the sampler and the
    training envs are reseeded, and rollouts stored after the checkpoint stay in the replay."""
    log_backends: tuple[Literal["tensorboard", "wandb"], ...] = ()
    """Extra logging back-ends beside RUN_DIR/metrics.jsonl (each needs its package installed)."""
    log_every: int = bounded(1, ge=1)
    """Print a progress line every this many epochs."""
    checkpoint_every: int = bounded(10, ge=1)
    """Write a checkpoint (RUN_DIR/checkpoints/ckpt-EPOCH) every this many epochs, and after the last one."""
    checkpoint_seconds: float = bounded(60.0, ge=0)
    """Also write one at the end of the first epoch that finishes this many seconds of wall time after the last
    (0: by epochs only), so a run stopped at any moment loses at most about a minute of training."""
    keep_checkpoints: int = bounded(3, ge=1)
    """Keep only the newest this many checkpoints."""


@dataclass(frozen=True)
class AsyncConfig:
    """The asynchronous pair (`icrl learn RUN_DIR` and any number of `icrl collect RUN_DIR`,
    icrl.asynchronous): how far the learner and the collectors may run ahead of each other. `icrl train`
    (synchronous: collect, then update) ignores this group."""

    utd: float | None = bounded(None, gt=0.0)
    """The learner makes at most this many updates per env step *stored* by the collectors, waiting when it
    gets ahead (unset: --updates-per-epoch / --steps-per-epoch, the ratio `icrl train` keeps)."""
    publish_every: int | None = bounded(None, ge=1)
    """The learner publishes its weights for the collectors every this many updates (unset:
    --updates-per-epoch)."""
    max_lead: int | None = bounded(None, ge=0)
    """A collector pauses while the run's stored env steps exceed the learner's published updates / utd by
    more than this many steps, so acting never runs far ahead of learning (unset: never pause). `icrl
    collect --max-lead` sets it per collector; without the flag a collector takes the run's value from its
    config.json."""
