"""Procgen: `procgen/<game>` and `procgen_multi` (icrl/envs/tasks/procgen.py). Spaces, the game and level draw,
replayed levels for a second attempt, seeding, reward factors, clear errors, and a tiny `icrl.train` run whose
metrics rows carry `return/<game>`. All but the missing-package test need procgen2 + gym3 (installed without
their pins: the module's docstring); a step takes ~0.1 ms."""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest

from icrl.envs import make_env, make_wrapped_env
from icrl.envs.tasks import procgen
from icrl.nets.tstep import is_image_space

from helpers import tiny_run_tasks

REASON = "procgen is not installed: pip install cffi imageio && pip install --no-deps procgen2 gym3"


@pytest.fixture
def engine():
    if importlib.util.find_spec("procgen") is None or importlib.util.find_spec("gym3") is None:
        pytest.skip(REASON)


def _play(env, seed=None, options=None, steps=40):
    obs, info = env.reset(seed=seed, options=options)
    frames, rewards = [obs], []
    for t in range(steps):
        obs, reward, terminated, truncated, step_info = env.step(t % procgen.ACTIONS)
        frames.append(obs)
        rewards.append(reward)
        assert step_info["task"] == info["task"] and step_info["level"] == info["level"]
        if terminated:
            assert isinstance(step_info["success"], bool)
            break
    return info, frames, rewards


def test_a_missing_package_is_a_clear_error(monkeypatch):
    monkeypatch.delitem(sys.modules, "procgen", raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    for name in ("procgen/coinrun", "procgen_multi"):
        with pytest.raises(ImportError, match=r"pip install --no-deps procgen2 gym3"):
            make_env(name)


def test_spaces_and_the_game_and_level_draw(engine):
    env = make_env("procgen_multi", {"games": ["coinrun", "bigfish", "maze"], "levels": [5, 9]})
    assert env.observation_space.shape == (64, 64, 3) and is_image_space(env.observation_space)
    assert env.action_space.n == 15
    seen = set()
    for seed in range(12):
        info, frames, _ = _play(env, seed=seed, steps=5)
        assert info["task"] in ("coinrun", "bigfish", "maze") and 5 <= info["level"] <= 9
        assert all(f.dtype == np.uint8 and f.shape == (64, 64, 3) for f in frames)
        seen.add(info["task"])
    assert len(seen) >= 2
    assert make_env("procgen/heist").reset(seed=0)[1]["task"] == "heist"


def test_a_seed_repeats_the_play_and_a_second_attempt_replays_the_level(engine):
    a, b = make_env("procgen_multi"), make_env("procgen_multi")
    info_a, frames_a, rewards_a = _play(a, seed=7)
    info_b, frames_b, rewards_b = _play(b, seed=7)
    assert info_a == info_b and rewards_a == rewards_b
    assert all(np.array_equal(x, y) for x, y in zip(frames_a, frames_b))
    again, frames_again, _ = _play(a, options={"new_task": False}, steps=0)  # the next attempt: same level
    assert (again["task"], again["level"]) == (info_a["task"], info_a["level"])
    assert np.array_equal(frames_again[0], frames_a[0])
    levels = {_play(a, options={"new_task": True}, steps=0)[0]["level"] for _ in range(6)}
    assert len(levels) > 1  # a new task draws a new level


def test_reward_factors_multiply_one_games_rewards(engine):
    plain = make_env("procgen/bigfish")
    scaled = make_env("procgen/bigfish", {"reward_scales": {"bigfish": 10.0}})
    paid = 0
    for seed in range(10):
        _, _, r1 = _play(plain, seed=seed, steps=300)
        _, _, r2 = _play(scaled, seed=seed, steps=300)
        assert r2 == [10.0 * r for r in r1]
        paid += sum(r != 0 for r in r1)
    assert paid > 0  # some rollout was paid, so the factor was seen at work


@pytest.mark.parametrize("kwargs, match", [
    ({"games": "coinrun"}, "list of game names"),
    ({"games": ["coinrun", "coinrun"]}, "distinct games"),
    ({"games": ["pong"]}, "distinct games of"),
    ({"distribution_mode": "extreme"}, "distribution_mode"),
    ({"levels": [9, 5]}, "levels"),
    ({"reward_scales": {"coinrun": 0}}, "reward_scales"),
    ({"reward_scales": {"coinrun": "ten"}}, "reward_scales"),
    ({"time_limit": 0}, "time_limit"),
    ({"games": ["maze"], "reward_scales": {"coinrun": 2}}, "reward_scales"),
])
def test_bad_kwargs_are_clear_errors(engine, kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_env("procgen_multi", kwargs)


def test_memory_hard_uses_memory_mode_only_where_a_game_has_it(engine):
    env = procgen.ProcgenGames(["maze", "coinrun"], distribution_mode="memory-hard")
    assert env._mode("maze") == "memory" and env._mode("coinrun") == "hard"
    for seed in range(4):
        env.reset(seed=seed)  # both modes build


def test_two_attempt_rollouts_and_a_tiny_run_log_return_per_game(engine, tmp_path):
    wrapped = make_wrapped_env("procgen_multi", {"games": ["bigfish"], "time_limit": 5}, episodes_per_rollout=2)
    _, info = wrapped.reset(seed=0)
    ends, steps, done = 0, 0, False
    while not done:  # two attempts at one level, each truncated at 5 steps
        _, _, terminated, truncated, step_info = wrapped.step(0)
        ends, steps, done = ends + bool(step_info.get("episode_end")), steps + 1, terminated or truncated
        assert (step_info["task"], step_info["level"]) == (info["task"], info["level"])
    assert ends == 2 and steps <= 11  # the bridge step between attempts, at most
    games = {"coinrun", "bigfish"}  # 12-step episodes: rollouts finish
    tiny_run_tasks("procgen_multi", {"games": sorted(games), "time_limit": 12}, tmp_path / "procgen", games)
