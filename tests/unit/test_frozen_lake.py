"""Meta Frozen Lake: a hidden lake per task, kept across the episodes of a rollout; hard-mode permutation."""

from __future__ import annotations

from collections import deque

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from icrl.envs import Collector, RandomPolicy, TimestepWrapper
from icrl.envs.tasks.frozen_lake import _MOVES, DOWN, LEFT, RIGHT, UP, MetaFrozenLake, lake_is_solvable


def lake(env: MetaFrozenLake) -> tuple[np.ndarray, tuple[int, int], tuple[int, int]]:
    """The one copy's lake: holes [size, size], start and goal cells."""
    return env.holes[0], cell_of(env.start[0]), cell_of(env.goal[0])


def cell_of(row) -> tuple[int, int]:
    return int(row[0]), int(row[1])


def shortest_moves(env: MetaFrozenLake) -> list[int]:
    """Moves (before the hard-mode permutation) of a shortest hole-free path from start to goal."""
    n = env.size
    holes, start, goal = lake(env)
    prev = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            break
        for move, (dr, dc) in _MOVES.items():
            nxt = (cell[0] + dr, cell[1] + dc)
            if 0 <= nxt[0] < n and 0 <= nxt[1] < n and not holes[nxt] and nxt not in prev:
                prev[nxt] = (cell, move)
                queue.append(nxt)
    moves, cell = [], goal
    while prev[cell] is not None:
        cell, move = prev[cell]
        moves.append(move)
    return moves[::-1]


def to_actions(env: MetaFrozenLake, moves: list[int]) -> list[int]:
    """Agent actions that produce `moves` under the env's (hidden) action permutation."""
    inverse = {int(m): a for a, m in enumerate(env.action_map[0])}
    return [inverse[m] for m in moves]


def play(env, actions):
    ret, steps = 0.0, []
    for a in actions:
        obs, r, term, trunc, info = env.step(a)
        ret += r
        steps.append((obs, r, term, trunc, info))
        if term or trunc:
            break
    return ret, steps


def task_of(env: MetaFrozenLake):
    holes, start, goal = lake(env)
    return (holes.tobytes(), start, goal, tuple(env.action_map[0].tolist()))


def test_spaces_and_checker():
    env = MetaFrozenLake()
    assert env.action_space == gym.spaces.Discrete(4)
    assert env.observation_space.shape == (2,)
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs) and np.array_equal(obs, [0.0, 0.0])
    onehot = MetaFrozenLake(size=4, obs_mode="onehot")
    obs, _ = onehot.reset(seed=0)
    assert obs.shape == (16,) and obs.sum() == 1 and obs[0] == 1
    check_env(MetaFrozenLake(size=4), skip_render_check=True)
    check_env(MetaFrozenLake(size=4, hard=True, obs_mode="onehot"), skip_render_check=True)
    ts, _ = TimestepWrapper(MetaFrozenLake()).reset(seed=0)
    assert ts["obs"]["obs"].shape == (2,)


@pytest.mark.parametrize("hard", [False, True])
def test_scripted_shortest_path_reaches_goal(hard):
    for seed in range(10):
        env = MetaFrozenLake(size=5, hard=hard, hole_prob=0.3)
        env.reset(seed=seed)
        moves = shortest_moves(env)
        ret, steps = play(env, to_actions(env, moves))
        assert ret == 1.0 and len(steps) == len(moves)
        assert steps[-1][2] and not steps[-1][3] and steps[-1][4]["success"] == 1.0
        assert all("success" not in s[4] for s in steps[:-1])
        assert np.array_equal(steps[-1][0], np.array(env.goal[0], np.float32) / 4)


def test_hole_terminates_with_zero():
    env = MetaFrozenLake(size=3)
    env.reset(seed=0)
    env.holes[0] = np.array([[0, 1, 0], [0, 0, 0], [0, 0, 0]], bool)  # hand-built lake: hole right of start
    ret, steps = play(env, [DOWN, UP, RIGHT])
    assert ret == 0.0 and len(steps) == 3
    assert steps[-1][2] and not steps[-1][3] and steps[-1][4]["success"] == 0.0
    assert all("success" not in s[4] for s in steps[:-1])


def test_walls_and_time_limit():
    env = MetaFrozenLake(size=3, max_episode_steps=4)
    env.reset(seed=0)
    env.holes[:] = False
    ret, steps = play(env, [LEFT, UP, LEFT, UP, RIGHT])
    assert len(steps) == 4 and ret == 0.0
    assert all(np.array_equal(s[0], [0.0, 0.0]) for s in steps)  # bumping the border: no move
    assert steps[-1][3] and not steps[-1][2] and steps[-1][4]["success"] == 0.0


def test_lakes_are_always_solvable_and_vary():
    env = MetaFrozenLake(size=6, hole_prob=0.45, random_corners=True)
    env.reset(seed=1)
    tasks = set()
    for _ in range(200):
        env.reset()
        holes, start, goal = lake(env)
        assert lake_is_solvable(holes, start, goal)
        assert not holes[start] and not holes[goal] and start != goal
        tasks.add(task_of(env))
    assert len(tasks) > 150
    assert lake_is_solvable(np.zeros((3, 3), bool), (0, 0), (2, 2))
    assert not lake_is_solvable(np.array([[0, 1, 0], [1, 0, 0], [0, 0, 0]], bool), (0, 0), (2, 2))


def test_seeding_is_deterministic():
    def rollout(seed):
        env = MetaFrozenLake(size=5, hard=True)
        obs, _ = env.reset(seed=seed)
        env.action_space.seed(seed)
        out = [obs]
        for _ in range(3):
            for _ in range(60):
                obs, r, term, trunc, _ = env.step(env.action_space.sample())
                out.append(np.append(obs, r))
                if term or trunc:
                    break
            out.append(env.reset(options={"new_task": False})[0])
        return task_of(env), np.concatenate(out)

    a, b, c = rollout(7), rollout(7), rollout(8)
    assert a[0] == b[0] and np.array_equal(a[1], b[1])
    assert a[0] != c[0]


@pytest.mark.parametrize("hard", [False, True])
def test_task_kept_within_rollout_and_changes_across(hard):
    env = MetaFrozenLake(size=5, hard=hard)
    env.reset(seed=3)
    first = task_of(env)
    for _ in range(10):
        env.step(env.action_space.sample())
        env.reset(options={"new_task": False})
        assert task_of(env) == first
    tasks = set()
    for options in [None, {"new_task": True}, {"new_task": True}, None, {"new_task": True}]:
        env.reset(options=options)
        tasks.add(task_of(env))
    assert len(tasks) >= 2


def test_hard_mode_permutes_actions_and_keeps_them():
    env = MetaFrozenLake(size=4, hard=True, hole_prob=0.0)
    perms = set()
    for seed in range(20):
        env.reset(seed=seed)
        perm = tuple(env.action_map[0].tolist())
        assert sorted(perm) == [0, 1, 2, 3]
        perms.add(perm)
        for _ in range(3):
            env.reset(options={"new_task": False})
            assert tuple(env.action_map[0].tolist()) == perm
        # the effect is real: action a moves the agent by the permuted move (from the centre-ish cell (1, 1))
        for a in range(4):
            env.reset(options={"new_task": False})
            env._pos[0] = (1, 1)
            obs, *_ = env.step(a)
            dr, dc = _MOVES[perm[a]]
            assert np.allclose(obs * 3, [1 + dr, 1 + dc])
    assert len(perms) >= 5 and any(p != (0, 1, 2, 3) for p in perms)
    easy = MetaFrozenLake(size=4)
    for seed in range(5):
        easy.reset(seed=seed)
        assert easy.action_map[0].tolist() == [0, 1, 2, 3]


def test_render_modes():
    env = MetaFrozenLake(size=4, render_mode="ansi")
    env.reset(seed=0)
    text = env.render()
    assert text.splitlines()[0][0] == "A" and "G" in text.splitlines()[3]
    env = MetaFrozenLake(size=4, render_mode="rgb_array")
    env.reset(seed=0)
    frame = env.render()
    assert frame.dtype == np.uint8 and frame.shape == (64, 64, 3)


def test_collector_three_episodes_same_lake():
    def make():
        return TimestepWrapper(MetaFrozenLake(size=4, max_episode_steps=6), episodes_per_rollout=3)

    venv = gym.vector.SyncVectorEnv([make] * 2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    spec = venv.envs[0].action_spec
    col = Collector(venv, spec, seed=0)
    # record the task at every step through a policy that peeks at the inner envs
    inner = [venv.envs[i].unwrapped for i in range(2)]
    seen: list[list] = [[], []]

    class Peek(RandomPolicy):
        def act(self, ts, new_rollout):
            for i in range(2):
                if new_rollout[i]:
                    seen[i].append([])
                seen[i][-1].append(task_of(inner[i]))
            return super().act(ts, new_rollout)

    rollouts, stats = col.collect(Peek(spec, 0), 2 * 25)
    assert len(rollouts) >= 2
    for r in rollouts:
        assert r.reset[0]
        # 3 episodes: the first timestep plus 2 inner resets
        assert int(r.reset.sum()) == 3
        assert r.terminated[-1] or r.truncated[-1]
        resets = np.flatnonzero(r.reset[1:]) + 1
        for k in resets:  # the reset timestep after the bridge step: zero prev action/reward, reward 0
            assert r.reward[k - 1] == 0.0 and r.prev_reward[k] == 0.0 and not r.prev_action[k].any()
            np.testing.assert_array_equal(r.obs["obs"][k], [0.0, 0.0])  # back at the start
    for i in range(2):  # within each finished rollout the lake never changed
        for tasks in seen[i][:-1]:
            assert len(set(tasks)) == 1
    assert len({t[0] for i in range(2) for t in seen[i]}) >= 2  # different rollouts/envs, different lakes
    by_rollout: dict = {}
    for e in stats:
        by_rollout.setdefault((e.env_index, e.rollout_id), []).append(e)
    complete = [eps for eps in by_rollout.values() if len(eps) == 3]
    assert complete
    for eps in complete:
        assert [e.episode_index for e in eps] == [0, 1, 2]
        assert all(e.success in (0.0, 1.0) for e in eps)


def test_invalid_arguments():
    with pytest.raises(ValueError):
        MetaFrozenLake(size=1)
    with pytest.raises(ValueError):
        MetaFrozenLake(hole_prob=1.0)
    with pytest.raises(ValueError):
        MetaFrozenLake(obs_mode="map")
    with pytest.raises(ValueError):
        MetaFrozenLake(max_episode_steps=0)
