"""The learner of an asynchronous run (`icrl learn RUN_DIR ...`; the protocol is icrl.asynchronous.protocol).

It is `icrl train` without the acting phase: an epoch is `updates_per_epoch` updates on batches from the
shared replay, throttled so that updates <= utd x env steps stored, then the train row, an evaluation every
`eval_every` epochs and a checkpoint every `checkpoint_every` epochs, exactly as in `train` (and with the
same run-directory, resume, update and report pieces: icrl.run.rundir, icrl.run.components, icrl.run.reporting).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from icrl.agent.exploration import Exploration
from icrl.agent.learner import Learner
from icrl.asynchronous.protocol import AsyncPaths, RunCounters, StopFlag, counter_limit, publish_weights
from icrl.config import ConfigError, ExperimentConfig
from icrl.data.offline import prepare_offline
from icrl.device import resolve_device
from icrl.envs import Collector
from icrl.envs.wrapper import agent_obs_space
from icrl.fileio import write_text_atomic
from icrl.run.artifacts import finish_run
from icrl.run.checkpoint import load_latest_checkpoint, save_checkpoint
from icrl.run.components import (
    LazyLoader,
    build_agent,
    closed_on_error,
    make_relabeler,
    make_run_envs,
    make_train_loader,
    open_replay,
    run_updates,
    seed_process,
    with_task_defaults,
)
from icrl.run.evaluate import add_task_sums, eval_row, metrics_from_task_sums
from icrl.run.reporting import Timer, due, open_log, report_epoch, row_head, say
from icrl.run.rundir import (
    RunLock,
    check_resume_target,
    check_run_dir_free,
    prune_after,
    resume_point,
    run_path,
    run_scope,
    take_run_dir,
    truncate_metrics,
    with_run_dir,
    write_run_files,
)
from icrl.seeding import derive_seed
from icrl.spaces_json import venv_spaces_record
from icrl.types import ActionSpec


def learn(cfg: ExperimentConfig, *, stop: StopFlag | None = None) -> dict:
    """Train from the collectors' rollouts in cfg.run.run_dir; returns the final evaluation (or {} when
    stopped early). `cfg.asynchronous.utd`: max updates per stored env step (default updates_per_epoch /
    steps_per_epoch); `cfg.asynchronous.publish_every`: publish weights every this many updates (default
    updates_per_epoch)."""
    s = Learning(cfg)  # every refusal, the seed, the eval env, agent, learner; run dir locked
    with run_scope(s.lock, s.eval_venv.close):  # an error or Ctrl-C: the run dir free again at once, as in train
        start_epoch, wall_offset = s.resume() if s.cfg.run.resume else (0, 0.0)
        s.open_run()  # config.json, spaces.json and the first weights: collectors may start acting
        log = open_log(s.run_dir, s.cfg)
        say(f"icrl learn: {s.total_updates:,} updates (<= {s.ratio:g} per env step stored) on {s.device}; start "
            f"collectors with `icrl collect {s.run_dir} --collector-id K`")
        batches = LazyLoader(lambda: make_train_loader(
            s.cfg, s.paths.replay, s.spec, s.device, obs_space=agent_obs_space(s.eval_venv),
            transform=s.relabeler,
            seed=derive_seed(s.cfg.run.seed, "loader", "async", start_epoch), auto_refresh=True))  # files arrive at any time
        try:
            last_eval = s.epochs(batches, log, start_epoch, wall_offset, stop)
        finally:
            log.close()
            batches.close()
        return s.finish(last_eval, stop)


def update_ratio(cfg: ExperimentConfig, utd: float | None) -> float:
    """The max updates per stored env step: `utd`, by default the synchronous run's ratio."""
    upe = cfg.epoch_updates  # --updates-per-epoch (Learning sets it: replay_ratio's count where unset)
    if upe < 1:
        raise ConfigError("icrl learn needs --updates-per-epoch >= 1 (its epochs are counted in updates)")
    ratio = upe / cfg.schedule.steps_per_epoch if utd is None else float(utd)
    if ratio <= 0:
        raise ConfigError(f"--utd {utd} must be positive (max updates per env step stored)")
    return ratio


class _NoExploration:
    """The learner does not explore; its checkpoints store an empty exploration state."""

    def state_dict(self) -> dict:
        return {}


class Learning:
    """The learner's run: its setup (in the order of `icrl train`'s: refusals before anything is written, the
    run lock before the first write) and the steps of its epochs."""

    def __init__(self, cfg: ExperimentConfig) -> None:
        cfg = with_run_dir(with_task_defaults(cfg))  # unset: a new folder
        # its epochs are counted in updates: replay_ratio's count for full windows where none is fixed
        self.cfg = cfg = cfg.replace(updates_per_epoch=cfg.epoch_updates).validate()
        self.upe = cfg.epoch_updates  # updates per epoch
        e = cfg.env
        self.ratio = update_ratio(cfg, cfg.asynchronous.utd)
        self.publish_every = cfg.asynchronous.publish_every or self.upe
        check_resume_target(cfg)
        check_run_dir_free(cfg)  # one learner (or icrl train) per run dir; collectors take no lock
        seed_process(cfg)
        self.device = resolve_device(cfg.run.device)
        with closed_on_error() as opened:  # a failed setup leaves no env open and the run dir free, as in train
            self.eval_venv = opened(make_run_envs(e, e.parallel_envs, asynchronous=e.async_envs))
            self.spec = ActionSpec.from_space(self.eval_venv.single_action_space)
            self.relabeler = make_relabeler(cfg.replay, self.eval_venv)
            self.paths = AsyncPaths(run_path(cfg))
            self.run_dir: Path = self.paths.run_dir
            lock = opened(take_run_dir(cfg))
            assert lock is not None  # the learner is a main process: take_run_dir always locks
            self.lock: RunLock = lock
            self._build_learning()

    def _build_learning(self) -> None:
        """The rest of the setup, once the run dir is taken: agent, learner, replay folders and counters."""
        cfg = self.cfg
        self.paths.make_collectors_dir()
        self.eval_collector = Collector(self.eval_venv, self.spec, seed=derive_seed(cfg.run.seed, "eval-envs"))
        self.agent = build_agent(cfg, agent_obs_space(self.eval_venv), self.spec, self.device)
        self.learner = Learner(self.agent, cfg, self.device)
        open_replay(cfg, self.run_dir)  # the folders collectors fill
        prepare_offline(cfg, self.paths.replay, log=say)  # --offline-data into replay/protected, once
        # only to log the collectors' ε: each anneals over its own steps per env copy (icrl.run.components.train_policy)
        self.schedule = Exploration(cfg.explore, self.spec, cfg.env.parallel_envs, seed=0)
        self.counts = RunCounters(self.paths, counter_limit(cfg)).read()
        # --offline-updates come on top of the ratio: they may run before any env step is stored
        self.total_updates = cfg.replay.offline_updates + math.floor(self.ratio * cfg.schedule.env_steps)
        self.published = 0

    def epochs(self, batches: LazyLoader, log: Any, start_epoch: int, wall_offset: float,
               stop: StopFlag | None) -> dict | None:
        """The epochs after `start_epoch` (until the run's updates are made, or `stop`); the last evaluation."""
        cfg, learner, upe = self.cfg, self.learner, self.upe
        num_epochs = math.ceil(self.total_updates / upe)
        last_eval, epoch, last_ckpt = None, start_epoch, learner.updates
        start = time.perf_counter() - wall_offset
        saved_at = time.perf_counter()  # --checkpoint-seconds counts from the last checkpoint
        while learner.updates < self.total_updates and not stop:
            epoch += 1
            timer, steps0, time0 = Timer(), self.counts.env_steps, time.perf_counter()
            sums0 = {**self.counts.sums, "tasks": self.counts.tasks}
            target = min(epoch * upe, self.total_updates)
            metrics = self.update_to(target, batches, timer, stop)
            if learner.updates < target:  # stopped within the epoch: checkpointed below, not logged
                break
            row = self.train_row(epoch, start, metrics, timer, steps0, time0, sums0)
            last_eval = report_epoch(log, row, cfg, epoch=epoch, num_epochs=num_epochs, last_eval=last_eval,
                                     evaluate=lambda: self.eval_row(epoch, start))  # noqa: B023
            late = 0 < cfg.run.checkpoint_seconds <= time.perf_counter() - saved_at
            if late or due(epoch, cfg.run.checkpoint_every, num_epochs):
                self.checkpoint(epoch, start)
                last_ckpt, saved_at = learner.updates, time.perf_counter()
        if stop and learner.updates > last_ckpt:  # keep the updates made since the last checkpoint
            partial = learner.updates // upe
            self.counts.read()
            self.checkpoint(partial, start)
            truncate_metrics(self.run_dir / "metrics.jsonl", partial)
        elif not stop and last_eval is None:  # resumed a run that had already made all its updates
            last_eval = self.eval_row(epoch, start)
        return last_eval

    def finish(self, last_eval: dict | None, stop: StopFlag | None) -> dict:
        """Publish the last weights; unless stopped, mark the run done and write its final weights and plot;
        then free the run dir. Returns the final evaluation ({} when stopped early)."""
        learner = self.learner
        self.publish()
        if stop:
            self.lock.release()
            say(f"icrl learn: stopped by {stop.signal} after {learner.updates:,} updates; continue with --resume")
            return {}
        assert last_eval is not None  # a run that was not stopped ends with an evaluation (`epochs`)
        write_text_atomic(self.paths.done, json.dumps({"updates": learner.updates, "env_steps": self.counts.env_steps}))
        finish_run(self.run_dir, self.agent, self.cfg, last_eval, self.counts.env_steps, learner.updates)
        self.lock.release()
        return last_eval

    def resume(self) -> tuple[int, float]:
        """(epoch, wall-clock seconds) of the newest usable checkpoint, else (0, 0.0); newer ones set aside."""
        found = load_latest_checkpoint(self.run_dir, agent=self.agent, log=say, learner=self.learner)
        start_epoch, wall_offset = 0, 0.0
        if found is not None:
            ckpt, state = found
            start_epoch, wall_offset = resume_point(state)
            say(f"icrl learn: resuming from {ckpt} (epoch {start_epoch}, {self.learner.updates:,} updates)")
        else:
            say(f"icrl learn: --resume: {self.run_dir} has no readable checkpoint; starting from the beginning")
        prune_after(self.run_dir, start_epoch)
        return start_epoch, wall_offset

    def open_run(self) -> None:
        """Clear an old finish marker, describe the run (collectors build from config.json) and publish."""
        e = self.cfg.env
        self.paths.done.unlink(missing_ok=True)
        write_run_files(self.run_dir, self.cfg, venv_spaces_record(self.eval_venv, e.env, e.kwargs))
        self.publish()

    def publish(self) -> None:
        self.published = publish_weights(self.agent, self.paths, self.learner.updates, self.ratio)

    def allowed(self) -> int:
        """The updates the stored data allows now."""
        counts, cfg = self.counts, self.cfg
        if counts.env_steps >= cfg.schedule.env_steps:  # collection is over: finish the run's updates
            return self.total_updates
        if counts.env_steps < cfg.schedule.start_updates_after or counts.rollouts == 0:
            return cfg.replay.offline_updates
        return min(self.total_updates, cfg.replay.offline_updates + math.floor(self.ratio * counts.stored_env_steps))

    def update_to(self, target: int, batches: LazyLoader, timer: Timer, stop: StopFlag | None) -> dict[str, float]:
        """Update until `target` updates (or `stop`), waiting whenever ahead of the data; returns the last
        update's metrics. Weights are published every `publish_every` updates and before each wait."""
        learner, every, metrics = self.learner, self.publish_every, {}
        while learner.updates < target and not stop:
            n = min(target, self.allowed()) - learner.updates
            if n <= 0:  # ahead of the data: wait for the collectors
                if self.published < learner.updates:  # with the newest weights (see collect's max_lead)
                    self.publish()
                with timer("wait"):
                    time.sleep(0.05)
                    self.counts.read()
                continue
            loader = batches.get()
            metrics = run_updates(learner, loader, min(n, every - learner.updates % every), timer)
            if learner.updates % every == 0 or learner.updates == self.total_updates:
                self.publish()
            self.counts.read()
        return metrics

    def train_row(self, epoch: int, start: float, metrics: dict[str, float], timer: Timer, steps0: int,
                  time0: float, sums0: dict[str, Any]) -> dict[str, Any]:
        """The epoch's train row: the collectors' rollouts stored since the epoch began (with per-task metrics of
        multi-task envs), and the updates."""
        counts = self.counts
        done = {k: counts.sums[k] - sums0[k] for k in counts.sums}
        tasks = metrics_from_task_sums(add_task_sums(counts.tasks, sums0["tasks"], sign=-1.0))
        return {
            **row_head("train", epoch, counts.env_steps, self.learner.updates, start),
            "train/return_mean": done["return_sum"] / done["rollouts"] if done["rollouts"] else None,
            "train/success_rate": done["success_sum"] / done["success_n"] if done["success_n"] else None,
            "train/epsilon": self.epsilon(),
            "async/stored_env_steps": counts.stored_env_steps, "async/utd": self.ratio,
            "async/collectors": counts.collectors,
            "time/sample_s": timer["sample"], "time/update_s": timer["update"], "time/wait_s": timer["wait"],
            "time/env_steps_per_s": (counts.env_steps - steps0) / max(time.perf_counter() - time0, 1e-9),
            "time/updates_per_s": self.upe / max(timer["update"], 1e-9),
            **{f"train/{k}": v for k, v in metrics.items()},
            **{f"train/{k}": v for k, v in tasks.items()},
        }

    def epsilon(self) -> float:
        """The collectors' annealed ε (before each env's scale), averaged over the collectors: each follows its
        own env steps, as `train`'s collector does, not the steps of all collectors together."""
        steps = self.counts.collector_env_steps or [0]
        return sum(self.schedule.level(n) for n in steps) / len(steps)

    def eval_row(self, epoch: int, start: float) -> dict[str, Any]:
        return eval_row(self.agent, self.eval_collector, self.cfg, self.device, epoch=epoch,
                        env_steps=self.counts.env_steps, updates=self.learner.updates, start=start)

    def checkpoint(self, epoch: int, start: float) -> None:
        save_checkpoint(self.run_dir, agent=self.agent, learner=self.learner, collector=self.counts,
                        exploration=_NoExploration(), epoch=epoch,
                        extra={"wall_time": time.perf_counter() - start, "config": json.loads(self.cfg.to_json()),
                               "mode": "async"}, keep=self.cfg.run.keep_checkpoints)
