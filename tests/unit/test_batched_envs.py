"""The batched built-in tasks (icrl.envs.batched) against the per-copy code they replace: a SyncVectorEnv of
TimestepWrapper'd envs with SAME_STEP autoreset, stepped side by side under the same seed and actions."""

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from icrl.envs.batched import BatchedCueRecall, BatchedTaskEnv, BatchedTMaze, batched_env
from icrl.envs.batched_goals import BatchedGoalGrid, BatchedMazeRunner, BatchedPackageDelivery
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


GOAL_TASKS = ("goal_grid", "mazerunner", "package_delivery")


def actions_for(
    spec: ActionSpec, rng: np.random.Generator, n: int, greedy_right: float, favoured: int = 3
) -> np.ndarray:
    if spec.kind == "continuous":
        return rng.uniform(-1.2, 1.2, size=(n, spec.dim)).astype(np.float32)
    a = rng.integers(0, spec.dim, size=n)
    # mostly RIGHT (3) for T-Maze, so rollouts reach the junction and the choice is exercised (Package
    # Delivery: mostly FORWARD, 0, so the van reaches the addresses)
    return np.where(rng.random(n) < greedy_right, min(favoured, spec.dim - 1), a).astype(np.int64)


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
        # goal tasks: sub-goals reached (successes), time-limit truncations, the "achieved" records
        ("goal_grid", {"size": 3, "num_goals": 1}, 0.0),
        ("goal_grid", {"size": 2, "num_goals": 2, "time_limit": 5, "obs_mode": "xy"}, 0.0),
        ("goal_grid", {"size": 4, "num_goals": 2, "time_limit": 12, "obs_mode": "onehot"}, 0.0),
        ("mazerunner", {"size": 5, "num_goals": 1, "time_limit": 12}, 0.0),
        ("mazerunner", {"size": 5, "num_goals": 2, "time_limit": 15, "randomized_actions": True}, 0.0),
        ("mazerunner", {"size": 7, "num_goals": 1, "time_limit": 25}, 0.0),
        ("package_delivery", {"length": 5, "min_packages": 1, "max_packages": 1, "time_limit": 12}, 0.3),
        ("package_delivery", {"length": 5, "min_packages": 1, "max_packages": 2, "time_limit": 30}, 0.3),
        ("package_delivery", {"length": 7, "min_packages": 2, "max_packages": 2, "time_limit": 20}, 0.3),
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
    favoured = 0 if name == "package_delivery" else 3
    dones = successes = truncations = achieved = 0
    for seed in (7, None, 11):  # a seeded reset, an unseeded one (the generators go on), a reseed
        assert_same(ref.reset(seed=seed), fast.reset(seed=seed), f"reset({seed})")
        for step in range(60):
            actions = actions_for(spec, rng, n, greedy_right, favoured)
            r, f = ref.step(actions), fast.step(actions)
            for part, x, y in zip(("obs", "reward", "terminated", "truncated", "info"), r, f):
                assert_same(x, y, f"seed {seed} step {step} {part}")
            dones += int((r[2] | r[3]).sum())
            truncations += int(r[3].sum())
            successes += int(np.nansum(r[4].get("final_info", {}).get("success", [0.0])))
            achieved += int((r[0].get("achieved", np.zeros(1)) > 0).sum())
    assert dones > 10 and successes > 0  # the comparison covered endings, both kinds
    if name in GOAL_TASKS:  # and time limits, and steps that achieved a goal token
        assert truncations > 0 and achieved > 0


@pytest.mark.parametrize(
    "name, kwargs",
    [("tmaze", {"length": 5, "horizon": 10}), ("mazerunner", {"size": 5, "num_goals": 2, "time_limit": 15})],
)
def test_collector_gives_the_same_rollouts_with_either_env(name: str, kwargs: dict) -> None:
    """What training stores: the same rollouts, step for step, from the batched and the per-copy envs (a goal
    task's achievement records included)."""
    out = []
    for native in (False, True):
        venv = make_vector_env(name, kwargs, 4, native=native)
        assert isinstance(venv, BatchedTaskEnv) == native
        spec = ActionSpec.from_space(venv.single_action_space)
        collector = Collector(venv, spec, seed=3)
        rollouts, stats = collector.collect(RandomPolicy(spec, seed=1), 400)
        out.append((rollouts, stats))
    (r0, s0), (r1, s1) = out
    assert len(r0) == len(r1) > 20 and s0 == s1
    for a, b in zip(r0, r1):
        assert_same(vars(a), vars(b))
    if name == "mazerunner":
        assert all(r.achieved is not None and (r.achieved[1:] > 0).all() for r in r1)
        assert any(s.success == 1.0 for s in s1) and any(s.success == 0.0 for s in s1)


def test_used_only_where_it_gives_the_same_envs() -> None:
    assert isinstance(make_vector_env("tmaze", {"length": 3}, 2), BatchedTMaze)
    assert isinstance(make_vector_env("cue_recall", None, 2), BatchedCueRecall)
    assert isinstance(make_vector_env("goal_grid", {"size": 3, "obs_mode": "xy"}, 2), BatchedGoalGrid)
    maze = make_vector_env("mazerunner", {"size": 5, "randomized_actions": True}, 2)
    assert isinstance(maze, BatchedMazeRunner)
    assert isinstance(make_vector_env("package_delivery", {"time_limit": 9}, 2), BatchedPackageDelivery)
    # several episodes per rollout, a horizon, a factory, a kwarg it does not know: the per-copy envs
    assert not isinstance(make_vector_env("tmaze", {"length": 3}, 2, episodes_per_rollout=2), BatchedTaskEnv)
    assert not isinstance(make_vector_env("tmaze", {"length": 3}, 2, rollout_horizon=9), BatchedTaskEnv)
    assert batched_env("tmaze", {"length": 3, "render_mode": "ansi"}, 2) is None
    assert batched_env("meta_frozen_lake", {}, 2) is None
    assert batched_env("mazerunner", {"size": 5, "render_mode": "ansi"}, 2) is None  # rendering: per-copy
    assert batched_env("package_delivery", {"render_mode": "rgb_array"}, 2) is None
    assert batched_env("goal_grid", {"size": 3, "seed": 1}, 2) is None
    multi = make_vector_env("mazerunner", {"size": 5}, 2, episodes_per_rollout=2)
    assert not isinstance(multi, BatchedTaskEnv)


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
