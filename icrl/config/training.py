"""How one learner process trains: the update (`optim`), what it samples from (`replay`) and how collection
and updates alternate (`schedule`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from icrl.config.bounds import bounded

DEFAULT_ENV_STEPS = 100_000  # the budget of a task that recommends none
WARMUP_UPDATES = 500
"""The official AMAGO's learning-rate warm-up, the most a run warms up for when `warmup_updates` is unset."""
WARMUP_FRACTION = 0.1
"""Where `warmup_updates` is unset, a run warms up for this fraction of its planned updates (at most
WARMUP_UPDATES), so a short run is not spent below the full rate (docs/results.md, where the defaults come from)."""


@dataclass(frozen=True)
class OptimConfig:
    """One gradient update: batch, optimiser, precision."""

    batch_size: int = bounded(24, ge=1)
    """Sequences per update."""
    lr: float = bounded(1e-4, gt=0.0)
    """AdamW learning rate (the official AMAGO's default, which solved T-Maze 100 where 3e-4 collapsed;
    docs/results.md)."""
    warmup_updates: int | None = bounded(None, ge=0)
    """Linear learning-rate warm-up, in updates. Unset: WARMUP_FRACTION of the run's planned updates, at most
    the official AMAGO's 500 (`icrl.config.resolve`): a short run is not spent warming up."""
    weight_decay: float = bounded(1e-4, ge=0.0)
    """AdamW weight decay (not applied to norms, biases and embeddings)."""
    grad_clip: float = bounded(1.0, gt=0.0)
    """Max global gradient norm."""
    dtype: Literal["fp32", "bf16"] = "fp32"
    """Precision of the learner's forward and loss: `bf16` runs them under torch.autocast(bfloat16) (matmuls
    and attention in bf16; heads' outputs, losses, PopArt, gradients and the optimiser stay float32). fp32 by
    default: bf16 is faster only where the hardware computes it natively (a CPU with AMX, a GPU); a CPU without
    AMX warns (icrl.device.warn_if_bf16_is_emulated; docs/results.md)."""
    compile: bool | None = None
    """torch.compile the learner's loss computation (the encoder pass, heads and losses: one graph; a failed
    compile falls back to eager with a warning): it fuses the elementwise work that dominates a CPU update, at a
    cost of 30-60 s of compiling at the start. Unset: on for Transformer runs whose batches hold >= 4,096
    timesteps and that plan >= 1,000 updates (>= 10,000 where updates are captured as CUDA graphs, which leave a
    compile less to save), where the compile repays itself; off otherwise (`icrl.config.resolve`; docs/results.md)."""
    cuda_graphs: bool = True
    """On CUDA, in one process: capture the learner's update and the acting step as CUDA graphs and replay them
    (icrl.agent.graphs): the same numbers without the fixed cost of launching hundreds of small kernels, which
    bounded both steps on a GPU. Ignored on the CPU and in data-parallel runs (eager there)."""
    fused_adam: bool | None = None
    """AdamW's fused kernel (one kernel for all parameters; the same maths as the per-tensor loop up to
    rounding). Unset: fused wherever torch has the kernel for the learner's device (CPU and CUDA do)."""


@dataclass(frozen=True)
class ReplayConfig:
    """What the learner samples from: the replay on disk, its loader, hindsight relabeling and offline data."""

    replay_capacity: int = bounded(1_000_000, ge=1)
    """FIFO replay capacity in timesteps."""
    num_workers: int = bounded(0, ge=0, le=256)
    """DataLoader worker processes (0: load in the learner process)."""
    relabel: Literal["none", "some", "all"] = "none"
    """Hindsight instruction relabeling of sampled rollouts (goal-conditioned tasks, docs/design.md §7): "some"
    adds a random number of goals the rollout achieved, "all" turns every rollout into a success."""
    relabel_rare_goals: bool = False
    """Pick hindsight goals by inverse achievement frequency, so rarely reached goals are replayed more."""
    offline_data: str | None = None
    """Offline data loaded once into RUN_DIR/replay/protected (never evicted): a local Minari dataset id
    (in $MINARI_DATASETS_PATH, default ~/.minari/datasets; never downloaded; needs icrl[offline]) or its
    folder, or icrl rollout files (a run dir, its replay/, or a folder of .npz files). Spaces must match --env."""
    offline_fraction: float | None = bounded(None, ge=0.0, le=1.0)
    """Probability that a sampled training window comes from the offline (protected) data; the others come
    from collected rollouts (when one side is still empty, windows come from the other). Unset: every stored
    rollout file is equally likely."""
    offline_updates: int = bounded(0, ge=0)
    """Gradient updates on the stored data before the first env step, in epochs of --updates-per-epoch
    (rounded up) that collect nothing; evaluation still runs every --eval-every epochs. With
    --total-env-steps 0 the run is purely offline."""


@dataclass(frozen=True)
class ScheduleConfig:
    """How long to train and how collection and updates alternate (one epoch = collect, then update)."""

    total_env_steps: int | None = bounded(None, ge=0, le=10**13)
    """Stop after this many env steps. Unset: what the task recommends for itself (`recommended_budget`,
    icrl.envs.make.task_budget: T-Maze's grows with its corridor), else 100,000. A run records the
    resolved number in config.json."""
    steps_per_epoch: int = bounded(1_000, ge=1, le=10**10)
    """Env steps collected per epoch (across all parallel envs)."""
    updates_per_epoch: int | None = bounded(None, ge=0, le=10**8)
    """Gradient updates per epoch, fixed (updates per env step = this / steps_per_epoch). Unset: as many as
    `replay_ratio` asks, which adapts to how long the task's rollouts are."""
    replay_ratio: float = bounded(64.0, gt=0.0, le=1e6)
    """Timesteps trained on per timestep collected, on average, when --updates-per-epoch is unset: an epoch
    makes replay_ratio x steps_per_epoch / (batch_size x the mean window length in the replay) updates
    (the remainder carries over), so the learner's share of the work is the same whether an episode lasts 20
    steps or 1,000. 64: about the official AMAGO T-Maze example's ratio (docs/results.md). Each trained timestep
    costs a Transformer forward and backward, so on a CPU this ratio sets the wall time per env step."""
    start_updates_after: int = bounded(0, ge=0)
    """Collect at least this many env steps before the first update."""

    @property
    def env_steps(self) -> int:
        """`total_env_steps`, or the library's default budget where it is unset (a run resolves it first)."""
        return DEFAULT_ENV_STEPS if self.total_env_steps is None else self.total_env_steps
