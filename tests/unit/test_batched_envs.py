"""The vector machinery of the built-in tasks on arrays (`BatchedTaskEnv`, icrl.envs.batched) against gymnasium's:
each task's one-copy env in a SyncVectorEnv of TimestepWrapper'd envs with SAME_STEP autoreset, stepped side by
side under the same seed, rollout settings and actions (seeding, draws, timesteps, bridges, infos)."""

from collections import Counter
from typing import Any, Iterator

import gymnasium as gym
import numpy as np
import pytest

from icrl.envs.batched import BatchedTaskEnv
from icrl.envs.clock import RolloutClock, RolloutClocks
from icrl.envs.collect import Collector, RandomPolicy
from icrl.envs.make import make_vector_env
from icrl.envs.registry import TASKS, batched_env
from icrl.envs.tasks.frozen_lake import MetaFrozenLake
from icrl.envs.tasks.goal_grid import GoalGrid
from icrl.envs.tasks.key_door import DarkKeyToDoor
from icrl.envs.tasks.mazerunner import MazeRunner
from icrl.envs.tasks.package_delivery import PackageDelivery
from icrl.envs.tasks.recall import CueRecall
from icrl.envs.tasks.tmaze import TMaze
from icrl.types import ActionSpec

from helpers import assert_same


def per_copy(name: str, kwargs: dict, n: int, **rollout: Any) -> gym.vector.VectorEnv:
    return make_vector_env(name, kwargs, n, native=False, **rollout)


def actions_for(
    spec: ActionSpec, rng: np.random.Generator, n: int, greedy_right: float, favoured: int = 3
) -> np.ndarray:
    if spec.kind == "continuous":
        return rng.uniform(-1.2, 1.2, size=(n, spec.dim)).astype(np.float32)
    a = rng.integers(0, spec.dim, size=n)
    # mostly RIGHT (3) for T-Maze, so rollouts reach the junction and the choice is exercised (Package
    # Delivery: mostly FORWARD, 0, so the van reaches the addresses)
    return np.where(rng.random(n) < greedy_right, min(favoured, spec.dim - 1), a).astype(np.int64)


def side_by_side(
    ref: gym.vector.VectorEnv, fast: gym.vector.VectorEnv, greedy_right: float, favoured: int, steps: int = 60
) -> Iterator[tuple]:
    """Reset both envs (seeded, unseeded: the generators go on, reseeded) and step them with the same actions,
    asserting that every reset and step returns the same; yields the per-copy env's step results."""
    n = ref.num_envs
    spec = ActionSpec.from_space(ref.single_action_space)
    rng = np.random.default_rng(0)
    for seed in (7, None, 11):
        assert_same(ref.reset(seed=seed), fast.reset(seed=seed), f"reset({seed})")
        for step in range(steps):
            actions = actions_for(spec, rng, n, greedy_right, favoured)
            r, f = ref.step(actions), fast.step(actions)
            for part, x, y in zip(("obs", "reward", "terminated", "truncated", "info"), r, f):
                assert_same(x, y, f"seed {seed} step {step} {part}")
            yield r


def flags(info: dict, key: str, n: int) -> np.ndarray:
    """[N] bool: the copies whose info holds `key` (its `_key` mask)."""
    return np.asarray(info.get(f"_{key}", np.zeros(n, bool)), bool)


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
        # meta-RL tasks, one episode per rollout: holes, goals, keys, doors, time limits
        ("meta_frozen_lake", {"size": 3}, 0.0),
        ("meta_frozen_lake", {"size": 4, "hard": True, "random_corners": True, "obs_mode": "onehot",
                              "hole_prob": 0.3, "max_episode_steps": 8}, 0.0),
        ("dark_key_door", {"size": 3, "episode_length": 10}, 0.0),
        ("dark_key_door", {"size": 3, "episode_length": 15, "random_start": False, "obs_mode": "onehot"}, 0.0),
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
    favoured = 0 if name == "package_delivery" else 3
    dones = successes = truncations = achieved = 0
    for obs, _, terminated, truncated, info in side_by_side(ref, fast, greedy_right, favoured):
        dones += int((terminated | truncated).sum())
        truncations += int(truncated.sum())
        successes += int(np.nansum(info.get("final_info", {}).get("success", [0.0])))
        achieved += int((obs.get("achieved", np.zeros(1)) > 0).sum())
    assert dones > 10 and successes > 0  # the comparison covered endings, both kinds
    if TASKS[name].family in ("goal", "meta"):  # and time limits
        assert truncations > 0
    if TASKS[name].family == "goal":  # and steps that achieved a goal token
        assert achieved > 0


@pytest.mark.parametrize(
    "name, kwargs, rollout, greedy_right",
    [
        ("meta_frozen_lake", {"size": 3}, {"episodes_per_rollout": 2}, 0.0),
        ("meta_frozen_lake", {"size": 4, "hard": True, "random_corners": True, "obs_mode": "onehot",
                              "max_episode_steps": 8}, {"episodes_per_rollout": 3}, 0.0),
        ("meta_frozen_lake", {"size": 3, "max_episode_steps": 6}, {"rollout_horizon": 12}, 0.0),
        ("dark_key_door", {"size": 3, "episode_length": 8}, {"episodes_per_rollout": 2}, 0.0),
        ("dark_key_door", {"size": 3, "episode_length": 10, "random_start": False, "obs_mode": "onehot"},
         {"episodes_per_rollout": 3}, 0.0),
        ("dark_key_door", {"size": 3, "episode_length": 6}, {"rollout_horizon": 14}, 0.0),  # H at bridges
        ("tmaze", {"length": 3, "horizon": 9}, {"episodes_per_rollout": 2}, 0.6),
        ("tmaze_active", {"length": 2}, {"episodes_per_rollout": 3}, 0.3),
        ("tmaze", {"length": 2}, {"rollout_horizon": 7}, 0.6),  # H as an episode ends: a truncation
        # the other tasks: cue recall and GoalGrid draw at every reset, MazeRunner and Package Delivery keep theirs
        ("cue_recall", {"delay": 2, "continuous": False}, {"episodes_per_rollout": 3}, 0.0),
        ("cue_recall", {"delay": 1}, {"rollout_horizon": 8}, 0.0),  # H as every third episode ends
        ("goal_grid", {"size": 2, "num_goals": 2, "time_limit": 5, "obs_mode": "xy"}, {"episodes_per_rollout": 2}, 0.0),
        ("mazerunner", {"size": 5, "num_goals": 1, "time_limit": 12}, {"rollout_horizon": 30}, 0.0),
        ("package_delivery", {"length": 5, "min_packages": 1, "max_packages": 1, "time_limit": 12},
         {"episodes_per_rollout": 3}, 0.3),
    ],
)
def test_multi_episode_rollouts_step_as_the_per_copy_envs(
    name: str, kwargs: dict, rollout: dict, greedy_right: float
) -> None:
    """Rollouts of k episodes or of a horizon H (TimestepWrapper's multi-episode mode): inner episode ends,
    bridge steps, rollouts ended by the k-th episode or by H, and successes, the same as the per-copy envs."""
    n = 6
    ref, fast = per_copy(name, kwargs, n, **rollout), make_vector_env(name, kwargs, n, **rollout)
    assert isinstance(fast, BatchedTaskEnv) and not isinstance(ref, BatchedTaskEnv)
    for attr in ("episodes_per_rollout", "rollout_horizon"):
        assert fast.get_attr(attr) == ref.get_attr(attr)
    horizon = "rollout_horizon" in rollout
    seen: Counter = Counter()
    favoured = 0 if name == "package_delivery" else 3
    for obs, reward, terminated, truncated, info in side_by_side(ref, fast, greedy_right, favoured):
        done = terminated | truncated
        final_info = info.get("final_info", {})
        final_obs = info.get("final_obs", np.full(n, None))
        final_reset = np.array([f is not None and bool(f["reset"]) for f in final_obs])  # H at a bridge step
        final_end = done & flags(final_info, "episode_end", n)
        bridge = (obs["reset"] == 1) & ~done | final_reset  # the step after an inner episode's end
        seen["inner episode ends"] += int(flags(info, "episode_end", n).sum())
        seen["bridge steps"] += int(bridge.sum())
        assert not reward[bridge].any() and (obs["time"][(obs["reset"] == 1) & ~done] > 0).all()  # time counts on
        seen["successes"] += int(np.nansum(info.get("success", [0.0])) + np.nansum(final_info.get("success", [0.0])))
        if horizon:
            assert not terminated.any()  # a rollout with a horizon only ever ends truncated
            seen["rollouts ended by H"] += int(truncated.sum())
            seen["H at a bridge step or an episode's end"] += int((final_reset | final_end).sum())
        else:
            assert (final_end == done).all()  # the rollout ends as its k-th episode does, and only then
            seen["rollouts ended by k"] += int(done.sum())
    ended = "rollouts ended by H" if horizon else "rollouts ended by k"
    wanted = ["inner episode ends", "bridge steps", "successes", ended]
    wanted += ["H at a bridge step or an episode's end"] if horizon else []
    assert all(seen[k] > 0 for k in wanted), seen


def test_rollout_clocks_are_rolloutclock_on_arrays() -> None:
    """The batched tasks' time, episode index and previous action (RolloutClocks) follow RolloutClock, the one
    state machine: the same operations on N of them and on the array form give the same fields throughout."""
    spec = ActionSpec("discrete", 3)
    rng = np.random.default_rng(0)
    n = 6
    for rollout in ({}, {"episodes_per_rollout": 3}, {"rollout_horizon": 5}):
        clocks, each = RolloutClocks(spec, n, **rollout), [RolloutClock(spec, **rollout) for _ in range(n)]
        for _ in range(100):
            vectors = spec.to_vector(rng.integers(0, 3, n))
            clocks.acted(vectors)
            for clock, vector in zip(each, vectors):
                clock.acted(vector)
            for new_task in (True, False):
                rows = np.flatnonzero(rng.random(n) < 0.2)
                clocks.start(rows, new_task)
                for i in rows:
                    each[i].start(new_task)
            rewards, cont = rng.normal(size=n), rng.random(n) < 0.7
            got = clocks.timestep(rewards, cont)
            for i, clock in enumerate(each):
                want = clock.timestep({}, float(rewards[i]), bool(cont[i]))
                assert_same({k: got[k][i] for k in got}, {k: want[k] for k in got}, f"copy {i}")
                assert (clocks.time[i], clocks.episode[i]) == (clock.time, clock.episode)
            assert clocks.rollout_over().tolist() == [clock.rollout_over() for clock in each]


@pytest.mark.parametrize(
    "name, kwargs, rollout",
    [
        ("tmaze", {"length": 5, "horizon": 10}, {}),
        ("mazerunner", {"size": 5, "num_goals": 2, "time_limit": 15}, {}),
        ("meta_frozen_lake", {"size": 3, "max_episode_steps": 8}, {"episodes_per_rollout": 3}),
    ],
)
def test_collector_gives_the_same_rollouts_with_either_env(name: str, kwargs: dict, rollout: dict) -> None:
    """What training stores: the same rollouts, step for step, and the same episode stats, from the batched and
    the per-copy envs (a goal task's achievement records included; a meta-RL task's episodes of one rollout)."""
    out = []
    for native in (False, True):
        venv = make_vector_env(name, kwargs, 4, native=native, **rollout)
        assert isinstance(venv, BatchedTaskEnv) == native
        spec = ActionSpec.from_space(venv.single_action_space)
        collector = Collector(venv, spec, seed=3)
        rollouts, stats = collector.collect(RandomPolicy(spec, seed=1), 400)
        out.append((rollouts, stats))
    (r0, s0), (r1, s1) = out
    assert len(r0) == len(r1) > 15 and s0 == s1
    for a, b in zip(r0, r1):
        assert_same(vars(a), vars(b))
    if name == "mazerunner":
        assert all(r.achieved is not None and (r.achieved[1:] > 0).all() for r in r1)
        assert any(s.success == 1.0 for s in s1) and any(s.success == 0.0 for s in s1)
    if rollout:  # three episodes in every rollout, the stats of each
        assert all(int(r.reset.sum()) == 3 for r in r1)
        assert {s.episode_index for s in s1} == {0, 1, 2}
        assert any(s.success == 1.0 for s in s1) and any(s.success == 0.0 for s in s1)


def batched_of(venv: gym.vector.VectorEnv) -> type:
    """The task class a BatchedTaskEnv steps."""
    assert isinstance(venv, BatchedTaskEnv)
    return type(venv.copies)


def test_used_only_where_it_gives_the_same_envs() -> None:
    assert batched_of(make_vector_env("tmaze", {"length": 3}, 2)) is TMaze
    assert batched_of(make_vector_env("cue_recall", None, 2)) is CueRecall
    assert batched_of(make_vector_env("goal_grid", {"size": 3, "obs_mode": "xy"}, 2)) is GoalGrid
    assert batched_of(make_vector_env("mazerunner", {"size": 5, "randomized_actions": True}, 2)) is MazeRunner
    assert batched_of(make_vector_env("package_delivery", {"time_limit": 9}, 2)) is PackageDelivery
    assert batched_of(make_vector_env("meta_frozen_lake", {"size": 3, "hard": True}, 2)) is MetaFrozenLake
    assert batched_of(make_vector_env("dark_key_door", {"random_start": False}, 2)) is DarkKeyToDoor
    # several episodes per rollout or a horizon: batched too, with the wrapper's settings
    multi = make_vector_env("tmaze", {"length": 3}, 2, episodes_per_rollout=2)
    assert batched_of(multi) is TMaze and multi.get_attr("episodes_per_rollout") == (2, 2)
    long = make_vector_env("dark_key_door", {"size": 5}, 2, rollout_horizon=100)
    assert batched_of(long) is DarkKeyToDoor and long.get_attr("rollout_horizon") == (100, 100)
    assert batched_of(make_vector_env("mazerunner", {"size": 5}, 2, episodes_per_rollout=2)) is MazeRunner
    with pytest.raises(ValueError, match="not both"):
        BatchedTaskEnv(TMaze(length=3), 2, episodes_per_rollout=2, rollout_horizon=9)
    # a factory, rendering, a kwarg it does not know: the per-copy envs
    assert not isinstance(make_vector_env("tmaze", {"length": 3}, 2, factories=[TMaze]), BatchedTaskEnv)
    assert batched_env("tmaze", {"length": 3, "render_mode": "ansi"}, 2) is None
    assert batched_env("meta_frozen_lake", {"render_mode": "ansi"}, 2) is None
    assert batched_env("dark_key_door", {"render_mode": "rgb_array"}, 2, rollout_horizon=50) is None
    assert batched_env("mazerunner", {"size": 5, "render_mode": "ansi"}, 2) is None  # rendering: per-copy
    assert batched_env("package_delivery", {"render_mode": "rgb_array"}, 2) is None
    assert batched_env("goal_grid", {"size": 3, "seed": 1}, 2) is None


def test_bad_actions_and_calls_are_refused() -> None:
    env = BatchedTaskEnv(TMaze(length=3), 2)
    with pytest.raises(RuntimeError, match="before reset"):
        env.step(np.zeros(2, np.int64))
    env.reset(seed=0)
    with pytest.raises(ValueError, match="discrete action 4 outside"):
        env.step(np.array([0, 4]))
    with pytest.raises(ValueError, match="takes no options"):
        env.reset(options={"new_task": False})
    with pytest.raises(ValueError, match="must be >= 1"):
        BatchedTaskEnv(TMaze(), 0)
    with pytest.raises(RuntimeError, match="holds 2 copies"):  # a task stepped as copies is not also one env
        env.copies.reset()
    recall = BatchedTaskEnv(CueRecall(delay=0, continuous=False), 2, episodes_per_rollout=2)
    recall.reset(seed=0)
    recall.step(np.array([0, 1]))  # both answer: their first episodes end
    obs, reward, *_ = recall.step(np.array([7, -1]))  # a bridge step ignores its action, as the wrapper does
    assert (obs["reset"] == 1).all() and not reward.any()
    with pytest.raises(ValueError, match="discrete action 7 outside"):
        recall.step(np.array([7, 0]))
