"""The Bernoulli bandit task and its known optimum."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch

from benchmarks.bandit_baselines import (
    bayes_optimal_return,
    oracle_return,
    thompson_return,
    win_stay_lose_shift_return,
)
from icrl.envs.make import make_env
from icrl.envs.tasks.bandit import BernoulliBandit


def test_episode_contract_and_regret() -> None:
    env = BernoulliBandit(arms=3, horizon=4)
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs) and obs[0] == 1.0
    probs = env.probs.copy()
    total, expected = 0.0, 0.0
    for t in range(4):
        obs, r, terminated, truncated, info = env.step(t % 3)
        assert r in (0.0, 1.0) and not truncated
        total += r
        expected += probs[t % 3]
        assert terminated == (t == 3)
        assert obs[0] == pytest.approx((3 - t) / 4)
    assert info["regret"] == pytest.approx(4 * probs.max() - expected)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(0)


def test_every_reset_draws_a_new_task_and_rewards_follow_it() -> None:
    env = BernoulliBandit(arms=2, horizon=2000)
    env.reset(seed=1)
    first = env.probs.copy()
    env.reset()
    assert not np.allclose(first, env.probs)
    arm = int(env.probs.argmax())
    mean = np.mean([env.step(arm)[1] for _ in range(2000)])
    assert mean == pytest.approx(env.probs[arm], abs=0.05)


@pytest.mark.parametrize("kwargs, match", [({"arms": 1}, "arms must be >= 2"), ({"horizon": 0}, "horizon")])
def test_bad_kwargs_name_the_problem(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        BernoulliBandit(**kwargs)


def test_bad_action_names_the_range() -> None:
    env = BernoulliBandit(arms=2, horizon=3)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        env.step(2)


def _brute_force_optimum(arms: int, horizon: int) -> float:
    """Bayes-optimal value by plain recursion over the (unsorted) posterior counts: the DP's reference."""
    def value(counts: tuple, left: int) -> float:
        if left == 0:
            return 0.0
        best = 0.0
        for i, (s, f) in enumerate(counts):
            m = (s + 1) / (s + f + 2)
            win = counts[:i] + ((s + 1, f),) + counts[i + 1:]
            lose = counts[:i] + ((s, f + 1),) + counts[i + 1:]
            best = max(best, m * (1 + value(win, left - 1)) + (1 - m) * value(lose, left - 1))
        return best

    return value(((0, 0),) * arms, horizon)


def test_bayes_optimal_matches_brute_force_and_hand_values() -> None:
    assert bayes_optimal_return(2, 1) == pytest.approx(0.5)
    # pull one arm; keep it after a success (posterior mean 2/3), switch after a failure (1/2)
    assert bayes_optimal_return(2, 2) == pytest.approx(0.5 + 0.5 * 2 / 3 + 0.5 * 0.5)
    for arms, horizon in itertools.product((2, 3), (3, 5)):
        assert bayes_optimal_return(arms, horizon) == pytest.approx(_brute_force_optimum(arms, horizon))


def test_the_reference_lines_are_ordered() -> None:
    """random < win-stay lose-shift < Thompson sampling < Bayes-optimal < oracle: the scale a learning curve is
    read on."""
    arms, horizon = 2, 30
    bayes = bayes_optimal_return(arms, horizon)
    thompson = thompson_return(arms, horizon, rollouts=40_000, seed=0)
    wsls = win_stay_lose_shift_return(arms, horizon, rollouts=40_000, seed=0)
    assert horizon / 2 < wsls < thompson < bayes < oracle_return(arms, horizon)
    assert thompson == pytest.approx(bayes, rel=0.06)  # Thompson sampling is near-optimal here
    with pytest.raises(ValueError, match="too many"):
        bayes_optimal_return(8, 200)


def test_builds_by_name_with_the_timestep_wrapper() -> None:
    env = make_env("bandit", env_kwargs={"arms": 3, "horizon": 7})
    obs, _ = env.reset(seed=0)
    steps = 0
    done = False
    while not done:
        obs, _, term, trunc, _ = env.step(env.action_space.sample())
        done = term or trunc
        steps += 1
    assert steps == 7


def test_the_probes_histories_carry_the_posterior_of_their_own_pulls() -> None:
    """benchmarks/bandit_probe.py: step t's inputs are pull t-1 and its reward, and the posterior mean of each arm
    counts exactly the pulls before t (uniform prior)."""
    from benchmarks.bandit_probe import centred_correlation as _r
    from benchmarks.bandit_probe import random_histories

    ts, post = random_histories(n=5, arms=3, horizon=12, seed=1)
    assert ts.shape == (5, 12) and post.shape == (5, 12, 3)
    np.testing.assert_allclose(post[:, 0], 0.5)  # nothing pulled yet
    pulls = ts.prev_action[:, 1:].argmax(-1).numpy()  # [5, 11]: pull t-1, read at step t
    rewards = ts.prev_reward[:, 1:].numpy()
    for i in range(5):
        for t in range(1, 12):
            for a in range(3):
                mine = pulls[i, :t] == a
                expected = (1 + rewards[i, :t][mine].sum()) / (2 + mine.sum())
                assert post[i, t, a] == pytest.approx(expected)
    assert ts.reset[:, 0].all() and not ts.reset[:, 1:].any()
    x = np.random.default_rng(0).normal(size=(4, 7, 3))
    assert _r(x, x) == pytest.approx(1.0) and _r(x, -x) == pytest.approx(-1.0)


def test_the_probes_arm_offset_splits_a_fixed_preference_from_what_the_history_moves() -> None:
    """benchmarks/bandit_probe.py: Q = (a history-independent preference between the arms) + (a part that moves with
    the history); `arm_offset` returns the first, centred over the arms, and the spread of the second."""
    from benchmarks.bandit_probe import arm_offset

    rng = np.random.default_rng(0)
    moved = rng.normal(size=(200, 9, 2))
    moved -= moved.mean((0, 1))  # no preference left in the moving part
    q = moved + np.array([3.0, 2.5])  # arm 0 preferred by 0.5 everywhere, on top of a common level
    out = arm_offset(q)
    assert out["q_arm_offset"] == pytest.approx([0.25, -0.25], abs=1e-3)
    centred = moved - moved.mean(-1, keepdims=True)
    assert out["q_history_sd"] == pytest.approx(float(centred.std()), abs=1e-3)
    assert arm_offset(np.ones((4, 5, 3)))["q_history_sd"] == 0.0


def test_the_action_offset_probes_random_rollouts_are_the_runs_env_cut_at_its_context(tmp_path) -> None:
    """benchmarks/action_offset_probe.py plays the run's own env (config.json) with random actions, one window
    [1, T] per rollout from its start, T at most the run's context; each step carries the previous step's action."""
    from benchmarks.action_offset_probe import random_rollouts

    config = {"env": {"env": "bandit", "env_kwargs": '{"arms": 3, "horizon": 6}'}, "model": {"max_seq_len": 4}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    batch = random_rollouts(tmp_path, n=3, seed=0)
    ts = batch.inputs
    assert ts.shape == (3, 4) and ts.prev_action.shape == (3, 4, 3) and batch.has_action.all()
    assert (ts.time == torch.arange(4)).all() and ts.reset[:, 0].all() and not ts.reset[:, 1:].any()
    assert (ts.prev_action[:, 0].sum(-1) == 0).all() and (ts.prev_action[:, 1:].sum(-1) == 1).all()
    (tmp_path / "config.json").write_text(json.dumps({**config, "model": {"max_seq_len": 50}}))
    batch = random_rollouts(tmp_path, n=2, seed=0)  # the episode ends first: 6 pulls, then the final timestep
    assert ((batch.has_action & batch.mask).sum(1) == 6).all() and (batch.mask.sum(1) == 7).all()
