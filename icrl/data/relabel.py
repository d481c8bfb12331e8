"""Hindsight instruction relabeling (docs/design.md §7; AMAGO Appendix B, Algorithm 1), applied at sample time.

A goal-conditioned rollout (docs/CONTRACTS.md) stores its instruction in `obs["goal"]` and, per timestep,
the goal tokens it achieved in `Rollout.achieved`. A failed rollout still achieved *something*: relabeling
rewrites its instruction into goals it actually reached, in the order it reached them, so sparse-reward
data turns into successes (or partial successes) for other instructions — an automatic curriculum of
skill chains. Because rewards, terminals and the instruction the policy saw all follow from the
instruction and the achievement record, they are recomputed exactly; the file on disk is never touched.

Per sampled rollout with k instruction slots, n of them completed:
    h = 0 ("none"), uniform in [0, k - n] ("some"), or k - n ("all")  goals to add
    pick h achievement events (t, token) that did not complete an original goal
        (uniformly, or by inverse goal frequency with `rare_goals=True`)
    new instruction = the n completed originals + the h picks, sorted by time,
                      then the next uncompleted originals to fill k slots
    replay the achievement record against it: rewards, goal observations, prev_reward, termination.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Literal

import numpy as np

from icrl.config.errors import flag, setting
from icrl.envs.tasks.instruction import InstructionProgress
from icrl.types import Rollout

GOAL_KEY = "goal"
RelabelMode = Literal["none", "some", "all"]
RELABEL_MODES: tuple[str, ...] = ("none", "some", "all")


class GoalContractError(ValueError):
    """A stored goal-conditioned rollout does not follow docs/CONTRACTS.md, so relabeling would be wrong."""


def replay_instruction(
    instruction: np.ndarray, achieved: np.ndarray
) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]], int | None]:
    """Play an achievement record against an instruction, scored by the envs' own rule (InstructionProgress).

    instruction: [k] int64 goal tokens in its first slots, 0 in the unused tail. achieved: [T+1, K] int64,
    -1 padded; row t lists the goals the transition into timestep t achieved (row 0, the reset, never
    completes a goal). Returns (reward [T] float32, goal observation [T+1, k] int64 with completed slots
    zeroed, completions [(t, slot)], t_done: the timestep at which the last goal was completed, or None).
    """
    instruction = np.asarray(instruction, dtype=np.int64)
    goal_obs = np.repeat(instruction[None], len(achieved), axis=0)  # [T+1, k]
    reward = np.zeros(len(achieved) - 1, dtype=np.float32)  # [T]
    completions: list[tuple[int, int]] = []
    length = int((instruction != 0).sum())
    if length == 0:
        return reward, goal_obs, completions, None
    if not (instruction[:length] != 0).all():
        raise GoalContractError(
            f"instruction {instruction.tolist()} has empty slots before goals: goal tokens fill the first slots "
            "and 0 pads the tail (docs/CONTRACTS.md)"
        )
    progress = InstructionProgress(instruction[:length], len(instruction))
    for t in range(1, len(achieved)):
        before = progress.current
        reward[t - 1] = progress.update(g for g in achieved[t] if g >= 1)
        if progress.current > before:
            completions += [(t, slot) for slot in range(before, progress.current)]
            goal_obs[t:] = progress.goal()
        if progress.done:
            return reward, goal_obs, completions, t
    return reward, goal_obs, completions, None


class HindsightRelabeler:
    """A sampler transform (`make_loader(..., transform=HindsightRelabeler("some"))`).

    Args:
        mode: "none" (unchanged), "some" (add a uniform number of hindsight goals: a mixture of partial
            and full successes), "all" (fill every slot: every relabeled rollout is a success).
        rare_goals: pick hindsight goals with probability proportional to 1 / (how often that goal has
            been achieved in the rollouts this relabeler has seen), so rare skills get replayed as goals
            more often than the ones every random walk reaches.
        check: verify that each rollout's stored rewards and goal observations match what the contract
            says its instruction and achievements imply (catches envs that break docs/CONTRACTS.md).
    """

    def __init__(self, mode: RelabelMode = "some", rare_goals: bool = False, check: bool = True):
        if mode not in RELABEL_MODES:
            raise ValueError(f"relabel mode must be one of {RELABEL_MODES}, got {mode!r}")
        self.mode, self.rare_goals, self.check = mode, bool(rare_goals), bool(check)
        self.goal_counts: Counter[int] = Counter()  # achievements seen so far, for `rare_goals`

    def __call__(self, rollout: Rollout, rng: np.random.Generator) -> Rollout:
        if self.mode == "none":
            return rollout
        if GOAL_KEY not in rollout.obs or rollout.achieved is None:
            raise GoalContractError(
                "hindsight relabeling needs goal-conditioned rollouts (obs['goal'] and Rollout.achieved); "
                f"this env does not follow docs/CONTRACTS.md. Train with {setting('relabel', 'none')}."
            )
        if rollout.time[0] != 0 or rollout.reset[1:].any():
            raise GoalContractError(
                f"hindsight relabeling needs whole single-episode rollouts: unset {flag('chunk_len')}, "
                f"{flag('episodes_per_rollout')} and {flag('rollout_horizon')}, "
                f"or train with {setting('relabel', 'none')}"
            )
        instruction = np.asarray(rollout.obs[GOAL_KEY][0], dtype=np.int64)  # [k]
        achieved = np.asarray(rollout.achieved, dtype=np.int64)  # [T+1, K]
        reward, goal_obs, completions, _ = replay_instruction(instruction, achieved)
        if self.check:
            self._check(rollout, reward, goal_obs)
        events = [(t, int(g)) for t in range(1, len(achieved)) for g in achieved[t] if g >= 1]
        self.goal_counts.update(g for _, g in events)

        length = int((instruction != 0).sum())
        n = len(completions)
        h = length - n if self.mode == "all" else int(rng.integers(0, length - n + 1))
        # hindsight candidates: every achievement except the ones that completed an original goal
        used = Counter((t, int(instruction[s])) for t, s in completions)
        candidates = []
        for event in events:
            if used[event]:
                used[event] -= 1
            else:
                candidates.append(event)
        h = min(h, len(candidates))
        if h == 0:
            return rollout  # the replay of the original instruction reproduces the stored rollout exactly
        if self.rare_goals:
            weight = np.array([1.0 / self.goal_counts[g] for _, g in candidates])
            picks = rng.choice(len(candidates), size=h, replace=False, p=weight / weight.sum())
        else:
            picks = rng.choice(len(candidates), size=h, replace=False)
        chosen = [candidates[i] for i in picks] + [(t, int(instruction[s])) for t, s in completions]
        chosen.sort(key=lambda e: e[0])  # in time order; goals of one timestep complete together in any order
        originals_left = instruction[n:length].tolist()
        new_instruction = np.zeros_like(instruction)
        new_instruction[:length] = ([g for _, g in chosen] + originals_left)[:length]  # same slots as before
        return relabel_rollout(rollout, new_instruction)

    def _check(self, rollout: Rollout, reward: np.ndarray, goal_obs: np.ndarray) -> None:
        n = len(reward)
        stored = np.asarray(rollout.reward, dtype=np.float32)
        if not np.allclose(stored, reward[:n]):
            t = int(np.flatnonzero(~np.isclose(stored, reward[:n]))[0])
            raise GoalContractError(
                f"stored reward {stored[t]} at step {t} differs from the {reward[t]} that the instruction and "
                "the achievement record imply (docs/CONTRACTS.md: 1 per sub-goal completed in order, no other "
                f"reward); fix the env or train with {setting('relabel', 'none')}"
            )
        if not np.array_equal(np.asarray(rollout.obs[GOAL_KEY]), goal_obs):
            raise GoalContractError(
                "stored obs['goal'] differs from the instruction with its completed slots zeroed "
                f"(docs/CONTRACTS.md); fix the env or train with {setting('relabel', 'none')}"
            )


def relabel_rollout(rollout: Rollout, instruction: np.ndarray) -> Rollout:
    """The rollout as if it had been played under `instruction` [k]: new goal observations, rewards,
    previous rewards and terminals; cut right after the instruction is complete (the episode would have
    ended there). Returns new arrays; `rollout` is not modified."""
    achieved = np.asarray(rollout.achieved, dtype=np.int64)
    reward, goal_obs, _, t_done = replay_instruction(np.asarray(instruction, dtype=np.int64), achieved)
    T = len(rollout.reward) if t_done is None else t_done  # transitions kept
    terminated = np.array(rollout.terminated[:T], dtype=bool)
    truncated = np.array(rollout.truncated[:T], dtype=bool)
    if t_done is not None:
        terminated[-1], truncated[-1] = True, False  # the new instruction is complete: the episode ends
    elif T and _original_completed(rollout):
        # The env ended the episode because the *original* instruction was complete; under the new one it
        # would have gone on, so the last transition is a cut (bootstrapped), not a terminal.
        terminated[-1], truncated[-1] = False, True
    prev_reward = np.zeros(T + 1, dtype=np.float32)  # [T+1]
    prev_reward[1:] = reward[:T]
    obs = {k: v[: T + 1] for k, v in rollout.obs.items()}
    obs[GOAL_KEY] = goal_obs[: T + 1]
    return replace(
        rollout,
        obs=obs,
        prev_action=rollout.prev_action[: T + 1],
        prev_reward=prev_reward,
        time=rollout.time[: T + 1],
        reset=rollout.reset[: T + 1],
        action=rollout.action[:T],
        reward=reward[:T].copy(),
        terminated=terminated,
        truncated=truncated,
        achieved=achieved[: T + 1],
    )


def _original_completed(rollout: Rollout) -> bool:
    """Whether the stored rollout ended because its own instruction was complete."""
    if not rollout.terminated[-1]:
        return False
    last_goal = np.asarray(rollout.obs[GOAL_KEY][-1])
    return bool((last_goal == 0).all())
