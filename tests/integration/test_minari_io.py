"""Minari <-> rollouts (icrl/data/minari_io.py): space mapping, foreign import, exact round trips, bad inputs.

Datasets are created locally in a temporary MINARI_DATASETS_PATH; nothing is downloaded.
"""

from __future__ import annotations

import os
import warnings

import gymnasium as gym
import numpy as np
import pytest

from icrl.data.minari_io import (
    OfflineDataNotFoundError,
    SpaceMismatchError,
    agent_observation_space,
    env_to_agent_actions,
    read_minari,
    write_minari,
)
from icrl.envs import Collector, make_vector_env
from icrl.envs.collect import RandomPolicy
from icrl.envs.make import make_wrapped_env
from icrl.envs.wrapper import TimestepWrapper, _flatten_obs_space, agent_to_env_action
from icrl.types import ActionSpec, Rollout


def create_foreign(minari, dataset_id: str, episodes: list[dict], obs_space: gym.Space, act_space: gym.Space):
    """A dataset made the way other Minari users make one (env spaces, raw values)."""
    from minari.data_collector.episode_buffer import EpisodeBuffer

    buffers = [EpisodeBuffer(**ep) for ep in episodes]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # minari warns about missing author / permalink metadata
        return minari.create_dataset_from_buffers(
            dataset_id, buffers, observation_space=obs_space, action_space=act_space
        )


class ToyEnv(gym.Env):
    """Deterministic env with every observation conversion the wrapper does and a Box(-2, 2) action."""

    def __init__(self):
        self.observation_space = gym.spaces.Dict({
            "pos": gym.spaces.Discrete(5, start=1),
            "body": gym.spaces.Dict({"vel": gym.spaces.Box(-9.0, 9.0, (2,), np.float64),
                                     "flag": gym.spaces.Box(0, 1, (), np.int64)}),
        })
        self.action_space = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
        self._t = 0
        self._v = np.zeros(2)

    def _obs(self):
        return {"pos": 1 + self._t % 5, "body": {"vel": self._v.copy(), "flag": np.int64(self._t % 2)}}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t, self._v = 0, np.array([0.25, -0.5])
        return self._obs(), {}

    def step(self, action):
        self._t += 1
        self._v = self._v + float(action[0]) / 3.0
        return self._obs(), float(action[0]) ** 2, self._t == 4, False, {}


# ------------------------------------------------------------------------------------------------- spaces
def test_agent_observation_space_is_the_wrappers_view_nested_like_the_env():
    env_space = ToyEnv().observation_space
    agent = agent_observation_space(env_space)
    wrapper_obs = TimestepWrapper(ToyEnv()).observation_space["obs"]
    assert [(k, b) for k, _, b, _ in _flatten_obs_space(agent)] == list(wrapper_obs.spaces.items())
    assert agent["pos"] == gym.spaces.Box(0.0, 1.0, (5,), np.float32)
    assert agent["body"]["vel"].dtype == np.float32
    plain = gym.spaces.Box(0.0, 1.0, (4,), np.float32)
    assert agent_observation_space(plain) == plain


def test_env_to_agent_actions_inverts_agent_to_env_action():
    rng = np.random.default_rng(0)
    box = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([3.0, 5.0], np.float32))
    u = rng.uniform(-1, 1, (50, 2)).astype(np.float32)
    env_actions = np.stack([agent_to_env_action(box, a) for a in u])
    np.testing.assert_allclose(env_to_agent_actions(box, env_actions), u, atol=1e-6)
    unit = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    assert np.array_equal(env_to_agent_actions(unit, u), u)  # exact on [-1, 1]: what icrl exports
    ids = env_to_agent_actions(gym.spaces.Discrete(4, start=-1), np.array([-1, 2, 0]))
    assert ids.dtype == np.int64 and ids.tolist() == [0, 3, 1]
    mb = env_to_agent_actions(gym.spaces.MultiBinary(3), np.array([[1, 0, 1]]))
    assert mb.dtype == np.int8 and mb.tolist() == [[1, 0, 1]]
    with pytest.raises(ValueError, match="outside"):
        env_to_agent_actions(gym.spaces.Discrete(2), np.array([2]))
    with pytest.raises(ValueError, match="Unsupported action space"):
        env_to_agent_actions(gym.spaces.Tuple([gym.spaces.Discrete(2)] * 2), np.zeros((1, 2)))


# ------------------------------------------------------------------------------------------------- import
def test_foreign_episodes_import_as_the_wrapper_records_them(minari_home):
    venv = gym.vector.SyncVectorEnv([lambda: TimestepWrapper(ToyEnv())],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    spec = ActionSpec.from_space(venv.single_action_space)
    recorded, _ = Collector(venv, spec, seed=0).collect(RandomPolicy(spec, seed=1), 12)  # 3 episodes of 4 steps
    raw = ToyEnv()
    episodes = []
    for r in recorded:  # replay the agent's actions in the raw env: what a Minari DataCollector would store
        obs, _ = raw.reset()
        observations, actions = [obs], []
        for a in r.action:
            actions.append(agent_to_env_action(raw.action_space, a))
            observations.append(raw.step(actions[-1])[0])
        stacked = {"pos": np.array([o["pos"] for o in observations]),
                   "body": {"vel": np.stack([o["body"]["vel"] for o in observations]),
                            "flag": np.array([o["body"]["flag"] for o in observations])}}
        episodes.append(dict(observations=stacked, actions=np.stack(actions), rewards=r.reward.astype(np.float64),
                             terminations=r.terminated, truncations=r.truncated))
    create_foreign(minari_home, "test/toy-v0", episodes, raw.observation_space, raw.action_space)

    imported = list(read_minari("test/toy-v0", raw.observation_space, raw.action_space))
    assert len(imported) == len(recorded) == 3
    for got, want in zip(imported, recorded):
        g, w = got.to_arrays(), want.to_arrays()
        assert g.keys() == w.keys()
        for key in g:
            assert g[key].dtype == w[key].dtype and g[key].shape == w[key].shape, key
            if key in ("action", "prev_action"):  # rescaled from [-2, 2] and back: float rounding only
                np.testing.assert_allclose(g[key], w[key], atol=1e-6)
            else:
                assert np.array_equal(g[key], w[key]), key


# ---------------------------------------------------------------------------------------------- round trip
def _collected(env: str, kwargs: dict, episodes_per_rollout: int, chunk_len: int | None) -> list[Rollout]:
    venv = make_vector_env(env, kwargs, 2, episodes_per_rollout=episodes_per_rollout)
    spec = ActionSpec.from_space(venv.single_action_space)
    rollouts, _ = Collector(venv, spec, chunk_len=chunk_len, seed=0).collect(RandomPolicy(spec, seed=0), 160)
    venv.close()
    return rollouts


@pytest.mark.parametrize(
    "env, kwargs, episodes_per_rollout, chunk_len",
    [
        ("tmaze", {"length": 3}, 1, 3),  # chunks of long rollouts: time offsets and carried prev_action
        ("meta_frozen_lake", {}, 3, None),  # multi-episode rollouts: bridges between episodes
        ("cue_recall", {"delay": 2, "continuous": True}, 2, None),  # continuous actions
    ],
)
def test_export_import_round_trip_is_exact(minari_home, env, kwargs, episodes_per_rollout, chunk_len):
    rollouts = _collected(env, kwargs, episodes_per_rollout, chunk_len)
    wrapped = make_wrapped_env(env, kwargs, episodes_per_rollout)
    obs_space = agent_observation_space(wrapped.env.observation_space)
    path, episodes, steps = write_minari(f"test/{env}-v0", rollouts, obs_space, wrapped.action_space)
    inner = sum(int(r.reset[1:].sum()) + 1 for r in rollouts)
    assert episodes == inner and path.is_dir()

    dataset = minari_home.load_dataset(f"test/{env}-v0")  # any Minari user can read it
    assert dataset.total_episodes == episodes and dataset.total_steps == steps
    for ep in dataset.iterate_episodes():
        assert len(ep.actions) == len(ep.rewards) and len(ep.observations) == len(ep.rewards) + 1
        assert ep.terminations[-1] or ep.truncations[-1]  # inner episodes and chunk cuts are marked truncated

    back = list(read_minari(f"test/{env}-v0", wrapped.env.observation_space, wrapped.env.action_space))
    assert len(back) == len(rollouts)
    assert len(list(read_minari(path, wrapped.env.observation_space, wrapped.env.action_space))) == len(rollouts)
    for got, want in zip(back, rollouts):
        g, w = got.to_arrays(), want.to_arrays()
        assert g.keys() == w.keys()
        for key in g:
            assert g[key].dtype == w[key].dtype and np.array_equal(g[key], w[key]), key


def test_achieved_goals_round_trip(minari_home):
    n, k = 6, 2
    rng = np.random.default_rng(0)
    reset = np.array([1, 0, 0, 1, 0, 0], bool)
    action = rng.integers(0, 3, n - 1)
    reward = rng.normal(size=n - 1).astype(np.float32)
    reward[2] = 0.0  # the bridge transition
    prev_action = np.zeros((n, 3), np.float32)
    prev_reward = np.zeros(n, np.float32)
    for t in range(1, n):
        if not reset[t]:
            prev_action[t, action[t - 1]], prev_reward[t] = 1.0, reward[t - 1]
    rollout = Rollout(
        obs={"obs": rng.normal(size=(n, 2)).astype(np.float32)}, prev_action=prev_action, prev_reward=prev_reward,
        time=np.arange(n), reset=reset, action=action, reward=reward, terminated=np.eye(n - 1, dtype=bool)[-1],
        truncated=np.zeros(n - 1, bool), achieved=rng.integers(-1, 4, (n, k)),
    )
    obs_space, act_space = gym.spaces.Box(-9.0, 9.0, (2,), np.float32), gym.spaces.Discrete(3)
    write_minari("test/goals-v0", [rollout], obs_space, act_space)
    (back,) = read_minari("test/goals-v0", obs_space, act_space, achieved_slots=k)
    for key, value in rollout.to_arrays().items():
        assert np.array_equal(back.to_arrays()[key], value), key


# ----------------------------------------------------------------------------------------------- bad inputs
def _tmaze_rollouts() -> tuple[list[Rollout], gym.Space, gym.Space]:
    wrapped = make_wrapped_env("tmaze", {"length": 3})
    return _collected("tmaze", {"length": 3}, 1, None), wrapped.observation_space["obs"]["obs"], wrapped.action_space


def test_existing_dataset_id_is_refused_unless_overwrite(minari_home):
    rollouts, obs_space, act_space = _tmaze_rollouts()
    path, n, _ = write_minari("test/tmaze-v0", rollouts, obs_space, act_space)
    with pytest.raises(FileExistsError, match="already exists.*overwrite"):
        write_minari("test/tmaze-v0", rollouts[:2], obs_space, act_space)
    assert minari_home.load_dataset("test/tmaze-v0").total_episodes == n  # untouched

    def failing():
        yield rollouts[0]
        raise RuntimeError("collector died")

    with pytest.raises(RuntimeError, match="collector died"):  # a failed replacement keeps the old dataset
        write_minari("test/tmaze-v0", failing(), obs_space, act_space, overwrite=True)
    assert minari_home.load_dataset("test/tmaze-v0").total_episodes == n
    write_minari("test/tmaze-v0", rollouts[:2], obs_space, act_space, overwrite=True)
    assert minari_home.load_dataset("test/tmaze-v0").total_episodes == 2
    hidden = [p.name for p in path.parent.parent.iterdir() if p.name.startswith(".")]
    assert hidden == [], hidden  # no temporary or replaced folders left behind
    with pytest.raises(ValueError, match="Malformed dataset ID"):
        write_minari("no version", rollouts, obs_space, act_space)


def test_failed_move_into_place_puts_the_old_dataset_back(minari_home, monkeypatch):
    """The new dataset is complete but moving it into place fails: the dataset moved aside comes back."""
    import icrl.data.minari_io as minari_io

    rollouts, obs_space, act_space = _tmaze_rollouts()
    path, n, _ = write_minari("test/tmaze-v0", rollouts, obs_space, act_space)
    real_rename = os.rename

    def rename(src, dst):
        if os.path.basename(src).startswith(".icrl-export-"):
            raise OSError("disk gone")
        real_rename(src, dst)

    with monkeypatch.context() as patch, pytest.raises(OSError, match="disk gone"):
        patch.setattr(minari_io.os, "rename", rename)
        write_minari("test/tmaze-v0", rollouts[:2], obs_space, act_space, overwrite=True)
    assert minari_home.load_dataset("test/tmaze-v0").total_episodes == n
    hidden = [p.name for p in path.parent.parent.iterdir() if p.name.startswith(".")]
    assert hidden == [], hidden


def test_missing_dataset_is_a_clear_error_and_never_downloaded(minari_home):
    space = gym.spaces.Discrete(2)
    with pytest.raises(OfflineDataNotFoundError, match="never downloads.*MINARI_DATASETS_PATH"):
        list(read_minari("test/absent-v0", space, space))


def test_space_mismatch_names_both_spaces(minari_home):
    rollouts, obs_space, act_space = _tmaze_rollouts()
    write_minari("test/tmaze-v0", rollouts, obs_space, act_space)
    other = make_wrapped_env("cue_recall", {"delay": 2, "continuous": True}).env
    with pytest.raises(SpaceMismatchError, match=r"observation space Box.*\(4,\).*the env's.*\(3,\).*env"):
        list(read_minari("test/tmaze-v0", other.observation_space, other.action_space))
    with pytest.raises(SpaceMismatchError, match=r"action space Discrete\(4\).*Discrete\(5\)"):
        list(read_minari("test/tmaze-v0", obs_space, gym.spaces.Discrete(5)))


def test_unsupported_and_corrupt_datasets(minari_home):
    tup = gym.spaces.Tuple([gym.spaces.Discrete(2), gym.spaces.Discrete(3)])
    episode = dict(observations=(np.array([0, 1]), np.array([2, 0])), actions=np.array([1]), rewards=[0.0],
                   terminations=[True], truncations=[False])
    create_foreign(minari_home, "test/tuple-v0", [episode], tup, gym.spaces.Discrete(2))
    (rollout,) = list(read_minari("test/tuple-v0", tup, gym.spaces.Discrete(2)))  # Tuple: entries "0", "1"
    assert rollout.obs["0"].tolist() == [[1, 0], [0, 1]] and rollout.obs["1"].tolist() == [[0, 0, 1], [1, 0, 0]]
    text = gym.spaces.Dict({"t": gym.spaces.Text(3)})
    with pytest.raises(ValueError, match="Unsupported observation space Text"):
        list(read_minari("test/tuple-v0", text, gym.spaces.Discrete(2)))

    rollouts, obs_space, act_space = _tmaze_rollouts()
    path, _, _ = write_minari("test/broken-v0", rollouts, obs_space, act_space)
    (path / "data" / "main_data.hdf5").write_bytes(b"not an hdf5 file")
    with pytest.raises(ValueError, match="cannot read the Minari dataset"):
        list(read_minari("test/broken-v0", obs_space, act_space))
