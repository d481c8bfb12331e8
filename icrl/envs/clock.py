"""The timestep state machine of docs/design.md §2: `RolloutClock` for one env, `RolloutClocks` for N at once.

One set of rules, two forms: `TimestepWrapper` runs a `RolloutClock` while it steps its env (Python scalars: it
runs at every step of every user env, where numpy on one-element arrays cost ~7 µs more per step), and
`icrl.load`'s predict (the caller's N envs) and the batched tasks (icrl.envs.batched) the array form,
`RolloutClocks`, whose every method is `RolloutClock`'s applied to [N] arrays (tests/unit/test_batched_envs.py
runs both side by side). When a rollout ends is one function, `rollout_over`, which both forms call.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from icrl.types import ActionSpec


def rollout_over(episode: Any, time: Any, episodes_per_rollout: int, rollout_horizon: int | None) -> Any:
    """The current episode is the rollout's last (with a horizon: time has reached it). `episode` (episodes
    begun in the rollout, minus one) and `time` (actions taken in it): ints -> bool, or [N] arrays -> [N] bool."""
    if rollout_horizon is None:
        return episode + 1 >= episodes_per_rollout
    return time >= rollout_horizon


class RolloutClock:
    """The timestep state machine of docs/design.md §2 for one env: the time index its next timestep gets, the
    index of its episode inside the rollout, and its previous action, as Python scalars: `TimestepWrapper` runs one
    while it steps the env (the array form, `RolloutClocks`, serves N envs at once).

    `start(new_task=True)` before a timestep that starts a new task: time and episode go to 0;
    `start(new_task=False)` before one that starts the next episode of the same task: the episode index counts
    on and time keeps counting. Either way that timestep shows a zero previous action and reward and the reset
    flag 1. `acted` after the agent acted; `rollout_over` is the one rule for when the rollout the agent is
    trained on ends: after `episodes_per_rollout` episodes, or once time reaches `rollout_horizon`.
    """

    __slots__ = ("spec", "episodes_per_rollout", "rollout_horizon", "time", "episode", "prev_action")

    def __init__(self, spec: ActionSpec, episodes_per_rollout: int = 1, rollout_horizon: int | None = None) -> None:
        self.spec, self.episodes_per_rollout, self.rollout_horizon = spec, episodes_per_rollout, rollout_horizon
        self.time = 0  # the time index the next timestep gets
        self.episode = 0  # episodes begun in the current rollout, minus one
        self.prev_action = spec.zero_vector()  # [A] float32: zeros where a rollout / episode starts

    def rollout_over(self) -> bool:
        """The current episode is the rollout's last (with a horizon: time has reached it)."""
        return bool(rollout_over(self.episode, self.time, self.episodes_per_rollout, self.rollout_horizon))

    def start(self, new_task: bool) -> None:
        """The coming timestep starts a new task (`new_task`) or the next episode of the same task."""
        if new_task:
            self.time, self.episode = 0, 0
        else:
            self.episode += 1
        self.prev_action = self.spec.zero_vector()

    def timestep(self, obs: dict[str, np.ndarray], reward: float, cont: bool) -> dict:
        """The timestep of converted observation `obs` after `reward` (of the previous action; ignored unless
        `cont`: the episode continues, else the reset flag is 1)."""
        return {
            "obs": obs,
            "prev_action": self.prev_action,  # [A] float32
            "prev_reward": _float32(reward if cont else 0.0),  # []
            "time": np.asarray(self.time, dtype=np.int64),  # []
            "reset": np.asarray(int(not cont), dtype=np.int8),  # []
        }

    def acted(self, action_vector: np.ndarray) -> None:
        """The agent acted: its action ([A] float32 vector) is the next timestep's previous action."""
        self.prev_action = action_vector
        self.time += 1


class RolloutClocks:
    """`RolloutClock` for N envs stepped at once (icrl.envs.batched, icrl.policy): the same fields as [N] arrays (time,
    episode [N] int64, prev_action [N, A] float32) and the same methods, `start` for the rows given."""

    def __init__(
        self, spec: ActionSpec, num_envs: int, episodes_per_rollout: int = 1, rollout_horizon: int | None = None
    ) -> None:
        self.spec, self.episodes_per_rollout, self.rollout_horizon = spec, episodes_per_rollout, rollout_horizon
        self.time = np.zeros(num_envs, np.int64)  # [N] the time index each env's next timestep gets
        self.episode = np.zeros(num_envs, np.int64)  # [N] episodes begun in each env's rollout, minus one
        self.prev_action = spec.zero_vector(num_envs)  # [N, A]

    def rollout_over(self) -> np.ndarray:
        """[N] bool: `RolloutClock.rollout_over` of every env."""
        return np.asarray(rollout_over(self.episode, self.time, self.episodes_per_rollout, self.rollout_horizon))

    def start(self, rows: np.ndarray, new_task: bool) -> None:
        """`RolloutClock.start(new_task)` for the envs `rows` (distinct indices, or an [N] bool mask)."""
        if new_task:
            self.time[rows], self.episode[rows] = 0, 0
        else:
            self.episode[rows] += 1
        self.prev_action[rows] = 0.0

    def timestep(self, reward: np.ndarray, cont: np.ndarray) -> dict[str, np.ndarray]:
        """`RolloutClock.timestep`'s entries beside "obs" for every env: [N, ...] arrays, fresh each call."""
        with np.errstate(over="ignore"):  # as _float32: beyond float32 becomes inf, for the collector's guard
            prev_reward = np.where(cont, reward, 0.0).astype(np.float32)
        return {
            "prev_action": self.prev_action.copy(),  # [N, A] float32
            "prev_reward": prev_reward,  # [N] float32
            "time": self.time.copy(),  # [N] int64
            "reset": (~np.asarray(cont, bool)).astype(np.int8),  # [N]
        }

    def acted(self, action_vectors: np.ndarray) -> None:
        """Every env acted: [N, A] float32 vectors, each env's next previous action."""
        self.prev_action = np.array(action_vectors, dtype=np.float32)  # a copy: `start` writes rows of it
        self.time += 1


def _float32(value: float) -> np.ndarray:
    """A reward as a float32 scalar; one beyond float32's range becomes inf without a warning, for the
    collector's guard (icrl.guards) to refuse with the env, step and value."""
    with np.errstate(over="ignore"):
        return np.asarray(value, dtype=np.float32)
