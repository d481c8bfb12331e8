"""The goal-conditioned reward rule (docs/CONTRACTS.md, docs/design.md §7): `InstructionProgress`, and its
array form `InstructionTask` that the built-in goal tasks score with.

The hindsight relabeler (icrl/data/relabel.py) replays stored achievement records through
`InstructionProgress`, so a relabeled rollout gets exactly the rewards, goal observations and terminals the env
would have produced: the built-in tasks, which achieve one token per step, score by the same rule on arrays
(tests/unit/test_goal_tasks.py replays their rollouts through `InstructionProgress`).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable
from typing import SupportsInt

import numpy as np

from icrl.envs.batched import ArrayTask, StepArrays


class InstructionProgress:
    """Progress through one instruction: zero the current slot and advance while the current goal is among
    a step's achieved tokens, each achieved token completing one slot at most; +1 reward per slot completed;
    done when none is left.

    `tokens`: the instruction (goal tokens >= 1, in order); `slots`: the goal observation's length
    k >= len(tokens) (the unused tail is padded with 0).
    """

    def __init__(self, tokens: Iterable[SupportsInt], slots: int):
        self.tokens = tuple(int(t) for t in tokens)
        if not self.tokens or min(self.tokens) < 1:
            raise ValueError(f"an instruction needs at least one goal token >= 1, got {self.tokens}")
        if len(self.tokens) > slots:
            raise ValueError(f"instruction of {len(self.tokens)} goals does not fit {slots} slots")
        self.slots = int(slots)
        self.current = 0  # index of the current sub-goal

    @property
    def done(self) -> bool:
        return self.current >= len(self.tokens)

    def goal(self) -> np.ndarray:
        """[slots] int64: the instruction with completed and unused slots zeroed."""
        g = np.zeros(self.slots, dtype=np.int64)
        g[self.current : len(self.tokens)] = self.tokens[self.current :]
        return g

    def update(self, achieved: Iterable[int]) -> int:
        """Advance on one step's achieved tokens; returns how many sub-goals this step completed (the reward)."""
        got = [int(t) for t in achieved]
        completed = 0
        while not self.done and self.tokens[self.current] in got:
            got.remove(self.tokens[self.current])  # one achievement completes one slot
            self.current += 1
            completed += 1
        return completed


class InstructionTask(ArrayTask):
    """The instruction side of the built-in goal tasks, every copy at once: the instruction [N, k] (0 padded),
    its progress and the step's score, by `InstructionProgress`'s rule for steps that achieve one token at
    most (`metadata["achieved_slots"] = 1`). A subclass sets `time_limit` and the observation's "goal" [k],
    draws its tasks (`_set_instruction` for each row), moves the copies in `_act(actions)` -> [N] int64, the
    token each copy's step achieved (-1: none), and shows `_goal()` as its "goal"; its `_allocate` and
    `_reset_rows` call these."""

    time_limit: int

    def _allocate(self, n: int) -> None:
        slots = int(self.observation_space["goal"].shape[0])  # type: ignore[index]
        self._tokens = np.zeros((n, slots), np.int64)  # [N, k] the instruction, unused slots 0
        self._length = np.ones(n, np.int64)  # [N] goals in the instruction
        self._current = np.zeros(n, np.int64)  # [N] index of the current sub-goal
        self._slot = np.arange(slots)  # [k]

    def _set_instruction(self, i: int, tokens: Iterable[SupportsInt]) -> None:
        goals = [int(t) for t in tokens]
        self._tokens[i] = 0
        self._tokens[i, : len(goals)] = goals
        self._length[i] = len(goals)

    def instruction(self, i: int = 0) -> list[int]:
        """Copy i's instruction: its goal tokens in order."""
        return self._tokens[i, : self._length[i]].tolist()

    def _reset_rows(self, rows: np.ndarray) -> None:
        self._current[rows] = 0

    def _goal(self) -> np.ndarray:
        """[N, k] int64: the instructions with completed slots zeroed (`InstructionProgress.goal`)."""
        return np.where(self._slot >= self._current[:, None], self._tokens, 0)

    @abstractmethod
    def _act(self, actions: np.ndarray) -> np.ndarray:
        """Move every copy by its action; [N] int64: the token each copy's step achieved (-1: none)."""

    def _step_arrays(self, actions: np.ndarray) -> StepArrays:
        token = self._act(actions)  # [N]
        current = np.minimum(self._current, self._slot.size - 1)
        hit = (self._current < self._length) & (self._tokens[np.arange(self.num_copies), current] == token)
        self._current += hit  # a step achieving one token completes one slot at most
        terminated = self._current >= self._length
        truncated = ~terminated & (self._time >= self.time_limit)
        success = np.where(terminated, 1.0, np.where(truncated, 0.0, np.nan))
        return StepArrays(hit.astype(np.float64), terminated, success, truncated, token[:, None])
