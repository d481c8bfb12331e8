"""Package Delivery (AMAGO, Grigsby et al. 2024): deliver packages to a sequence of addresses on a road.

A one-dimensional road of cells 0 .. length-1 (0 is the depot, where the agent starts). A random set of
cells are forks: there the agent cannot drive straight on; it must turn left or right, and each fork has a
hidden correct side: the right turn moves it one cell on, the wrong one sends it back to the depot. Away
from forks, one of four drop actions (hidden, one per task) delivers a package at the current cell; the
other three drop actions, or dropping with an empty van or at the depot, send the agent back to the depot.
The van holds 3 packages per address. The instruction is the list of addresses (distinct non-fork cells,
ascending along the road) to deliver to in order; reward 1 for each package dropped at the current address.

What it tests: sparse-reward, goal-conditioned exploration with memory. Mistakes are costly (back to the
depot), so the agent must find the fork sides and the working drop action by trial and error and keep
them in context for the rest of the rollout, while reading the instruction. Almost no random rollout
delivers to the right addresses, but every delivery (anywhere) is an achieved goal, which is what makes
the task learnable with hindsight instruction relabeling.

Goal-conditioned under docs/CONTRACTS.md: an address is its own token (1 .. length-1, vocabulary
length-1); a step achieves at most one token, the cell a package was delivered to (achieved_slots = 1).
Follows the official env's rules (fork count, package budget, wrap-around at the end of the road) with
these differences: the time limit truncates instead of ending the episode by termination, the observation
is scaled to [0, 1], and the task (road, addresses, drop action) persists across episodes when asked to
(`new_task=False`), so it also runs as a multi-episode meta-RL task.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from icrl.envs.tasks.grid import RenderModes, wants_new_task
from icrl.envs.tasks.instruction import InstructionProgress, score_step

FORWARD, TURN_LEFT, TURN_RIGHT = 0, 1, 2
DROP_ACTIONS = (3, 4, 5, 6)  # exactly one of them delivers (hidden per task)
NO_OP = 7
PACKAGES_PER_ADDRESS = 3


class PackageDelivery(RenderModes, gym.Env):
    """Drive down a road with hidden fork sides and deliver packages to the instructed addresses in order.

    kwargs:
      length: cells on the road (default 30, as in AMAGO's experiments); 1 .. length-1 are addresses/forks.
      min_packages, max_packages: the instruction has between these many addresses (default 2 and 4),
        drawn per task; the "goal" observation has max_packages slots (shorter instructions padded with 0).
      time_limit: steps per episode (default 180); reaching it truncates with `info["success"] = 0`.

    Each task draws between (length // 5) // 2 and length // 5 forks among cells 1 .. length-1, a correct
    side for each fork, the addresses (sorted, never on a fork) and the working drop action.
    Actions Discrete(8): 0 forward (blocked at a fork; from the last cell it wraps to the depot), 1 turn
    left, 2 turn right (only at a fork: the correct side moves one cell on, the wrong one goes back to the
    depot; elsewhere nothing), 3-6 drop a package (nothing at a fork; the working one, with a package left
    and away from the depot, delivers to the current cell; anything else sends the agent to the depot),
    7 no-op. The van starts each episode with 3 packages per address.
    Observation Dict:
      "goal": Box(0, length-1, (max_packages,), int64): the addresses in order, each zeroed once delivered.
      "obs": Box(0, 1, (3,), float32): position / (length-1), packages left / (3 * max_packages), at a fork.
    Reward 1 for a delivery to the current address; the last one terminates with `info["success"] = 1`.
    `info["achieved"]` is [address] on a delivery (to any cell), else empty (also at reset). The task is
    hidden: `reset()` with `options=None` or `{"new_task": True}` (or a seed) samples a new one,
    `{"new_task": False}` keeps it.
    """

    metadata: dict[str, Any] = {"render_modes": ["ansi", "rgb_array"], "render_fps": 8}

    def __init__(
        self,
        length: int = 30,
        min_packages: int = 2,
        max_packages: int = 4,
        time_limit: int = 180,
        render_mode: str | None = None,
    ):
        length, lo, hi = int(length), int(min_packages), int(max_packages)
        if length < 5:
            raise ValueError(f"PackageDelivery length must be >= 5, got {length}")
        if not 1 <= lo <= hi:
            raise ValueError(f"PackageDelivery needs 1 <= min_packages <= max_packages, got {lo} and {hi}")
        free = length - 1 - length // 5  # non-fork cells when the most forks are drawn
        if hi > free:
            raise ValueError(
                f"PackageDelivery max_packages={hi} needs as many distinct non-fork addresses, but a road of "
                f"length {length} may have only {free}; lengthen the road or lower max_packages"
            )
        if int(time_limit) < 1:
            raise ValueError(f"PackageDelivery time_limit must be >= 1, got {time_limit}")
        self.length, self.min_packages, self.max_packages = length, lo, hi
        self.time_limit = int(time_limit)
        self.render_mode = render_mode
        vocab = length - 1
        self.metadata = {**type(self).metadata, "goal_vocab": vocab, "achieved_slots": 1}
        self.observation_space = gym.spaces.Dict(
            {
                "goal": gym.spaces.Box(0, vocab, (hi,), np.int64),
                "obs": gym.spaces.Box(0.0, 1.0, (3,), np.float32),
            }
        )
        self.action_space = gym.spaces.Discrete(8)
        # Task (hidden): fork cell -> correct turn (TURN_LEFT / TURN_RIGHT), addresses, working drop action.
        self.forks: dict[int, int] = {}
        self.addresses: list[int] = []
        self.drop_action = DROP_ACTIONS[0]
        self._has_task = False
        # Episode state
        self._pos = 0
        self._t = 0
        self._packages = 0
        self._progress = InstructionProgress([1], hi)  # the instruction's progress; the real one at reset

    # --------------------------------------------------------------------------------------------- task
    def _sample_task(self) -> None:
        rng, n = self.np_random, self.length
        num_forks = int(rng.integers((n // 5) // 2, n // 5 + 1))
        fork_cells = rng.choice(np.arange(1, n), size=num_forks, replace=False)
        self.forks = {int(c): int(rng.choice((TURN_LEFT, TURN_RIGHT))) for c in fork_cells}
        free = np.array([c for c in range(1, n) if c not in self.forks])
        k = int(rng.integers(self.min_packages, self.max_packages + 1))
        self.addresses = sorted(int(c) for c in rng.choice(free, size=k, replace=False))
        self.drop_action = int(rng.choice(DROP_ACTIONS))
        self._has_task = True

    def _obs(self) -> dict[str, np.ndarray]:
        vec = [
            self._pos / (self.length - 1),
            self._packages / (PACKAGES_PER_ADDRESS * self.max_packages),
            float(self._pos in self.forks),
        ]
        return {"goal": self._progress.goal(), "obs": np.asarray(vec, dtype=np.float32)}

    # ---------------------------------------------------------------------------------------------- API
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        if wants_new_task(options, seed, self._has_task):
            self._sample_task()
        self._pos, self._t = 0, 0
        self._packages = PACKAGES_PER_ADDRESS * len(self.addresses)
        self._progress = InstructionProgress(self.addresses, self.max_packages)  # unused slots padded with 0
        return self._obs(), {"achieved": []}

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        action = int(action)
        if not 0 <= action < 8:
            raise ValueError(f"PackageDelivery action must be in [0, 8), got {action}")
        self._t += 1
        achieved: list[int] = []  # a delivery achieves its address (scored below, docs/CONTRACTS.md)
        fork = self.forks.get(self._pos)  # the correct turn here, None away from forks
        if action == FORWARD:
            if fork is None:
                self._pos += 1
        elif action in (TURN_LEFT, TURN_RIGHT):
            if fork is not None:
                self._pos = self._pos + 1 if action == fork else 0
        elif action in DROP_ACTIONS:
            if fork is None:
                if action == self.drop_action and self._packages > 0 and self._pos > 0:
                    self._packages -= 1
                    achieved = [self._pos]
                else:
                    self._pos = 0
        self._pos %= self.length  # the end of the road wraps to the depot
        reward, terminated, truncated, info = score_step(self._progress, achieved, self._t, self.time_limit)
        return self._obs(), reward, terminated, truncated, info

    # ------------------------------------------------------------------------------------------- render
    def _ansi(self) -> str:
        turns = {TURN_LEFT: "<", TURN_RIGHT: ">"}  # forks show their correct side
        road = ["D"] + [turns.get(self.forks.get(c, -1), ".") for c in range(1, self.length)]
        for i, a in enumerate(self.addresses):
            if i >= self._progress.current:
                road[a] = str(i + 1) if i < 9 else "G"
        marker = [" "] * self.length
        marker[self._pos] = "A"
        status = f"t={self._t} packages={self._packages} drop_action={self.drop_action}"
        return "\n".join(["".join(road), "".join(marker), status])

    def _frame(self, cell: int = 16) -> np.ndarray:
        """[2 * cell, length * cell, 3] uint8: the road (forks orange, addresses still to serve green, depot
        grey) over a row marking the agent in blue."""
        img = np.full((2, self.length, 3), 235, np.uint8)
        img[0, 0] = (150, 150, 150)
        for c in self.forks:
            img[0, c] = (240, 150, 40)
        for i, a in enumerate(self.addresses):
            if i >= self._progress.current:
                img[0, a] = (60, 180, 80)
        img[1, self._pos] = (40, 90, 230)
        return np.kron(img, np.ones((cell, cell, 1), np.uint8))
