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

from icrl.envs.tasks.instruction import InstructionTask

FORWARD, TURN_LEFT, TURN_RIGHT = 0, 1, 2
DROP_ACTIONS = (3, 4, 5, 6)  # exactly one of them delivers (hidden per task)
NO_OP = 7
PACKAGES_PER_ADDRESS = 3


class PackageDelivery(InstructionTask):
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
        self._copies(1)

    def _allocate(self, n: int) -> None:
        super()._allocate(n)
        self.forks = np.zeros((n, self.length), np.int64)  # [N, L] the correct turn at forks, else 0
        self.drop_action = np.full(n, DROP_ACTIONS[0], np.int64)  # [N] the working drop action
        self._pos = np.zeros(n, np.int64)  # [N] cell
        self._packages = np.zeros(n, np.int64)  # [N] packages left in the van

    def _draw_tasks(self, rows: np.ndarray) -> None:
        n = self.length
        for i in rows.tolist():
            rng = self._rng(i)
            num_forks = int(rng.integers((n // 5) // 2, n // 5 + 1))
            fork_cells = rng.choice(np.arange(1, n), size=num_forks, replace=False)
            forks = {int(c): int(rng.choice((TURN_LEFT, TURN_RIGHT))) for c in fork_cells}
            free = np.array([c for c in range(1, n) if c not in forks])
            k = int(rng.integers(self.min_packages, self.max_packages + 1))
            addresses = sorted(int(c) for c in rng.choice(free, size=k, replace=False))
            self.set_task(i, forks, addresses, int(rng.choice(DROP_ACTIONS)))

    def set_task(self, i: int, forks: dict[int, int], addresses: list[int], drop_action: int) -> None:
        """Copy i's task: the forks (cell -> TURN_LEFT / TURN_RIGHT, the correct side), the addresses in order
        and the working drop action; its next reset with `options={"new_task": False}` starts it."""
        self.forks[i] = 0
        for cell, side in forks.items():
            self.forks[i, cell] = side
        self._set_instruction(i, addresses)
        self.drop_action[i] = drop_action

    def _reset_rows(self, rows: np.ndarray) -> None:
        super()._reset_rows(rows)
        self._pos[rows] = 0
        self._packages[rows] = PACKAGES_PER_ADDRESS * self._length[rows]

    def _obs(self) -> dict[str, np.ndarray]:
        at_fork = self.forks[np.arange(self.num_copies), self._pos] > 0
        packages = self._packages / (PACKAGES_PER_ADDRESS * self.max_packages)
        vec = np.stack([self._pos / (self.length - 1), packages, at_fork.astype(np.float64)], 1)
        return {"goal": self._goal(), "obs": vec.astype(np.float32)}

    def _act(self, actions: np.ndarray) -> np.ndarray:
        pos = self._pos
        fork = self.forks[np.arange(self.num_copies), pos]  # [N] the correct turn here, 0 away from forks
        at_fork = fork > 0
        turn = at_fork & ((actions == TURN_LEFT) | (actions == TURN_RIGHT))
        drop = ~at_fork & (actions >= DROP_ACTIONS[0]) & (actions <= DROP_ACTIONS[-1])  # nothing at a fork
        deliver = drop & (actions == self.drop_action) & (self._packages > 0) & (pos > 0)
        new = np.where(~at_fork & (actions == FORWARD), pos + 1, pos)
        new = np.where(turn, np.where(actions == fork, pos + 1, 0), new)  # the wrong side: back to the depot
        new = np.where(drop & ~deliver, 0, new)  # a failed drop: back to the depot
        self._packages -= deliver
        self._pos = new % self.length  # the end of the road wraps to the depot
        return np.where(deliver, pos, -1)  # a delivery achieves its address

    # ------------------------------------------------------------------------------------------- render
    def _ansi(self) -> str:
        turns = {TURN_LEFT: "<", TURN_RIGHT: ">"}  # forks show their correct side
        road = ["D"] + [turns.get(int(t), ".") for t in self.forks[0, 1:]]
        current = int(self._current[0])
        for i, a in enumerate(self.instruction(0)):
            if i >= current:
                road[a] = str(i + 1) if i < 9 else "G"
        marker = [" "] * self.length
        marker[int(self._pos[0])] = "A"
        status = f"t={int(self._time[0])} packages={int(self._packages[0])} drop_action={int(self.drop_action[0])}"
        return "\n".join(["".join(road), "".join(marker), status])

    def _frame(self, cell: int = 16) -> np.ndarray:
        """[2 * cell, length * cell, 3] uint8: the road (forks orange, addresses still to serve green, depot
        grey) over a row marking the agent in blue."""
        img = np.full((2, self.length, 3), 235, np.uint8)
        img[0, 0] = (150, 150, 150)
        img[0, self.forks[0] > 0] = (240, 150, 40)
        img[0, [a for a in self._goal()[0].tolist() if a]] = (60, 180, 80)  # the addresses still to serve
        img[1, int(self._pos[0])] = (40, 90, 230)
        return np.kron(img, np.ones((cell, cell, 1), np.uint8))
