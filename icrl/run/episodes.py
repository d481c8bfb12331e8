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

from icrl.parallel import Replicas
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
