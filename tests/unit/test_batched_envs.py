"""The batched built-in tasks (icrl.envs.batched) against the per-copy code they replace: a SyncVectorEnv of
TimestepWrapper'd envs with SAME_STEP autoreset, stepped side by side under the same seed and actions."""

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from icrl.envs.batched import BatchedCueRecall, BatchedTaskEnv, BatchedTMaze, batched_env
from icrl.envs.collect import Collector, RandomPolicy
from icrl.envs.make import make_vector_env
from icrl.types import ActionSpec


def assert_same(a: Any, b: Any, where: str = "") -> None:
    """Nested dicts / arrays / object arrays equal in value, dtype and shape (NaN equal to NaN)."""
    if isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
        return
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{where}: keys {list(a)} vs {list(b)}"  # order is no contract
        for k in a:
            assert_same(a[k], b[k], f"{where}/{k}")
        return
    if isinstance(a, np.ndarray) and a.dtype == object:
        assert isinstance(b, np.ndarray) and b.dtype == object and a.shape == b.shape, where
        for i, (x, y) in enumerate(zip(a, b)):
            assert (x is None) == (y is None), f"{where}[{i}]"
            if x is not None:
                assert_same(x, y, f"{where}[{i}]")
        return
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
    np.testing.assert_array_equal(a, b, err_msg=where)


def per_copy(name: str, kwargs: dict, n: int) -> gym.vector.VectorEnv:
    return make_vector_env(name, kwargs, n, native=False)


def actions_for(spec: ActionSpec, rng: np.random.Generator, n: int, greedy_right: float) -> np.ndarray:
    if spec.kind == "continuous":
        return rng.uniform(-1.2, 1.2, size=(n, spec.dim)).astype(np.float32)
    a = rng.integers(0, spec.dim, size=n)
    # mostly RIGHT (3) for T-Maze, so rollouts reach the junction and the choice is exercised
    return np.where(rng.random(n) < greedy_right, min(3, spec.dim - 1), a).astype(np.int64)


@pytest.mark.parametrize(
    "name, kwargs, greedy_right",
    [
        ("tmaze", {"length": 4}, 0.8),
        ("tmaze", {"length": 3, "horizon": 9}, 0.5),  # time-limit terminations too
        ("tmaze_active", {"length": 3}, 0.5),
        ("tmaze_active", {"length": 2, "horizon": 8}, 0.3),
        ("cue_recall", {"delay": 3, "continuous": False}, 0.0),
        ("cue_recall", {"delay": 0, "continuous": True}, 0.0),
        ("cue_recall", {"delay": 2}, 0.0),
    ],
)
def test_batched_task_steps_as_the_per_copy_envs(name: str, kwargs: dict, greedy_right: float) -> None:
    n = 5
    ref, fast = per_copy(name, kwargs, n), make_vector_env(name, kwargs, n)
    assert isinstance(fast, BatchedTaskEnv) and not isinstance(ref, BatchedTaskEnv)
    assert fast.single_observation_space == ref.single_observation_space
    assert fast.single_action_space == ref.single_action_space
    assert fast.metadata["autoreset_mode"] == ref.metadata["autoreset_mode"]
    assert fast.get_attr("env_observation_space") == ref.get_attr("env_observation_space")
    spec = ActionSpec.from_space(ref.single_action_space)
    rng = np.random.default_rng(0)
    dones = successes = 0
    for seed in (7, None, 11):  # a seeded reset, an unseeded one (the generators go on), a reseed
        assert_same(ref.reset(seed=seed), fast.reset(seed=seed), f"reset({seed})")
        for step in range(60):
            actions = actions_for(spec, rng, n, greedy_right)
            r, f = ref.step(actions), fast.step(actions)
            for part, x, y in zip(("obs", "reward", "terminated", "truncated", "info"), r, f):
                assert_same(x, y, f"seed {seed} step {step} {part}")
            dones += int(r[2].sum())
            successes += int(np.nansum(r[4].get("final_info", {}).get("success", [0.0])))
    assert dones > 10 and successes > 0  # the comparison covered endings, both kinds


def test_collector_gives_the_same_rollouts_with_either_env() -> None:
    """What training stores: the same rollouts, step for step, from the batched and the per-copy T-Maze."""
    spec = ActionSpec.from_space(gym.spaces.Discrete(4))
    out = []
    for native in (False, True):
        venv = make_vector_env("tmaze", {"length": 5, "horizon": 10}, 4, native=native)
        collector = Collector(venv, spec, seed=3)
        rollouts, stats = collector.collect(RandomPolicy(spec, seed=1), 400)
        out.append((rollouts, stats))
    (r0, s0), (r1, s1) = out
    assert len(r0) == len(r1) > 20 and s0 == s1
    for a, b in zip(r0, r1):
        assert_same(vars(a), vars(b))


def test_used_only_where_it_gives_the_same_envs() -> None:
    assert isinstance(make_vector_env("tmaze", {"length": 3}, 2), BatchedTMaze)
    assert isinstance(make_vector_env("cue_recall", None, 2), BatchedCueRecall)
    # several episodes per rollout, a horizon, a factory, a kwarg it does not know: the per-copy envs
    assert not isinstance(make_vector_env("tmaze", {"length": 3}, 2, episodes_per_rollout=2), BatchedTaskEnv)
    assert not isinstance(make_vector_env("tmaze", {"length": 3}, 2, rollout_horizon=9), BatchedTaskEnv)
    assert batched_env("tmaze", {"length": 3, "render_mode": "ansi"}, 2) is None
    assert batched_env("meta_frozen_lake", {}, 2) is None


def test_bad_actions_and_calls_are_refused() -> None:
    env = BatchedTMaze(2, length=3)
    with pytest.raises(RuntimeError, match="before reset"):
        env.step(np.zeros(2, np.int64))
    env.reset(seed=0)
    with pytest.raises(ValueError, match="discrete action 4 outside"):
        env.step(np.array([0, 4]))
    with pytest.raises(ValueError, match="takes no options"):
        env.reset(options={"new_task": False})
    with pytest.raises(ValueError, match="must be >= 1"):
        BatchedTMaze(0)
