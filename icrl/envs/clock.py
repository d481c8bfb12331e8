"""The timestep state machine of docs/design.md §2, `RolloutClocks`, for N envs at once: `TimestepWrapper` runs
one of one env while it steps its env, `icrl.load`'s predict one of the caller's N envs, and `BatchedTaskEnv`
(icrl.envs.batched) one of its N copies.
"""

from __future__ import annotations

import numpy as np

from icrl.types import ActionSpec


class RolloutClocks:
    """For each of N envs: the time index its next timestep gets, the index of its episode inside the rollout,
    and its previous action ([N] int64, [N] int64, [N, A] float32).

    `start(rows, new_task=True)` before the rows' timesteps that start a new task: time and episode go to 0;
    `start(rows, new_task=False)` before ones that start the next episode of the same task: the episode index
    counts on and time keeps counting. Either way that timestep shows a zero previous action and reward and
    the reset flag 1. `acted` after the agents acted; `rollout_over` is the one rule for when the rollout the
    agent is trained on ends: after `episodes_per_rollout` episodes, or once time reaches `rollout_horizon`.
    """

    def __init__(
        self, spec: ActionSpec, num_envs: int, episodes_per_rollout: int = 1, rollout_horizon: int | None = None
    ) -> None:
        self.spec, self.episodes_per_rollout, self.rollout_horizon = spec, episodes_per_rollout, rollout_horizon
        self.time = np.zeros(num_envs, np.int64)  # [N] the time index each env's next timestep gets
        self.episode = np.zeros(num_envs, np.int64)  # [N] episodes begun in each env's rollout, minus one
        self.prev_action = spec.zero_vector(num_envs)  # [N, A]

    def rollout_over(self) -> np.ndarray:
        """[N] bool: each env's current episode is its rollout's last (with a horizon: time has reached it)."""
        if self.rollout_horizon is None:
            return self.episode + 1 >= self.episodes_per_rollout
        return self.time >= self.rollout_horizon

    def start(self, rows: np.ndarray, new_task: bool) -> None:
        """The coming timesteps of the envs `rows` (distinct indices, or an [N] bool mask) start a new task
        (`new_task`) or the next episode of the same task."""
        if new_task:
            self.time[rows], self.episode[rows] = 0, 0
        else:
            self.episode[rows] += 1
        self.prev_action[rows] = 0.0

    def timestep(self, reward: np.ndarray, cont: np.ndarray) -> dict[str, np.ndarray]:
        """A timestep's entries beside "obs" for every env after `reward` [N] (of the previous actions; ignored
        where not `cont` [N]: the episode continues, else the reset flag is 1): [N, ...] arrays, fresh each call.
        A reward beyond float32's range becomes inf without a warning, for the collector's guard (icrl.guards)
        to refuse with the env, step and value."""
        with np.errstate(over="ignore"):
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
