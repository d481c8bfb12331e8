"""Hindsight instruction relabeling (icrl/data/relabel.py) on hand-built goal-conditioned rollouts."""

from __future__ import annotations

import numpy as np
import pytest

from icrl.data.relabel import GoalContractError, HindsightRelabeler, relabel_rollout, replay_instruction
from icrl.types import Rollout

NONE = -1


def goal_rollout(instruction, achieved_rows, terminated_end=None, K=2) -> Rollout:
    """A rollout scored exactly as docs/CONTRACTS.md says: rows of achieved tokens for t = 1..T."""
    T = len(achieved_rows)
    achieved = np.full((T + 1, K), NONE, dtype=np.int64)
    for t, row in enumerate(achieved_rows, start=1):
        achieved[t, : len(row)] = row
    instruction = np.asarray(instruction, dtype=np.int64)
    reward, goal_obs, _, t_done = replay_instruction(instruction, achieved)
    if t_done is not None:  # the env ends the episode when the instruction is complete
        T = t_done
    terminated = np.zeros(T, dtype=bool)
    truncated = np.zeros(T, dtype=bool)
    if t_done is not None:
        terminated[-1] = True
    elif terminated_end:
        terminated[-1] = True
    else:
        truncated[-1] = True
    prev_reward = np.zeros(T + 1, dtype=np.float32)
    prev_reward[1:] = reward[:T]
    rng = np.random.default_rng(0)
    return Rollout(
        obs={"goal": goal_obs[: T + 1], "pos": rng.normal(size=(T + 1, 3)).astype(np.float32)},
        prev_action=rng.normal(size=(T + 1, 2)).astype(np.float32),
        prev_reward=prev_reward,
        time=np.arange(T + 1),
        reset=np.r_[True, np.zeros(T, bool)],
        action=rng.integers(0, 4, size=T),
        reward=reward[:T],
        terminated=terminated,
        truncated=truncated,
        achieved=achieved[: T + 1],
    )


def frozen(rollout: Rollout) -> Rollout:
    for arr in rollout.to_arrays().values():
        arr.flags.writeable = False  # as the sampler's cache hands them out
    return rollout


def test_replay_instruction_scores_goals_in_order():
    ach = np.full((6, 2), -1)
    ach[1, 0] = 7  # not the current goal: nothing
    ach[2, 0] = 5  # completes slot 0
    ach[3, :] = [7, 9]  # completes slot 1 (7); 9 is not current yet... slot 2 is 9: completed in the same step
    reward, goal_obs, completions, t_done = replay_instruction(np.array([5, 7, 9]), ach)
    assert reward.tolist() == [0, 1, 2, 0, 0]
    assert completions == [(2, 0), (3, 1), (3, 2)]
    assert t_done == 3
    assert goal_obs[:2].tolist() == [[5, 7, 9], [5, 7, 9]]
    assert goal_obs[2].tolist() == [0, 7, 9]
    assert goal_obs[3].tolist() == [0, 0, 0]


def test_reset_achievements_do_not_count():
    ach = np.full((3, 1), -1)
    ach[0, 0] = 5
    reward, _, completions, t_done = replay_instruction(np.array([5]), ach)
    assert reward.tolist() == [0, 0] and completions == [] and t_done is None


def test_one_achievement_completes_one_slot():
    ach = np.full((3, 1), -1)
    ach[1, 0] = 4
    reward, _, _, t_done = replay_instruction(np.array([4, 4]), ach)
    assert reward.tolist() == [1, 0] and t_done is None
    ach[2, 0] = 4
    reward, _, _, t_done = replay_instruction(np.array([4, 4]), ach)
    assert reward.tolist() == [1, 1] and t_done == 2


def test_none_mode_and_successful_rollouts_are_unchanged():
    r = frozen(goal_rollout([3, 4], [[3], [1], [4]]))  # succeeds at t=3
    assert r.terminated[-1] and r.reward.sum() == 2
    for mode in ("none", "some", "all"):
        assert HindsightRelabeler(mode)(r, np.random.default_rng(0)) is r


def test_rollout_that_achieved_nothing_is_unchanged():
    r = frozen(goal_rollout([3, 4], [[], [], []]))
    assert HindsightRelabeler("all")(r, np.random.default_rng(0)) is r


def test_all_mode_turns_a_failure_into_a_success_with_achieved_goals_in_time_order():
    rows = [[11], [12], [3], [13], [14], [15]]  # original [3, 4, 5]: only 3 done (t=3)
    r = frozen(goal_rollout([3, 4, 5], rows))
    assert r.reward.sum() == 1 and r.truncated[-1]
    before = {k: v.copy() for k, v in r.to_arrays().items()}
    for seed in range(20):
        out = HindsightRelabeler("all")(r, np.random.default_rng(seed))
        new = out.obs["goal"][0]
        assert 3 in new.tolist() and new.tolist().index(3) >= 0  # the original goal it reached is kept
        times = {11: 1, 12: 2, 3: 3, 13: 4, 14: 5, 15: 6}
        assert set(new.tolist()) <= set(times)  # only goals achieved in this rollout
        assert [times[g] for g in new] == sorted(times[g] for g in new)  # in the order achieved
        assert out.reward.sum() == 3 and out.terminated[-1] and not out.truncated[-1]  # a success
        t_end = max(times[g] for g in new)
        assert len(out.reward) == t_end  # cut where the new instruction is complete
        assert out.obs["goal"][-1].tolist() == [0, 0, 0]
        np.testing.assert_array_equal(out.prev_reward[1:], out.reward)
        assert out.prev_reward[0] == 0
        out.validate()
        np.testing.assert_array_equal(out.action, r.action[:t_end])
        np.testing.assert_array_equal(out.obs["pos"], r.obs["pos"][: t_end + 1])
    for k, v in r.to_arrays().items():  # the stored rollout is never modified
        np.testing.assert_array_equal(v, before[k])


def test_relabeled_rewards_and_terminals_recomputed_exactly():
    rows = [[7], [], [8], [3], [9]]
    r = frozen(goal_rollout([3, 4], rows))
    out = relabel_rollout(r, np.array([7, 8]))
    assert out.reward.tolist() == [1, 0, 1]
    assert out.terminated.tolist() == [False, False, True] and not out.truncated.any()
    assert out.obs["goal"].tolist() == [[7, 8], [0, 8], [0, 8], [0, 0]]
    assert out.prev_reward.tolist() == [0, 1, 0, 1]
    # an instruction it never completes: full length, original time-limit cut kept
    out = relabel_rollout(r, np.array([8, 7]))
    assert out.reward.tolist() == [0, 0, 1, 0, 0] and out.truncated[-1] and not out.terminated.any()


def test_env_termination_other_than_success_is_kept():
    r = frozen(goal_rollout([3, 4], [[5], [6]], terminated_end=True))  # e.g. the agent died
    out = relabel_rollout(r, np.array([6, 9]))
    assert out.reward.tolist() == [0, 1] and out.terminated[-1] and not out.truncated[-1]


def test_some_mode_mixes_partial_and_full_successes():
    rows = [[11], [12], [13], [14], [15], [16]]
    r = frozen(goal_rollout([1, 2, 3], rows))
    returns = [HindsightRelabeler("some")(r, np.random.default_rng(s)).reward.sum() for s in range(200)]
    assert set(returns) == {0.0, 1.0, 2.0, 3.0}


def test_some_mode_keeps_uncompleted_originals_after_the_hindsight_goals():
    rows = [[11], [3], [12], [13]]
    r = frozen(goal_rollout([3, 4, 5], rows))
    seen = set()
    for s in range(100):
        new = HindsightRelabeler("some")(r, np.random.default_rng(s)).obs["goal"][0].tolist()
        seen.add(tuple(new))
        n_hind = sum(g in (11, 12, 13) for g in new)
        assert new[: n_hind + 1].count(3) == 1  # the reached original stays, in its time order
        assert new[n_hind + 1 :] == [4, 5][: 3 - n_hind - 1]  # then the next uncompleted originals
    assert (3, 4, 5) in seen and len(seen) > 3


def test_relabeling_is_deterministic_under_a_seed():
    rows = [[11], [12], [13], [14], [15], [16], [17]]
    r = frozen(goal_rollout([1, 2, 3], rows))
    a = [HindsightRelabeler("some")(r, np.random.default_rng(7)).obs["goal"][0].tolist() for _ in range(3)]
    assert a[0] == a[1] == a[2]


def test_rare_goals_are_picked_more_often():
    relabeler = HindsightRelabeler("all", rare_goals=True)
    common = frozen(goal_rollout([1], [[20]] * 10))
    rng = np.random.default_rng(0)
    for _ in range(20):  # goal 20 becomes very common
        relabeler(common, rng)
    mixed = frozen(goal_rollout([1], [[20]] * 5 + [[30]] + [[20]] * 5))
    picks = [relabeler(mixed, rng).obs["goal"][0][0] for _ in range(200)]
    assert np.mean(np.asarray(picks) == 30) > 0.5  # uniform picking would give 1/11
    plain = HindsightRelabeler("all")
    picks = [plain(mixed, np.random.default_rng(s)).obs["goal"][0][0] for s in range(200)]
    assert np.mean(np.asarray(picks) == 30) < 0.25


def test_padding_slots_stay_empty():
    r = frozen(goal_rollout([3, 0, 0], [[11], [12], [13]]))
    for s in range(20):
        out = HindsightRelabeler("all")(r, np.random.default_rng(s))
        assert out.obs["goal"][0][1:].tolist() == [0, 0] and out.reward.sum() == 1


def test_contract_violations_are_named():
    r = goal_rollout([3, 4], [[11], [3], [12]])
    bad = Rollout(**{**r.__dict__, "reward": r.reward + np.array([0.5, 0, 0], np.float32)})
    with pytest.raises(GoalContractError, match="stored reward"):
        HindsightRelabeler("all")(bad, np.random.default_rng(0))
    no_goals = Rollout(**{**r.__dict__, "achieved": None})
    with pytest.raises(GoalContractError, match="relabel='none'"):
        HindsightRelabeler("all")(no_goals, np.random.default_rng(0))
    chunk = Rollout(**{**r.__dict__, "time": r.time + 5})
    with pytest.raises(GoalContractError, match="chunk_len"):
        HindsightRelabeler("some")(chunk, np.random.default_rng(0))
    with pytest.raises(ValueError, match="relabel mode"):
        HindsightRelabeler("most")  # type: ignore[arg-type]
