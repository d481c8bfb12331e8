"""Evaluating a policy, and the episode summaries training, the asynchronous collectors and evaluation share.

`evaluate` is the greedy evaluation every path runs (`eval_row`: the training-time one, seeded by the epoch);
`play` is the one path of `icrl eval` and `icrl.evaluate`; `evaluate_run` evaluates a run's weights (loaded by
`icrl.run.load.load_agent`) and `write_eval` stores the result in RUN_DIR/eval.json atomically
(`icrl.run.reporting.eval_table` prints it). Used by `icrl train`, `icrl learn` and `icrl eval RUN_DIR`.

Every summary averages over rollouts, not episodes (docs/design.md §10): a rollout's return sums its episodes
and its success is that of its last episode (after adapting), so short episodes are not over-weighted.
Multi-task envs name each episode's task (`info["task"]`, docs/CONTRACTS.md; `EpisodeStats.task`): the summaries
then also give each task's mean return, success rate and rollout count (`task_metrics`).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from icrl.config import ExperimentConfig
from icrl.config.errors import flag, setting
from icrl.envs.make import make_run_envs
from icrl.envs.user import EnvOverride, run_env_config
from icrl.fileio import write_text_atomic
from icrl.parallel import Replicas
from icrl.run.load import RunDirError, load_agent, resolve_weights
from icrl.types import EpisodeStats


def evaluate(agent: Any, collector: Any, num_rollouts: int, device: torch.device, seed: int,
             max_steps: int | None = None, greedy: bool = True) -> dict:
    """Rollouts of the policy (greedy, or sampled from it with `greedy=False`) summarised over rollouts
    (`summarize_episodes`); `max_steps` caps a rollout's length (episodes that never end), with a warning,
    so an evaluation always ends."""
    return summarize_episodes(evaluation_episodes(agent, collector, num_rollouts, device, seed, max_steps, greedy))


def evaluation_episodes(agent: Any, collector: Any, num_rollouts: int, device: torch.device, seed: int,
                        max_steps: int | None = None, greedy: bool = True) -> list:
    """The episodes of `evaluate`'s rollouts (icrl.types.EpisodeStats), before they are summarised."""
    from icrl.agent.model import AgentPolicy
    from icrl.run.reporting import say

    policy = AgentPolicy(agent, collector.num_envs, greedy=greedy, device=device)
    _, episodes = collector.collect_rollouts(policy, num_rollouts, seed=seed, max_steps=max_steps)
    if collector.capped_rollouts:
        say(f"icrl: warning: evaluation stopped at {max_steps:,} steps per rollout; {collector.capped_rollouts} "
            "rollout(s) had not ended and count as they stood (raise --eval-max-steps to let them finish)")
    return episodes


def play(agent: Any, venv: Any, device: torch.device, rollouts: int, *, seed: int, max_steps: int | None,
         deterministic: bool = True) -> dict[str, Any]:
    """Evaluate `agent` in `venv` (icrl's wrapped vector env) over exactly `rollouts` rollouts: the summary, and each
    rollout's return, success and length (`returns`, `successes`, `lengths`; `tasks` where the env names them).
    `icrl eval` and `icrl.evaluate` both call this, with the same seeds, so they agree on the same weights and env."""
    from icrl.envs import Collector
    from icrl.seeding import derive_seed
    from icrl.types import ActionSpec

    collector = Collector(venv, ActionSpec.from_space(venv.single_action_space), seed=derive_seed(seed, "eval-cli"))
    episodes = evaluation_episodes(agent, collector, rollouts, device, derive_seed(seed, "eval-cli", "rollouts"),
                                   max_steps, greedy=deterministic)
    # every env played ceil(rollouts / N) rollouts: keep exactly `rollouts`, the first ones of each env first
    groups = sorted(group_rollouts(episodes), key=lambda r: (r[0].rollout_id, r[0].env_index))[:rollouts]
    episodes = [e for r in groups for e in r]
    tasks = [rollout_task(r) for r in groups]  # multi-task envs: each rollout's task (info["task"])
    return {**summarize_episodes(episodes), "returns": [float(sum(e.ret for e in r)) for r in groups],
            "successes": [r[-1].success for r in groups], "lengths": [int(sum(e.length for e in r)) for r in groups],
            **({"tasks": tasks} if any(t is not None for t in tasks) else {})}


def eval_row(agent: Any, collector: Any, cfg: ExperimentConfig, device: torch.device, *, epoch: int,
             env_steps: int, updates: int, start: float) -> dict:
    """The metrics row of one evaluation (greedy unless `--no-eval-greedy`; seeded by the epoch, so every run meets
    the same tasks)."""
    from icrl.run.reporting import Timer, row_head
    from icrl.seeding import derive_seed

    timer = Timer()
    with timer("eval"):
        stats = evaluate(agent, collector, cfg.eval.eval_rollouts, device, derive_seed(cfg.run.seed, "eval", epoch),
                         max_steps=cfg.eval.eval_max_steps, greedy=cfg.eval.eval_greedy)
    return {**row_head("eval", epoch, env_steps, updates, start), "time/eval_s": timer["eval"], **stats}


def check_env_fits(venv, spaces: tuple | None, env_name: str) -> None:
    """RunDirError when the env to act in does not give the observations and actions of the agent's
    `spaces` (the env's (observation, action) spaces it was trained on, e.g. RUN_DIR/spaces.json), as with an
    env chosen with --env instead of the run's; without `spaces` (runs of older icrl) nothing is checked."""
    from icrl.spaces_json import spaces_wrapper
    from icrl.types import ActionSpec

    if spaces is None:
        return
    io = spaces_wrapper(*spaces)
    obs, spec = venv.single_observation_space["obs"], ActionSpec.from_space(venv.single_action_space)
    want_obs, want_spec = io.observation_space["obs"], io.action_spec
    if spec != want_spec or obs != want_obs:
        def show(o, s) -> str:
            return (", ".join(f"{k} {b.dtype}{list(b.shape)}" for k, b in o.spaces.items())
                    + f"; {s.kind} actions x{s.dim}")

        raise RunDirError(f"env {env_name!r} does not fit the run's agent: it gives {show(obs, spec)}, the agent was "
                          f"trained on {show(want_obs, want_spec)}")


def evaluate_agent(agent: Any, cfg: ExperimentConfig, spaces: tuple, device: torch.device, env: Any = None,
                   n_episodes: int = 10, deterministic: bool = True, *, env_kwargs: dict[str, Any] | None = None,
                   seed: int = 0, parallel_envs: int | None = None, max_steps: int | None = None,
                   trust_run_env: bool = False) -> dict[str, Any]:
    """`icrl.evaluate` (icrl.policy.evaluate, which documents the arguments) for an agent of a run with config
    `cfg` trained on the env's `spaces` (observation, action); callbacks evaluate a training agent with it."""
    import dataclasses

    from icrl.envs.user import resolve_env

    if n_episodes < 1:
        raise ValueError(f"n_episodes must be >= 1, got {n_episodes}")
    if env is None:
        cfg = run_env_config(cfg, "the policy's run", EnvOverride(trust_run_env=trust_run_env))  # refuses code
    src = resolve_env(cfg.env.env if env is None else env)
    if env_kwargs is None:
        env_kwargs = src.env_kwargs or (cfg.env.kwargs if src.name == cfg.env.env else {})
    e = dataclasses.replace(cfg.env, env=src.name, env_kwargs=json.dumps(env_kwargs))
    venv = make_run_envs(e, min(parallel_envs or src.parallel_envs or e.parallel_envs, n_episodes),
                         factories=src.factories)
    try:
        check_env_fits(venv, spaces, src.name)
        return play(agent, venv, device, n_episodes, seed=seed, deterministic=deterministic,
                    max_steps=cfg.eval.eval_max_steps if max_steps is None else max_steps)
    finally:
        venv.close()


def eval_device(device: str) -> torch.device:
    """The torch device `device` names, usable here; RunDirError (one line) otherwise."""
    from icrl.device import resolve_device

    try:
        dev = resolve_device(device)
    except RuntimeError as e:
        raise RunDirError(f"{flag('device')} {device!r} is not a torch device ({e})") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RunDirError(f"{flag('device')} {device}: this torch build has no usable CUDA device; "
                          f"use {setting('device', 'cpu')}")
    return dev


def evaluate_run(
    run_dir: str | Path,
    checkpoint: str | Path | None = None,
    rollouts: int | None = None,
    seed: int | None = None,
    parallel_envs: int | None = None,
    device: str = "cpu",
    override: EnvOverride = EnvOverride(),
) -> dict[str, Any]:
    """Evaluation of a run's weights (greedy unless the run evaluated by sampling); returns `summarize_episodes`
    plus provenance.

    The env is the run's when config.json names a built-in task or a registered id, else the one `override`
    names (--env) or allows (--trust-run-env): a run directory never makes icrl run code on its own.

    Defaults come from the run's config: its eval_rollouts, parallel_envs and seed (the eval envs are
    seeded with derive_seed(seed, "eval-cli"), apart from the training-time evaluations).
    """
    from icrl.seeding import seed_everything
    from icrl.spaces_json import read_spaces

    if rollouts is not None and rollouts < 1:
        raise RunDirError(f"{flag('rollouts')} must be >= 1, got {rollouts}")
    if parallel_envs is not None and parallel_envs < 1:
        raise RunDirError(f"{flag('parallel_envs')} must be >= 1, got {parallel_envs}")
    dev = eval_device(device)
    agent, cfg = load_agent(run_dir, checkpoint, dev, override)
    cfg = run_env_config(cfg, run_dir, override)
    e = cfg.env
    seed = cfg.run.seed if seed is None else seed
    rollouts = cfg.eval.eval_rollouts if rollouts is None else rollouts
    n_envs = min(parallel_envs or e.parallel_envs, rollouts)
    seed_everything(seed)
    venv = make_run_envs(e, n_envs)
    try:
        check_env_fits(venv, read_spaces(run_dir), e.env)
        stats = play(agent, venv, dev, rollouts, seed=seed, max_steps=cfg.eval.eval_max_steps,
                     deterministic=cfg.eval.eval_greedy)
    finally:
        venv.close()
    return {
        "run_dir": str(run_dir),
        "weights": str(resolve_weights(run_dir, checkpoint)),
        "env": e.env,
        "env_kwargs": e.kwargs,
        "episodes_per_rollout": e.episodes_per_rollout,
        "seed": seed,
        "parallel_envs": n_envs,
        **stats,
    }


def write_eval(run_dir: str | Path, result: dict[str, Any]) -> Path:
    """Store an `evaluate_run` result in RUN_DIR/eval.json atomically (temp file, fsync, rename)."""
    return write_text_atomic(Path(run_dir) / "eval.json", json.dumps(result, indent=2) + "\n")


# ------------------------------------------------------------------------------------ episode summaries
def group_rollouts(episodes: list[EpisodeStats]) -> list[list[EpisodeStats]]:
    """Episodes grouped by rollout, each group in episode order: the unit every summary averages over."""
    rollouts: dict[tuple[int, int], list[EpisodeStats]] = defaultdict(list)
    for ep in episodes:
        rollouts[(ep.env_index, ep.rollout_id)].append(ep)
    return [sorted(r, key=lambda e: e.episode_index) for r in rollouts.values()]


def summarize_episodes(episodes: list[EpisodeStats]) -> dict[str, float | None | list]:
    """Return and success rate over rollouts (see the module docstring), with the `*_by_episode` lists that
    give the adaptation curve of multi-episode tasks."""
    eps = group_rollouts(episodes)
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
    out.update(task_metrics(episodes))
    if len(by_index) > 1:
        out["return_by_episode"] = [float(np.mean([e.ret for e in by_index[i]])) for i in sorted(by_index)]
        succ = [[e.success for e in by_index[i] if e.success is not None] for i in sorted(by_index)]
        if all(succ):
            out["success_by_episode"] = [float(np.mean(s)) for s in succ]
    return out


TASK_METRIC_PREFIXES = ("return/", "success/", "rollouts/")
"""The keys `task_metrics` writes: a prefix, then the task's name (`icrl.types.task_key`)."""


def rollout_task(rollout: list[EpisodeStats]) -> str | None:
    """The task a rollout played: its last episode's that names one (all its episodes play one task)."""
    return next((e.task for e in reversed(rollout) if e.task is not None), None)


def task_sums(episodes: list[EpisodeStats]) -> dict[str, dict[str, float]]:
    """Per task, the sums behind `task_metrics` (`rollout_sums`' keys over the rollouts that name it): sums add up
    over ranks and an asynchronous learner's collectors, where means do not. Empty when no episode names a task."""
    by_task: dict[str, list[list[EpisodeStats]]] = defaultdict(list)
    for r in group_rollouts(episodes):
        task = rollout_task(r)
        if task is not None:
            by_task[task].append(r)
    return {task: _sums(rollouts) for task, rollouts in by_task.items()}


def add_task_sums(*parts: Mapping[str, Mapping[str, float]], sign: float = 1.0) -> dict[str, dict[str, float]]:
    """`task_sums` added up (ranks, collectors); `sign=-1` subtracts every part after the first (an epoch's share
    of running totals). A task absent from a part counts zero there; tasks left with no rollout are dropped."""
    out: dict[str, dict[str, float]] = {}
    for i, part in enumerate(parts):
        k = 1.0 if i == 0 else sign
        for task, sums in part.items():
            acc = out.setdefault(task, dict.fromkeys(SUM_KEYS, 0.0))
            for key in SUM_KEYS:
                acc[key] += k * float(sums.get(key, 0.0))
    return {task: v for task, v in out.items() if v["rollouts"] > 0}


def metrics_from_task_sums(sums: Mapping[str, Mapping[str, float]]) -> dict[str, float | int]:
    """Per task, in name order: `return/<task>` (mean rollout return), `success/<task>` (success rate, only for a
    task whose env reports success) and `rollouts/<task>` (how many)."""
    out: dict[str, float | int] = {}
    for task in sorted(sums):
        s = sums[task]
        if s["rollouts"] <= 0:
            continue
        out[f"return/{task}"] = s["return_sum"] / s["rollouts"]
        if s["success_n"] > 0:
            out[f"success/{task}"] = s["success_sum"] / s["success_n"]
        out[f"rollouts/{task}"] = int(s["rollouts"])
    return out


def task_metrics(episodes: list[EpisodeStats]) -> dict[str, float | int]:
    """`metrics_from_task_sums` of these episodes. Empty when no episode names a task."""
    return metrics_from_task_sums(task_sums(episodes))


SUM_KEYS = ("rollouts", "return_sum", "success_n", "success_sum")
"""The keys of `rollout_sums` (and of each task's `task_sums`)."""


def _sums(rollouts: list[list[EpisodeStats]]) -> dict[str, float]:
    succ = [r[-1].success for r in rollouts if r[-1].success is not None]
    return {"rollouts": len(rollouts), "return_sum": float(sum(sum(e.ret for e in r) for r in rollouts)),
            "success_n": len(succ), "success_sum": float(sum(succ))}


def rollout_sums(episodes: list[EpisodeStats]) -> dict[str, float]:
    """The sums behind `summarize_episodes`' return and success rate: sums add up over rounds (an
    asynchronous learner's collectors) and ranks, where means do not."""
    return _sums(group_rollouts(episodes))


def train_stats_all_ranks(episodes: list[EpisodeStats], replicas: Replicas) -> dict[str, float | int | None]:
    """`summarize_episodes`' return and success rate over the rollouts every rank finished, with the per-task
    metrics of multi-task envs (each rank's `task_sums`, gathered as JSON: ranks may have met different tasks)."""
    s = rollout_sums(episodes)
    n, ret, n_succ, succ_sum = replicas.sum([s[k] for k in SUM_KEYS])
    tasks = add_task_sums(*replicas.gather_json(task_sums(episodes)))
    return {"return_mean": ret / n if n else None, "success_rate": succ_sum / n_succ if n_succ else None,
            **metrics_from_task_sums(tasks)}


def train_stats(episodes: list[EpisodeStats], replicas: Replicas) -> Mapping[str, float | None | list]:
    """The train row's return and success rate, with per-task metrics: this process's rollouts, or every
    rank's in a data-parallel run."""
    if replicas.world_size == 1:
        return summarize_episodes(episodes)
    return train_stats_all_ranks(episodes, replicas)
