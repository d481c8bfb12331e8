"""Meta-World ML1 / ML10: spaces, seeding, a hidden task kept within a rollout and redrawn across rollouts,
ever-succeeded success reporting, one benchmark per process, and the clear error without the extra."""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from icrl.envs import Collector, RandomPolicy, TimestepWrapper, make_env, make_vector_env
from icrl.envs.tasks import metaworld_envs as mw

from helpers import assert_missing_extra_reported

try:
    import metaworld  # noqa: F401

    SKIP_REASON = ""
except (ImportError, OSError) as e:  # OSError: a half-downgraded mujoco (see DEPENDENCIES / README)
    SKIP_REASON = f"metaworld is not usable ({e}): pip install 'icrl[metaworld]'"
requires_metaworld = pytest.mark.skipif(bool(SKIP_REASON), reason=SKIP_REASON or "-")


def _random_run(env: gym.Env, seed: int, steps: int) -> tuple[list[int], np.ndarray]:
    """Task indices and observations of 2 episodes of one task plus 1 of a new one, random actions."""
    obs, _ = env.reset(seed=seed)
    env.action_space.seed(seed)
    tasks, out = [env.task_index], [obs]
    for options in ({"new_task": False}, {"new_task": True}):
        for _ in range(steps):
            obs, r, *_ = env.step(env.action_space.sample())
            out.append(np.append(obs, r))
        obs, _ = env.reset(options=options)
        tasks.append(env.task_index)
        out.append(obs)
    return tasks, np.concatenate(out)


@requires_metaworld
def test_spaces_and_checker():
    env = mw.MetaWorldML("ML1", task="reach-v3", max_episode_steps=10)
    assert isinstance(env.observation_space, gym.spaces.Box) and env.observation_space.shape == (39,)
    assert env.action_space == gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    obs, info = env.reset(seed=0)
    assert env.observation_space.contains(obs) and info == {"task_id": 0, "task": "reach-v3"}
    assert np.all(obs[-3:] == 0.0)  # ML setting: the goal is hidden
    assert len(env.tasks) == 50 and env.class_names == ["reach-v3"]
    check_env(env, skip_render_check=True)
    ts, _ = TimestepWrapper(env).reset(seed=0)
    assert ts["obs"]["obs"].shape == (39,) and ts["obs"]["obs"].dtype == np.float32
    env.close()


@requires_metaworld
def test_seeding_is_reproducible():
    a = _random_run(mw.MetaWorldML("ML1", task="reach-v3"), 3, 5)
    b = _random_run(mw.MetaWorldML("ML1", task="reach-v3"), 3, 5)
    c = _random_run(mw.MetaWorldML("ML1", task="reach-v3"), 4, 5)
    assert a[0] == b[0] and np.array_equal(a[1], b[1])
    assert a[0] != c[0] and not np.array_equal(a[1], c[1])


@requires_metaworld
def test_task_kept_within_rollout_and_redrawn_across():
    env = mw.MetaWorldML("ML1", task="pick-place-v3", max_episode_steps=5)
    first, _ = env.reset(seed=0)
    task = env.task_index
    for _ in range(3):  # episodes of one task start identically (the task fixes object and goal)
        for _ in range(5):
            env.step(env.action_space.sample())
        again, _ = env.reset(options={"new_task": False})
        assert env.task_index == task and np.array_equal(again, first)
    tasks, starts = set(), []
    for _ in range(6):
        obs, _ = env.reset()
        tasks.add(env.task_index)
        starts.append(obs[4:7])  # the object's position differs between tasks
    assert len(tasks) > 1 and len({tuple(s) for s in starts}) > 1
    # the test split holds other goals than the train split
    test = mw.MetaWorldML("ML1", task="pick-place-v3", split="test")
    train_vecs = {env.tasks[i].data for i in range(50)}
    assert not train_vecs & {t.data for t in test.tasks}


def _scripted_reach(env: mw.MetaWorldML, leave: bool = False) -> tuple[int, dict, bool, bool]:
    """metaworld's scripted reach policy, given the privileged goal (the ML observation hides it), for one
    episode of task seed 3; with `leave`, the hand moves straight up after the first success. Returns the
    first success step (or -1) and the last step's info, terminated and truncated."""
    from metaworld.policies import SawyerReachV3Policy

    policy, obs, first = SawyerReachV3Policy(), env.reset(seed=3)[0], -1
    up = np.array([0, 0, 1, 0], np.float32)
    for t in range(env.max_episode_steps):
        full = obs.copy()
        full[-3:] = env._env._target_pos
        obs, _, term, trunc, info = env.step(up if leave and first >= 0 else policy.get_action(full))
        if info["step_success"] and first < 0:
            first = t
        if term or trunc:
            break
    return first, info, term, trunc


@requires_metaworld
def test_success_is_ever_succeeded_at_episode_end():
    env = mw.MetaWorldML("ML1", task="reach-v3", max_episode_steps=100)
    first, info, term, trunc = _scripted_reach(env)
    assert 0 <= first < 90 and info["success"] == 1.0 and info["step_success"] == 1.0 and trunc and not term
    # after succeeding, leave the goal: the per-step success drops, the episode's stays 1
    first_leave, info, term, trunc = _scripted_reach(env, leave=True)
    assert first_leave == first and info["success"] == 1.0 and info["step_success"] == 0.0 and trunc
    # doing nothing fails
    env.reset(seed=3)
    for _ in range(100):
        _, _, _, trunc, info = env.step(np.zeros(4, np.float32))
    assert trunc and info["success"] == 0.0
    # metaworld's evaluation mode ends the episode at the first success
    stop = mw.MetaWorldML("ML1", task="reach-v3", max_episode_steps=100, terminate_on_success=True)
    first_stop, info, term, trunc = _scripted_reach(stop)
    assert first_stop == first and term and not trunc and info["success"] == 1.0


@requires_metaworld
def test_episode_length_beyond_metaworld_default():
    env = mw.MetaWorldML("ML1", task="reach-v3", max_episode_steps=503)
    env.reset(seed=0)
    for t in range(503):  # metaworld itself raises when stepped past its 500
        _, _, term, trunc, _ = env.step(np.zeros(4, np.float32))
        assert not term and trunc == (t == 502)


@requires_metaworld
def test_vector_env_and_collector_share_one_benchmark():
    name, kwargs = "metaworld/ML1/reach-v3", {"max_episode_steps": 8}
    make_env(name, kwargs).close()  # built (and cached) once
    before = mw.get_benchmark.cache_info()
    venv = make_vector_env(name, kwargs, 3, episodes_per_rollout=2)
    after = mw.get_benchmark.cache_info()
    assert after.misses == before.misses and after.hits >= before.hits + 4  # check + 3 copies, no rebuild
    spec = venv.envs[0].action_spec
    rollouts, stats = Collector(venv, spec, seed=0).collect_rollouts(RandomPolicy(spec, seed=0), 3, seed=0)
    assert len(rollouts) == 3 and len(stats) == 6
    for r in rollouts:
        r.validate()
        assert r.obs["obs"].shape == (2 * 8 + 2, 39) and r.reset.sum() == 2 and r.truncated[-1]
    assert all(s.success in (0.0, 1.0) and s.length == 8 for s in stats)
    venv.close()


@requires_metaworld
def test_names_and_errors():
    names = mw.metaworld_env_names()
    assert len(names) == 51 and "ML1/reach-v3" in names and names[-1] == "ML10"
    with pytest.raises(ValueError, match="Did you mean 'reach-v3'"):
        make_env("metaworld/ML1/reach-v2")
    with pytest.raises(ValueError, match="does not accept the keyword argument 'bogus'"):
        make_env("metaworld/ML1/reach-v3", {"bogus": 1})
    with pytest.raises(ValueError, match="split"):
        mw.MetaWorldML("ML1", task="reach-v3", split="val")


def test_unknown_member_and_missing_extra(monkeypatch, capsys):
    with pytest.raises(ValueError, match="metaworld/ML1/<task>"):
        make_env("metaworld/ML2")
    assert_missing_extra_reported(monkeypatch, capsys, "metaworld", ["metaworld/ML1/reach-v3"], "metaworld",
                                  "metaworld")
    with pytest.raises(ImportError, match=r"icrl\[metaworld\]"):
        mw.MetaWorldML("ML10")


def test_listed_without_importing_the_extras():
    code = (
        "import sys; from icrl.cli import main; main(['envs']); "
        "print(sorted(m for m in ('metaworld', 'minigrid', 'mujoco') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[-1] == "[]"
    assert any(line.startswith("metaworld/<name>") and "icrl[metaworld]" in line for line in lines)
    assert any(line.startswith("babyai/<name>") and "icrl[minigrid]" in line for line in lines)


# ------------------------------------------------------------------------------------------ ML10 (slow)
@pytest.fixture(scope="module")
def ml10():
    """metaworld.ML10() takes ~12 s: built once here (get_benchmark caches it for the test split too)."""
    if SKIP_REASON:
        pytest.skip(SKIP_REASON)
    env = mw.MetaWorldML("ML10", max_episode_steps=3)
    yield env
    env.close()


@pytest.mark.slow
def test_ml10_train_and_test_classes(ml10):
    train = ml10
    assert len(train.class_names) == 10 and len(train.tasks) == 500
    seen = set()
    for i in range(40):
        obs, info = train.reset(seed=i) if i == 0 else train.reset()
        assert train.observation_space.contains(obs) and info["task_id"] == train.class_names.index(train.task_name)
        seen.add(train.task_name)
        _, _, _, trunc, info = [train.step(train.action_space.sample()) for _ in range(3)][-1]
        assert trunc and info["success"] in (0.0, 1.0) and info["task"] == train.task_name  # per-task metrics
    assert len(seen) >= 8  # a new class per rollout, uniformly
    # a kept task keeps its class
    name = train.task_name
    train.reset(options={"new_task": False})
    assert train.task_name == name

    before = mw.get_benchmark.cache_info().misses
    test = make_env("metaworld/ML10", {"split": "test", "max_episode_steps": 3})
    assert mw.get_benchmark.cache_info().misses == before  # same benchmark object, not rebuilt
    assert len(test.class_names) == 5 and not set(test.class_names) & set(train.class_names)
    test.reset(seed=0)
    assert test.task_name in test.class_names
    test.close()


def test_infos_name_the_task_class():
    """`info["task"]` (per-task metrics, docs/CONTRACTS.md) is the task class; checked without metaworld."""
    from types import SimpleNamespace

    env = object.__new__(mw.MetaWorldML)  # the task list only: no benchmark, no MuJoCo
    env.tasks = [SimpleNamespace(env_name="reach-v3"), SimpleNamespace(env_name="push-v3")]
    env.class_names, env.task_index = ["reach-v3", "push-v3"], 1
    assert env._info() == {"task_id": 1, "task": "push-v3"}
