"""The learner of an asynchronous run (`icrl learn RUN_DIR ...`; the protocol is icrl.asynchronous.protocol).

It is `icrl train`'s own loop (icrl.run.loop.fit, with its setup, epochs, evaluations, checkpoints, resuming and
finish) whose data source is the collector processes' files (`CollectorFiles`) instead of envs of its own: an
epoch is `updates_per_epoch` updates on batches from the shared replay, throttled so that updates <= utd x env
steps stored, with the weights published for the collectors as they go.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import gymnasium as gym

from icrl.agent.exploration import Exploration
from icrl.agent.learner import Learner
from icrl.asynchronous.protocol import AsyncPaths, RunCounters, StopFlag, counter_limit, publish_weights
from icrl.config import ConfigError, ExperimentConfig
from icrl.config.errors import flag
from icrl.data import DiskReplay
from icrl.fileio import write_text_atomic
from icrl.parallel import Replicas
from icrl.run.build import build_run
from icrl.run.callbacks import Callbacks
from icrl.run.checkpoint import list_checkpoints
from icrl.run.evaluate import add_task_sums, metrics_from_task_sums
from icrl.run.loop import fit
from icrl.run.reporting import Timer, say
from icrl.run.rundir import run_path
from icrl.types import ActionSpec


def learn(cfg: ExperimentConfig, *, stop: StopFlag | None = None) -> dict:
    """Train from the collectors' rollouts in cfg.run.run_dir; returns the final evaluation (or {} when
    stopped early). `cfg.asynchronous.utd`: max updates per stored env step (default updates_per_epoch /
    steps_per_epoch); `cfg.asynchronous.publish_every`: publish weights every this many updates (default
    updates_per_epoch)."""
    return fit(build_run(cfg, kind=CollectorFiles, stop=stop), Callbacks())


def update_ratio(cfg: ExperimentConfig, utd: float | None) -> float:
    """The max updates per stored env step: `utd`, by default the synchronous run's ratio."""
    upe = cfg.epoch_updates  # --updates-per-epoch (`CollectorFiles.prepare` sets replay_ratio's count where unset)
    if upe < 1:
        raise ConfigError(f"icrl learn needs {flag('updates_per_epoch')} >= 1 (its epochs are counted in updates)")
    ratio = upe / cfg.schedule.steps_per_epoch if utd is None else float(utd)
    if ratio <= 0:
        raise ConfigError(f"{flag('utd')} {utd} must be positive (max updates per env step stored)")
    return ratio


class NoExploration:
    """The learner does not explore; its checkpoints store an empty exploration state."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Nothing to restore: each collector keeps its own exploration."""


class CollectorFiles:
    """The data source of `icrl learn`: the rollouts any number of `icrl collect` processes store in the run's
    replay, counted by their counter files (`RunCounters`); the learner's weights go back to them as a file."""

    acts_here: ClassVar[bool] = False

    def __init__(self, *, cfg: ExperimentConfig, replicas: Replicas, seed: int, learner: Learner, replay: DiskReplay,
                 spec: ActionSpec, venv: gym.vector.VectorEnv | None, offline_epochs: int, stop: Any = None) -> None:
        self.cfg, self.agent, self.learner, self.stop = cfg, learner.agent, learner, stop
        self.paths = AsyncPaths(run_path(cfg))
        self.paths.make_collectors_dir()
        self.upe = cfg.epoch_updates  # updates per epoch
        self.ratio = update_ratio(cfg, cfg.asynchronous.utd)
        self.publish_every = cfg.asynchronous.publish_every or self.upe
        # only to log the collectors' ε: each anneals over its own steps per env copy (icrl.run.sources.train_policy)
        self.schedule = Exploration(cfg.explore, spec, cfg.env.parallel_envs, seed=0)
        self.collector = self.counts = RunCounters(self.paths, counter_limit(cfg)).read()
        self.exploration = NoExploration()
        # --offline-updates come on top of the ratio: they may run before any env step is stored
        self.total_updates = cfg.replay.offline_updates + math.floor(self.ratio * cfg.schedule.env_steps)
        self.published = self.target = 0
        self.steps0, self.time0, self.sums0 = 0, 0.0, dict[str, Any]()  # at the epoch's start

    @staticmethod
    def prepare(cfg: ExperimentConfig, world_size: int) -> ExperimentConfig:
        """Epochs counted in updates: replay_ratio's count for full windows where none is fixed; one process."""
        if world_size > 1:
            raise ConfigError("icrl learn runs in one process: start more `icrl collect` processes instead")
        run_dir = run_path(cfg) if cfg.run.run_dir is not None else None
        if (cfg.run.resume and run_dir is not None and list_checkpoints(run_dir)
                and not AsyncPaths(run_dir).root.is_dir()):
            raise ConfigError(f"{run_dir} is a run of `icrl train` (icrl.train): "
                              "its checkpoints count the env steps of "
                              "its own envs, not collectors', so `icrl learn` cannot continue it; resume it as it was "
                              "started, with `icrl train` (icrl.train)")
        cfg = cfg.replace(updates_per_epoch=cfg.epoch_updates).validate()
        update_ratio(cfg, cfg.asynchronous.utd)  # a bad --utd is refused before anything is written
        return cfg

    @property
    def interrupted(self) -> bool:
        return bool(self.stop) and self.learner.updates < self.target

    def env_steps(self) -> int:
        return self.counts.env_steps

    def num_epochs(self) -> int:
        return math.ceil(self.total_updates / self.upe)

    def start(self) -> None:
        """Clear an old finish marker and publish the weights: collectors may start acting."""
        self.paths.done.unlink(missing_ok=True)
        self.publish()
        say(f"icrl learn: {self.total_updates:,} updates (<= {self.ratio:g} per env step stored); start collectors "
            f"with `icrl collect {self.paths.run_dir} --collector-id K`")

    def collect(self, epoch: int, timer: Timer) -> None:
        """Nothing to act: the collectors store their rollouts at any time. The epoch starts its counts."""
        self.steps0, self.time0 = self.counts.env_steps, time.perf_counter()
        self.sums0 = {**self.counts.sums, "tasks": self.counts.tasks}

    def updates(self, epoch: int, timer: Timer) -> Iterator[int]:
        """Up to the epoch's updates (or `stop`), waiting whenever ahead of the data. Weights are published every
        `publish_every` updates and before each wait."""
        learner, every = self.learner, self.publish_every
        self.target = min(epoch * self.upe, self.total_updates)
        while learner.updates < self.target and not self.stop:
            n = min(self.target, self.allowed()) - learner.updates
            if n <= 0:  # ahead of the data: wait for the collectors
                if self.published < learner.updates:  # with the newest weights (see collect's max_lead)
                    self.publish()
                with timer("wait"):
                    time.sleep(0.05)
                    self.counts.read()
                continue
            yield min(n, every - learner.updates % every)
            if learner.updates % every == 0 or learner.updates == self.total_updates:
                self.publish()
            self.counts.read()

    def allowed(self) -> int:
        """The updates the stored data allows now."""
        counts, cfg = self.counts, self.cfg
        if counts.env_steps >= cfg.schedule.env_steps:  # collection is over: finish the run's updates
            return self.total_updates
        if counts.env_steps < cfg.schedule.start_updates_after or counts.rollouts == 0:
            return cfg.replay.offline_updates
        return min(self.total_updates, cfg.replay.offline_updates + math.floor(self.ratio * counts.stored_env_steps))

    def publish(self) -> None:
        self.published = publish_weights(self.agent, self.paths, self.learner.updates, self.ratio)

    def row(self, timer: Timer) -> dict[str, Any]:
        """The collectors' rollouts stored since the epoch began (with per-task metrics of multi-task envs)."""
        counts, sums0 = self.counts, self.sums0
        done = {k: counts.sums[k] - sums0[k] for k in counts.sums}
        tasks = metrics_from_task_sums(add_task_sums(counts.tasks, sums0["tasks"], sign=-1.0))
        return {
            "train/return_mean": done["return_sum"] / done["rollouts"] if done["rollouts"] else None,
            "train/success_rate": done["success_sum"] / done["success_n"] if done["success_n"] else None,
            "train/epsilon": self.epsilon(),
            "async/stored_env_steps": counts.stored_env_steps, "async/utd": self.ratio,
            "async/collectors": counts.collectors, "time/wait_s": timer["wait"],
            "time/env_steps_per_s": (counts.env_steps - self.steps0) / max(time.perf_counter() - self.time0, 1e-9),
            **{f"train/{k}": v for k, v in tasks.items()},
        }

    def epsilon(self) -> float:
        """The collectors' annealed ε (before each env's scale), averaged over the collectors: each follows its
        own env steps, as `train`'s collector does, not the steps of all collectors together."""
        steps = self.counts.collector_env_steps or [0]
        return sum(self.schedule.level(n) for n in steps) / len(steps)

    def resumed(self, epoch: int, state: dict[str, Any]) -> None:
        """Nothing to restore: the collectors' counter files hold the env steps."""

    def finish(self, done: bool) -> None:
        """Publish the last weights; mark the run done (collectors stop at the marker), or say why it stopped."""
        self.publish()
        if done:
            write_text_atomic(self.paths.done, json.dumps({"updates": self.learner.updates,
                                                           "env_steps": self.counts.env_steps}))
        else:
            say(f"icrl learn: stopped by {self.stop.signal} after {self.learner.updates:,} updates; "
                "continue with --resume")
