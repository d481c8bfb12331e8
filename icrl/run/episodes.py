"""Episode summaries shared by training, the asynchronous collectors and evaluation.

Every summary averages over rollouts, not episodes (docs/design.md §10): a rollout's return sums its episodes
and its success is that of its last episode (after adapting), so short episodes are not over-weighted.

Multi-task envs name each episode's task (`info["task"]`, docs/CONTRACTS.md; `EpisodeStats.task`): the summaries
then also give each task's mean return, success rate and rollout count (`task_metrics`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

import numpy as np

from icrl.run.distributed import Replicas
from icrl.types import EpisodeStats


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


def task_metrics(episodes: list[EpisodeStats]) -> dict[str, float | int]:
    """Per task, in name order, over the rollouts that name it: `return/<task>` (mean rollout return),
    `success/<task>` (success rate, only for a task whose env reports success) and `rollouts/<task>` (how many).
    Empty when no episode names a task."""
    by_task: dict[str, list[list[EpisodeStats]]] = defaultdict(list)
    for r in group_rollouts(episodes):
        task = rollout_task(r)
        if task is not None:
            by_task[task].append(r)
    out: dict[str, float | int] = {}
    for task in sorted(by_task):
        rollouts = by_task[task]
        out[f"return/{task}"] = float(np.mean([sum(e.ret for e in r) for r in rollouts]))
        successes = [r[-1].success for r in rollouts if r[-1].success is not None]
        if successes:
            out[f"success/{task}"] = float(np.mean(successes))
        out[f"rollouts/{task}"] = len(rollouts)
    return out


def rollout_sums(episodes: list[EpisodeStats]) -> dict[str, float]:
    """The sums behind `summarize_episodes`' return and success rate: sums add up over rounds (an
    asynchronous learner's collectors) and ranks, where means do not."""
    eps = group_rollouts(episodes)
    succ = [r[-1].success for r in eps if r[-1].success is not None]
    return {"rollouts": len(eps), "return_sum": sum(sum(e.ret for e in r) for r in eps),
            "success_n": len(succ), "success_sum": float(sum(succ))}


def train_stats_all_ranks(episodes: list[EpisodeStats], replicas: Replicas) -> dict[str, float | None]:
    """`summarize_episodes`' return and success rate over the rollouts every rank finished."""
    s = rollout_sums(episodes)
    n, ret, n_succ, succ_sum = replicas.sum([s["rollouts"], s["return_sum"], s["success_n"], s["success_sum"]])
    return {"return_mean": ret / n if n else None, "success_rate": succ_sum / n_succ if n_succ else None}


def train_stats(episodes: list[EpisodeStats], replicas: Replicas) -> Mapping[str, float | None | list]:
    """The train row's return and success rate: this process's rollouts, or every rank's in a data-parallel
    run (one process keeps `summarize_episodes`' own arithmetic, with its per-task metrics; a data-parallel run
    has none in its train rows, as the ranks' task names are not gathered)."""
    if replicas.world_size == 1:
        return summarize_episodes(episodes)
    return train_stats_all_ranks(episodes, replicas)
