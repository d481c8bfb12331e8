"""The epoch loop (DESIGN §8): collect -> write rollouts -> sample -> update -> evaluate -> log."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from safetensors.torch import save_model

from icrl.agent.exploration import Exploration
from icrl.agent.learner import Learner
from icrl.agent.model import Agent, AgentPolicy
from icrl.config import ConfigError, ExperimentConfig, TrainConfig
from icrl.data import DiskReplay, ReplayLoader, make_loader
from icrl.data.offline import prepare_offline
from icrl.data.relabel import HindsightRelabeler
from icrl.envs import Collector, make_vector_env
from icrl.envs.make import task_exploration
from icrl.envs.user import apply_env
from icrl.fileio import write_text_atomic
from icrl.guards import assert_finite_weights
from icrl.run.checkpoint import (
    list_checkpoints,
    load_latest_checkpoint,
    save_checkpoint,
    set_aside,
)
from icrl.run.distributed import Replicas, init_replicas
from icrl.run.loggers import MultiLogger, make_loggers, progress_bar, progress_line, say
from icrl.run.plot import plot_learning_curves
from icrl.run.runlock import RunLock, check_not_locked, check_run_dir_usable
from icrl.seeding import derive_seed, seed_everything
from icrl.spaces_json import venv_spaces_record, write_spaces
from icrl.types import ActionSpec, EpisodeStats


def with_task_defaults(cfg: ExperimentConfig, factory: Any = None) -> ExperimentConfig:
    """`cfg` with its unset exploration fields filled from the task's recommendation (asked of `factory`, the
    user's env class or factory, when given), else the library defaults (`ExploreConfig.resolve`), so
    config.json records exactly what ran."""
    rec = task_exploration(cfg.env.env, cfg.env.kwargs, factory) if cfg.explore.task_recommendation else {}
    return dataclasses.replace(cfg, explore=cfg.explore.resolve(rec))


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def summarize_episodes(episodes: list[EpisodeStats]) -> dict[str, float | None | list]:
    """Average over rollouts, not episodes, so short episodes are not over-weighted (DESIGN §10).

    A rollout's return sums its episodes; its success is that of its last episode (after adapting).
    The `*_by_episode` lists give the adaptation curve of multi-episode tasks.
    """
    eps = _group_rollouts(episodes)
    if not eps:
        return {"return_mean": None, "success_rate": None, "rollouts": 0}
    returns = [sum(e.ret for e in r) for r in eps]
    successes = [r[-1].success for r in eps if r[-1].success is not None]
    by_index: dict[int, list[EpisodeStats]] = defaultdict(list)
    for r in eps:
        for e in r:
            by_index[e.episode_index].append(e)
    out: dict = {
        "return_mean": float(np.mean(returns)),
        "return_std": float(np.std(returns)),
        "success_rate": float(np.mean(successes)) if successes else None,
        "rollouts": len(eps),
        "episode_length_mean": float(np.mean([e.length for e in episodes])),
    }
    if len(by_index) > 1:
        out["return_by_episode"] = [float(np.mean([e.ret for e in by_index[i]])) for i in sorted(by_index)]
        succ = [[e.success for e in by_index[i] if e.success is not None] for i in sorted(by_index)]
        if all(succ):
            out["success_by_episode"] = [float(np.mean(s)) for s in succ]
    return out


def _group_rollouts(episodes: list[EpisodeStats]) -> list[list[EpisodeStats]]:
    """Episodes grouped by rollout, each group in episode order."""
    rollouts: dict[tuple[int, int], list[EpisodeStats]] = defaultdict(list)
    for ep in episodes:
        rollouts[(ep.env_index, ep.rollout_id)].append(ep)
    return [sorted(r, key=lambda e: e.episode_index) for r in rollouts.values()]


def train_stats_all_ranks(episodes: list[EpisodeStats], replicas: Replicas) -> dict[str, float | None]:
    """`summarize_episodes`' return and success rate over the rollouts every rank finished."""
    eps = _group_rollouts(episodes)
    succ = [r[-1].success for r in eps if r[-1].success is not None]
    n, ret, n_succ, succ_sum = replicas.sum([len(eps), sum(sum(e.ret for e in r) for r in eps), len(succ), sum(succ)])
    return {"return_mean": ret / n if n else None, "success_rate": succ_sum / n_succ if n_succ else None}


# Fields that may change when a run is resumed: the flag itself, how far to train, and the run-only settings
# that say where and how this process runs but not what it learns (the folder's spelling or location, the
# device, threads, workers, logging, checkpoint retention). The rest is the run's learning config.
RESUMABLE_CHANGES = (
    "train.resume", "train.total_env_steps", "train.run_dir", "train.device", "train.threads", "train.num_workers",
    "train.log_backends", "train.log_every", "train.keep_checkpoints", "train.compile", "env.async_envs",
    "env.eval_max_steps",
)


def _flatten(tree: dict, prefix: str = "") -> dict[str, object]:
    from icrl.dicts import flatten

    return flatten(tree, prefix)


def holds_run(run_dir: Path) -> bool:
    """True when `run_dir` already holds a run: checkpoints or a non-empty metrics.jsonl."""
    metrics = run_dir / "metrics.jsonl"
    return bool(list_checkpoints(run_dir)) or (metrics.is_file() and metrics.stat().st_size > 0)


def check_run_dir(cfg: ExperimentConfig) -> None:
    """Refuse to overwrite an existing run without --resume, and to resume one with a different config."""
    run_dir = Path(cfg.train.run_dir)
    if not cfg.train.resume:
        if holds_run(run_dir):
            raise ConfigError(
                f"--run-dir {run_dir} already holds a run (checkpoints or metrics.jsonl): pass --resume to "
                "continue it, or choose another --run-dir"
            )
        return
    path = run_dir / "config.json"
    if not path.is_file():
        return
    try:
        old = json.loads(ExperimentConfig.from_json(path.read_text(encoding="utf-8")).to_json())
    except (ValueError, TypeError) as e:
        raise ConfigError(f"--resume: cannot read the run's config {path} ({e}); choose another --run-dir") from e
    new = json.loads(cfg.to_json())
    a, b = _flatten(old), _flatten(new)
    diffs = [k for k in sorted(set(a) | set(b)) if k not in RESUMABLE_CHANGES and a.get(k) != b.get(k)]
    if diffs:
        listed = ", ".join(f"{k} ({a.get(k)!r} in the run, {b.get(k)!r} now)" for k in diffs)
        raise ConfigError(
            f"--resume: the config differs from {path} in {listed}; resume with the run's values (only "
            "--total-env-steps may change), or start a new run in another --run-dir"
        )


def truncate_metrics(path: Path, epoch: int) -> int:
    """Drop rows of epochs after `epoch` (written after the checkpoint, before a crash) and torn lines,
    by writing a temp file and renaming it over the log. Returns the number of rows dropped."""
    if not path.is_file():
        return 0
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = []
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        row_epoch = row.get("epoch", 0) if isinstance(row, dict) else None
        if isinstance(row_epoch, int) and row_epoch <= epoch:  # anything else is a torn or foreign line
            kept.append(line)
    if len(kept) != len(lines):
        write_text_atomic(path, "".join(line + "\n" for line in kept))
    return len(lines) - len(kept)


def evaluate(agent: Agent, collector: Collector, num_rollouts: int, device: torch.device, seed: int,
             max_steps: int | None = None) -> dict:
    """Greedy rollouts summarised; `max_steps` caps a rollout's length (episodes that never end)."""
    policy = AgentPolicy(agent, collector.num_envs, greedy=True, device=device)
    _, episodes = collector.collect_rollouts(policy, num_rollouts, seed=seed, max_steps=max_steps)
    if collector.capped_rollouts:
        say(f"icrl: warning: evaluation stopped at {max_steps:,} steps per rollout; {collector.capped_rollouts} "
            "rollout(s) had not ended and count as they stood (raise --eval-max-steps to let them finish)")
    return summarize_episodes(episodes)


def make_relabeler(t: TrainConfig, venv: gym.vector.VectorEnv) -> HindsightRelabeler | None:
    """The sample-time hindsight relabeler `--relabel` asks for; the env must report achieved goals."""
    if t.relabel == "none":
        return None
    if "achieved" not in venv.single_observation_space.spaces:
        raise ConfigError(
            f"--relabel {t.relabel}: this env does not report the goals it achieved (docs/CONTRACTS.md, "
            "goal-conditioned tasks such as mazerunner or package_delivery); use --relabel none"
        )
    return HindsightRelabeler(t.relabel, rare_goals=t.relabel_rare_goals)


def training_window(cfg: ExperimentConfig) -> int:
    """Timesteps per training window: the acting context (`max_seq_len`) plus one.

    The critic learns Q(s_t) from the TD target at s_{t+1}, so the window must hold a full context *and*
    the step after it. With windows of only `max_seq_len` timesteps, a rollout of exactly context + 1
    timesteps (T-Maze's corridor + junction + final observation) is cut one way or the other: either the
    cue at t = 0 or the junction's transition to the final state falls outside every window, and the
    junction's value can never be learned from memory. The Transformer's banded mask keeps each
    position's receptive field at `max_seq_len`, exactly what acting sees.
    """
    return cfg.model.max_seq_len + 1


def make_train_loader(
    cfg: ExperimentConfig, replay_root: Path, spec: ActionSpec, device: torch.device, seed: int, **kwargs
) -> ReplayLoader:
    """The learner's endless batches from the replay (`train` and the asynchronous learner share it);
    `kwargs` go to `make_loader` (e.g. `auto_refresh`)."""
    t = cfg.train
    return make_loader(
        replay_root,
        batch_size=t.batch_size,
        max_seq_len=training_window(cfg),
        action_spec=spec,
        seed=seed,
        num_workers=t.num_workers,
        pin_memory=device.type == "cuda",
        offline_fraction=t.offline_fraction,
        **kwargs,
    )


def run_updates(learner: Learner, loader: ReplayLoader, num_updates: int) -> tuple[dict[str, float], float, float]:
    """`num_updates` gradient steps on fresh batches. Returns the last update's metrics as floats and the
    seconds spent sampling and updating (reading the metrics waits for the device: it counts as updating)."""
    metrics, t_sample, t_update = {}, 0.0, 0.0
    for _ in range(num_updates):
        t2 = time.perf_counter()
        batch = next(loader)
        t3 = time.perf_counter()
        metrics = learner.update(batch)
        t_sample += t3 - t2
        t_update += time.perf_counter() - t3
    t4 = time.perf_counter()
    metrics = {k: float(v) for k, v in metrics.items()}
    t_update += time.perf_counter() - t4
    return metrics, t_sample, t_update


def eval_row(agent: Agent, collector: Collector, cfg: ExperimentConfig, device: torch.device, *, epoch: int,
             env_steps: int, updates: int, start: float) -> dict:
    """The metrics row of one greedy evaluation (seeded by the epoch, so every run meets the same tasks)."""
    t5 = time.perf_counter()
    stats = evaluate(agent, collector, cfg.env.eval_rollouts, device, seed=derive_seed(cfg.train.seed, "eval", epoch),
                     max_steps=cfg.env.eval_max_steps)
    return {"kind": "eval", "epoch": epoch, "env_steps": env_steps, "updates": updates,
            "wall_time": time.perf_counter() - start, "time/eval_s": time.perf_counter() - t5, **stats}


def save_weights(agent: Agent, path: Path, metadata: dict[str, str] | None = None) -> Path:
    """Write the agent's weights (safetensors) to a temp file and rename it over `path`: readers (icrl eval,
    asynchronous collectors) see the old file or the new one, never half of one."""
    from icrl.fileio import atomic_path

    assert_finite_weights(agent, str(path))  # a published NaN would reach every reader (icrl.guards)
    with atomic_path(path, fsync=False, tmp_name=f".{path.name}.tmp-{os.getpid()}") as tmp:
        save_model(agent, str(tmp), metadata=metadata)
    return path


def finish_run(run_dir: Path, agent: Agent, cfg: ExperimentConfig, last_eval: dict, env_steps: int, updates: int) -> None:
    """Final weights (RUN_DIR/agent.safetensors), the learning-curve plot and the result line."""
    save_weights(agent, run_dir / "agent.safetensors")
    plot = plot_learning_curves([run_dir], run_dir / "learning_curve.png", title=f"{cfg.env.env} {cfg.env.env_kwargs}")
    success = last_eval.get("success_rate")
    say(
        f"[bold green]result[/bold green]: eval return {last_eval['return_mean']:+.3f}"
        + (f", success rate {success:.2f}" if success is not None else "")
        + f" over {last_eval['rollouts']} rollouts after {env_steps:,} env steps and "
        f"{updates:,} updates in {last_eval['wall_time']:.0f} s; plot: {plot}"
    )


def train(cfg: ExperimentConfig | None = None, env: Any = None) -> dict:
    """Train an agent as `cfg` says; returns the final evaluation. Writes everything under run_dir.

    `env` (or `cfg.env.env`) is a built-in task, a Gymnasium id or 'module:factory', a gymnasium.Env subclass,
    a zero-arg factory, or a gymnasium.vector.VectorEnv (icrl.envs.user.resolve_env): icrl wraps and vectorises
    its own copies. RUN_DIR/spaces.json records the env's spaces, so `icrl.load(RUN_DIR)` needs no env.
    `icrl.train(cfg, env=...)` is this function.

    Started N times by a launcher (`torchrun --nproc_per_node N -m icrl train ...`), the processes train one
    agent data-parallel (icrl.run.distributed): per epoch each collects steps_per_epoch / N env steps with its own
    envs into the shared replay, and each update averages the gradients of N batches of batch_size windows.
    Rank 0 alone writes the run directory and evaluates; the other ranks return {}.
    """
    cfg, source = apply_env(cfg or ExperimentConfig(), env)
    cfg = with_task_defaults(cfg, source.factories[0] if source.factories else None).validate()
    e, t = cfg.env, cfg.train
    replicas = init_replicas(t.device)  # one process, or this rank of a data-parallel run
    world, main = replicas.world_size, replicas.is_main
    steps_per_rank = t.steps_per_epoch // world
    if steps_per_rank < e.parallel_envs:
        raise ConfigError(
            f"--steps-per-epoch {t.steps_per_epoch} split over {world} processes is below --parallel-envs "
            f"{e.parallel_envs}: raise --steps-per-epoch to at least {world * e.parallel_envs}"
        )
    check_run_dir_usable(t.run_dir)  # a file, an unwritable folder: refused before anything is built
    check_not_locked(t.run_dir)  # another live process trains in it
    check_run_dir(cfg)  # before anything is created or written
    replicas.barrier()  # every rank has checked the run dir before any of them writes to it
    seed_everything(t.seed, replicas.rank)
    seed = replicas.rank_seed(t.seed)  # this rank's envs, exploration and sampler (the run's seed on rank 0)
    if t.threads > 0:
        torch.set_num_threads(t.threads)
    device = replicas.device
    venv_kwargs = dict(episodes_per_rollout=e.episodes_per_rollout, rollout_horizon=e.rollout_horizon)
    venv_kwargs.update(asynchronous=e.async_envs, factories=source.factories)
    venv = make_vector_env(e.env, e.kwargs, e.parallel_envs, **venv_kwargs)
    eval_venv = make_vector_env(e.env, e.kwargs, e.parallel_envs, **venv_kwargs) if main else None
    spaces = venv_spaces_record(venv, e.env, e.kwargs, source.rebuild)  # RUN_DIR/spaces.json, checkpoints
    spec = ActionSpec.from_space(venv.single_action_space)
    relabeler = make_relabeler(t, venv)  # before the run dir exists: a wrong --relabel leaves nothing behind
    run_dir = Path(t.run_dir)  # created only once the envs exist, so a bad env name leaves nothing behind
    # One process per run dir (icrl.run.runlock): the lock is taken before the first write and released by the
    # OS if this process dies; the run dir is checked again under the lock (a run may have started meanwhile).
    lock = RunLock.acquire(run_dir) if main else None
    if main:
        check_run_dir(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    collector = Collector(venv, spec, chunk_len=e.chunk_len, seed=derive_seed(seed, "train-envs"))
    eval_collector = Collector(eval_venv, spec, seed=derive_seed(t.seed, "eval-envs")) if main else None

    agent = Agent(venv.single_observation_space["obs"], spec, cfg.model, cfg.loss).to(device)
    learner = Learner(agent, cfg, device, replicas)  # data parallel: rank 0's initial weights on every rank
    # The FIFO part skips fsync: the atomic rename already keeps readers from torn files after a crash;
    # fsync would only add power-loss durability for data that is cheap to collect again.
    replay = DiskReplay(run_dir / "replay", capacity_timesteps=t.replay_capacity, fsync=False)
    # --offline-data: loaded once into replay/protected (rank 0); --offline-updates: epochs without env steps
    offline_epochs = prepare_offline(cfg, replay.root, log=say, import_data=main)
    replicas.barrier()  # the offline data is on disk before any rank samples
    exploration = Exploration(cfg.explore, spec, e.parallel_envs, seed=derive_seed(seed, "explore"))

    def env_steps() -> int:  # the run's env steps: every rank takes the same number
        return world * collector.total_env_steps

    policy = AgentPolicy(
        agent, e.parallel_envs, greedy=False, exploration=exploration, device=device,
        env_steps=lambda: collector.total_env_steps, sample=cfg.explore.train_actions == "sample",
    )
    start_epoch, wall_offset = 0, 0.0
    if t.resume:
        # The newest checkpoint consistent with this run (the checks come before anything is applied); the
        # checkpoint holds rank 0's exploration and RNG states, the other ranks keep their own.
        found = load_latest_checkpoint(run_dir, agent=agent, log=say if main else None, learner=learner,
                                       collector=collector, exploration=exploration if main else None,
                                       restore_rng=main)
        if found is not None:
            ckpt, state = found
            start_epoch, wall_offset = int(state["epoch"]), float(state["extra"].get("wall_time", 0.0))
            saved_world = int(state["extra"].get("world_size", 1))
            if saved_world != world:  # the counter is per rank: rescale it to this run's process count
                collector.total_env_steps = collector.total_env_steps * saved_world // world
            # The rollouts in progress at the checkpoint are lost: the collector starts from a hard reset,
            # seeded apart from the run's first reset so the tasks do not repeat.
            collector.seed = derive_seed(seed, "train-envs", "resume", start_epoch)
            if main:
                say(f"icrl: resuming from {ckpt} (epoch {start_epoch}, {env_steps():,} env steps, "
                    f"{learner.updates:,} updates)")
        elif main and holds_run(run_dir):
            say(f"icrl: no readable checkpoint in {run_dir}; starting the run over (the replay is reused)")
        replicas.barrier()  # every rank has read the checkpoint before rank 0 prunes newer, unreadable ones
        if main:
            for path in list_checkpoints(run_dir):  # skipped ones newer than the one resumed from
                if int(path.name.split("-")[-1]) > start_epoch:
                    set_aside(path)
            truncate_metrics(run_dir / "metrics.jsonl", start_epoch)
    if main:  # one writer of the run directory
        write_text_atomic(run_dir / "config.json", cfg.to_json())
        write_spaces(run_dir, spaces)
        log = make_loggers(run_dir, ("jsonl", *t.log_backends), json.loads(cfg.to_json()))
        say(
            f"icrl: training on [bold]{e.env}[/bold] {e.kwargs or ''} with a {cfg.model.traj_encoder} "
            f"({sum(p.numel() for p in agent.online_parameters()):,} parameters) on {device}"
            + (f" x {world} processes" if world > 1 else "") + f"; run dir {run_dir}"
        )
    else:
        log = MultiLogger([])

    loader, hinted = None, False
    bar, bar_task = progress_bar(t.total_env_steps)
    bar.disable = bar.disable or not main
    bar.start()
    try:
        num_epochs = max(1, offline_epochs + t.total_env_steps // t.steps_per_epoch)
        start, last_eval = time.perf_counter() - wall_offset, None
        for epoch in range(start_epoch + 1, num_epochs + 1):
            # Acting phase. Eval mode once for the whole phase (AgentPolicy.act would switch too, once);
            # Learner.update switches back to train mode.
            agent.eval()
            steps0, policy_s0 = env_steps(), policy.seconds
            t0 = time.perf_counter()
            rollouts, episodes = collector.collect(policy, steps_per_rank if epoch > offline_epochs else 0)
            t_collect = time.perf_counter() - t0
            for rollout in rollouts:
                replay.write(rollout)
            replicas.barrier()  # every rank's rollouts are on disk before any rank lists the replay
            if loader is not None:  # new files become visible now, not at a timing-dependent moment
                loader.refresh()
            t_write = time.perf_counter() - t0 - t_collect

            # Learning phase: sampling and updates timed apart.
            metrics, t_sample, t_update, n_updates = {}, 0.0, 0.0, 0
            ready = env_steps() >= t.start_updates_after and replay.num_rollouts() > 0
            if main and not hinted and not rollouts and epoch > offline_epochs and replay.num_rollouts() == 0:
                hinted = True  # e.g. MountainCar: no episode ends within one epoch, so there is nothing to learn from
                say(f"icrl: epoch {epoch} finished no rollout: no episode ended within the {steps_per_rank // e.parallel_envs} "
                    f"steps each of the {e.parallel_envs} envs took, so nothing is stored and no update runs; "
                    "pass --chunk-len 64 to store pieces of long rollouts, or raise --steps-per-epoch (or lower --parallel-envs)")
            if replicas.sum([float(ready)])[0] == world:  # all ranks update or none: DDP steps in lockstep
                if loader is None:
                    t1 = time.perf_counter()
                    loader = make_train_loader(
                        cfg, replay.root, spec, device,
                        # a resumed run draws a fresh sample stream rather than replaying the first one's
                        seed=derive_seed(seed, "loader", *(("resume", start_epoch) if start_epoch else ())),
                        transform=relabeler,
                    )
                    t_sample += time.perf_counter() - t1
                metrics, t_sample_u, t_update = run_updates(learner, loader, t.updates_per_epoch)
                t_sample, n_updates = t_sample + t_sample_u, t.updates_per_epoch
                if world > 1:  # the logged losses average over the ranks' batches
                    metrics = dict(zip(metrics, (v / world for v in replicas.sum(list(metrics.values())))))

            train_stats = summarize_episodes(episodes) if world == 1 else train_stats_all_ranks(episodes, replicas)
            row = {
                "kind": "train",
                "epoch": epoch,
                "env_steps": env_steps(),
                "updates": learner.updates,
                "wall_time": time.perf_counter() - start,
                "train/return_mean": train_stats["return_mean"],
                "train/success_rate": train_stats["success_rate"],
                "train/epsilon": exploration.level(collector.total_env_steps),
                "time/collect_s": t_collect,  # the acting loop: policy + env steps + collector bookkeeping
                "time/policy_s": policy.seconds - policy_s0,  # of which inside AgentPolicy.act
                "time/replay_write_s": t_write,
                "time/sample_s": t_sample,
                "time/update_s": t_update,
                "time/env_steps_per_s": (env_steps() - steps0) / max(t_collect, 1e-9),
                "time/updates_per_s": n_updates / max(t_update, 1e-9) if n_updates else 0.0,
                **{f"train/{k}": v for k, v in metrics.items()},
            }
            log.write(row)
            if main and (epoch % t.eval_every == 0 or epoch == num_epochs):
                last_eval = eval_row(agent, eval_collector, cfg, device, epoch=epoch, env_steps=env_steps(),
                                     updates=learner.updates, start=start)
                log.write(last_eval)
            if main:
                bar.update(bar_task, completed=env_steps(), description=progress_line(row, last_eval))
            if main and (epoch % t.log_every == 0 or epoch == num_epochs):
                say(progress_line(row, last_eval))
            if epoch % t.checkpoint_every == 0 or epoch == num_epochs:
                extra = {"wall_time": time.perf_counter() - start, "config": json.loads(cfg.to_json()), "spaces": spaces}
                if world > 1:  # every rank hashes its state (raising if they differ); rank 0 records them
                    extra.update(world_size=world, replica_sha256=replicas.fingerprints(agent))
                if main:
                    save_checkpoint(
                        run_dir,
                        agent=agent,
                        learner=learner,
                        collector=collector,
                        exploration=exploration,
                        epoch=epoch,
                        extra=extra,
                        keep=t.keep_checkpoints,
                    )
        if main and last_eval is None:  # resumed a run that had already reached its last epoch
            stats = evaluate(agent, eval_collector, e.eval_rollouts, device, seed=derive_seed(t.seed, "eval", num_epochs),
                             max_steps=e.eval_max_steps)
            last_eval = {"kind": "eval", "epoch": max(start_epoch, num_epochs), "env_steps": env_steps(),
                         "updates": learner.updates, "wall_time": time.perf_counter() - start, **stats}
    except BaseException:  # an error or Ctrl-C: the run dir is free again at once
        if lock is not None:
            lock.release()
        raise
    finally:  # also on errors and Ctrl-C: no orphaned env processes or loader workers
        bar.stop()
        log.close()
        venv.close()
        if eval_venv is not None:
            eval_venv.close()
        if loader is not None:
            loader.close()
        replicas.close()
    if not main:
        return {}
    assert last_eval is not None
    try:
        finish_run(run_dir, agent, cfg, last_eval, env_steps(), learner.updates)
    finally:
        if lock is not None:
            lock.release()
    return last_eval
