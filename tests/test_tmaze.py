"""Passive T-Maze: optimal return exactly 1, cue only at t=0, penalties, success info, seeding."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from icrl.envs import TMaze, TimestepWrapper
from icrl.envs.tmaze import DOWN, LEFT, RIGHT, UP


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
    assert steps[-1][2] and not steps[-1][1] and steps[-1][3]["success"] == 0.0
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
