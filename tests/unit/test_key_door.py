"""Dark Key-To-Door: hidden key/door per task, key before door, rewards, random starts, long rollouts."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from icrl.envs import Collector, RandomPolicy, TimestepWrapper
from icrl.envs.tasks.key_door import DOWN, LEFT, RIGHT, STAY, UP, DarkKeyToDoor


def path_to(src: tuple[int, int], dst: tuple[int, int]) -> list[int]:
    """Rows first, then columns (the room has no obstacles)."""
    dr, dc = dst[0] - src[0], dst[1] - src[1]
    return [DOWN if dr > 0 else UP] * abs(dr) + [RIGHT if dc > 0 else LEFT] * abs(dc)


def play(env, actions):
    ret, steps = 0.0, []
    for a in actions:
        obs, r, term, trunc, info = env.step(a)
        ret += r
        steps.append((obs, r, term, trunc, info))
        if term or trunc:
            break
    return ret, steps


def place(env: DarkKeyToDoor, agent, key, door) -> None:
    """Hand-build a scenario (after a reset): the one copy's row of the task's arrays."""
    env._pos[0], env.key[0], env.door[0], env.has_key[0] = agent, key, door, False


def room(env: DarkKeyToDoor) -> tuple[tuple[int, int], tuple[int, int]]:
    """The one copy's key and door cells."""
    return cell(env.key[0]), cell(env.door[0])


def cell(row) -> tuple[int, int]:
    return int(row[0]), int(row[1])


def test_spaces_and_checker():
    env = DarkKeyToDoor()
    assert env.action_space == gym.spaces.Discrete(5)
    assert env.observation_space.shape == (2,)
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    np.testing.assert_allclose(obs * 8, env._pos[0])
    obs, _ = DarkKeyToDoor(size=5, obs_mode="onehot").reset(seed=0)
    assert obs.shape == (25,) and obs.sum() == 1
    check_env(DarkKeyToDoor(size=5), skip_render_check=True)
    check_env(DarkKeyToDoor(size=4, obs_mode="onehot", random_start=False), skip_render_check=True)


def test_key_then_door_gives_two_and_success():
    env = DarkKeyToDoor()
    env.reset(seed=0)
    place(env, (4, 4), key=(0, 0), door=(8, 8))
    ret, steps = play(env, path_to((4, 4), (0, 0)) + path_to((0, 0), (8, 8)))
    assert ret == 2.0 and len(steps) == 8 + 16
    assert [i for i, s in enumerate(steps) if s[1]] == [7, 23]
    assert steps[-1][2] and not steps[-1][3] and steps[-1][4]["success"] == 1.0
    assert all("success" not in s[4] for s in steps[:-1])


def test_door_without_key_gives_nothing_and_key_pays_once():
    env = DarkKeyToDoor(size=5)
    env.reset(seed=0)
    place(env, (2, 2), key=(0, 0), door=(2, 4))
    # to the door without the key: nothing, the episode goes on; stay on it: still nothing
    ret, steps = play(env, [RIGHT, RIGHT, STAY, STAY])
    assert ret == 0.0 and not any(s[2] or s[3] for s in steps)
    # fetch the key, step off and back on it (pays once), then the door
    actions = path_to((2, 4), (0, 0)) + [RIGHT, LEFT, STAY] + path_to((0, 0), (2, 4))
    ret, steps = play(env, actions)
    assert ret == 2.0 and [s[1] for s in steps].count(1.0) == 2
    assert steps[-1][2] and steps[-1][4]["success"] == 1.0


def test_time_limit_truncates_without_success():
    env = DarkKeyToDoor(size=5, episode_length=7)
    env.reset(seed=0)
    place(env, (2, 2), key=(0, 0), door=(4, 4))
    ret, steps = play(env, [UP, UP, LEFT, LEFT] + [STAY] * 10)  # key after 4 steps, then dawdle
    assert ret == 1.0 and len(steps) == 7
    assert steps[-1][3] and not steps[-1][2] and steps[-1][4]["success"] == 0.0


def test_key_is_dropped_between_episodes_and_task_kept():
    env = DarkKeyToDoor(size=6)
    env.reset(seed=4)
    key, door = room(env)
    starts = set()
    for _ in range(30):
        env.reset(options={"new_task": False})
        assert room(env) == (key, door) and not env.has_key[0]
        assert cell(env._pos[0]) not in (key, door)
        starts.add(cell(env._pos[0]))
        # the key pays again in every episode
        ret, _ = play(env, path_to(cell(env._pos[0]), key))
        assert ret == 1.0
    assert len(starts) >= 5  # the start is random per episode
    fixed = DarkKeyToDoor(size=9, random_start=False)
    fixed.reset(seed=0)
    fixed.key[0], fixed.door[0] = (0, 0), (8, 8)
    assert {fixed.reset(options={"new_task": False})[0].tobytes() for _ in range(5)} == {
        np.array([0.5, 0.5], np.float32).tobytes()
    }


def test_task_changes_across_rollouts():
    env = DarkKeyToDoor()
    env.reset(seed=0)
    tasks = set()
    for options in [None, {"new_task": True}, {"new_task": True}, None, {"new_task": True}]:
        env.reset(options=options)
        tasks.add(room(env))
        assert room(env)[0] != room(env)[1]
    assert len(tasks) >= 2


def test_seeding_is_deterministic():
    def rollout(seed):
        env = DarkKeyToDoor()
        obs, _ = env.reset(seed=seed)
        env.action_space.seed(seed)
        out = [obs]
        for _ in range(3):
            for _ in range(50):
                obs, r, term, trunc, _ = env.step(env.action_space.sample())
                out.append(np.append(obs, r))
                if term or trunc:
                    break
            out.append(env.reset(options={"new_task": False})[0])
        return room(env), np.concatenate(out)

    a, b, c = rollout(11), rollout(11), rollout(12)
    assert a[0] == b[0] and np.array_equal(a[1], b[1])
    assert a[0] != c[0] or not np.array_equal(a[1], c[1])


def test_render_modes():
    env = DarkKeyToDoor(size=5, render_mode="ansi")
    env.reset(seed=0)
    text = env.render()
    assert "A" in text and "K" in text and "D" in text
    env = DarkKeyToDoor(size=5, render_mode="rgb_array")
    env.reset(seed=0)
    frame = env.render()
    assert frame.dtype == np.uint8 and frame.shape == (60, 60, 3)


def test_collector_rollout_horizon_keeps_task():
    horizon = 120

    def make():
        return TimestepWrapper(DarkKeyToDoor(size=5, episode_length=20), rollout_horizon=horizon)

    venv = gym.vector.SyncVectorEnv([make] * 2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    spec = venv.envs[0].action_spec
    assert spec.dim == 5
    inner = [venv.envs[i].unwrapped for i in range(2)]
    seen: list[list] = [[], []]

    class Peek(RandomPolicy):
        def act(self, ts, new_rollout):
            for i in range(2):
                if new_rollout[i]:
                    seen[i].append(set())
                seen[i][-1].add(room(inner[i]))
            return super().act(ts, new_rollout)

    col = Collector(venv, spec, seed=0)
    rollouts, stats = col.collect(Peek(spec, 0), 2 * (horizon + 5))
    assert len(rollouts) == 2
    for r in rollouts:
        assert len(r.action) == horizon and r.truncated[-1] and not r.terminated.any()
        assert int(r.reset.sum()) >= 1 + (horizon // 21) - 1  # several episodes glued together
        for k in np.flatnonzero(r.reset[1:]) + 1:
            assert r.reward[k - 1] == 0.0 and r.prev_reward[k] == 0.0
    for i in range(2):
        assert len(seen[i]) == 2 and len(seen[i][0]) == 1  # one task per rollout
    assert len({t for i in range(2) for s in seen[i] for t in s}) >= 2
    assert max(e.episode_index for e in stats) >= 4
    assert all(e.success in (0.0, 1.0) for e in stats)


def test_invalid_arguments():
    with pytest.raises(ValueError):
        DarkKeyToDoor(size=1)
    with pytest.raises(ValueError):
        DarkKeyToDoor(episode_length=0)
    with pytest.raises(ValueError):
        DarkKeyToDoor(obs_mode="pixels")
