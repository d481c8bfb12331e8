"""Atari (ale-py): `atari/<Game>` and `atari_multi` (icrl/envs/tasks/atari.py). Spaces, the full action space
for every game, seeding, the game draw and `info["task"]`, unclipped rewards, the frame time limit, clear
errors, and a tiny `icrl.train` run whose metrics rows carry `return/<game>`. All but the missing-extra test
need ale-py; a step takes about a millisecond, so the tests play short stretches of real games."""

from __future__ import annotations

import numpy as np
import pytest

from icrl.envs import make_env, make_wrapped_env
from icrl.envs.registry import ENV_FAMILIES
from icrl.envs.tasks import atari
from icrl.nets.tstep import is_image_space

from helpers import assert_missing_extra_reported, tiny_run_tasks

ALE_REASON = "ale-py is not installed: pip install 'icrl[atari]'"


@pytest.fixture
def ale():
    return pytest.importorskip("ale_py", reason=ALE_REASON)


def _play(env, seed: int, actions) -> tuple[list[np.ndarray], list[float], list[dict]]:
    obs, info = env.reset(seed=seed)
    frames, rewards, infos = [obs], [], [info]
    for a in actions:
        obs, reward, terminated, truncated, info = env.step(a)
        frames.append(obs)
        rewards.append(reward)
        infos.append(info)
        if terminated or truncated:
            break
    return frames, rewards, infos


def test_missing_extra_is_a_clear_error(monkeypatch, capsys):
    assert_missing_extra_reported(monkeypatch, capsys, "ale_py", ["atari/Pong", "atari_multi"], "atari", "atari")


def test_spaces_are_images_with_the_full_action_space(ale):
    cases = [({}, (84, 84, 3)), ({"grayscale": True}, (84, 84, 1)), ({"resolution": [64, 48]}, (64, 48, 3))]
    for kwargs, shape in cases:
        env = make_env("atari/Pong", kwargs)
        assert env.observation_space.shape == shape and is_image_space(env.observation_space)
        obs, info = env.reset(seed=0)
        assert obs.dtype == np.uint8 and env.observation_space.contains(obs) and info["task"] == "Pong"
        obs, _, _, _, info = env.step(0)
        assert env.observation_space.contains(obs) and info["task"] == "Pong" and "lives" in info
        env.close()
    for game in ("Breakout", "SpaceInvaders", "Qbert"):  # 4, 6 and 6 minimal actions: all play the same 18
        env = make_env(f"atari/{game}")
        assert env.action_space.n == 18 and env.ale_env.action_space.n == 18
        env.close()
    multi = make_env("atari_multi")
    assert multi.games == list(atari.DEFAULT_GAMES) and multi.action_space.n == 18
    wrapped = make_wrapped_env("atari_multi", {"games": ["Pong"]})
    obs, _ = wrapped.reset(seed=0)
    image = obs["obs"]["obs"]
    assert image.shape == (84, 84, 3) and image.dtype == np.uint8  # an image key: the CNN reads it
    assert "Pong" in ENV_FAMILIES["atari/"].members() and len(atari.atari_env_names()) > 50


def test_same_seed_same_play_and_the_frame_time_limit(ale):
    actions = np.random.default_rng(0).integers(18, size=60)
    runs = [_play(make_env("atari/Breakout"), seed, actions) for seed in (3, 3)]
    assert all((a == b).all() for a, b in zip(runs[0][0], runs[1][0])) and runs[0][1] == runs[1][1]
    env = make_env("atari/Pong", {"time_limit": 50, "frame_skip": 5})  # 50 emulator frames: 10 steps
    env.reset(seed=0)
    ends = [env.step(0)[2:4] for _ in range(10)]
    assert ends[:9] == [(False, False)] * 9 and ends[9] == (False, True)
    env = make_env("atari/Breakout", {"terminal_on_life_loss": True})
    _, _, infos = _play(env, 0, [1] + [0] * 400)  # serve, then never move: the ball is missed
    assert len(infos) < 400 and infos[-1]["lives"] < infos[0]["lives"]


def test_multi_draws_a_game_per_rollout_and_names_it(ale):
    env = make_env("atari_multi", {"games": ["Pong", "breakout", "space_invaders"]})  # case and "_" ignored
    assert env.games == ["Pong", "Breakout", "SpaceInvaders"]

    def draws(seed: int) -> list[str]:
        names = [env.reset(seed=seed)[1]["task"]] + [env.reset()[1]["task"] for _ in range(11)]
        return names

    first = draws(0)
    assert set(first) == set(env.games) and draws(0) == first  # every game drawn; the draw follows the seed
    _, info = env.reset()
    for _ in range(3):  # a new episode of the same game (meta-RL rollouts) keeps it
        assert env.reset(options={"new_task": False})[1]["task"] == info["task"]
    obs, _, _, _, step_info = env.step(5)
    assert step_info["task"] == info["task"] and step_info["task_id"] == env.games.index(info["task"])
    screens = {}
    for _ in range(12):
        obs, info = env.reset()
        screens[info["task"]] = obs
    assert len(screens) == 3 and not np.array_equal(screens["Pong"], screens["Breakout"])  # no id: the screen


def test_rewards_are_unclipped_unless_asked(ale):
    actions = np.random.default_rng(1).choice([1, 11, 12], size=600)  # fire, fire while moving
    _, raw, _ = _play(make_env("atari/SpaceInvaders"), 0, actions)
    _, clipped, _ = _play(make_env("atari/SpaceInvaders", {"clip_rewards": True}), 0, actions)
    assert max(raw) > 1.0  # invaders score 5..30 points each
    assert clipped == [min(max(r, -1.0), 1.0) for r in raw]


def test_bad_kwargs_are_one_line_errors(ale):
    pongg = r"Unknown Atari game 'Pongg'\. Did you mean 'Pong'\? .*Breakout"  # a close match, then all games
    with pytest.raises(ValueError, match=pongg) as e:
        make_env("atari_multi", {"games": ["Pongg"]})
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="Unknown Atari game"):
        make_env("atari/Pongg")
    with pytest.raises(ValueError, match="list of game names"):
        make_env("atari_multi", {"games": "Pong"})
    for bad in ({"frame_skip": 0}, {"sticky_action_prob": 2}, {"resolution": 4}, {"games": ["Pong", "pong"]}):
        with pytest.raises(ValueError):
            make_env("atari_multi", bad)


def test_a_tiny_run_logs_return_per_game(ale, tmp_path):
    games = ["Pong", "Breakout"]
    kwargs = {"games": games, "time_limit": 60, "resolution": 42}  # 12-step episodes: rollouts finish
    tiny_run_tasks("atari_multi", kwargs, tmp_path / "atari", set(games))
