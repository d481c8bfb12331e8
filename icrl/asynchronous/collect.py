"""The collectors of an asynchronous run (`icrl collect RUN_DIR --collector-id K`; the protocol they share
with the learner is icrl.asynchronous.protocol): act with the learner's latest weights and store every
finished rollout in the run's replay, until the run's env steps are taken or the learner is done."""

from __future__ import annotations

import os
import time

import gymnasium as gym
import torch

from icrl.agent.model import build_agent
from icrl.asynchronous.protocol import (
    AsyncPaths,
    StopFlag,
    WeightsWatcher,
    counter_limit,
    read_counters,
    read_own_counters,
    wait_for,
    write_counters,
)
from icrl.config import ConfigError, ExperimentConfig
from icrl.config.errors import flag
from icrl.envs import Collector
from icrl.envs.make import make_run_envs
from icrl.envs.user import EnvOverride, run_env_config
from icrl.envs.wrapper import agent_obs_space
from icrl.run.build import open_replay
from icrl.run.evaluate import add_task_sums, rollout_sums, task_sums
from icrl.run.reporting import say
from icrl.run.rundir import hold_exclusive
from icrl.run.sources import train_policy
from icrl.seeding import derive_seed, seed_process
from icrl.types import ActionSpec, EpisodeStats

__all__ = ["StopFlag", "collect"]

COUNTER_KEYS = ("env_steps", "stored_env_steps", "stored_rollouts", "rollouts", "return_sum", "success_n",
                "success_sum")


def collect(run_dir: str | os.PathLike, collector_id: int = 0, *, device: str = "cpu", wait_s: float = 600.0,
            max_env_steps: int | None = None, max_lead: int | None = None, stop: StopFlag | None = None,
            override: EnvOverride | None = None) -> dict:
    """Run one collector until the run's total env steps are taken, the learner finishes, `max_env_steps`
    (this process) are taken, or `stop` is set. Returns its final counters.

    `max_lead`: pause while the run's stored env steps exceed (the published weights' updates / utd) +
    max_lead, i.e. while the collectors are more than `max_lead` env steps ahead of the learner (None: the
    run's `asynchronous.max_lead` from its config.json, read once the learner has written it; unset there:
    never pause). It cannot deadlock with the learner's throttle: the learner waits only while
    stored >= updates / utd, and publishes its weights before it waits.
    """
    paths = AsyncPaths(run_dir)
    cfg = wait_for_run(paths, wait_s, stop, override or EnvOverride())
    if cfg is None:
        return {}
    paths.make_collectors_dir()
    held = hold_exclusive(paths.collectors / f"{collector_id}.lock")  # one live collector per id
    if held is None:
        raise ConfigError(f"icrl collect: collector id {collector_id} is in use by another icrl collect on {run_dir}: "
                          f"two would share one counter and one seed stream; pass another {flag('collector_id')}")
    try:
        return _collect(paths, cfg, collector_id, device, max_env_steps, max_lead, stop)
    finally:
        os.close(held)


def _collect(paths: AsyncPaths, cfg: ExperimentConfig, collector_id: int, device: str, max_env_steps: int | None,
             max_lead: int | None, stop: StopFlag | None) -> dict:
    """`collect` once the run exists and this process holds its collector id."""
    max_lead = cfg.asynchronous.max_lead if max_lead is None else max_lead
    counters = read_own_counters(paths, collector_id, counter_limit(cfg))
    starts = int(counters.get("starts", 0)) + 1
    seed = derive_seed(cfg.run.seed, "collector", collector_id, "start", starts)  # a restart draws new tasks
    seed_process(seed, threads=cfg.run.threads)
    venv = make_run_envs(cfg.env, cfg.env.parallel_envs, asynchronous=cfg.env.async_envs)
    run = None
    try:
        run = CollectorProcess(cfg, paths, collector_id, venv, torch.device(device), seed, counters, starts)
        while run.wants_more(stop, max_env_steps):
            if run.ahead_of_learner(max_lead):  # wait for newer weights
                time.sleep(0.05)
                run.waited += 0.05
                continue
            run.collect_round(stop)
    finally:
        venv.close()
        if run is not None:  # its finished rollouts are stored and counted already
            run.finish(stop)
    say(f"icrl collect {collector_id}: {counters['state']} after {counters['env_steps']:,} env steps "
        f"({counters['stored_rollouts']:,} rollouts stored, {run.weights.reloads} weight reloads, "
        f"{run.waited:.0f} s waiting)")
    return counters


def wait_for_run(paths: AsyncPaths, wait_s: float, stop: StopFlag | None, override: EnvOverride
                 ) -> ExperimentConfig | None:
    """The run's config once the learner has written it and published its first weights; None when stopped."""
    learn_cmd = f"icrl learn {paths.run_dir}"
    if not wait_for(paths.config, wait_s, learn_cmd, stop):
        return None
    # the learner's device may not exist here: the collector acts on its own --device
    cfg = ExperimentConfig.from_json(paths.config.read_text(encoding="utf-8")).validate(check_device=False)
    # config.json is data: its env is built only if it is a built-in / registered one or the user said so
    cfg = run_env_config(cfg, paths.run_dir, override)
    if not wait_for(paths.weights, wait_s, learn_cmd, stop):
        return None
    return cfg


class CollectorProcess:
    """One collector process's envs, agent, replay and counters (`counters`, updated in place)."""

    def __init__(self, cfg: ExperimentConfig, paths: AsyncPaths, collector_id: int, venv: gym.vector.VectorEnv,
                 device: torch.device, seed: int, counters: dict, starts: int) -> None:
        e = cfg.env
        self.cfg, self.paths, self.collector_id, self.counters = cfg, paths, collector_id, counters
        spec = ActionSpec.from_space(venv.single_action_space)
        self.collector = Collector(venv, spec, chunk_len=e.chunk_len, seed=derive_seed(seed, "envs"))
        self.collector.total_env_steps = int(counters.get("env_steps", 0))
        self.agent = build_agent(cfg, agent_obs_space(venv), spec, device)
        self.weights = WeightsWatcher(self.agent, paths)
        self.replay = open_replay(cfg, paths.run_dir)
        # the exploration schedule follows this collector's own env copies
        _, self.policy = train_policy(cfg, self.agent, self.collector, spec, seed, device)
        counters.update(collector_id=collector_id, starts=starts, pid=os.getpid(), state="collecting")
        for key in COUNTER_KEYS:
            counters.setdefault(key, 0)
        paths.make_collectors_dir()
        self.start_steps, self.waited = self.collector.total_env_steps, 0.0
        self.others_stored = 0  # env steps the other collectors have stored (at the last look)
        say(f"icrl collect {collector_id}: {e.env} x {e.parallel_envs} envs, weights after "
            f"{self.weights.meta.get('updates')} updates")

    def wants_more(self, stop: StopFlag | None, max_env_steps: int | None) -> bool:
        """Reload newer weights and read the other collectors' counters; False once this collector is done."""
        self.weights.poll()
        rest = [c for c in read_counters(self.paths, counter_limit(self.cfg))
                if c.get("collector_id") != self.collector_id]
        others = sum(int(c.get("env_steps", 0)) for c in rest)  # the run's env steps end every collector
        self.others_stored = sum(int(c.get("stored_env_steps", 0)) for c in rest)
        mine = self.collector.total_env_steps
        return not (stop or self.paths.done.exists() or others + mine >= self.cfg.schedule.env_steps or (
            max_env_steps is not None and mine - self.start_steps >= max_env_steps))

    def ahead_of_learner(self, max_lead: int | None) -> bool:
        """More than `max_lead` stored env steps ahead of what the published weights' updates allow."""
        meta = self.weights.meta
        return max_lead is not None and "utd" in meta and (
            self.others_stored + self.counters["stored_env_steps"]
            > int(meta["updates"]) / float(meta["utd"]) + max_lead
        )

    def collect_round(self, stop: StopFlag | None) -> None:
        """steps_per_epoch env steps, one vector step at a time, each finished rollout stored at once."""
        self.agent.eval()
        episodes: list[EpisodeStats] = []
        counters, collector = self.counters, self.collector
        round_end = collector.total_env_steps + self.cfg.schedule.steps_per_epoch
        while collector.total_env_steps < round_end and not stop:
            rollouts, eps = collector.collect(self.policy, self.cfg.env.parallel_envs)
            for rollout in rollouts:
                self.replay.write(rollout)
                counters["stored_env_steps"] += rollout.num_timesteps - 1  # actions stored
                counters["stored_rollouts"] += 1
            episodes += eps
        for key, value in rollout_sums(episodes).items():
            counters[key] += value
        counters["tasks"] = add_task_sums(counters.get("tasks", {}), task_sums(episodes))  # multi-task envs
        counters.update(env_steps=collector.total_env_steps, weights_updates=int(self.weights.meta.get("updates", 0)),
                        waited_s=round(self.waited, 2), time=time.time())
        write_counters(self.paths, self.collector_id, counters)

    def finish(self, stop: StopFlag | None) -> None:
        """The final counters, with why the collector stopped."""
        self.counters.update(env_steps=self.collector.total_env_steps, time=time.time(),
                             state=f"stopped by {stop.signal}" if stop else "finished")
        write_counters(self.paths, self.collector_id, self.counters)
