"""TimestepWrapper: every supported space, clear errors, and multi-episode rollouts on real tiny envs."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from icrl.envs import TimestepWrapper, action_to_vector, agent_to_env_action
from icrl.types import ActionSpec


class SpaceEnv(gym.Env):
    """Samples observations from any space; records the last action it received; ends after `ep_len`."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space | None = None, ep_len: int = 3):
        action_space = gym.spaces.Discrete(3) if action_space is None else action_space
        self.observation_space, self.action_space, self.ep_len = obs_space, action_space, ep_len
        self.last_action = None

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.observation_space.seed(seed)
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        self.last_action = action
        self.t += 1
        return self.observation_space.sample(), 1.0, False, self.t >= self.ep_len, {}


class HiddenParamEnv(gym.Env):
    """A task with a hidden parameter `p` revealed as the reward of action 0; honours options['new_task'].

    Episodes last `ep_len` steps; action 1 terminates the episode early (success=1).
    """

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, ep_len: int = 3):
        self.ep_len = ep_len
        self.p = None
        self.resets: list = []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.resets.append(options)
        if self.p is None or (options or {}).get("new_task", True):
            self.p = float(self.np_random.uniform(1.0, 2.0))
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        obs = np.full(1, self.t / 10, np.float32)
        if int(action) == 1:
            return obs, 0.0, True, False, {"success": True}
        return obs, self.p, False, self.t >= self.ep_len, {"success": False}


# ------------------------------------------------------------------------------------------ observations
@pytest.mark.parametrize(
    "space, key, shape, dtype",
    [
        (gym.spaces.Box(-1, 1, (3,), np.float32), "obs", (3,), np.float32),
        (gym.spaces.Box(-1, 1, (2, 3, 4), np.float64), "obs", (2, 3, 4), np.float32),
        (gym.spaces.Box(0, 255, (8, 8, 3), np.uint8), "obs", (8, 8, 3), np.uint8),
        (gym.spaces.Box(-1, 1, (), np.float32), "obs", (1,), np.float32),
    ],
)
def test_box_observations(space, key, shape, dtype):
    env = TimestepWrapper(SpaceEnv(space))
    ts, _ = env.reset(seed=0)
    assert ts["obs"][key].shape == shape and ts["obs"][key].dtype == dtype
    assert env.observation_space.contains(ts)
    ts, *_ = env.step(0)
    assert env.observation_space.contains(ts)


def test_image_is_kept_exactly():
    inner = SpaceEnv(gym.spaces.Box(0, 255, (8, 8, 3), np.uint8))
    env = TimestepWrapper(inner)
    ts, _ = env.reset(seed=3)
    inner.observation_space.seed(3)
    np.testing.assert_array_equal(ts["obs"]["obs"], inner.observation_space.sample())


def test_discrete_observation_one_hot_with_start():
    inner = SpaceEnv(gym.spaces.Discrete(5, start=2))
    env = TimestepWrapper(inner)
    inner.observation_space.seed(1)
    for _ in range(5):
        raw = inner.observation_space.sample()
        out = env._convert_obs(raw)["obs"]
        assert out.dtype == np.float32 and out.shape == (5,)
        np.testing.assert_array_equal(out, np.eye(5, dtype=np.float32)[raw - 2])


def test_multidiscrete_and_multibinary_observations():
    env = TimestepWrapper(SpaceEnv(gym.spaces.MultiDiscrete([3, 2, 4])))
    np.testing.assert_array_equal(env._convert_obs(np.array([2, 0, 1]))["obs"], [0, 0, 1, 1, 0, 0, 1, 0, 0])
    assert env.observation_space["obs"]["obs"].shape == (9,)
    env = TimestepWrapper(SpaceEnv(gym.spaces.MultiBinary([2, 2])))
    out = env._convert_obs(np.array([[1, 0], [0, 1]], np.int8))["obs"]
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [1, 0, 0, 1])
    ts, _ = env.reset(seed=0)
    assert env.observation_space.contains(ts)


def test_nested_dict_observation_flattened():
    space = gym.spaces.Dict(
        {
            "image": gym.spaces.Box(0, 255, (4, 4, 3), np.uint8),
            "state": gym.spaces.Dict({"pos": gym.spaces.Box(-1, 1, (2,)), "room": gym.spaces.Discrete(3)}),
            "bits": gym.spaces.MultiBinary(2),
        }
    )
    env = TimestepWrapper(SpaceEnv(space))
    ts, _ = env.reset(seed=0)
    assert set(ts["obs"]) == {"image", "state/pos", "state/room", "bits"}
    assert ts["obs"]["image"].dtype == np.uint8 and ts["obs"]["state/room"].shape == (3,)
    assert env.observation_space.contains(ts)


@pytest.mark.parametrize(
    "space, name",
    [
        (gym.spaces.Text(5), "Text"),
        (gym.spaces.Graph(gym.spaces.Box(0, 1, (2,)), None), "Graph"),
        (gym.spaces.Sequence(gym.spaces.Discrete(2)), "Sequence"),
        (gym.spaces.Dict({"a": gym.spaces.Text(3)}), "Text"),
    ],
)
def test_unsupported_observation_space(space, name):
    with pytest.raises(ValueError, match=name) as e:
        TimestepWrapper(SpaceEnv(space))
    assert "MultiDiscrete" in str(e.value)  # lists the supported spaces


# ----------------------------------------------------------------------------------------------- actions
def test_discrete_action_and_prev_action():
    inner = SpaceEnv(gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(4, start=1))
    env = TimestepWrapper(inner)
    assert env.action_spec == ActionSpec("discrete", 4)
    ts, _ = env.reset(seed=0)
    np.testing.assert_array_equal(ts["prev_action"], np.zeros(4))
    assert ts["prev_reward"] == 0 and ts["time"] == 0 and ts["reset"] == 1
    ts, r, *_ = env.step(np.int64(2))
    assert inner.last_action == 3  # start offset applied
    np.testing.assert_array_equal(ts["prev_action"], [0, 0, 1, 0])
    assert ts["prev_reward"] == r == 1.0 and ts["time"] == 1 and ts["reset"] == 0
    assert ts["time"].dtype == np.int64


def test_box_action_rescaling_is_exact():
    space = gym.spaces.Box(np.array([-2.0, 0.0, 10.0]), np.array([2.0, 1.0, 30.0]), dtype=np.float64)
    inner = SpaceEnv(gym.spaces.Box(-1, 1, (2,)), space)
    env = TimestepWrapper(inner)
    assert env.action_spec == ActionSpec("continuous", 3)
    assert env.action_space == gym.spaces.Box(-1, 1, (3,), np.float32)
    np.testing.assert_array_equal(agent_to_env_action(space, np.array([-1, -1, -1])), space.low)
    np.testing.assert_array_equal(agent_to_env_action(space, np.array([1, 1, 1])), space.high)
    np.testing.assert_allclose(agent_to_env_action(space, np.array([0, 0.5, -0.5])), [0.0, 0.75, 15.0])
    clipped = agent_to_env_action(space, np.array([5, -5, 0]))
    np.testing.assert_array_equal(clipped, [2.0, 0.0, 20.0])
    env.reset(seed=0)
    ts, *_ = env.step(np.array([1.0, -1.0, 3.0], np.float32))
    np.testing.assert_array_equal(inner.last_action, [2.0, 0.0, 30.0])
    np.testing.assert_array_equal(ts["prev_action"], [1.0, -1.0, 1.0])  # what the env executed, in [-1, 1]


def test_multibinary_action():
    inner = SpaceEnv(gym.spaces.Box(-1, 1, (2,)), gym.spaces.MultiBinary(3))
    env = TimestepWrapper(inner)
    assert env.action_spec == ActionSpec("multibinary", 3)
    env.reset(seed=0)
    ts, *_ = env.step(np.array([1, 0, 1], np.int8))
    np.testing.assert_array_equal(inner.last_action, [1, 0, 1])
    assert ts["prev_action"].dtype == np.float32
    np.testing.assert_array_equal(ts["prev_action"], [1, 0, 1])


@pytest.mark.parametrize(
    "space, words",
    [
        (gym.spaces.Box(-np.inf, np.inf, (2,)), "infinite"),
        (gym.spaces.Box(-1, 1, (2, 2)), "Box"),
        (gym.spaces.Tuple([gym.spaces.Discrete(2)]), "Tuple"),
        (gym.spaces.MultiDiscrete([100, 100]), "MultiDiscrete"),  # 10,000 combinations: too many
        (gym.spaces.MultiBinary([2, 2]), "MultiBinary"),
    ],
)
def test_unsupported_action_space(space, words):
    with pytest.raises(ValueError, match=words) as e:
        TimestepWrapper(SpaceEnv(gym.spaces.Box(-1, 1, (2,)), space))
    assert "Discrete(n)" in str(e.value) or "infinite" in str(e.value) or "combination" in str(e.value)


# ----------------------------------------------------------------------------------------- multi-episode
def run(env, actions, seed=0):
    out = [env.reset(seed=seed)[0]]
    steps = []
    for a in actions:
        ts, r, term, trunc, info = env.step(a)
        out.append(ts)
        steps.append((r, term, trunc, info))
        if term or trunc:
            break
    return out, steps


def test_single_episode_passthrough():
    inner = HiddenParamEnv(ep_len=3)
    env = TimestepWrapper(inner)
    ts, steps = run(env, [0, 0, 0, 0])
    assert len(steps) == 3 and steps[-1][2] and not steps[-1][1]
    assert steps[-1][3]["episode_end"] and steps[-1][3]["success"] == 0.0
    assert inner.resets == [None]  # no new_task option outside multi-episode mode


def test_k_episodes_same_task():
    inner = HiddenParamEnv(ep_len=3)
    env = TimestepWrapper(inner, episodes_per_rollout=3)
    # episode 1: truncated after 3 steps; episode 2: terminated by action 1; episode 3: truncated.
    actions = [0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0]
    ts, steps = run(env, actions, seed=5)
    assert [o["time"] for o in ts] == list(range(len(ts)))
    resets = [int(o["reset"]) for o in ts]
    assert resets == [1, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0]
    assert len(steps) == 10
    p = steps[0][0]
    assert 1.0 <= p <= 2.0
    rewards = [s[0] for s in steps]
    assert rewards == [p, p, p, 0.0, p, 0.0, 0.0, p, p, p]  # same hidden parameter in every episode
    # final obs of an episode is its own timestep with last action/reward; the reset one has zeros.
    assert ts[3]["prev_reward"] == np.float32(p) and ts[3]["reset"] == 0
    assert ts[4]["prev_reward"] == 0 and not ts[4]["prev_action"].any()
    assert ts[6]["prev_reward"] == 0 and ts[6]["prev_action"][1] == 1  # terminating action, reward 0
    # inner ends are neither terminated nor truncated at rollout level; the last one is.
    assert [(s[1], s[2]) for s in steps[:-1]] == [(False, False)] * 9
    assert steps[-1][1:3] == (False, True)
    ends = [i for i, s in enumerate(steps) if s[3].get("episode_end")]
    assert ends == [2, 5, 9]
    assert [steps[i][3]["success"] for i in ends] == [0.0, 1.0, 0.0]
    assert inner.resets == [{"new_task": True}, {"new_task": False}, {"new_task": False}]
    # a hard reset draws a new task
    env.reset(seed=6)
    _, r, *_ = env.step(0)
    assert r != p


def test_k_th_episode_terminated_terminates_rollout():
    env = TimestepWrapper(HiddenParamEnv(ep_len=3), episodes_per_rollout=2)
    _, steps = run(env, [1, 0, 1, 0])
    assert len(steps) == 3 and steps[-1][1:3] == (True, False)
    assert steps[0][1:3] == (False, False)


def test_horizon_mode():
    inner = HiddenParamEnv(ep_len=2)
    env = TimestepWrapper(inner, rollout_horizon=7)
    ts, steps = run(env, [0] * 20, seed=1)
    assert len(steps) == 7 and steps[-1][1:3] == (False, True)
    assert [int(o["reset"]) for o in ts] == [1, 0, 0, 1, 0, 0, 1, 0]
    assert all(s[1:3] == (False, False) for s in steps[:-1])
    # an inner termination exactly at the horizon still truncates (the rollout would have gone on)
    env = TimestepWrapper(HiddenParamEnv(ep_len=5), rollout_horizon=2)
    _, steps = run(env, [0, 1])
    assert steps[-1][1:3] == (False, True) and steps[-1][3]["episode_end"]


def test_bad_arguments():
    with pytest.raises(ValueError, match="not both"):
        TimestepWrapper(HiddenParamEnv(), episodes_per_rollout=2, rollout_horizon=5)
    with pytest.raises(ValueError, match="episodes_per_rollout"):
        TimestepWrapper(HiddenParamEnv(), episodes_per_rollout=0)


@pytest.mark.parametrize("kind", ["discrete", "continuous", "multibinary"])
def test_action_conversions_agree_for_numpy_and_torch(kind: str) -> None:
    """ActionSpec is the one home of action conversions: numpy and torch give the same storage and vectors,
    and the wrapper's per-action `action_to_vector` equals the batched form."""
    spec = ActionSpec(kind, 4)
    a_vec = np.random.default_rng(0).uniform(-1.5, 1.5, (6, 4)).astype(np.float32)  # [N, A] network vectors
    stored = spec.from_vector(a_vec)
    stored_t = spec.from_vector(torch.from_numpy(a_vec))
    assert stored.dtype == spec.storage_dtype and stored.shape == spec.storage_shape(6)
    np.testing.assert_array_equal(stored_t.numpy(), stored)
    vec = spec.to_vector(stored)
    assert vec.dtype == np.float32 and vec.shape == (6, 4)
    np.testing.assert_array_equal(spec.to_vector(stored_t).numpy(), vec)
    np.testing.assert_array_equal(np.stack([action_to_vector(spec, a) for a in stored]), vec)
    np.testing.assert_array_equal(spec.from_vector(vec), stored)  # storage -> vector -> storage is exact


def test_action_to_vector_cleans_policy_outputs() -> None:
    """What a policy returns becomes the stored form first: ids, clipped Box actions, 0/1 (> 0) bits."""
    np.testing.assert_array_equal(action_to_vector(ActionSpec("discrete", 3), np.array([2])), [0, 0, 1])
    np.testing.assert_array_equal(action_to_vector(ActionSpec("continuous", 2), [5.0, -0.5]), [1.0, -0.5])
    np.testing.assert_array_equal(action_to_vector(ActionSpec("multibinary", 3), [0.3, 0, -2]), [1, 0, 0])
    assert ActionSpec("continuous", 2).zero_vector(3).shape == (3, 2)


def test_rollout_clock_is_the_one_timestep_state_machine():
    """RolloutClock, which TimestepWrapper runs: a new task zeroes time and the
    episode index, the next episode of the same task counts the episode on and keeps time, both zero the
    previous action and reward and set the reset flag; `rollout_over` is the one end-of-rollout rule."""
    from icrl.envs.wrapper import RolloutClock

    spec = ActionSpec("discrete", 3)
    obs = {"obs": np.zeros(1, np.float32)}
    clock = RolloutClock(spec, episodes_per_rollout=2)
    clock.start(new_task=True)
    ts = clock.timestep(obs, 5.0, cont=False)
    assert (ts["reset"], ts["prev_reward"], ts["time"]) == (1, 0.0, 0) and not ts["prev_action"].any()
    assert ts["prev_reward"].dtype == np.float32 and ts["time"].dtype == np.int64 and ts["reset"].dtype == np.int8
    clock.acted(spec.to_vector(np.array(2)))
    ts = clock.timestep(obs, 0.5, cont=True)
    assert (ts["reset"], ts["prev_reward"], ts["time"]) == (0, 0.5, 1) and ts["prev_action"].tolist() == [0, 0, 1]
    assert not clock.rollout_over()  # the first of two episodes
    clock.acted(spec.to_vector(np.array(0)))
    clock.start(new_task=False)  # the next episode of the same task: time counts on
    ts = clock.timestep(obs, 2.0, cont=False)
    assert (ts["reset"], ts["prev_reward"], ts["time"], clock.episode) == (1, 0.0, 2, 1) and not ts["prev_action"].any()
    assert clock.rollout_over()
    clock.start(new_task=True)
    assert (clock.time, clock.episode) == (0, 0) and not clock.rollout_over()
    horizon = RolloutClock(spec, rollout_horizon=2)
    horizon.acted(spec.zero_vector())
    assert not horizon.rollout_over()
    horizon.acted(spec.zero_vector())
    assert horizon.rollout_over()  # time reached the horizon


def test_rollout_clocks_move_only_the_rows_given():
    """RolloutClocks, which icrl.load's predict and the batched tasks run: RolloutClock's rules, for the rows
    given only; a reward beyond float32 becomes inf without a warning."""
    from icrl.envs.clock import RolloutClocks

    spec = ActionSpec("discrete", 3)
    clock = RolloutClocks(spec, 2, episodes_per_rollout=2)
    clock.start(np.arange(2), new_task=True)
    ts = clock.timestep(np.array([5.0, 5.0]), cont=np.array([False, False]))
    assert ts["reset"].tolist() == [1, 1] and ts["prev_reward"].tolist() == [0, 0] and ts["time"].tolist() == [0, 0]
    assert not ts["prev_action"].any()
    assert ts["prev_reward"].dtype == np.float32 and ts["time"].dtype == np.int64 and ts["reset"].dtype == np.int8
    clock.acted(spec.to_vector(np.array([2, 1])))
    ts = clock.timestep(np.array([0.5, 1.0]), cont=np.array([True, True]))
    assert ts["reset"].tolist() == [0, 0] and ts["prev_reward"].tolist() == [0.5, 1.0] and ts["time"].tolist() == [1, 1]
    assert ts["prev_action"].tolist() == [[0, 0, 1], [0, 1, 0]]
    assert not clock.rollout_over().any()  # the first of two episodes
    clock.acted(spec.to_vector(np.array([0, 0])))
    clock.start(np.array([True, False]), new_task=False)  # env 0's next episode of the same task: time counts on
    ts = clock.timestep(np.array([2.0, 3.0]), cont=np.array([False, True]))
    assert ts["reset"].tolist() == [1, 0] and ts["prev_reward"].tolist() == [0.0, 3.0] and ts["time"].tolist() == [2, 2]
    assert clock.episode.tolist() == [1, 0] and ts["prev_action"].tolist() == [[0, 0, 0], [1, 0, 0]]
    assert clock.rollout_over().tolist() == [True, False]
    clock.start(np.array([0]), new_task=True)
    assert (clock.time.tolist(), clock.episode.tolist()) == ([0, 2], [0, 0]) and not clock.rollout_over().any()
    horizon = RolloutClocks(spec, 1, rollout_horizon=2)
    horizon.acted(spec.zero_vector(1))
    assert not horizon.rollout_over()[0]
    horizon.acted(spec.zero_vector(1))
    assert horizon.rollout_over()[0]  # time reached the horizon
    with np.errstate(over="raise"):  # beyond float32: inf without a warning, for the collector's guard
        assert np.isinf(horizon.timestep(np.array([1e300]), np.array([True]))["prev_reward"][0])
