"""Building a run: the one setup (`build_run`) of every run, whatever its data source (icrl.run.sources), and the
parts it builds from the config: envs, agent (`icrl.agent.model.build_agent`), learner, replay and its loader of
training batches. `build_run` is the setup of `icrl train` (`icrl.train`), of each data-parallel rank and of
`icrl learn`, in the order that fixes its seeds, refusals and first writes.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import gymnasium as gym
import torch

from icrl.agent.learner import Learner
from icrl.agent.model import Agent, build_agent
from icrl.config import ConfigError, ExperimentConfig, ReplayConfig
from icrl.config.errors import flag, setting
from icrl.config.resolve import kept_on_resume, resolve
from icrl.config.validation import field_errors
from icrl.data import DiskReplay, ReplayLoader, make_loader
from icrl.data.offline import prepare_offline
from icrl.data.relabel import HindsightRelabeler
from icrl.device import resolve_device
from icrl.envs import Collector
from icrl.envs.make import make_run_envs, steps_copies_at_once, task_defaults
from icrl.envs.user import resolve_env
from icrl.envs.wrapper import agent_obs_space
from icrl.fileio import check_inside
from icrl.parallel import Replicas, init_replicas
from icrl.run.reporting import say, say_literally
from icrl.run.rundir import (
    RunLock,
    check_resume_target,
    check_run_dir_free,
    recorded_config,
    run_path,
    take_run_dir,
    with_run_dir,
)
from icrl.run.sources import DataSource, SourceKind
from icrl.seeding import derive_seed, seed_process
from icrl.spaces_json import venv_spaces_record
from icrl.types import ActionSpec

T = TypeVar("T")


MAX_BATCHED_EVAL_ENVS = 128
"""Evaluation copies of a batched task at most: acting's env steps per second stop growing near 128 copies
(docs/results.md, acting), while the KV cache grows with every copy."""


def eval_env_copies(cfg: ExperimentConfig, factories: Sequence[Any] | None = None) -> int:
    """Env copies for the run's evaluations: one per rollout (up to `MAX_BATCHED_EVAL_ENVS`) where one env steps
    every copy at once (`icrl.envs.make.steps_copies_at_once`: a batched built-in task or a family's vector form
    such as "xland/"; a copy costs a row of arrays, and one wide acting step takes many more env steps per second
    than several narrow ones: T-Maze 1,000's evaluations were a fifth of its wall time at 8 copies), else the
    run's `parallel_envs` (a copy of a user's env may hold a simulator). Either form serves rollouts of one
    episode or several (`episodes_per_rollout`, `rollout_horizon`: make_vector_env passes them on)."""
    e = cfg.env
    batched = not factories and steps_copies_at_once(e.env, e.kwargs)
    return max(e.parallel_envs, min(cfg.eval.eval_rollouts, MAX_BATCHED_EVAL_ENVS)) if batched else e.parallel_envs


def open_replay(cfg: ExperimentConfig, run_dir: Path) -> DiskReplay:
    """The run's disk replay, RUN_DIR/replay (a symlink there that leads out is refused: eviction deletes files).
    The FIFO part skips fsync: the atomic rename already keeps readers from torn files after a crash; fsync would
    only add power-loss durability for data that is cheap to collect again. Bad files are reported on screen."""
    root = check_inside(run_dir, Path(run_dir) / "replay")
    return DiskReplay(root, capacity_timesteps=cfg.replay.replay_capacity, fsync=False, log=say_literally)


def with_task_defaults(cfg: ExperimentConfig, factory: Any = None) -> ExperimentConfig:
    """`cfg` resolved (`icrl.config.resolve`) with what its task recommends (asked of `factory`, the user's env
    class or factory, when given) and, on --resume, the exploration schedule and warm-up the run recorded; says
    when those stay the run's under a new budget (the run's plan is said by its data source: icrl.run.loop.Plan)."""
    recorded = recorded_config(cfg)
    on_cuda = cfg.run.device.startswith("cuda") or (cfg.run.device == "auto" and resolve_device("auto").type == "cuda")
    out = resolve(cfg, task_defaults(cfg.env.env, cfg.env.kwargs, factory), recorded, on_cuda=on_cuda)
    s = out.schedule
    if recorded is not None and recorded.schedule.total_env_steps not in (None, s.total_env_steps):
        kept = kept_on_resume(cfg, recorded)  # what stays the run's under the new budget
        if kept.keys() - {"entropy_coeff"}:  # the schedule's fields: the bonus never derives from the budget
            say(f"icrl: --resume: {recorded.schedule.total_env_steps:,} -> {s.env_steps:,} env steps; the exploration "
                f"schedule and the warm-up stay the run's (eps_anneal_steps {kept.get('eps_anneal_steps', 'as set')}, "
                f"warmup_updates {kept.get('warmup_updates', 'as set')}), not derived again from the new budget")
    return out


def make_relabeler(r: ReplayConfig, venv: gym.vector.VectorEnv) -> HindsightRelabeler | None:
    """The sample-time hindsight relabeler `--relabel` asks for; the env must report achieved goals."""
    if r.relabel == "none":
        return None
    space = venv.single_observation_space
    if not isinstance(space, gym.spaces.Dict) or "achieved" not in space.spaces:
        raise ConfigError(
            f"{flag('relabel')} {r.relabel}: this env does not report the goals it achieved (docs/CONTRACTS.md, "
            f"goal-conditioned tasks such as mazerunner or package_delivery); use {setting('relabel', 'none')}"
        )
    return HindsightRelabeler(r.relabel, rare_goals=r.relabel_rare_goals)


@dataclass(frozen=True)
class Run:
    """One run as `build_run` leaves it for the training loop (icrl.run.loop.fit): the resolved config, this
    process, the learner, the data source and what evaluation, checkpoints and the finish need. Built once,
    complete (the data source from the other parts first), never changed."""

    cfg: ExperimentConfig  # resolved: what config.json records
    replicas: Replicas  # this process among the run's: one, or a data-parallel rank (its device, the collectives)
    seed: int  # this rank's seed for its envs, exploration and sampler (the run's seed on rank 0)
    learner: Learner  # with the agent it trains (`agent`)
    replay: DiskReplay
    loader: Callable[[int], ReplayLoader]  # the train batches from the replay, given their seed
    spec: ActionSpec
    spaces: dict[str, Any]  # RUN_DIR/spaces.json and every checkpoint
    lock: RunLock | None  # rank 0's
    venv: gym.vector.VectorEnv | None  # the envs this process acts in; None where collector processes act
    eval_collector: Collector | None  # rank 0's
    offline_epochs: int  # --offline-updates: epochs without env steps
    source: DataSource  # where the rollouts come from
    env: Any  # the user's env (icrl.train's env=) for the callbacks; None: built by name

    @property
    def agent(self) -> Agent:
        return self.learner.agent

    @property
    def run_dir(self) -> Path:
        return run_path(self.cfg)

    def close(self) -> None:
        """No orphaned env processes, the data-parallel wrapper freed, and the process group left."""
        for venv in (self.venv, None if self.eval_collector is None else self.eval_collector.venv):
            if venv is not None:
                venv.close()
        self.learner.release_wrapper()
        self.replicas.close()


def check_config_type(cfg: Any) -> None:
    """`icrl.train` takes an ExperimentConfig: a run dir's path or a dict of fields would otherwise fail deep
    inside with an AttributeError; TypeError naming what it takes and how to build one instead."""
    if cfg is None or isinstance(cfg, ExperimentConfig):
        return
    if isinstance(cfg, (str, Path)):
        hint = ("to continue a run, pass ExperimentConfig.from_json(Path(RUN_DIR, 'config.json').read_text())"
                ".replace(resume=True)")
    else:
        hint = "build it with ExperimentConfig().replace(**fields)" if isinstance(cfg, dict) else "see icrl.config"
    raise TypeError(f"icrl.train(cfg, env=...) takes an icrl.config.ExperimentConfig (or None for the defaults), "
                    f"got {type(cfg).__name__} {cfg!r:.60}; {hint}")


def build_run(cfg: ExperimentConfig | None, env: Any = None, *, kind: SourceKind, stop: Any = None) -> Run:
    """The one setup of every run (`icrl train`, each data-parallel rank, `icrl learn`): validate `cfg` (with
    `env`, see `icrl.train`), refuse what cannot run, seed, and build the run with a data source of `kind`.

    The order matters: every refusal comes before anything is written (the envs are built, and the relabeler
    checked, before the run dir is created), the run lock is taken before the first write, and the RNG is
    seeded before the first draw.
    """
    check_config_type(cfg)
    cfg = cfg or ExperimentConfig()
    source = resolve_env(cfg.env.env if env is None else env)  # (cfg.env.env may hold an env object until here)
    cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, **source.env_fields(cfg.env.env_kwargs)))
    errors = field_errors(cfg)  # before any value is computed with (a budget of "lots"...)
    if errors:
        raise ConfigError(errors[0] + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""))
    cfg = with_task_defaults(cfg, source.factories[0] if source.factories else None).validate()
    replicas = init_replicas(cfg.run.device)  # one process, or this rank of a data-parallel run
    cfg = kind.prepare(cfg, replicas.world_size)  # the data source's own refusals and settings
    cfg = with_run_dir(cfg, stamp=replicas.max([int(time.time())])[0])  # unset: a new folder, the same on every rank
    check_resume_target(cfg)
    check_run_dir_free(cfg)  # before anything is created or written
    replicas.barrier()  # every rank has checked the run dir before any of them writes to it
    seed_process(cfg.run.seed, replicas.rank, cfg.run.threads)
    with closed_on_error() as opened:  # what to close if a later step raises (bad offline data, a full disk...)
        return _build(cfg, replicas, source.factories, source.rebuild, kind, stop, opened)


def _build(cfg: ExperimentConfig, replicas: Replicas, factories: Sequence[Any] | None, rebuild: str,
           kind: SourceKind, stop: Any, opened: Callable[[Any], Any]) -> Run:
    """`build_run` from the envs on; `opened` closes what it is given should a later step raise."""
    acts_here = kind.acts_here
    e, main, device = cfg.env, replicas.is_main, replicas.device
    venv = opened(make_run_envs(e, e.parallel_envs, asynchronous=e.async_envs, factories=factories)
                  if acts_here else None)
    eval_venv = opened(make_run_envs(e, eval_env_copies(cfg, factories), asynchronous=e.async_envs,
                                     factories=factories) if main else None)
    probe = venv if venv is not None else eval_venv  # collector processes act elsewhere: the learner is rank 0
    assert probe is not None
    spaces = venv_spaces_record(probe, e.env, e.kwargs, rebuild)
    spec = ActionSpec.from_space(probe.single_action_space)
    cfg = resolve(cfg, discrete=spec.kind == "discrete")  # the entropy bonus reads the action space, known now
    relabeler = make_relabeler(cfg.replay, probe)  # before the run dir exists: a wrong --relabel leaves nothing
    lock = opened(take_run_dir(cfg, main))
    eval_seed = derive_seed(cfg.run.seed, "eval-envs")
    eval_collector = None if eval_venv is None else Collector(eval_venv, spec, seed=eval_seed)
    agent = build_agent(cfg, agent_obs_space(probe), spec, device)
    learner = Learner(agent, cfg, device, replicas)  # data parallel: rank 0's initial weights on every rank
    replay = open_replay(cfg, run_path(cfg))
    # --offline-data: loaded once into replay/protected (rank 0); --offline-updates: epochs without env steps
    offline_epochs = prepare_offline(cfg, replay.root, log=say, import_data=main)
    replicas.barrier()  # the offline data is on disk before any rank samples
    # collector processes store rollouts at any time: the sampler lists the replay on its own
    loader = partial(make_train_loader, cfg, replay.root, spec, device, obs_space=agent_obs_space(probe),
                     transform=relabeler, **({} if acts_here else {"auto_refresh": True}))
    seed = replicas.rank_seed(cfg.run.seed)
    source = kind(cfg=cfg, replicas=replicas, seed=seed, learner=learner, replay=replay, spec=spec, venv=venv,
                  offline_epochs=offline_epochs, stop=stop)
    return Run(cfg=cfg, replicas=replicas, seed=seed, learner=learner, replay=replay, loader=loader, spec=spec,
               spaces=spaces, lock=lock, venv=venv, eval_collector=eval_collector, offline_epochs=offline_epochs,
               source=source, env=factories[0] if factories else None)


@contextmanager
def closed_on_error() -> Iterator[Callable[[T], T]]:
    """`with closed_on_error() as opened:` a run's setup; `opened(thing)` returns `thing` and, should the block
    raise, closes it (a RunLock: released), newest first: no env processes left behind, and the run dir free
    again for the next attempt."""
    things: list[Any] = []

    def opened(thing: T) -> T:
        things.append(thing)
        return thing

    try:
        yield opened
    except BaseException:
        for thing in reversed(things):
            if isinstance(thing, RunLock):
                thing.release()
            elif thing is not None:
                thing.close()
        raise


# ----------------------------------------------------------------------------------- the training batches
def _shape(key: str, space: gym.Space) -> tuple[int, ...]:
    """The shape of one of the agent's observation entries (Boxes, TimestepWrapper's; a Box always has one)."""
    if space.shape is None:
        raise TypeError(f"observation entry {key!r} is a {type(space).__name__} without a shape, not a Box")
    return tuple(space.shape)


def make_train_loader(
    cfg: ExperimentConfig, replay_root: Path, spec: ActionSpec, device: torch.device, seed: int,
    obs_space: gym.spaces.Dict | None = None, **kwargs
) -> ReplayLoader:
    """The learner's endless batches from the replay (`train` and the asynchronous learner share it);
    files whose observations do not fit `obs_space` (the agent's) are skipped with a warning; `kwargs` go to
    `make_loader` (e.g. `auto_refresh`)."""
    if obs_space is not None:
        kwargs["obs_shapes"] = {key: _shape(key, space) for key, space in obs_space.spaces.items()}
    return make_loader(
        replay_root,
        batch_size=cfg.optim.batch_size,
        max_seq_len=cfg.model.training_window,
        action_spec=spec,
        seed=seed,
        num_workers=cfg.replay.num_workers,
        pin_memory=device.type == "cuda",
        offline_fraction=cfg.replay.offline_fraction,
        **kwargs,
    )


class LazyLoader:
    """The train loader, opened at the first update rather than at the start: the replay may still be empty
    then, and a loader's sample stream starts when it is opened."""

    def __init__(self, open_loader: Callable[[], ReplayLoader]) -> None:
        self._open = open_loader
        self.loader: ReplayLoader | None = None

    def get(self) -> ReplayLoader:
        if self.loader is None:
            self.loader = self._open()
        return self.loader

    def refresh(self) -> None:
        """Make newly written rollouts visible now (not at a timing-dependent moment); no-op before opening."""
        if self.loader is not None:
            self.loader.refresh()

    def close(self) -> None:
        if self.loader is not None:
            self.loader.close()
