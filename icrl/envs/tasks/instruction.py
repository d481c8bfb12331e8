"""The one implementation of the goal-conditioned reward rule (docs/CONTRACTS.md, docs/design.md §7).

Every built-in goal task scores its instruction with `InstructionProgress`, and the hindsight relabeler
(icrl/data/relabel.py) replays stored achievement records through the same class, so a relabeled rollout
gets exactly the rewards, goal observations and terminals the env would have produced.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import SupportsInt

import numpy as np


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


def score_step(
    progress: InstructionProgress, achieved: list[int], t: int, time_limit: int
) -> tuple[float, bool, bool, dict]:
    """A goal env's step outcome under the contract: (reward, terminated, truncated, info) for a step that
    achieved `achieved` and is the t-th of the episode. Success 1 when the instruction is complete, 0 when the
    time limit cuts it first."""
    info: dict = {"achieved": list(achieved)}
    reward = float(progress.update(achieved))
    terminated = progress.done
    truncated = not terminated and t >= time_limit
    if terminated or truncated:
        info["success"] = float(terminated)
    return reward, terminated, truncated, info
