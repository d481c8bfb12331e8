"""The training loop (docs/design.md §8): collect -> write rollouts -> sample -> update -> evaluate -> log ->
checkpoint, one loop for every run.

`train` is `icrl.train`: a run whose data source (icrl.run.components.DataSource) is this process's own envs
(`Collecting`), also on each rank of a data-parallel run. The asynchronous learner (icrl.asynchronous.learn) runs
the same loop, `fit`, on the collector processes' files: the setup (icrl.run.components.build_run), the epoch,
the train row, evaluation, checkpoints, resuming and the finish are these, whatever the source. The run directory
(icrl.run.rundir), the reports (icrl.run.reporting, icrl.run.evaluate) and the data-parallel decisions
(icrl.parallel) live in the modules the evaluation paths share.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from icrl.agent.learner import Learner
from icrl.agent.model import Agent
from icrl.config import ConfigError, ExperimentConfig
from icrl.config.errors import flag
from icrl.envs import Collector
from icrl.fileio import write_text_atomic
from icrl.parallel import Replicas
from icrl.run.artifacts import finish_run, hint_critic_reach
from icrl.run.callbacks import Callbacks, TrainingRun
from icrl.run.checkpoint import save_checkpoint
from icrl.run.components import (
    DataSource,
    LazyLoader,
    Run,
    UpdateBudget,
    build_run,
    train_policy,
    training_window,
)
from icrl.run.evaluate import TASK_METRIC_PREFIXES, eval_row, evaluate, train_stats
from icrl.run.reporting import (
    Logger,
    MultiLogger,
    Timer,
    due,
    open_log,
    progress_bar,
    progress_line,
    report_epoch,
    row_head,
    say,
)
from icrl.run.rundir import (
    RunLock,
    holds_run,
    resume_training,
    run_path,
    run_scope,
    truncate_metrics,
    write_run_files,
)
from icrl.seeding import derive_seed
from icrl.spaces_json import read_spaces_record
from icrl.types import EpisodeStats, Rollout


def train(cfg: ExperimentConfig | None = None, env: Any = None, callbacks: Sequence[Any] | Any = ()) -> dict:
    """Train an agent as `cfg` says; returns the final evaluation (and `run_dir`). Writes everything under
    run_dir (unset: a new folder runs/<env>-<seed>-<time>).

    `env` (or `cfg.env.env`) is a built-in task, a Gymnasium id or 'module:factory', a gymnasium.Env subclass,
    a zero-arg factory, an env made by gymnasium.make, or a gymnasium.vector.VectorEnv
    (icrl.envs.user.resolve_env): icrl wraps and vectorises its own copies. RUN_DIR/spaces.json records the
    env's spaces, so `icrl.load(RUN_DIR)` needs no env. `callbacks`: objects with hooks (icrl.run.callbacks);
    one returning True stops the run after that epoch, as `cfg.eval.stop_at_return` does.

    Started N times by a launcher (`torchrun --nproc_per_node N -m icrl train ...`), the processes train one agent
    data-parallel (icrl.parallel): each collects steps_per_epoch / N env steps per epoch into the shared
    replay, each update averages N batches' gradients; rank 0 alone writes the run dir, evaluates and calls the
    callbacks, the other ranks return {}.
    """
    hooks = Callbacks(callbacks)  # a callback without any hook is refused before anything is built
    run = build_run(cfg, env, kind=Collecting)  # every refusal, the seeds, envs, agent, learner, replay; run dir locked
    return fit(run, hooks)


def fit(run: Run, hooks: Callbacks) -> dict:
    """The one training loop (docs/design.md §8), whatever `run`'s data source: resume, start the log, the epochs,
    the finish. The one place that unpacks `run`: each step below is given what it uses. Returns the final
    evaluation with `run_dir` (rank 0; {} on the other ranks, and when the data source was interrupted)."""
    cfg, replicas, learner, source = run.cfg, run.replicas, run.learner, run.source
    checkpoints = Checkpoints(cfg, run.spaces, replicas, learner, source)
    evaluation = Evaluation(cfg, learner, source, run.eval_collector, replicas.device)
    with run_scope(run.lock, run.close):  # an error or Ctrl-C: the run dir is free again at once; no orphaned envs
        start_epoch, wall_offset = checkpoints.resume() if cfg.run.resume else (0, 0.0)
        log = start_log(cfg, replicas, source, hooks, agent=learner.agent, spaces=run.spaces,
                        eval_collector=run.eval_collector, env=run.env)
        # a resumed run draws a fresh sample stream rather than replaying the first one's
        batches = LazyLoader(lambda: run.loader(derive_seed(run.seed, "loader", *(
            ("resume", start_epoch) if start_epoch else ()))))
        bar, bar_task = progress_bar(cfg.schedule.env_steps)
        bar.disable = bar.disable or not replicas.is_main
        bar.start()
        try:
            last_eval = epochs(source, learner, batches, cfg=cfg, replicas=replicas, checkpoints=checkpoints,
                               evaluation=evaluation, log=log, hooks=hooks, start_epoch=start_epoch,
                               wall_offset=wall_offset, progress=lambda row, new_eval: bar.update(
                                   bar_task, completed=source.env_steps(),
                                   description=progress_line(row, new_eval, live=True)))
        finally:  # also on errors and Ctrl-C: no loader workers left
            bar.stop()
            log.close()
            batches.close()
    if not replicas.is_main:
        return {}
    return finish(last_eval, hooks, cfg=cfg, source=source, learner=learner, lock=run.lock)


def epochs(source: DataSource, learner: Learner, batches: LazyLoader, *, cfg: ExperimentConfig, replicas: Replicas,
           checkpoints: Checkpoints, evaluation: Evaluation, log: Logger, hooks: Callbacks,
           progress: Callable[[dict, dict | None], None], start_epoch: int, wall_offset: float) -> dict | None:
    """The epochs after `start_epoch`; returns the last evaluation (rank 0; None on the other ranks)."""
    main, num_epochs = replicas.is_main, source.num_epochs()
    start, last_eval, stop, epoch = time.perf_counter() - wall_offset, None, False, start_epoch
    saved_at, saved_updates = time.perf_counter(), learner.updates  # --checkpoint-seconds counts from the last one
    for epoch in range(start_epoch + 1, num_epochs + 1):
        timer = Timer()
        source.collect(epoch, timer)  # this process's env steps into the replay (the collectors store theirs)
        with timer("replay_write"):
            batches.refresh()  # what was written is sampled from now on, not from a timing-dependent moment
        metrics, n_updates = update(learner, batches, source.updates(epoch, timer), timer, replicas)
        if source.interrupted:  # a signal before the epoch's updates were made: kept below, the epoch not logged
            break
        row = train_row(source, learner, timer, metrics, epoch=epoch, start=start, n_updates=n_updates)
        new_eval = report(log, row, evaluation, epoch=epoch, num_epochs=num_epochs, start=start,
                          progress=progress) if main else None
        late = main and 0 < cfg.run.checkpoint_seconds <= time.perf_counter() - saved_at
        stop_flag, late_flag = replicas.max([int(main and hooks.epoch_end(row, new_eval)), int(late)])
        stop = stop_flag > 0  # rank 0 decides both, so every rank stops and checkpoints alike
        last_eval = new_eval or (None if stop else last_eval)  # a run stopped between evaluations: one more
        if stop or late_flag or due(epoch, cfg.run.checkpoint_every, num_epochs):
            checkpoints.save(epoch, start)
            saved_at, saved_updates = time.perf_counter(), learner.updates
        if stop:
            break
    if source.interrupted:
        if learner.updates > saved_updates:  # keep the updates made since the last checkpoint
            checkpoints.save(epoch - 1, start)
            truncate_metrics(run_path(cfg) / "metrics.jsonl", epoch - 1)
        return None
    if main and last_eval is None:  # resumed a run that had already reached its last epoch, or stopped early
        last_eval = evaluation.final(epoch if stop else max(start_epoch, num_epochs), num_epochs, start)
    return last_eval


def update(learner: Learner, batches: LazyLoader, counts: Iterable[int], timer: Timer,
           replicas: Replicas) -> tuple[dict[str, float], int]:
    """The updates the data allows (`counts`, the data source's), each on a fresh batch; returns the means of the
    last count's update metrics (`Learner.read_metrics`, one host read per count; averaged over the ranks) and the
    number of updates made. Timed into "sample" and "update": an update does not wait for the device, so on a GPU
    the next batch is sampled while the last update runs, and the read (waiting for the device) counts as updating."""
    metrics: dict[str, float] | None = None
    made = 0
    for n in counts:
        with timer("sample"):  # opening the loader counts as sampling
            loader = batches.get()
        for _ in range(n):
            with timer("sample"):
                batch = next(loader)
            with timer("update"):
                learner.update(batch)
        with timer("update"):
            metrics = learner.read_metrics()
        made += n
    return ({} if metrics is None else replicas.average(metrics)), made


def train_row(source: DataSource, learner: Learner, timer: Timer, metrics: dict[str, float], *, epoch: int,
              start: float, n_updates: int) -> dict[str, Any]:
    """The epoch's train row: the data source's columns (every rank takes part), then the updates'."""
    return {
        **row_head("train", epoch, source.env_steps(), learner.updates, start),
        **source.row(timer),
        "time/sample_s": timer["sample"],
        "time/update_s": timer["update"],
        "time/updates_per_s": n_updates / max(timer["update"], 1e-9) if n_updates else 0.0,
        **{f"train/{k}": v for k, v in metrics.items()},
    }


def report(log: Logger, row: dict, evaluation: Evaluation, *, epoch: int, num_epochs: int, start: float,
           progress: Any) -> dict | None:
    """Rank 0 logs the epoch's train row and, when due, evaluates; returns this epoch's evaluation, if any."""
    return report_epoch(log, row, evaluation.cfg, epoch=epoch, num_epochs=num_epochs, last_eval=None,
                        progress=progress, evaluate=lambda: evaluation.row(epoch, start))


@dataclass(frozen=True)
class Evaluation:
    """What an evaluation row needs: the agent's greedy rollouts in rank 0's eval envs (`collector`), and the
    counters every row starts with (the data source's env steps, the learner's updates)."""

    cfg: ExperimentConfig
    learner: Learner
    source: DataSource
    collector: Collector | None  # rank 0's
    device: torch.device

    def row(self, epoch: int, start: float) -> dict[str, Any]:
        """The epoch's evaluation row (seeded by the epoch)."""
        return eval_row(self.learner.agent, self.collector, self.cfg, self.device, epoch=epoch,
                        env_steps=self.source.env_steps(), updates=self.learner.updates, start=start)

    def final(self, epoch: int, seed_epoch: int, start: float) -> dict[str, Any]:
        """The evaluation a run resumed after its last epoch returns (not logged: the log has its last one)."""
        cfg = self.cfg
        stats = evaluate(self.learner.agent, self.collector, cfg.eval.eval_rollouts, self.device,
                         seed=derive_seed(cfg.run.seed, "eval", seed_epoch), max_steps=cfg.eval.eval_max_steps)
        return {**row_head("eval", epoch, self.source.env_steps(), self.learner.updates, start), **stats}


# ------------------------------------------------------------------------- start, checkpoint, resume, finish
def start_log(cfg: ExperimentConfig, replicas: Replicas, source: DataSource, hooks: Callbacks, *, agent: Agent,
              spaces: dict[str, Any], eval_collector: Collector | None, env: Any) -> Logger:
    """Rank 0, the one writer of the run directory: config.json, spaces.json, the data source's start, the
    metrics log and the banner; then the callbacks' on_train_start (`env`: the user's, or None). The other ranks
    log nothing."""
    if not replicas.is_main:
        return MultiLogger([])
    run_dir, e, world = run_path(cfg), cfg.env, replicas.world_size
    write_run_files(run_dir, cfg, spaces)
    log = open_log(run_dir, cfg)
    say(
        f"icrl: training on [bold]{e.env}[/bold] {e.kwargs or ''} with a {cfg.model.traj_encoder} "
        f"({sum(p.numel() for p in agent.online_parameters()):,} parameters) on {replicas.device}"
        + (f" x {world} processes" if world > 1 else "") + f"; run dir {run_dir}"
    )
    source.start()  # say what the run does; collector processes may start acting now
    if eval_collector is not None:
        n = eval_collector.num_envs
        done = -(-cfg.eval.eval_rollouts // n) * n
        if done != cfg.eval.eval_rollouts:
            say(f"icrl: note: evaluations run {done} rollouts, not --eval-rollouts {cfg.eval.eval_rollouts}: each of "
                f"the {n} eval env copies finishes the same number")
    hooks.start(TrainingRun(cfg, run_dir, agent, read_spaces_record(spaces, "the run"), replicas.device,
                            source.env_steps, env=env))
    return log


@dataclass(frozen=True)
class Checkpoints:
    """What a checkpoint holds and where it goes: the learner (its agent and optimiser), the data source's
    env-step counter and exploration, the config and spaces, in the config's run dir; `save` and `resume`."""

    cfg: ExperimentConfig
    spaces: dict[str, Any]
    replicas: Replicas
    learner: Learner
    source: DataSource

    def resume(self) -> tuple[int, float]:
        """(epoch, wall-clock seconds) to continue from: the newest usable checkpoint's, else (0, 0.0)."""
        run_dir = run_path(self.cfg)
        held = holds_run(run_dir)  # a run without a readable checkpoint says so itself
        source = self.source
        start = resume_training(self.cfg, self.replicas, agent=self.learner.agent, learner=self.learner,
                                collector=source.counter, exploration=source.exploration, resumed=source.resumed)
        if start[0] == 0 and not held and self.replicas.is_main:
            say(f"icrl: --resume: {run_dir} has no checkpoint yet; starting the run from the beginning")
        return start

    def save(self, epoch: int, start: float) -> None:
        """Rank 0 saves the epoch's checkpoint; in a data-parallel run every rank first hashes its state, which
        raises if the ranks diverged (`Replicas.checkpoint_record`)."""
        cfg, agent = self.cfg, self.learner.agent
        extra = {"wall_time": time.perf_counter() - start, "config": json.loads(cfg.to_json()), "spaces": self.spaces,
                 **self.replicas.checkpoint_record(agent)}
        if self.replicas.is_main:
            save_checkpoint(run_path(cfg), agent=agent, learner=self.learner, collector=self.source.counter,
                            exploration=self.source.exploration, epoch=epoch, extra=extra,
                            keep=cfg.run.keep_checkpoints)


def finish(last_eval: dict | None, hooks: Callbacks, *, cfg: ExperimentConfig, source: DataSource, learner: Learner,
           lock: RunLock | None) -> dict:
    """Rank 0: the data source's end, then the final weights, the plot and the result line; then the run dir is
    free again (`lock`). Returns the final evaluation with the run dir; {} where there is none (`last_eval` None:
    the data source was interrupted)."""
    run_dir = run_path(cfg)
    try:
        source.finish(done=last_eval is not None)
        if last_eval is not None:
            finish_run(run_dir, learner.agent, cfg, last_eval, source.env_steps(), learner.updates)
    finally:
        if lock is not None:
            lock.release()
    if last_eval is None:
        return {}
    hint_critic_reach(cfg, learner.updates, last_eval)
    result = {**last_eval, "run_dir": str(run_dir)}  # where the run lives, also when icrl chose the folder
    hooks.end(result)
    return result


# ------------------------------------------------------------------------------ the in-process data source
@dataclass(frozen=True)
class Plan:
    """What an `icrl train` run will do, computed once from its resolved config and said once (`line`), in the
    numbers its metrics show: every process steps each of its envs `steps_per_env` times an epoch (whole vector
    steps of its share of `--steps-per-epoch`), for `epochs` epochs (the budget's whole epochs, at least one)."""

    asked: int  # --total-env-steps
    epochs: int
    processes: int
    envs: int  # per process
    steps_per_env: int  # per epoch
    updates_per_epoch: int | None  # --updates-per-epoch; None: the replay ratio's count
    replay_ratio: float
    window: int  # timesteps of a full training window
    updates: int  # planned: fixed, or the replay ratio's count for full windows
    warmup: int
    context: int  # timesteps the policy attends to
    compiled: bool  # the loss is torch.compile'd
    captured: bool  # updates and acting steps replay CUDA graphs
    device: str

    @classmethod
    def of(cls, cfg: ExperimentConfig, world_size: int = 1, learner: Learner | None = None) -> Plan:
        """The plan of `cfg` (resolved) on `world_size` processes; `learner`: where it runs and how (else CPU, eager)."""
        s, n = cfg.schedule, cfg.env.parallel_envs
        epochs = max(1, s.env_steps // s.steps_per_epoch)
        return cls(asked=s.env_steps, epochs=epochs, processes=world_size, envs=n,
                   steps_per_env=-(-(s.steps_per_epoch // world_size) // n), updates_per_epoch=s.updates_per_epoch,
                   replay_ratio=s.replay_ratio, window=training_window(cfg), updates=epochs * cfg.epoch_updates,
                   warmup=int(cfg.optim.warmup_updates or 0), context=cfg.model.context,
                   compiled=bool(cfg.optim.compile), captured=learner is not None and learner.graphed,
                   device=str(learner.device) if learner is not None else "cpu")

    def record(self) -> dict[str, Any]:
        """What RUN_DIR/plan.json holds: every number of the plan, none unset (config.json keeps what was asked)."""
        return {**dataclasses.asdict(self), "steps_per_epoch": self.steps_per_epoch, "env_steps": self.env_steps,
                "updates_per_epoch": self.updates // self.epochs,
                "updates_counted_by": "replay_ratio" if self.updates_per_epoch is None else "updates_per_epoch"}

    @property
    def steps_per_epoch(self) -> int:
        return self.processes * self.envs * self.steps_per_env

    @property
    def env_steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    def line(self) -> str:
        procs = f"{self.processes} processes x " if self.processes > 1 else ""
        epochs = f"{self.epochs:,} epoch{'s' if self.epochs > 1 else ''}"
        taken = f"{epochs} x {procs}{self.envs} envs x {self.steps_per_env:,} steps = {self.env_steps:,} env steps"
        if self.env_steps != self.asked:
            taken += f" (asked {self.asked:,}: whole epochs of whole steps of every env)"
        if self.updates_per_epoch is not None:
            updates = f"{self.updates_per_epoch:,} updates per epoch = {self.updates:,}"
        else:
            updates = (f"replay ratio {self.replay_ratio:g}: ~{self.updates:,} update{'s' if self.updates != 1 else ''} for full windows of "
                       f"{self.window:,} timesteps, more where rollouts are shorter")
        return f"icrl: plan: {taken}; {updates}; learning-rate warm-up {self.warmup:,} update{'s' if self.warmup != 1 else ''}"


class Collecting:
    """The data source of `icrl train` and of each data-parallel rank: this process's own envs, explored by the
    learner's agent; each epoch's finished rollouts are written into the shared replay, the updates follow the
    data collected (`UpdateBudget`)."""

    acts_here: ClassVar[bool] = True
    interrupted = False  # Ctrl-C raises instead

    def __init__(self, run: Run) -> None:
        cfg, replicas = run.cfg, run.replicas
        assert run.venv is not None  # build_run builds the envs of a source that acts here
        self.cfg, self.replicas, self.replay, self.agent, self.seed = cfg, replicas, run.replay, run.agent, run.seed
        self.offline_epochs, self.steps_per_rank = run.offline_epochs, cfg.schedule.steps_per_epoch // replicas.world_size
        self.counter = Collector(run.venv, run.spec, chunk_len=cfg.env.chunk_len, seed=derive_seed(run.seed, "train-envs"))
        self.exploration, self.policy = train_policy(cfg, run.agent, self.counter, run.spec, run.seed, replicas.device)
        self.budget = UpdateBudget(cfg, replicas.world_size)
        self.plan = Plan.of(cfg, replicas.world_size, run.learner)
        self.episodes: list[EpisodeStats] = []
        self.said: frozenset[str] = frozenset()  # the hints said so far (`hint_once`)
        self.steps0, self.policy_s0 = 0, 0.0  # at the epoch's start

    @staticmethod
    def prepare(cfg: ExperimentConfig, world_size: int) -> ExperimentConfig:
        if cfg.run.resume and cfg.run.run_dir is not None and (run_path(cfg) / "async").is_dir():
            raise ConfigError(f"{run_path(cfg)} is a run of `icrl learn` and its collectors: its checkpoints count the "
                              "collectors' env steps, so `icrl train` cannot continue it; resume it as it was started, "
                              "with `icrl learn` and its `icrl collect` processes")
        if cfg.schedule.steps_per_epoch % world_size:
            raise ConfigError(
                f"{flag('steps_per_epoch')} {cfg.schedule.steps_per_epoch} does not split evenly over {world_size} "
                f"processes: pass a multiple of {world_size}, e.g. {cfg.schedule.steps_per_epoch // world_size * world_size or world_size}"
            )
        if cfg.schedule.steps_per_epoch // world_size < cfg.env.parallel_envs:
            raise ConfigError(
                f"{flag('steps_per_epoch')} {cfg.schedule.steps_per_epoch} split over {world_size} processes is below "
                f"{flag('parallel_envs')} {cfg.env.parallel_envs}: raise {flag('steps_per_epoch')} to at least "
                f"{world_size * cfg.env.parallel_envs}"
            )
        return cfg

    def env_steps(self) -> int:
        """The run's env steps: every rank takes the same number."""
        return self.replicas.world_size * self.counter.total_env_steps

    def num_epochs(self) -> int:
        return max(1, self.offline_epochs + self.cfg.schedule.env_steps // self.cfg.schedule.steps_per_epoch)

    def collect(self, epoch: int, timer: Timer) -> None:
        """This rank's env steps of the epoch (none in an --offline-updates epoch) with the exploring policy,
        written into the replay, visible to every rank's sampler once all ranks wrote. Eval mode once for the
        whole phase (AgentPolicy.act would switch too, once); Learner.update switches back."""
        self.steps0, self.policy_s0 = self.env_steps(), self.policy.seconds
        with timer("collect"):  # the acting loop: policy + env steps + collector bookkeeping
            self.agent.eval()
            rollouts, self.episodes = self.counter.collect(
                self.policy, self.steps_per_rank if epoch > self.offline_epochs else 0)
        with timer("replay_write"):
            for rollout in rollouts:
                self.replay.write(rollout)
            self.replicas.barrier()  # every rank's rollouts are on disk before any rank lists the replay
        self.said = hint_once(self, epoch, rollouts, self.said, last=epoch == self.num_epochs())

    def updates(self, epoch: int, timer: Timer) -> Iterator[int]:
        """Once the run has enough data, the epoch's updates: an offline epoch's fixed count, else the budget's."""
        cfg = self.cfg
        ready = self.env_steps() >= cfg.schedule.start_updates_after and self.replay.num_rollouts() > 0
        if not self.replicas.all_ready(ready):
            return
        if epoch <= self.offline_epochs:
            yield cfg.epoch_updates
        else:
            yield self.budget.updates(cfg.schedule.steps_per_epoch, [f.num_timesteps for f in self.replay.files()])

    def row(self, timer: Timer) -> dict[str, Any]:
        stats = train_stats(self.episodes, self.replicas)  # summed over the ranks
        return {
            "train/return_mean": stats["return_mean"],
            "train/success_rate": stats["success_rate"],
            "train/epsilon": self.exploration.level(self.counter.total_env_steps),
            "time/collect_s": timer["collect"],  # the acting loop: policy + env steps + collector bookkeeping
            "time/policy_s": self.policy.seconds - self.policy_s0,  # of which inside AgentPolicy.act
            "time/replay_write_s": timer["replay_write"],
            "time/env_steps_per_s": (self.env_steps() - self.steps0) / max(timer["collect"], 1e-9),
            **{f"train/{k}": v for k, v in stats.items() if k.startswith(TASK_METRIC_PREFIXES)},  # multi-task envs
        }

    def resumed(self, epoch: int, state: dict[str, Any]) -> None:
        """The env-step counter per rank, rescaled to this run's process count; the envs start from a hard reset,
        seeded apart from the run's first reset so the tasks do not repeat (the rollouts in progress are lost)."""
        saved_world, world = int(state["extra"].get("world_size", 1)), self.replicas.world_size
        if saved_world != world:
            self.counter.total_env_steps = self.counter.total_env_steps * saved_world // world
        self.counter.seed = derive_seed(self.seed, "train-envs", "resume", epoch)

    def start(self) -> None:
        """Say the plan, once (`Plan.line`), and record it beside the config (RUN_DIR/plan.json)."""
        if self.replicas.is_main:
            say(self.plan.line())
            write_text_atomic(run_path(self.cfg) / "plan.json", json.dumps(self.plan.record(), indent=1) + "\n")

    def finish(self, done: bool) -> None:
        """Nothing to hand over: the envs close with the run."""


def hint_once(c: Collecting, epoch: int, rollouts: list[Rollout], said: frozenset[str], last: bool) -> frozenset[str]:
    """The hints said so far (`said`), plus those that apply now and were not said before: each only once."""
    if "stored" not in said and hint_nothing_stored(c, epoch, rollouts, last):
        said |= {"stored"}
    if "context" not in said and hint_short_context(c, rollouts):
        said |= {"context"}
    return said


def hint_nothing_stored(c: Collecting, epoch: int, rollouts: list[Rollout], last: bool) -> bool:
    """Say once why no update runs while online epochs store nothing; True once said. Quiet, until the last
    epoch, while each env has taken no more steps than the context holds: a task whose rollouts fill the
    context (T-Maze 500 in 1,000-step epochs of 8 envs) finishes its first ones only after several epochs."""
    if not c.replicas.is_main or rollouts or epoch <= c.offline_epochs or c.replay.num_rollouts() > 0:
        return False
    n = c.cfg.env.parallel_envs  # e.g. MountainCar: no episode ends within one epoch, nothing to learn from
    per_env = (epoch - c.offline_epochs) * c.plan.steps_per_env
    if per_env <= c.cfg.model.context and not last:
        return False
    say(f"icrl: epoch {epoch} finished no rollout: no episode ended within the {per_env} steps each of the {n} "
        "envs took so far, so nothing is stored and no update runs; pass --chunk-len 64 to store pieces of long "
        "rollouts, or raise --steps-per-epoch (or lower --parallel-envs)")
    return True


def hint_short_context(c: Collecting, rollouts: list[Rollout]) -> bool:
    """Say once when a rollout had more action steps than the context: its late steps cannot attend to its
    first ones (a T-Maze cue), which no loss curve shows. True once said."""
    steps = max((int(r.time[-1]) for r in rollouts if len(r.time)), default=0)
    context = c.cfg.model.context
    if not c.replicas.is_main or steps <= context:
        return False
    say(f"icrl: rollouts last {steps} steps but the context is {context} (--max-seq-len): late steps see only "
        f"the last {context}; pass --max-seq-len {steps} if the task needs memory of the whole rollout")
    return True
