"""Half-Cheetah-Vel: HalfCheetah-v5 with a hidden target velocity kept across the episodes of a rollout."""

from __future__ import annotations

import importlib
import importlib.util

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import icrl.envs.tasks.half_cheetah_vel as hcv_module  # must import without MuJoCo
from icrl.envs import Collector, RandomPolicy, TimestepWrapper
from icrl.envs.tasks.half_cheetah_vel import HalfCheetahVel

# Every test but the last needs MuJoCo; without it they are skipped with this reason.
requires_mujoco = pytest.mark.skipif(
    importlib.util.find_spec("mujoco") is None,
    reason='MuJoCo is not installed (pip install "gymnasium[mujoco]")',
)


@requires_mujoco
def test_spaces_and_checker():
    env = HalfCheetahVel()
    assert env.observation_space.shape == (17,) and isinstance(env.observation_space, gym.spaces.Box)
    assert isinstance(env.action_space, gym.spaces.Box) and env.action_space.shape == (6,)
    assert np.all(env.action_space.low == -1.0) and np.all(env.action_space.high == 1.0)
    obs, info = env.reset(seed=0)
    assert env.observation_space.contains(obs) and info == {}
    assert 0.0 <= env.target_velocity <= 3.0
    check_env(HalfCheetahVel(episode_steps=5), skip_render_check=True)
    ts, _ = TimestepWrapper(HalfCheetahVel()).reset(seed=0)
    assert ts["obs"]["obs"].shape == (17,) and ts["obs"]["obs"].dtype == np.float32
    env.close()


@requires_mujoco
def test_reward_formula_and_time_limit():
    env = HalfCheetahVel(target_velocities=(1.0, 2.0), episode_steps=7)
    env.reset(seed=1)
    target = env.target_velocity
    assert 1.0 <= target <= 2.0
    rng = np.random.default_rng(0)
    for t in range(7):
        if t % 2 == 0:  # zero action: reward is exactly -|v - target|
            obs, r, term, trunc, info = env.step(np.zeros(6, np.float32))
            assert r == -abs(info["x_velocity"] - target) and info["reward_ctrl"] == 0.0
        else:
            a = rng.uniform(-1, 1, 6).astype(np.float32)
            obs, r, term, trunc, info = env.step(a)
            expected = -abs(info["x_velocity"] - target) - 0.05 * float(np.sum(a.astype(np.float64) ** 2))
            assert r == pytest.approx(expected, abs=1e-12)
        assert "success" not in info and "target_velocity" not in info
        assert not term and trunc == (t == 6)
    # the reported velocity is the torso's x displacement over dt (HalfCheetah-v5), so it moves x_position
    x0 = info["x_position"]
    _, _, _, _, info = env.step(np.zeros(6, np.float32))
    assert info["x_position"] - x0 == pytest.approx(info["x_velocity"] * env.cheetah.dt)


@requires_mujoco
def test_seeding_is_deterministic():
    def rollout(seed):
        env = HalfCheetahVel(episode_steps=10)
        obs, _ = env.reset(seed=seed)
        env.action_space.seed(seed)
        out, targets = [obs], [env.target_velocity]
        for _ in range(2):
            for _ in range(10):
                obs, r, _, trunc, _ = env.step(env.action_space.sample())
                out.append(np.append(obs, r))
            out.append(env.reset(options={"new_task": False})[0])
            targets.append(env.target_velocity)
        return targets, np.concatenate(out)

    a, b, c = rollout(7), rollout(7), rollout(8)
    assert a[0] == b[0] and np.array_equal(a[1], b[1])
    assert a[0] != c[0] and not np.array_equal(a[1], c[1])


@requires_mujoco
def test_target_kept_within_rollout_and_changes_across():
    env = HalfCheetahVel()
    env.reset(seed=3)
    first = env.target_velocity
    for _ in range(5):
        env.step(env.action_space.sample())
        env.reset(options={"new_task": False})
        assert env.target_velocity == first
    targets = set()
    for options in [None, {"new_task": True}, {"new_task": True}, None, {"new_task": True}]:
        env.reset(options=options)
        targets.add(env.target_velocity)
        assert 0.0 <= env.target_velocity <= 3.0
    assert len(targets) == 5
    fixed = HalfCheetahVel(target_velocities=(2.0, 2.0))
    fixed.reset(seed=0)
    assert fixed.target_velocity == 2.0


@requires_mujoco
def test_collector_two_episodes_same_target():
    def make():
        return TimestepWrapper(HalfCheetahVel(episode_steps=20), episodes_per_rollout=2)

    venv = gym.vector.SyncVectorEnv([make] * 2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    spec = venv.envs[0].action_spec
    col = Collector(venv, spec, seed=0)
    inner = [venv.envs[i].unwrapped for i in range(2)]
    seen: list[list] = [[], []]

    class Peek(RandomPolicy):
        def act(self, ts, new_rollout):
            for i in range(2):
                if new_rollout[i]:
                    seen[i].append([])
                seen[i][-1].append(inner[i].target_velocity)
            return super().act(ts, new_rollout)

    # one rollout = 2 episodes x (20 steps + the final-observation timestep) per env
    rollouts, stats = col.collect(Peek(spec, 0), 2 * 2 * 21)
    assert len(rollouts) >= 2
    for r in rollouts:
        assert r.reset[0] and int(r.reset.sum()) == 2
        assert r.truncated[-1] and not r.terminated.any()
        assert r.obs["obs"].shape[1:] == (17,)
        k = int(np.flatnonzero(r.reset[1:])[0]) + 1
        assert k == 21  # 20 steps, then the bridge timestep, then the reset one
        assert r.reward[k - 1] == 0.0 and r.prev_reward[k] == 0.0 and not r.prev_action[k].any()
    for i in range(2):
        for targets in seen[i][:-1]:
            assert len(set(targets)) == 1  # kept across both episodes of the rollout
    assert len({t for i in range(2) for ts in seen[i] for t in ts}) >= 2
    complete = {}
    for e in stats:
        complete.setdefault((e.env_index, e.rollout_id), []).append(e)
    for eps in complete.values():
        assert [e.episode_index for e in eps] in ([0], [0, 1])
        assert all(e.length == 20 and e.success is None and e.ret < 0 for e in eps)
    venv.close()


def test_invalid_arguments():  # checked before MuJoCo is imported
    with pytest.raises(ValueError):
        HalfCheetahVel(target_velocities=(3.0, 0.0))
    with pytest.raises(ValueError):
        HalfCheetahVel(episode_steps=0)
    with pytest.raises(ValueError):
        HalfCheetahVel(forward_reward_weight=2.0)


def test_missing_mujoco_gives_install_hint(monkeypatch):
    import sys

    # runs with or without MuJoCo (simulating its absence): the constructor must name the pip command
    monkeypatch.setitem(sys.modules, "mujoco", None)
    for name in [m for m in sys.modules if m.startswith("gymnasium.envs.mujoco")]:
        monkeypatch.delitem(sys.modules, name)
    mod = importlib.reload(hcv_module)
    with pytest.raises(ImportError, match=r'pip install "gymnasium\[mujoco\]"'):
        mod.HalfCheetahVel()
