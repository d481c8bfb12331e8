"""Where a run's rollouts come from (docs/design.md §8): the `DataSource` protocol the training loop asks, and the
in-process source of `icrl train` and of each data-parallel rank, `OwnEnvs` (this process's envs, explored by the
learner's agent). The other source, the files of `icrl collect` processes, is `icrl.asynchronous.learn.CollectorFiles`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, ClassVar, Protocol

import gymnasium as gym
import torch

from icrl.agent.exploration import Exploration
from icrl.agent.learner import Learner
from icrl.agent.model import Agent, AgentPolicy
from icrl.config import ConfigError, ExperimentConfig
from icrl.config.errors import flag
from icrl.data import DiskReplay
from icrl.envs import Collector
from icrl.fileio import write_text_atomic
from icrl.parallel import Replicas
from icrl.run.evaluate import TASK_METRIC_PREFIXES, train_stats
from icrl.run.hints import hint_nothing_stored, hint_short_context
from icrl.run.reporting import Timer, say
from icrl.run.rundir import run_path
from icrl.run.schedule import Plan, UpdateBudget
from icrl.seeding import derive_seed
from icrl.types import ActionSpec, EpisodeStats, Rollout


class DataSource(Protocol):
    """Where a run's rollouts come from (docs/design.md §8). The one training loop (icrl.run.loop.fit) asks only
    this of it; everything else (setup, the epoch, evaluation, checkpoints, resuming, the finish) is the same for
    both kinds: this process's own envs (`OwnEnvs`: `icrl train` and each data-parallel rank)
    and the files of collector processes (`icrl.asynchronous.learn.CollectorFiles`: `icrl learn`)."""

    # a checkpoint's "collector" state: the env-step counter (total_env_steps, state_dict, load_state_dict)
    collector: Any
    exploration: Any  # a checkpoint's "exploration" state (state_dict, load_state_dict)

    @property
    def interrupted(self) -> bool:
        """Stopped (a signal) before the epoch's updates were all made: the loop keeps them and ends the run."""

    def env_steps(self) -> int:
        """The run's env steps so far: every rank's, or every collector's."""

    def num_epochs(self) -> int:
        """The run's epochs (resumes included)."""

    def start(self) -> None:
        """Rank 0, once the run's files are written: say what the run does; collectors may start acting."""

    def collect(self, epoch: int, timer: Timer) -> None:
        """The epoch's env steps into the replay (collector processes store theirs whenever they finish them)."""

    def updates(self, epoch: int, timer: Timer) -> Iterator[int]:
        """The epoch's updates as the data allows them: each count is made before the next is asked for."""

    def row(self, timer: Timer) -> dict[str, Any]:
        """The data's columns of the epoch's train row (every rank takes part)."""

    def resumed(self, epoch: int, state: dict[str, Any]) -> None:
        """A checkpoint of `epoch` (its state.json, `state`) was loaded."""

    def finish(self, done: bool) -> None:
        """Rank 0, at the run's end: `done`, or interrupted."""


class SourceKind(Protocol):
    """A data source's class, as `build_run` uses it."""

    acts_here: bool  # this process acts in envs of its own: `build_run` builds them before the run dir is taken

    def prepare(self, cfg: ExperimentConfig, world_size: int) -> ExperimentConfig:
        """`cfg` with the source's own settings, or ConfigError: before anything is written."""

    def __call__(self, *, cfg: ExperimentConfig, replicas: Replicas, seed: int, learner: Learner, replay: DiskReplay,
                 spec: ActionSpec, venv: gym.vector.VectorEnv | None, offline_epochs: int, stop: Any) -> DataSource:
        """The data source of a run, built last from its parts (`icrl.run.build.Run`); `stop` (icrl learn's
        SIGTERM / SIGINT flag) is truthy once the source should stop."""


def train_policy(cfg: ExperimentConfig, agent: Agent, collector: Collector, spec: ActionSpec, seed: int,
                 device: torch.device) -> tuple[Exploration, AgentPolicy]:
    """The exploring policy that collects training data, with its exploration schedule. The schedule
    follows `collector`'s own env steps: ε anneals per env copy over that copy's steps (docs/design.md §10)."""
    n = cfg.env.parallel_envs
    exploration = Exploration(cfg.explore, spec, n, seed=derive_seed(seed, "explore"))
    policy = AgentPolicy(agent, n, greedy=False, exploration=exploration, device=device,
                         env_steps=lambda: collector.total_env_steps, sample=cfg.explore.train_actions == "sample",
                         cuda_graphs=cfg.optim.cuda_graphs)
    return exploration, policy


class OwnEnvs:
    """The data source of `icrl train` and of each data-parallel rank: this process's own envs, explored by the
    learner's agent; each epoch's finished rollouts are written into the shared replay, the updates follow the
    data collected (`UpdateBudget`)."""

    acts_here: ClassVar[bool] = True
    interrupted = False  # Ctrl-C raises instead

    def __init__(self, *, cfg: ExperimentConfig, replicas: Replicas, seed: int, learner: Learner, replay: DiskReplay,
                 spec: ActionSpec, venv: gym.vector.VectorEnv | None, offline_epochs: int, stop: Any = None) -> None:
        assert venv is not None  # build_run builds the envs of a source that acts here
        self.cfg, self.replicas, self.replay, self.agent, self.seed = cfg, replicas, replay, learner.agent, seed
        self.offline_epochs, self.steps_per_rank = offline_epochs, cfg.schedule.steps_per_epoch // replicas.world_size
        self.collector = Collector(venv, spec, chunk_len=cfg.env.chunk_len, seed=derive_seed(seed, "train-envs"))
        self.exploration, self.policy = train_policy(cfg, learner.agent, self.collector, spec, seed, replicas.device)
        self.budget = UpdateBudget(cfg, replicas.world_size)
        self.plan = Plan.of(cfg, replicas.world_size, learner)
        self.episodes: list[EpisodeStats] = []
        self.said: set[str] = set()  # the hints said so far (`hint`): each only once
        self.steps0, self.policy_s0 = 0, 0.0  # at the epoch's start
        self.online_epochs = 0  # the online epochs this process collected: a resumed run's envs start new episodes

    @staticmethod
    def prepare(cfg: ExperimentConfig, world_size: int) -> ExperimentConfig:
        if cfg.run.resume and cfg.run.run_dir is not None and (run_path(cfg) / "async").is_dir():
            raise ConfigError(f"{run_path(cfg)} is a run of `icrl learn` and its collectors: its checkpoints count the "
                              "collectors' env steps, so `icrl train` cannot continue it; resume it as it was started, "
                              "with `icrl learn` and its `icrl collect` processes")
        if cfg.schedule.steps_per_epoch % world_size:
            raise ConfigError(
                f"{flag('steps_per_epoch')} {cfg.schedule.steps_per_epoch} does not split evenly over {world_size} "
                f"processes: pass a multiple of {world_size}, e.g. "
                f"{cfg.schedule.steps_per_epoch // world_size * world_size or world_size}"
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
        return self.replicas.world_size * self.collector.total_env_steps

    def num_epochs(self) -> int:
        return max(1, self.offline_epochs + self.cfg.schedule.env_steps // self.cfg.schedule.steps_per_epoch)

    def collect(self, epoch: int, timer: Timer) -> None:
        """This rank's env steps of the epoch (none in an --offline-updates epoch) with the exploring policy,
        written into the replay, visible to every rank's sampler once all ranks wrote. Eval mode once for the
        whole phase (AgentPolicy.act would switch too, once); Learner.update switches back."""
        self.steps0, self.policy_s0 = self.env_steps(), self.policy.seconds
        with timer("collect"):  # the acting loop: policy + env steps + collector bookkeeping
            self.agent.eval()
            rollouts, self.episodes = self.collector.collect(
                self.policy, self.steps_per_rank if epoch > self.offline_epochs else 0)
            self.online_epochs += epoch > self.offline_epochs
        with timer("replay_write"):
            for rollout in rollouts:
                self.replay.write(rollout)
            self.replicas.barrier()  # every rank's rollouts are on disk before any rank lists the replay
        self.hint(epoch, rollouts)

    def hint(self, epoch: int, rollouts: list[Rollout]) -> None:
        """Rank 0 says the hints that apply after `epoch` (icrl.run.hints), each once."""
        if not self.replicas.is_main:
            return
        if ("stored" not in self.said and not rollouts and epoch > self.offline_epochs
                and self.replay.num_rollouts() == 0
                and hint_nothing_stored(self.cfg, epoch, self.online_epochs * self.plan.steps_per_env,
                                        last=epoch == self.num_epochs())):
            self.said.add("stored")
        if "context" not in self.said and hint_short_context(self.cfg, rollouts):
            self.said.add("context")

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
            "train/epsilon": self.exploration.level(self.collector.total_env_steps),
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
            self.collector.total_env_steps = self.collector.total_env_steps * saved_world // world
        self.collector.seed = derive_seed(self.seed, "train-envs", "resume", epoch)

    def start(self) -> None:
        """Say the plan, once (`Plan.line`), and record it beside the config (RUN_DIR/plan.json)."""
        if self.replicas.is_main:
            say(self.plan.line())
            write_text_atomic(run_path(self.cfg) / "plan.json", json.dumps(self.plan.record(), indent=1) + "\n")

    def finish(self, done: bool) -> None:
        """Nothing to hand over: the envs close with the run."""
