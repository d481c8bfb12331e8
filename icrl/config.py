"""Every hyperparameter, in frozen dataclasses with one docstring per field (CleanRL style).

`tyro` turns `ExperimentConfig` into the `icrl train` command line; presets are plain functions that
return configs. Derived values are properties; nothing mutates a parsed config.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Literal

DEFAULT_GAMMAS: tuple[float, ...] = (0.1, 0.9, 0.95, 0.97, 0.99, 0.995, 0.999)


class ConfigError(ValueError):
    """A config value or combination that cannot work; the message names the fields and the fix."""


@dataclass(frozen=True)
class EnvConfig:
    env: str = "tmaze"
    """A built-in task name (see `icrl envs`), a registered Gymnasium id, or `package.module:factory`."""
    env_kwargs: str = "{}"
    """JSON object passed to the env constructor, e.g. '{"length": 20}'."""
    parallel_envs: int = 8
    """Env copies stepped as one batch during collection."""
    async_envs: bool = False
    """Step the env copies in subprocesses (worth it for slow simulators, not for tiny tasks)."""
    episodes_per_rollout: int = 1
    """Meta-RL: episodes of the same task per rollout (the agent keeps its memory across them)."""
    rollout_horizon: int | None = None
    """Meta-RL: instead of a fixed episode count, repeat episodes of one task for this many steps."""
    chunk_len: int | None = None
    """Store very long rollouts as chunks of this many steps (None: whole rollouts)."""

    @property
    def kwargs(self) -> dict[str, Any]:
        try:
            value = json.loads(self.env_kwargs)
        except json.JSONDecodeError as e:
            raise ConfigError(f"--env-kwargs is not valid JSON ({e.msg} at char {e.pos}): {self.env_kwargs!r}") from e
        if not isinstance(value, dict):
            raise ConfigError(f"--env-kwargs must be a JSON object like '{{\"length\": 20}}', got {self.env_kwargs!r}")
        return value


@dataclass(frozen=True)
class EvalConfig:
    """Greedy evaluation during training (and the defaults of `icrl eval`)."""

    eval_every: int = 5
    """Evaluate every this many epochs (and after the last)."""
    eval_rollouts: int = 32
    """Rollouts per evaluation (results average over rollouts, not episodes)."""
    eval_max_steps: int = 50_000
    """Evaluation stops a rollout after this many steps (counted as it stands, with a warning), so an env
    whose episodes never end cannot hang evaluation."""


@dataclass(frozen=True)
class ModelConfig:
    traj_encoder: Literal["transformer", "gru", "lstm", "ff"] = "transformer"
    """Sequence model over the rollout; `ff` is the memoryless baseline."""
    d_model: int = 64
    """Width of the timestep embedding and of the trajectory encoder (the paper's larger runs use 128-512)."""
    layers: int = 2
    """Transformer layers (or RNN layers)."""
    heads: int = 4
    """Attention heads."""
    max_seq_len: int = 256
    """Training window length and the Transformer's context while acting (sliding window beyond it)."""
    max_time: int = 4096
    """Largest time index with its own learned embedding (later steps share the last one)."""
    pos_emb: Literal["learned", "sinusoidal", "none"] = "sinusoidal"
    """Time-position embedding of the Transformer (as the official AMAGO's default "fixed"); `learned` is a
    table initialised N(0, 1), at the scale of the token embedding it is added to."""
    dropout: float = 0.0
    """Dropout inside the Transformer."""
    head_hidden: int = 128
    """Hidden width of the actor and critic MLP heads."""
    head_layers: int = 2
    """Hidden layers of the actor and critic MLP heads."""
    cnn: Literal["impala", "nature"] = "impala"
    """CNN for image observations."""
    goal_dim: int = 32
    """Width of the instruction embedding (tasks with a "goal" observation, docs/CONTRACTS.md)."""
    goal_view: Literal["full", "current"] = "full"
    """Instruction the agent sees: every remaining sub-goal, or only the current one (the paper's ablation)."""


@dataclass(frozen=True)
class LossConfig:
    gammas: tuple[float, ...] = DEFAULT_GAMMAS
    """Discounts learned in parallel; the last one is the policy's."""
    num_critics: int = 4
    """Critic ensemble size C."""
    redq_subset: int = 2
    """Target critics drawn at random per update; their min is the target (REDQ)."""
    reward_scale: float = 10.0
    """Rewards are multiplied by this before the TD target (the official AMAGO's default). With PopArt the
    critics' targets are normalised anyway; the scale sets how far above PopArt's σ floor small returns lie."""
    online_coeff: float = 1.0
    """Weight of the -Q(s, a~pi) actor term."""
    offline_coeff: float = 0.1
    """Weight of the filtered behaviour-cloning actor term."""
    bc_filter: Literal["binary", "exp"] = "binary"
    """Advantage filter of the BC term: 1[A>0], or clamp(exp(A / beta))."""
    entropy_coeff: float = 0.0
    """Entropy bonus of the actor, on PopArt-normalised values. Not in the paper's loss (0, the default, gives
    it exactly); exploration comes from `ExploreConfig`."""
    critic_weight: float = 10.0
    """Weight of the critic loss against the actor loss."""
    n_step: int = 1
    """n-step TD returns."""
    tau: float = 0.003
    """EMA rate of the target actor and critics."""
    popart: bool = True
    """Normalise value targets with PopArt."""
    popart_beta: float = 5e-4
    """PopArt statistics step size (bias-corrected: the first update takes the first batch's moments)."""


# The library's exploration defaults: the official AMAGO's ε-greedy (ε from 1.0 to 0.05, annealed over each
# env copy's own steps, every env drawing its own scale of it per rollout, flat within a rollout). The
# anneal is 10x shorter than the official 1M steps per env, which CPU-sized runs never reach.
EXPLORE_DEFAULTS: dict[str, Any] = {
    "train_actions": "sample",
    "eps_start": 1.0,
    "eps_end": 0.05,
    "eps_anneal_steps": 100_000,
    "per_env_scale": True,
    "eps_shape": "flat",
    "shape_horizon": None,
    "bilevel_end_start": 0.8,
    "bilevel_end_end": 0.01,
    "window_start": 1,
    "window_end": 4,
    "window_eps": None,
    "noise_start": 0.5,
    "noise_end": 0.05,
}


@dataclass(frozen=True)
class ExploreConfig:
    """Exploration while collecting (DESIGN §5, icrl.agent.exploration), built from composable parts: an anneal
    over each env's own steps, a per-env random scale, a shape over the step index inside a rollout, and
    argmax-or-sample training actions.

    Every field left unset (None) takes the task's recommendation when its env class ships one (a
    `recommended_exploration(**env_kwargs) -> dict` attribute, e.g. `icrl.envs.tasks.tmaze.TMaze`), else the
    library default (`EXPLORE_DEFAULTS`); the run's config.json records the resolved values.
    """

    task_recommendation: bool = True
    """Let the task's recommended exploration fill the unset fields (False: library defaults only)."""
    train_actions: Literal["sample", "argmax"] | None = None
    """Training actions before exploration noise: sampled from the policy, or its mode (argmax / mean).
    Long chains of exact actions (T-Maze's corridor) need argmax: sampling at p = 0.999 per step still
    breaks a 100-step corridor. Unset: the task's choice, else `sample`."""
    eps_start: float | None = None
    """Discrete: ε at the start of training (unset: 1.0)."""
    eps_end: float | None = None
    """Discrete: ε once annealed (unset: 0.05)."""
    eps_anneal_steps: int | None = None
    """Steps *of each env copy* over which ε (and continuous noise) decays linearly; per env, so the schedule
    does not depend on the number of parallel envs (unset: 100,000)."""
    per_env_scale: bool | None = None
    """Each env draws its own uniform [0, 1) multiplier of ε per rollout, so a batch always mixes nearly
    greedy and very exploratory rollouts (unset: True)."""
    eps_shape: Literal["flat", "bilevel", "window"] | None = None
    """ε over the step index t inside a rollout. `flat`: the same at every step. `bilevel` (the AMAGO
    paper's two-level schedule): from the annealed ε at t = 0 linearly down to the annealed
    `bilevel_end_*` ε at t = `shape_horizon` (explore early, exploit late). `window`: the annealed ε in
    the first `window_start` steps and the last `window_end` steps up to `shape_horizon`, and the small
    fixed `window_eps` elsewhere (T-Maze: explore at the junction, not in the corridor). Unset: `flat`."""
    shape_horizon: int | None = None
    """`bilevel` and `window`: the rollout length the shape is laid over (required by those shapes)."""
    bilevel_end_start: float | None = None
    """`bilevel`: ε at a rollout's end at the start of training (unset: 0.8)."""
    bilevel_end_end: float | None = None
    """`bilevel`: ε at a rollout's end once annealed (unset: 0.01)."""
    window_start: int | None = None
    """`window`: the first this many steps (t < window_start) explore with the annealed ε (unset: 1)."""
    window_end: int | None = None
    """`window`: the last this many steps up to the horizon (shape_horizon - window_end < t <= shape_horizon)
    explore with the annealed ε (unset: 4; with 1 and 4 the shape is the official `TMazeExploration`)."""
    window_eps: float | None = None
    """`window`: ε between the two windows, not scaled or annealed (unset: 0.5 / shape_horizon)."""
    noise_start: float | None = None
    """Continuous: std of the Gaussian action noise at the start of training (unset: 0.5)."""
    noise_end: float | None = None
    """Continuous: std of the Gaussian action noise once annealed (unset: 0.05)."""

    def resolve(self, recommendation: dict[str, Any] | None = None) -> ExploreConfig:
        """Unset fields filled from `recommendation` (the task's; ignored with task_recommendation=False),
        then from EXPLORE_DEFAULTS. Idempotent."""
        rec = dict(recommendation or {}) if self.task_recommendation else {}
        unknown = sorted(set(rec) - set(EXPLORE_DEFAULTS))
        if unknown:
            raise ConfigError(f"the task's recommended exploration names unknown fields {unknown}")
        values = {}
        for name, default in EXPLORE_DEFAULTS.items():
            value = getattr(self, name)
            values[name] = value if value is not None else rec.get(name, default)
        if values["eps_shape"] == "window" and values["window_eps"] is None and values["shape_horizon"]:
            values["window_eps"] = 0.5 / values["shape_horizon"]
        return dataclasses.replace(self, **values)

    def validate(self) -> None:
        """The combination checks (each field's own range is in icrl.validation.RULES)."""
        r = self.resolve()
        if r.eps_shape != "flat" and r.shape_horizon is None:
            raise ConfigError(f"--eps-shape {r.eps_shape} needs --shape-horizon N (the rollout length the shape is laid over)")


@dataclass(frozen=True)
class OptimConfig:
    """One gradient update: batch, optimiser, precision."""

    batch_size: int = 24
    """Sequences per update."""
    lr: float = 1e-4
    """AdamW learning rate (the official AMAGO's default). Measured at the official T-Maze-100 update ratio
    (100 updates per 4,040 env steps, seed 0): 3e-4 reached success 0.75 and then collapsed to 0.00 by
    101,000 env steps; 1e-4 with 500 warm-up updates solved it at 80,800 (the official code: 84,840)."""
    warmup_updates: int = 500
    """Linear learning-rate warm-up (the official AMAGO's default)."""
    weight_decay: float = 1e-4
    """AdamW weight decay (not applied to norms, biases and embeddings)."""
    grad_clip: float = 1.0
    """Max global gradient norm."""
    dtype: Literal["fp32", "bf16"] = "fp32"
    """Precision of the learner's forward and loss: `bf16` runs them under torch.autocast(bfloat16) (matmuls
    and attention in bf16; heads' outputs, losses, PopArt, gradients and the optimiser stay float32).
    On a CPU with bf16 instructions and 1 thread it made updates ~1.25x faster (d128, B24x256)."""
    compile: bool = False
    """torch.compile the learner's loss computation (the encoder pass, heads and losses). Costs tens of
    seconds of compilation at start; on CPU it gained little (0-20% per update), so it is off by default."""


@dataclass(frozen=True)
class ReplayConfig:
    """What the learner samples from: the replay on disk, its loader, hindsight relabeling and offline data."""

    replay_capacity: int = 1_000_000
    """FIFO replay capacity in timesteps."""
    num_workers: int = 0
    """DataLoader worker processes (0: load in the learner process)."""
    relabel: Literal["none", "some", "all"] = "none"
    """Hindsight instruction relabeling of sampled rollouts (goal-conditioned tasks, DESIGN §7): "some"
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

    total_env_steps: int = 100_000
    """Stop after this many env steps."""
    steps_per_epoch: int = 1_000
    """Env steps collected per epoch (across all parallel envs)."""
    updates_per_epoch: int = 200
    """Gradient updates per epoch (updates per env step = this / steps_per_epoch)."""
    start_updates_after: int = 0
    """Collect at least this many env steps before the first update."""


@dataclass(frozen=True)
class RunConfig:
    """Where and how this process runs: the run directory, seed, device, logging and checkpoints. Apart from
    the seed, nothing here changes what is learned, so most of it may change on --resume."""

    run_dir: str = "runs/icrl"
    """Folder for metrics, replay, checkpoints and plots."""
    seed: int = 0
    """Seeds Python, numpy, torch, every env copy and every loader worker."""
    device: str = "auto"
    """`auto` (CUDA when available), `cpu`, `cuda`, `cuda:1`..."""
    threads: int = 1
    """torch CPU threads (0: torch's default). 1 is fastest for small models on shared cores: with env
    processes or other jobs on the machine, OpenMP threads oversubscribe the cores and an update gets
    several times slower. Raise it for large models on a CPU of your own."""
    resume: bool = False
    """Continue the run in --run-dir from its newest readable checkpoint: same counters, exploration level
    and RNG states, the replay buffer reused (rollouts in progress at the checkpoint are dropped). The
    config must match the run's config.json except for --total-env-steps. Without it, a run dir that
    already holds a run is refused."""
    log_backends: tuple[Literal["tensorboard", "wandb"], ...] = ()
    """Extra logging back-ends beside RUN_DIR/metrics.jsonl (each needs its package installed)."""
    log_every: int = 1
    """Print a progress line every this many epochs."""
    checkpoint_every: int = 10
    """Write a checkpoint (RUN_DIR/checkpoints/ckpt-EPOCH) every this many epochs, and after the last one."""
    keep_checkpoints: int = 3
    """Keep only the newest this many checkpoints."""


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

    def validate(self, check_device: bool = True) -> ExperimentConfig:
        """Raise ConfigError naming the fields of the first impossible value or combination.
        `check_device=False` skips whether --device exists here (a run's config read to evaluate elsewhere)."""
        from icrl.validation import device_error, field_errors

        errors = field_errors(self)  # every field's type and range first: the checks below assume them
        if errors:
            raise ConfigError(errors[0] + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""))
        e, m, lo, r, sc = self.env, self.model, self.loss, self.replay, self.schedule
        e.kwargs  # noqa: B018 - parses the JSON, raising a clear error
        self.explore.validate()
        checks = [
            (e.parallel_envs >= 1, "--parallel-envs must be >= 1"),
            (e.episodes_per_rollout >= 1, "--episodes-per-rollout must be >= 1"),
            (
                not (e.episodes_per_rollout > 1 and e.rollout_horizon is not None),
                "--episodes-per-rollout and --rollout-horizon both set: choose one way to end a rollout",
            ),
            (m.d_model % m.heads == 0, f"--d-model {m.d_model} is not divisible by --heads {m.heads}"),
            (m.max_seq_len >= 2, "--max-seq-len must be >= 2 (a TD transition needs two timesteps)"),
            (len(lo.gammas) >= 1 and all(0 <= g < 1 for g in lo.gammas), "--gammas must lie in [0, 1)"),
            (
                1 <= lo.redq_subset <= lo.num_critics,
                f"--redq-subset {lo.redq_subset} must be between 1 and --num-critics {lo.num_critics}",
            ),
            (lo.n_step >= 1, "--n-step must be >= 1"),
            (0 < lo.tau <= 1, "--tau must lie in (0, 1]"),
            (self.optim.batch_size >= 1 and sc.updates_per_epoch >= 0, "--batch-size must be >= 1, --updates-per-epoch >= 0"),
            (
                sc.steps_per_epoch >= e.parallel_envs,
                f"--steps-per-epoch {sc.steps_per_epoch} is below --parallel-envs {e.parallel_envs}: "
                "each epoch steps every env at least once",
            ),
            (
                sc.total_env_steps >= sc.steps_per_epoch or (sc.total_env_steps == 0 and r.offline_updates > 0),
                "--total-env-steps must be >= --steps-per-epoch (or 0 with --offline-updates: offline training)",
            ),
            (r.offline_updates >= 0, "--offline-updates must be >= 0"),
            (
                r.offline_fraction is None or 0.0 <= r.offline_fraction <= 1.0,
                f"--offline-fraction {r.offline_fraction} must lie in [0, 1]",
            ),
            (
                r.offline_data is not None or (r.offline_updates == 0 and r.offline_fraction is None),
                "--offline-updates and --offline-fraction need --offline-data PATH_OR_MINARI_ID",
            ),
            (
                r.offline_updates == 0 or (sc.updates_per_epoch >= 1 and sc.start_updates_after == 0),
                "--offline-updates trains before any env step: it needs --updates-per-epoch >= 1 and "
                "--start-updates-after 0",
            ),
            (e.chunk_len is None or e.chunk_len >= 2, "--chunk-len must be >= 2"),
            (
                r.relabel == "none"
                or (e.chunk_len is None and e.episodes_per_rollout == 1 and e.rollout_horizon is None),
                f"--relabel {r.relabel} needs whole single-episode rollouts: unset --chunk-len, "
                "--episodes-per-rollout and --rollout-horizon",
            ),
            (m.goal_dim >= 1, "--goal-dim must be >= 1"),
            (self.run.checkpoint_every >= 1, "--checkpoint-every must be >= 1"),
            (self.run.keep_checkpoints >= 1, "--keep-checkpoints must be >= 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        device = device_error(self.run.device) if check_device else None
        if device is not None:
            raise ConfigError(device)
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
        return dataclasses.replace(
            self, **{g: dataclasses.replace(getattr(self, g), **values) for g, values in by_group.items()}
        )

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> ExperimentConfig:
        """The config a run's config.json holds. Fields are found by name, whichever group the file puts
        them in, so config.json files of older versions (one `train` group) still load."""
        raw = json.loads(text)
        if not isinstance(raw, dict) or not all(isinstance(v, dict) for v in raw.values()):
            raise ConfigError(f"expected a JSON object of config groups ({', '.join(GROUPS)})")
        fields = {k: tuple(v) if isinstance(v, list) else v for group in raw.values() for k, v in group.items()}
        return cls().replace(**fields)  # JSON has no tuples: lists become tuples


GROUPS: dict[str, type] = {
    "env": EnvConfig, "model": ModelConfig, "loss": LossConfig, "explore": ExploreConfig, "optim": OptimConfig,
    "replay": ReplayConfig, "schedule": ScheduleConfig, "eval": EvalConfig, "run": RunConfig,
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

