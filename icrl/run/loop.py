"""The epoch loop (docs/design.md §8): collect -> write rollouts -> sample -> update -> evaluate -> log ->
checkpoint.

`train` is the algorithm; the setup and the updates (icrl.run.components), the run directory and resuming
(icrl.run.rundir), the reports (icrl.run.reporting, icrl.run.evaluate) and the data-parallel
decisions (icrl.parallel) live in the modules the asynchronous and evaluation paths share.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from icrl.config import ExperimentConfig
from icrl.envs.wrapper import agent_obs_space
from icrl.run.artifacts import finish_run
from icrl.run.callbacks import Callbacks, TrainingRun
from icrl.run.checkpoint import save_checkpoint
from icrl.run.components import (
    Components,
    LazyLoader,
    UpdateBudget,
    build_components,
    make_train_loader,
    run_updates,
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
from icrl.run.rundir import holds_run, resume_training, run_scope, write_run_files
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
    c = build_components(cfg, env)  # every refusal, the seeds, envs, agent, learner, replay; the run dir locked
    cfg, main = c.cfg, c.replicas.is_main
    with run_scope(c.lock, c.close):  # an error or Ctrl-C: the run dir is free again at once; no orphaned envs
        start_epoch, wall_offset = resume(c) if cfg.run.resume else (0, 0.0)
        log = start_log(c, hooks)
        batches = LazyLoader(lambda: make_train_loader(
            cfg, c.replay.root, c.spec, c.device, obs_space=agent_obs_space(c.venv),
            transform=c.relabeler,
            # a resumed run draws a fresh sample stream rather than replaying the first one's
            seed=derive_seed(c.seed, "loader", *(("resume", start_epoch) if start_epoch else ()))))
        bar, bar_task = progress_bar(cfg.schedule.env_steps)
        bar.disable = bar.disable or not main
        bar.start()
        try:
            last_eval = epochs(c, hooks, log, batches, bar, bar_task, start_epoch, wall_offset)
        finally:  # also on errors and Ctrl-C: no loader workers left
            bar.stop()
            log.close()
            batches.close()
    return finish(c, last_eval, hooks) if main else {}


def epochs(c: Components, hooks: Callbacks, log: Logger, batches: LazyLoader, bar: Any, bar_task: Any,
           start_epoch: int, wall_offset: float) -> dict | None:
    """The epochs after `start_epoch`; returns the last evaluation (rank 0; None on the other ranks)."""
    cfg, main = c.cfg, c.replicas.is_main
    budget = UpdateBudget(cfg, c.replicas.world_size)
    num_epochs = max(1, c.offline_epochs + cfg.schedule.env_steps // cfg.schedule.steps_per_epoch)
    said: frozenset[str] = frozenset()  # the hints said so far (hint_once)
    start, last_eval, stop, epoch = time.perf_counter() - wall_offset, None, False, start_epoch
    saved_at = time.perf_counter()  # the last checkpoint (or the start): --checkpoint-seconds counts from it
    for epoch in range(start_epoch + 1, num_epochs + 1):
        timer, steps0, policy_s0 = Timer(), c.env_steps(), c.policy.seconds
        with timer("collect"):  # the acting loop: policy + env steps + collector bookkeeping
            rollouts, episodes = collect(c, epoch)
        with timer("replay_write"):
            store(c, rollouts, batches)
        said = hint_once(c, epoch, rollouts, said, last=epoch == num_epochs)
        metrics, n_updates = update(c, batches, timer, budget, epoch)
        row = train_row(c, epoch, start, episodes, metrics, timer, steps0, policy_s0, n_updates)
        new_eval = report(c, log, row, epoch, num_epochs, start, lambda r, ev: bar.update(  # noqa: B023
            bar_task, completed=c.env_steps(), description=progress_line(r, ev, live=True))) if main else None
        late = main and 0 < cfg.run.checkpoint_seconds <= time.perf_counter() - saved_at
        stop_flag, late_flag = c.replicas.max([int(main and hooks.epoch_end(row, new_eval)), int(late)])
        stop = stop_flag > 0  # rank 0 decides both, so every rank stops and checkpoints alike
        last_eval = new_eval or (None if stop else last_eval)  # a run stopped between evaluations: one more
        if stop or late_flag or due(epoch, cfg.run.checkpoint_every, num_epochs):
            checkpoint(c, epoch, start)
            saved_at = time.perf_counter()
        if stop:
            break
    if main and last_eval is None:  # resumed a run that had already reached its last epoch, or stopped early
        last_eval = final_eval(c, epoch if stop else max(start_epoch, num_epochs), num_epochs, start)
    return last_eval


def report(c: Components, log: Logger, row: dict, epoch: int, num_epochs: int, start: float,
           progress: Any) -> dict | None:
    """Rank 0 logs the epoch's train row and, when due, evaluates; returns this epoch's evaluation, if any."""
    cfg = c.cfg
    return report_epoch(log, row, cfg, epoch=epoch, num_epochs=num_epochs, last_eval=None, progress=progress,
                        evaluate=lambda: eval_row(c.agent, c.eval_collector, cfg, c.device, epoch=epoch,
                                                  env_steps=c.env_steps(), updates=c.learner.updates, start=start))


def resume(c: Components) -> tuple[int, float]:
    """(epoch, wall-clock seconds) to continue from: the newest usable checkpoint's, else (0, 0.0)."""
    held = holds_run(c.run_dir)  # a run without a readable checkpoint says so itself
    start = resume_training(c.cfg, c.replicas, seed=c.seed, agent=c.agent, learner=c.learner,
                            collector=c.collector, exploration=c.exploration)
    if start[0] == 0 and not held and c.replicas.is_main:
        say(f"icrl: --resume: {c.run_dir} has no checkpoint yet; starting the run from the beginning")
    return start


def start_log(c: Components, hooks: Callbacks) -> Logger:
    """Rank 0, the one writer of the run directory: config.json, spaces.json, the metrics log and the banner;
    then the callbacks' on_train_start. The other ranks log nothing."""
    if not c.replicas.is_main:
        return MultiLogger([])
    cfg, e, world = c.cfg, c.cfg.env, c.replicas.world_size
    write_run_files(c.run_dir, cfg, c.spaces)
    log = open_log(c.run_dir, cfg)
    say(
        f"icrl: training on [bold]{e.env}[/bold] {e.kwargs or ''} with a {cfg.model.traj_encoder} "
        f"({sum(p.numel() for p in c.agent.online_parameters()):,} parameters) on {c.device}"
        + (f" x {world} processes" if world > 1 else "") + f"; run dir {c.run_dir}"
    )
    say_roundings(c)
    hooks.start(TrainingRun(cfg, c.run_dir, c.agent, read_spaces_record(c.spaces, "the run"), c.device, c.env_steps,
                            env=c.env_factories[0] if c.env_factories else None))
    return log


def say_roundings(c: Components) -> None:
    """Say once where the run does not do exactly what was asked: a budget that is not whole epochs, an epoch that
    is not whole vector steps of every process's envs (each takes ceil(its share / envs) of them), and
    evaluations of more rollouts than asked (every eval env copy finishes the same number)."""
    s, cfg, world, n = c.cfg.schedule, c.cfg, c.replicas.world_size, c.cfg.env.parallel_envs
    epochs = s.env_steps // s.steps_per_epoch
    per_epoch = world * -(-c.steps_per_rank // n) * n
    if epochs * per_epoch != s.env_steps:
        how = (f"whole epochs of --steps-per-epoch {per_epoch:,}" if per_epoch == s.steps_per_epoch else
               f"epochs of {per_epoch:,}, not --steps-per-epoch {s.steps_per_epoch:,}: " + (
                   f"{world} processes x {per_epoch // world:,} env steps, whole steps of their {n} envs" if world > 1
                   else f"whole steps of the {n} envs"))
        say(f"icrl: note: the run takes {epochs * per_epoch:,} env steps, not --total-env-steps {s.env_steps:,}: "
            f"{epochs:,} {how}")
    if c.eval_collector is not None:
        n = c.eval_collector.num_envs
        done = -(-cfg.eval.eval_rollouts // n) * n
        if done != cfg.eval.eval_rollouts:
            say(f"icrl: note: evaluations run {done} rollouts, not --eval-rollouts {cfg.eval.eval_rollouts}: each of "
                f"the {n} eval env copies finishes the same number")


def collect(c: Components, epoch: int) -> tuple[list[Rollout], list[EpisodeStats]]:
    """This rank's env steps of the epoch (none in an --offline-updates epoch) with the exploring policy.
    Eval mode once for the whole phase (AgentPolicy.act would switch too, once); Learner.update switches back."""
    c.agent.eval()
    return c.collector.collect(c.policy, c.steps_per_rank if epoch > c.offline_epochs else 0)


def store(c: Components, rollouts: list[Rollout], batches: LazyLoader) -> None:
    """Write the finished rollouts into the replay, visible to every rank's sampler once all ranks wrote."""
    for rollout in rollouts:
        c.replay.write(rollout)
    c.replicas.barrier()  # every rank's rollouts are on disk before any rank lists the replay
    batches.refresh()  # new files become visible now, not at a timing-dependent moment


def hint_once(c: Components, epoch: int, rollouts: list[Rollout], said: frozenset[str], last: bool) -> frozenset[str]:
    """The hints said so far (`said`), plus those that apply now and were not said before: each only once."""
    if "stored" not in said and hint_nothing_stored(c, epoch, rollouts, last):
        said |= {"stored"}
    if "context" not in said and hint_short_context(c, rollouts):
        said |= {"context"}
    return said


def hint_nothing_stored(c: Components, epoch: int, rollouts: list[Rollout], last: bool) -> bool:
    """Say once why no update runs while online epochs store nothing; True once said. Quiet, until the last
    epoch, while each env has taken no more steps than the context holds: a task whose rollouts fill the
    context (T-Maze 500 in 1,000-step epochs of 8 envs) finishes its first ones only after several epochs."""
    if not c.replicas.is_main or rollouts or epoch <= c.offline_epochs or c.replay.num_rollouts() > 0:
        return False
    n = c.cfg.env.parallel_envs  # e.g. MountainCar: no episode ends within one epoch, nothing to learn from
    per_env = (epoch - c.offline_epochs) * (c.steps_per_rank // n)
    if per_env <= c.cfg.model.context and not last:
        return False
    say(f"icrl: epoch {epoch} finished no rollout: no episode ended within the {per_env} steps each of the {n} "
        "envs took so far, so nothing is stored and no update runs; pass --chunk-len 64 to store pieces of long "
        "rollouts, or raise --steps-per-epoch (or lower --parallel-envs)")
    return True


def hint_short_context(c: Components, rollouts: list[Rollout]) -> bool:
    """Say once when a rollout had more action steps than the context: its late steps cannot attend to its
    first ones (a T-Maze cue), which no loss curve shows. True once said."""
    steps = max((int(r.time[-1]) for r in rollouts if len(r.time)), default=0)
    context = c.cfg.model.context
    if not c.replicas.is_main or steps <= context:
        return False
    say(f"icrl: rollouts last {steps} steps but the context is {context} (--max-seq-len): late steps see only "
        f"the last {context}; pass --max-seq-len {steps} if the task needs memory of the whole rollout")
    return True


def update(c: Components, batches: LazyLoader, timer: Timer, budget: UpdateBudget,
           epoch: int) -> tuple[dict[str, float], int]:
    """The epoch's updates once the run has enough data (an offline epoch: a fixed count; else `budget`'s);
    returns the means of the epoch's update metrics (averaged over the ranks) and the number of updates made."""
    cfg = c.cfg
    ready = c.env_steps() >= cfg.schedule.start_updates_after and c.replay.num_rollouts() > 0
    if not c.replicas.all_ready(ready):
        return {}, 0
    if epoch <= c.offline_epochs:
        n = cfg.epoch_updates
    else:
        n = budget.updates(cfg.schedule.steps_per_epoch, [f.num_timesteps for f in c.replay.files()])
    with timer("sample"):  # opening the loader counts as sampling
        loader = batches.get()
    metrics = run_updates(c.learner, loader, n, timer)
    return c.replicas.average(metrics), n


def train_row(c: Components, epoch: int, start: float, episodes: list[EpisodeStats], metrics: dict[str, float],
              timer: Timer, steps0: int, policy_s0: float, n_updates: int) -> dict[str, Any]:
    """The epoch's train row (every rank takes part: the episode stats are summed over the ranks)."""
    stats = train_stats(episodes, c.replicas)
    return {
        **row_head("train", epoch, c.env_steps(), c.learner.updates, start),
        "train/return_mean": stats["return_mean"],
        "train/success_rate": stats["success_rate"],
        "train/epsilon": c.exploration.level(c.collector.total_env_steps),
        "time/collect_s": timer["collect"],  # the acting loop: policy + env steps + collector bookkeeping
        "time/policy_s": c.policy.seconds - policy_s0,  # of which inside AgentPolicy.act
        "time/replay_write_s": timer["replay_write"],
        "time/sample_s": timer["sample"],
        "time/update_s": timer["update"],
        "time/env_steps_per_s": (c.env_steps() - steps0) / max(timer["collect"], 1e-9),
        "time/updates_per_s": n_updates / max(timer["update"], 1e-9) if n_updates else 0.0,
        **{f"train/{k}": v for k, v in metrics.items()},
        **{f"train/{k}": v for k, v in stats.items() if k.startswith(TASK_METRIC_PREFIXES)},  # multi-task envs
    }


def checkpoint(c: Components, epoch: int, start: float) -> None:
    """Rank 0 saves the epoch's checkpoint; in a data-parallel run every rank first hashes its state, which
    raises if the ranks diverged (`Replicas.checkpoint_record`)."""
    extra = {"wall_time": time.perf_counter() - start, "config": json.loads(c.cfg.to_json()), "spaces": c.spaces,
             **c.replicas.checkpoint_record(c.agent)}
    if c.replicas.is_main:
        save_checkpoint(c.run_dir, agent=c.agent, learner=c.learner, collector=c.collector,
                        exploration=c.exploration, epoch=epoch, extra=extra, keep=c.cfg.run.keep_checkpoints)


def final_eval(c: Components, epoch: int, seed_epoch: int, start: float) -> dict[str, Any]:
    """The evaluation a run resumed after its last epoch returns (not logged: the log has its last one)."""
    cfg = c.cfg
    stats = evaluate(c.agent, c.eval_collector, cfg.eval.eval_rollouts, c.device,
                     seed=derive_seed(cfg.run.seed, "eval", seed_epoch), max_steps=cfg.eval.eval_max_steps)
    return {**row_head("eval", epoch, c.env_steps(), c.learner.updates, start), **stats}


def finish(c: Components, last_eval: dict | None, hooks: Callbacks) -> dict:
    """Rank 0: the final weights, the plot and the result line, then the run dir is free again; returns the
    final evaluation with the run dir."""
    assert last_eval is not None
    try:
        finish_run(c.run_dir, c.agent, c.cfg, last_eval, c.env_steps(), c.learner.updates)
    finally:
        if c.lock is not None:
            c.lock.release()
    hint_critic_reach(c.cfg, c.learner.updates, last_eval)
    result = {**last_eval, "run_dir": str(c.run_dir)}  # where the run lives, also when icrl chose the folder
    hooks.end(result)
    return result


def critic_reach(cfg: ExperimentConfig, updates: int) -> float:
    """About how many steps ahead the critic can have seen by now: each update moves the target networks a
    fraction τ of the way, and each bootstrap hop spans n steps, so values propagate ~τ × updates × n steps
    (docs/results.md, "Why Pendulum-v1 learned slowly")."""
    return cfg.loss.tau * updates * cfg.loss.td_steps


def hint_critic_reach(cfg: ExperimentConfig, updates: int, last_eval: dict) -> bool:
    """At the end of a run that did not succeed, say once when its critic's reach (`critic_reach`) was far
    shorter than its episodes: the values cannot have reached rewards further away, whatever the task. True
    when said."""
    length, success = last_eval.get("episode_length_mean"), last_eval.get("success_rate")
    reach = critic_reach(cfg, updates)
    if not length or (success is not None and success >= 0.5) or reach >= length / 4:
        return False
    say(f"icrl: hint: the critic can have looked only ~{reach:.0f} steps ahead (τ {cfg.loss.tau:g} x {updates:,} "
        f"updates x {cfg.loss.td_steps}-step returns) in episodes of ~{length:.0f} steps; if rewards lie further "
        "away, raise --tau, --n-step or the updates (--replay-ratio, --total-env-steps), as --preset control does")
    return True
