"""The training algorithm (docs/design.md §8), one loop for every run. Each epoch:

    collect   the data source's env steps with the exploring policy, written into the replay (icrl.run.sources)
    update    as many updates as the data allows, each on a fresh batch of windows (icrl.agent.learner)
    report    the epoch's train row; every --eval-every epochs, an evaluation (icrl.run.evaluate)
    save      a checkpoint when due, when a callback stops the run or --checkpoint-seconds passed

`epochs` is that loop; `fit` wraps it in resuming, the log and the finish; `train` (`icrl.train`) builds the run
(icrl.run.build) with this process's own envs as its data source. The asynchronous learner (icrl.asynchronous.learn)
runs the same `fit` on the collector processes' files.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from icrl.agent.learner import Learner
from icrl.agent.model import Agent
from icrl.config import ExperimentConfig
from icrl.envs import Collector
from icrl.parallel import Replicas
from icrl.run.artifacts import finish_run
from icrl.run.build import LazyLoader, Run, build_run
from icrl.run.callbacks import Callbacks, TrainingRun
from icrl.run.checkpoint import save_checkpoint
from icrl.run.evaluate import eval_row, evaluate
from icrl.run.hints import hint_critic_reach
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
from icrl.run.sources import DataSource, OwnEnvs
from icrl.seeding import derive_seed
from icrl.spaces_json import read_spaces_record


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
    run = build_run(cfg, env, kind=OwnEnvs)  # every refusal, the seeds, envs, agent, learner, replay; run dir locked
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
                         seed=derive_seed(cfg.run.seed, "eval", seed_epoch), max_steps=cfg.eval.eval_max_steps,
                         greedy=cfg.eval.eval_greedy)
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
                                collector=source.collector, exploration=source.exploration, resumed=source.resumed)
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
            save_checkpoint(run_path(cfg), agent=agent, learner=self.learner, collector=self.source.collector,
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
