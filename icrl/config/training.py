"""How one learner process trains: the update (`optim`), what it samples from (`replay`) and how collection
and updates alternate (`schedule`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

DEFAULT_ENV_STEPS = 100_000  # the budget of a task that recommends none
WARMUP_UPDATES = 500
"""The official AMAGO's learning-rate warm-up, the most a run warms up for when `warmup_updates` is unset."""
WARMUP_FRACTION = 0.1
"""Where `warmup_updates` is unset, a run warms up for this fraction of its planned updates (at most
WARMUP_UPDATES). The flat 500 spent all of a 10,000-env-step POPGym RepeatPreviousEasy run (d128, context 64,
512 updates) below the full rate: it reached 0.95 only at its last evaluation on seeds 0-2, where 50 updates of
warm-up solved it at 7,000-8,000 env steps (docs/results.md, the learning suite)."""


@dataclass(frozen=True)
class OptimConfig:
    """One gradient update: batch, optimiser, precision."""

    batch_size: int = 24
    """Sequences per update."""
    lr: float = 1e-4
    """AdamW learning rate (the official AMAGO's default). Measured at the official T-Maze-100 update ratio
    (100 updates per 4,040 env steps, seed 0): 3e-4 reached success 0.75 and then collapsed to 0.00 by
    101,000 env steps; 1e-4 with 500 warm-up updates solved it at 80,800 (the official code: 84,840)."""
    warmup_updates: int | None = None
    """Linear learning-rate warm-up, in updates. Unset: WARMUP_FRACTION of the run's planned updates, at most
    the official AMAGO's 500 (`ExperimentConfig.resolved_warmup`): a short run is not spent warming up."""
    weight_decay: float = 1e-4
    """AdamW weight decay (not applied to norms, biases and embeddings)."""
    grad_clip: float = 1.0
    """Max global gradient norm."""
    dtype: Literal["fp32", "bf16"] = "fp32"
    """Precision of the learner's forward and loss: `bf16` runs them under torch.autocast(bfloat16) (matmuls
    and attention in bf16; heads' outputs, losses, PopArt, gradients and the optimiser stay float32).
    On a CPU with bf16 instructions (AMX) and 1 thread it made updates ~1.25x faster (d128, B24x256); on an x86
    CPU with AVX512-BF16 but no AMX no faster (d64 x 501); on one without (AVX2 only: torch emulates bf16
    matmuls) ~10x slower. The last two warn (icrl.device.warn_if_bf16_is_emulated)."""
    compile: bool | None = None
    """torch.compile the learner's loss computation (the encoder pass, heads and losses: one graph; a failed
    compile falls back to eager with a warning). It fuses the heads' and norms' elementwise work, which
    dominates a CPU update: d64 x context 501, batch 24, 1 thread, bf16: 0.49 s per update compiled, 1.1 s
    eager (benchmarks/throughput.py). Compiling costs ~30-60 s at start (and once more when the batch
    length first changes). Unset: on for Transformer runs whose batches hold >= 4,096 timesteps and that plan
    >= 1,000 updates, where the saving repays the compile within minutes; off otherwise (small and short runs,
    the tests). Where updates are captured as CUDA graphs (`cuda_graphs`) a compile saves less per update (on
    an H200, T-Maze 1,000's first update compiled for 38 s, and a captured d64 x 1,002 update took ~7 ms
    compiled against ~10-16 ms eager), so there the rule asks for >= 10,000 planned updates."""
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

    replay_capacity: int = 1_000_000
    """FIFO replay capacity in timesteps."""
    num_workers: int = 0
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
    offline_fraction: float | None = None
    """Probability that a sampled training window comes from the offline (protected) data; the others come
    from collected rollouts (when one side is still empty, windows come from the other). Unset: every stored
    rollout file is equally likely."""
    offline_updates: int = 0
    """Gradient updates on the stored data before the first env step, in epochs of --updates-per-epoch
    (rounded up) that collect nothing; evaluation still runs every --eval-every epochs. With
    --total-env-steps 0 the run is purely offline."""


@dataclass(frozen=True)
class ScheduleConfig:
    """How long to train and how collection and updates alternate (one epoch = collect, then update)."""

    total_env_steps: int | None = None
    """Stop after this many env steps. Unset: what the task recommends for itself (`recommended_budget`,
    icrl.envs.make.task_budget: T-Maze's grows with its corridor), else 100,000. A run records the
    resolved number in config.json."""
    steps_per_epoch: int = 1_000
    """Env steps collected per epoch (across all parallel envs)."""
    updates_per_epoch: int | None = None
    """Gradient updates per epoch, fixed (updates per env step = this / steps_per_epoch). Unset: as many as
    `replay_ratio` asks, which adapts to how long the task's rollouts are."""
    replay_ratio: float = 64.0
    """Timesteps trained on per timestep collected, on average, when --updates-per-epoch is unset: an epoch
    makes replay_ratio x steps_per_epoch / (batch_size x the mean window length in the replay) updates
    (the remainder carries over). Counting timesteps rather than updates keeps the learner's share of the
    work the same whether an episode lasts 20 steps or 1,000 (one update of 24 x 502-step T-Maze-500
    windows trains 25x the timesteps of one of 24 x 20). 64 is the official AMAGO T-Maze example's ratio
    (100 updates of 24 windows per 5 rollouts of each of 8 envs: ~60), which solves T-Maze 20 and 100 here
    (benchmarks/parity.py); its POPGym example trains ~190, SAC 256. Each trained timestep costs a
    Transformer forward and backward, so on a CPU this ratio sets the wall time per env step."""
    start_updates_after: int = 0
    """Collect at least this many env steps before the first update."""

    @property
    def env_steps(self) -> int:
        """`total_env_steps`, or the library's default budget where it is unset (a run resolves it first)."""
        return DEFAULT_ENV_STEPS if self.total_env_steps is None else self.total_env_steps
