"""Passive T-Maze: optimal return exactly 1, cue only at t=0, penalties, success info, seeding."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from icrl.envs import TimestepWrapper, TMaze
from icrl.envs.tasks.tmaze import DOWN, LEFT, RIGHT, UP, TMazeActive


def play(env, actions, seed):
    obs, _ = env.reset(seed=seed)
    history = [obs]
    ret, steps = 0.0, []
    for a in actions:
        obs, r, term, trunc, info = env.step(a)
        history.append(obs)
        ret += r
        steps.append((r, term, trunc, info))
        if term or trunc:
            break
    return ret, history, steps


def cue_action(obs0):
    return UP if obs0[0] == 1 else DOWN


@pytest.mark.parametrize("length", [1, 5, 50])
def test_optimal_policy_gets_one(length):
    for seed in range(6):
        env = TMaze(length=length)
        obs0, _ = env.reset(seed=seed)
        ret, hist, steps = play(env, [RIGHT] * length + [cue_action(obs0)], seed)
        assert ret == 1.0
        assert len(steps) == length + 1 == env.horizon
        assert steps[-1][1] and not steps[-1][2]
        assert steps[-1][3]["success"] == 1.0


def test_wrong_end_gets_zero():
    env = TMaze(length=4)
    obs0, _ = env.reset(seed=0)
    wrong = DOWN if cue_action(obs0) == UP else UP
    ret, _, steps = play(env, [RIGHT] * 4 + [wrong], seed=0)
    assert ret == 0.0 and steps[-1][1] and steps[-1][3]["success"] == 0.0
    assert all("success" not in s[3] for s in steps[:-1])  # success only on the last step


def test_dawdling_is_penalised_and_times_out():
    env = TMaze(length=4)
    ret, _, steps = play(env, [UP, RIGHT, LEFT, RIGHT, RIGHT, RIGHT, RIGHT], seed=1)
    assert len(steps) == env.horizon == 5  # time limit before reaching the junction
    # the horizon is part of the task: it terminates (no bootstrap), it does not truncate
    assert steps[-1][1] and not steps[-1][2] and steps[-1][3]["success"] == 0.0
    assert [s[0] for s in steps] == pytest.approx([-0.2, 0.0, -0.2, 0.0, 0.0])
    # with a longer horizon the agent can still succeed, with a smaller return
    env = TMaze(length=3, horizon=10)
    obs0, _ = env.reset(seed=2)
    ret, _, steps = play(env, [LEFT, RIGHT, RIGHT, RIGHT, RIGHT, cue_action(obs0)], seed=2)
    # LEFT at cell 0 bumps the wall, RIGHT at the junction does not move: two penalties
    assert ret == pytest.approx(1.0 - 2 / 10) and steps[-1][3]["success"] == 1.0


def test_cue_only_at_t0_and_junction_visible():
    env = TMaze(length=6)
    for seed in range(4):
        obs0, _ = env.reset(seed=seed)
        assert obs0[:2].sum() == 1 and obs0[2] == 1 and obs0[3] == 0
        _, hist, _ = play(env, [RIGHT] * 6 + [UP], seed=seed)
        for obs in hist[1:]:
            assert obs[:2].sum() == 0
        assert all(o[2] == 1 and o[3] == 0 for o in hist[:6])
        assert hist[6][3] == 1 and hist[6][2] == 0  # the junction is recognisable
        # corridor observations do not depend on the goal
        assert all(np.array_equal(o, hist[1]) for o in hist[1:6])


def test_seeding_is_deterministic_and_both_goals_occur():
    goals = [TMaze().reset(seed=s)[0][0] for s in range(20)]
    assert goals == [TMaze().reset(seed=s)[0][0] for s in range(20)]
    assert 0 < sum(goals) < 20


def test_new_task_option_keeps_goal():
    env = TMaze(length=2)
    first = env.reset(seed=3)[0]
    for _ in range(10):
        assert np.array_equal(env.reset(options={"new_task": False})[0], first)
    changed = {tuple(env.reset(options={"new_task": True})[0]) for _ in range(20)}
    assert len(changed) == 2


def test_passes_gymnasium_checker_and_wraps():
    check_env(TMaze(length=3), skip_render_check=True)
    env = TimestepWrapper(TMaze(length=3))
    ts, _ = env.reset(seed=0)
    assert env.action_spec.kind == "discrete" and env.action_spec.dim == 4
    assert ts["obs"]["obs"].shape == (4,)


def test_invalid_arguments():
    with pytest.raises(ValueError):
        TMaze(length=0)
    with pytest.raises(ValueError):
        TMaze(length=5, horizon=3)


# ------------------------------------------------------------------------------------------- active T-Maze
def optimal_active(env, seed):
    """Scripted optimal policy: left to the cue cell, read the cue, right to the junction, choose."""
    obs, _ = env.reset(seed=seed)
    assert obs[:2].sum() == 0  # the cue is not visible from the start cell
    obs, r0, *_ = env.step(LEFT)
    assert obs[:2].sum() == 1 and r0 == 0.0
    return [LEFT] + [RIGHT] * env.length + [cue_action(obs)]


@pytest.mark.parametrize("length", [1, 5, 50])
def test_active_optimal_policy_gets_one(length):
    for seed in range(6):
        env = TMazeActive(length=length)
        ret, _, steps = play(env, optimal_active(env, seed), seed)
        assert ret == 1.0
        assert len(steps) == length + 2 == env.horizon
        assert steps[-1][1] and not steps[-1][2] and steps[-1][3]["success"] == 1.0
        assert all(s[0] == 0.0 for s in steps[:-1]) and all("success" not in s[3] for s in steps[:-1])


def test_active_cue_visible_only_on_cue_cell():
    env = TMazeActive(length=4, horizon=30)
    for seed in range(4):
        # wander: right, back left past the start onto the cue cell, stay (bump), leave, come back, go on
        actions = [RIGHT, LEFT, LEFT, LEFT, UP, RIGHT, LEFT, RIGHT, RIGHT, RIGHT, RIGHT]
        _, hist, _ = play(env, actions, seed)
        positions = [1, 2, 1, 0, 0, 0, 1, 0, 1, 2, 3, 4]
        goal = 0 if env.goal_up[0] else 1
        for obs, pos in zip(hist, positions):
            if pos == 0:
                assert obs[goal] == 1 and obs[1 - goal] == 0
            else:
                assert obs[:2].sum() == 0
            assert obs[2] == (pos < 4) and obs[3] == (pos == 4)


def test_active_skipping_the_cue_can_only_guess():
    length = 6
    seen, wins = set(), 0
    for seed in range(40):
        env = TMazeActive(length=length)
        ret, hist, steps = play(env, [RIGHT] * (length - 1) + [UP], seed)
        seen.add(tuple(np.concatenate(hist).tolist()))  # observations never depend on the goal
        assert all(o[:2].sum() == 0 for o in hist)
        wins += steps[-1][3]["success"] == 1.0
        # each right step before the cue is seen is penalised
        assert ret == pytest.approx(float(env.goal_up[0]) - (length - 1) / env.horizon)
    assert len(seen) == 1 and 0 < wins < 40


def test_active_rewards_hand_built():
    env = TMazeActive(length=3, horizon=10)  # penalty 0.1
    # start at 1: RIGHT (wrong way before the cue, -0.1) -> 2; LEFT (toward the cue, 0) -> 1; UP in the
    # corridor (-0.1); LEFT onto the cue (0) -> 0; LEFT bump (-0.1); RIGHT x3 (0) -> junction 3;
    # RIGHT at the junction (-0.1); then the cued end (+1).
    actions = [RIGHT, LEFT, UP, LEFT, LEFT, RIGHT, RIGHT, RIGHT, RIGHT]
    ret, hist, steps = play(env, actions, seed=0)
    cue = cue_action(hist[4])
    assert [s[0] for s in steps] == pytest.approx([-0.1, 0, -0.1, 0, -0.1, 0, 0, 0, -0.1])
    obs, r, term, trunc, info = env.step(cue)
    assert r == 1.0 and term and not trunc and info["success"] == 1.0
    assert ret + r == pytest.approx(0.6)
    # after seeing the cue, walking left again is penalised; wrong end gives 0; time limit -> success 0
    env = TMazeActive(length=2, horizon=6)
    _, hist, steps = play(env, [LEFT, RIGHT, LEFT, RIGHT, RIGHT], seed=1)
    assert [s[0] for s in steps] == pytest.approx([0, 0, -1 / 6, 0, 0])
    wrong = DOWN if cue_action(hist[1]) == UP else UP
    _, r, term, _, info = env.step(wrong)
    assert r == 0.0 and term and info["success"] == 0.0
    env = TMazeActive(length=2)
    ret, _, steps = play(env, [UP] * 10, seed=2)
    assert len(steps) == env.horizon == 4 and steps[-1][1] and steps[-1][3]["success"] == 0.0
    assert ret == pytest.approx(-1.0)


def test_active_tasks_seeding_render_and_checker():
    goals = [_goal(s) for s in range(20)]
    assert goals == [_goal(s) for s in range(20)] and 0 < sum(goals) < 20
    env = TMazeActive(length=3)
    env.reset(seed=3)
    g = bool(env.goal_up[0])
    assert all(env.reset(options={"new_task": False}) and env.goal_up[0] == g for _ in range(10))
    check_env(TMazeActive(length=3), skip_render_check=True)
    wrapped = TimestepWrapper(TMazeActive(length=3))
    assert wrapped.reset(seed=0)[0]["obs"]["obs"].shape == (4,) and wrapped.action_spec.dim == 4
    env = TMazeActive(length=3, render_mode="ansi")
    env.reset(seed=0)
    assert env.render().startswith("cA.+")
    env = TMazeActive(length=3, render_mode="rgb_array")
    env.reset(seed=0)
    frame = env.render()
    assert frame.shape == (36, 48, 3) and frame.dtype == np.uint8
    cue_rows = frame[:12, :12].copy(), frame[24:, :12].copy()
    env.step(LEFT)  # on the cue cell the cue is drawn above or below it
    on_cue = env.render()
    assert not (
        np.array_equal(on_cue[:12, :12], cue_rows[0]) and np.array_equal(on_cue[24:, :12], cue_rows[1])
    )
    with pytest.raises(ValueError):
        TMazeActive(length=0)
    with pytest.raises(ValueError):
        TMazeActive(length=5, horizon=6)  # optimal path takes 7 steps


def _goal(seed: int) -> bool:
    env = TMazeActive(length=3)
    env.reset(seed=seed)
    return bool(env.goal_up[0])
