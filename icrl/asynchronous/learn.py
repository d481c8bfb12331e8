"""The learner of an asynchronous run (`icrl learn RUN_DIR ...`; see icrl.asynchronous.collect for the protocol).

It is `icrl train` without the acting phase: an epoch is `updates_per_epoch` updates on batches from the
shared replay, throttled so that updates <= utd x env steps stored, then the train row, an evaluation every
`eval_every` epochs and a checkpoint every `checkpoint_every` epochs, exactly as in `train`.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch

from icrl.agent.exploration import Exploration
from icrl.agent.learner import Learner
from icrl.agent.model import Agent
from icrl.asynchronous.collect import AsyncPaths, StopFlag, read_counters
from icrl.config import ConfigError, ExperimentConfig
from icrl.data import DiskReplay
from icrl.data.offline import prepare_offline
from icrl.envs import Collector, make_vector_env
from icrl.fileio import write_text_atomic
from icrl.run.checkpoint import list_checkpoints, load_latest_checkpoint, save_checkpoint, set_aside
from icrl.run.loggers import make_loggers, progress_line, say
from icrl.run.loop import (
    check_run_dir,
    eval_row,
    finish_run,
    make_relabeler,
    make_train_loader,
    resolve_device,
    run_updates,
    save_weights,
    truncate_metrics,
    with_task_defaults,
)
from icrl.run.runlock import RunLock, check_not_locked, check_run_dir_usable
from icrl.seeding import derive_seed, seed_everything
from icrl.spaces_json import venv_spaces_record, write_spaces
from icrl.types import ActionSpec


class _RunCounters:
    """The collectors' summed counters, in the shape `save_checkpoint` stores as the collector's state."""

    def __init__(self, paths: AsyncPaths) -> None:
        self.paths = paths
        self.env_steps = self.stored_env_steps = self.rollouts = 0
        self.sums = {"rollouts": 0.0, "return_sum": 0.0, "success_n": 0.0, "success_sum": 0.0}
        self.collectors = 0

    def read(self) -> _RunCounters:
        counters = read_counters(self.paths)
        self.collectors = sum(c.get("state") == "collecting" for c in counters)
        self.env_steps = sum(int(c.get("env_steps", 0)) for c in counters)
        self.stored_env_steps = sum(int(c.get("stored_env_steps", 0)) for c in counters)
        self.rollouts = sum(int(c.get("stored_rollouts", 0)) for c in counters)
        self.sums = {k: float(sum(c.get(k, 0) for c in counters)) for k in self.sums}
        return self

    @property
    def total_env_steps(self) -> int:
        return self.env_steps

    def state_dict(self) -> dict[str, int]:
        return {"total_env_steps": self.env_steps, "total_rollouts": self.rollouts, "eval_env_steps": 0,
                "next_rollout_id": 0}


class _NoExploration:
    """The learner does not explore; its checkpoints store an empty exploration state."""

    def state_dict(self) -> dict:
        return {}


def learn(cfg: ExperimentConfig, *, utd: float | None = None, publish_every: int | None = None,
          stop: StopFlag | None = None) -> dict:
    """Train from the collectors' rollouts in cfg.run.run_dir; returns the final evaluation (or {} when
    stopped early). `utd`: max updates per stored env step (default updates_per_epoch / steps_per_epoch);
    `publish_every`: publish weights every this many updates (default updates_per_epoch)."""
    cfg = with_task_defaults(cfg).validate()
    e = cfg.env
    if cfg.schedule.updates_per_epoch < 1:
        raise ConfigError("icrl learn needs --updates-per-epoch >= 1 (its epochs are counted in updates)")
    ratio = cfg.schedule.updates_per_epoch / cfg.schedule.steps_per_epoch if utd is None else float(utd)
    if ratio <= 0:
        raise ConfigError(f"--utd {utd} must be positive (max updates per env step stored)")
    publish_every = publish_every or cfg.schedule.updates_per_epoch
    check_run_dir_usable(cfg.run.run_dir)
    check_not_locked(cfg.run.run_dir)  # one learner (or icrl train) per run dir; collectors take no lock
    check_run_dir(cfg)
    seed_everything(cfg.run.seed)
    if cfg.run.threads > 0:
        torch.set_num_threads(cfg.run.threads)
    device = resolve_device(cfg.run.device)
    venv_kwargs = dict(episodes_per_rollout=e.episodes_per_rollout, rollout_horizon=e.rollout_horizon)
    eval_venv = make_vector_env(e.env, e.kwargs, e.parallel_envs, asynchronous=e.async_envs, **venv_kwargs)
    spec = ActionSpec.from_space(eval_venv.single_action_space)
    relabeler = make_relabeler(cfg.replay, eval_venv)
    paths = AsyncPaths(cfg.run.run_dir)
    run_dir = paths.run_dir
    lock = RunLock.acquire(run_dir)  # released by the OS if this process dies (icrl.run.runlock)
    check_run_dir(cfg)  # again, under the lock
    paths.collectors.mkdir(parents=True, exist_ok=True)
    eval_collector = Collector(eval_venv, spec, seed=derive_seed(cfg.run.seed, "eval-envs"))
    agent = Agent(eval_venv.single_observation_space["obs"], spec, cfg.model, cfg.loss).to(device)
    learner = Learner(agent, cfg, device)
    DiskReplay(paths.replay, capacity_timesteps=cfg.replay.replay_capacity, fsync=False)  # the folders collectors fill
    prepare_offline(cfg, paths.replay, log=say)  # --offline-data into replay/protected, once
    schedule = Exploration(cfg.explore, spec, 1, seed=0)  # only to log the collectors' epsilon
    counts = _RunCounters(paths).read()
    start_epoch, wall_offset = 0, 0.0
    if cfg.run.resume:
        found = load_latest_checkpoint(run_dir, agent=agent, log=say, learner=learner)
        if found is not None:
            ckpt, state = found
            start_epoch, wall_offset = int(state["epoch"]), float(state["extra"].get("wall_time", 0.0))
            say(f"icrl learn: resuming from {ckpt} (epoch {start_epoch}, {learner.updates:,} updates)")
        for path in list_checkpoints(run_dir):
            if int(path.name.split("-")[-1]) > start_epoch:
                set_aside(path)
        truncate_metrics(run_dir / "metrics.jsonl", start_epoch)
    paths.done.unlink(missing_ok=True)
    write_text_atomic(paths.config, cfg.to_json())
    write_spaces(run_dir, venv_spaces_record(eval_venv, e.env, e.kwargs))  # icrl.load needs no env

    def publish() -> int:
        save_weights(agent, paths.weights, {"updates": str(learner.updates), "utd": str(ratio)})
        return learner.updates

    published = publish()  # collectors may start acting
    log = make_loggers(run_dir, ("jsonl", *cfg.run.log_backends), json.loads(cfg.to_json()))
    # --offline-updates come on top of the ratio: they may run before any env step is stored
    total_updates = cfg.replay.offline_updates + math.floor(ratio * cfg.schedule.total_env_steps)
    num_epochs = math.ceil(total_updates / cfg.schedule.updates_per_epoch)
    say(f"icrl learn: {total_updates:,} updates (<= {ratio:g} per env step stored) on {device}; start "
        f"collectors with `icrl collect {run_dir} --collector-id K`")

    def allowed() -> int:  # updates the stored data allows now
        if counts.env_steps >= cfg.schedule.total_env_steps:  # collection is over: finish the run's updates
            return total_updates
        if counts.env_steps < cfg.schedule.start_updates_after or counts.rollouts == 0:
            return cfg.replay.offline_updates
        return min(total_updates, cfg.replay.offline_updates + math.floor(ratio * counts.stored_env_steps))

    loader, last_eval, epoch, last_ckpt = None, None, start_epoch, learner.updates
    start = time.perf_counter() - wall_offset
    try:
        while learner.updates < total_updates and not stop:
            epoch += 1
            t_sample = t_update = t_wait = 0.0
            steps0, time0, sums0 = counts.env_steps, time.perf_counter(), dict(counts.sums)
            metrics: dict[str, float] = {}
            target = min(epoch * cfg.schedule.updates_per_epoch, total_updates)
            while learner.updates < target and not stop:
                n = min(target, allowed()) - learner.updates
                if n <= 0:  # ahead of the data: wait for the collectors
                    if published < learner.updates:  # with the newest weights (see collect's max_lead)
                        published = publish()
                    t0 = time.perf_counter()
                    time.sleep(0.05)
                    counts.read()
                    t_wait += time.perf_counter() - t0
                    continue
                if loader is None:
                    loader = make_train_loader(cfg, paths.replay, spec, device, transform=relabeler,
                                               seed=derive_seed(cfg.run.seed, "loader", "async", start_epoch),
                                               auto_refresh=True)  # files arrive at any time
                n = min(n, publish_every - learner.updates % publish_every)
                metrics, ts, tu = run_updates(learner, loader, n)
                t_sample, t_update = t_sample + ts, t_update + tu
                if learner.updates % publish_every == 0 or learner.updates == total_updates:
                    published = publish()
                counts.read()
            if learner.updates < target:  # stopped within the epoch: checkpointed below, not logged
                break
            done = {k: counts.sums[k] - sums0[k] for k in counts.sums}
            row = {
                "kind": "train", "epoch": epoch, "env_steps": counts.env_steps, "updates": learner.updates,
                "wall_time": time.perf_counter() - start,
                "train/return_mean": done["return_sum"] / done["rollouts"] if done["rollouts"] else None,
                "train/success_rate": done["success_sum"] / done["success_n"] if done["success_n"] else None,
                "train/epsilon": schedule.level(counts.env_steps),
                "async/stored_env_steps": counts.stored_env_steps, "async/utd": ratio,
                "async/collectors": counts.collectors,
                "time/sample_s": t_sample, "time/update_s": t_update, "time/wait_s": t_wait,
                "time/env_steps_per_s": (counts.env_steps - steps0) / max(time.perf_counter() - time0, 1e-9),
                "time/updates_per_s": cfg.schedule.updates_per_epoch / max(t_update, 1e-9),
                **{f"train/{k}": v for k, v in metrics.items()},
            }
            log.write(row)
            if epoch % cfg.eval.eval_every == 0 or epoch == num_epochs:
                last_eval = eval_row(agent, eval_collector, cfg, device, epoch=epoch, env_steps=counts.env_steps,
                                     updates=learner.updates, start=start)
                log.write(last_eval)
            if epoch % cfg.run.log_every == 0 or epoch == num_epochs:
                say(progress_line(row, last_eval))
            if epoch % cfg.run.checkpoint_every == 0 or epoch == num_epochs:
                _checkpoint(run_dir, agent, learner, counts, epoch, start, cfg)
                last_ckpt = learner.updates
        if stop and learner.updates > last_ckpt:  # keep the updates made since the last checkpoint
            partial = learner.updates // cfg.schedule.updates_per_epoch
            _checkpoint(run_dir, agent, learner, counts.read(), partial, start, cfg)
            truncate_metrics(run_dir / "metrics.jsonl", partial)
        elif not stop and last_eval is None:  # resumed a run that had already made all its updates
            last_eval = eval_row(agent, eval_collector, cfg, device, epoch=epoch, env_steps=counts.env_steps,
                                 updates=learner.updates, start=start)
    finally:
        log.close()
        eval_venv.close()
        if loader is not None:
            loader.close()
    publish()
    if stop:
        lock.release()
        say(f"icrl learn: stopped by {stop.signal} after {learner.updates:,} updates; continue with --resume")
        return {}
    write_text_atomic(paths.done, json.dumps({"updates": learner.updates, "env_steps": counts.env_steps}))
    finish_run(run_dir, agent, cfg, last_eval, counts.env_steps, learner.updates)
    lock.release()
    return last_eval


def _checkpoint(run_dir: Path, agent: Agent, learner: Learner, counts: _RunCounters, epoch: int, start: float,
                cfg: ExperimentConfig) -> None:
    save_checkpoint(run_dir, agent=agent, learner=learner, collector=counts, exploration=_NoExploration(),
                    epoch=epoch, extra={"wall_time": time.perf_counter() - start, "config": json.loads(cfg.to_json()),
                                        "mode": "async"}, keep=cfg.run.keep_checkpoints)
