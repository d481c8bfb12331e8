"""Envs a user hands to `icrl.train`: a Gymnasium vector env or env instance (re-created from its spec), their own
env classes with Tuple observations and MultiDiscrete actions, and spaces too large to build, refused early."""

import json

import gymnasium as gym
import numpy as np
import pytest
from helpers import Combo, tiny

import icrl
from icrl.config import ExperimentConfig


def test_make_vec_with_kwargs_trains(in_tmp):
    """make_vec's closures already hold their kwargs (map_name, is_slippery): they are not passed again."""
    venv = gym.make_vec("FrozenLake-v1", num_envs=2, vectorization_mode="sync", is_slippery=True)
    result = icrl.train(tiny("runs/lake", env_kwargs="{}"), env=venv)
    cfg = json.loads((in_tmp / "runs/lake/config.json").read_text())
    assert cfg["env"]["env"] == "FrozenLake-v1" and json.loads(cfg["env"]["env_kwargs"])["is_slippery"] is True
    assert result["rollouts"] == 2


def test_an_env_made_by_gymnasium_make_is_accepted(in_tmp):
    """SB3's first habit: an instance. icrl re-creates it from its spec (kwargs and time limit kept)."""
    result = icrl.train(tiny("runs/inst", env_kwargs="{}"), env=gym.make("CartPole-v1", max_episode_steps=6))
    cfg = json.loads((in_tmp / "runs/inst/config.json").read_text())
    assert cfg["env"]["env"] == "CartPole-v1" and json.loads(cfg["env"]["env_kwargs"]) == {"max_episode_steps": 6}
    assert result["episode_length_mean"] <= 6


def test_tuple_observations_and_multidiscrete_actions_train_and_act(in_tmp):
    icrl.train(tiny("runs/combo", env_kwargs="{}"), env=Combo)
    policy = icrl.load("runs/combo")
    env = Combo()
    obs, _ = env.reset(seed=0)
    action, state = policy.predict(obs)
    assert env.action_space.contains(np.asarray(action))
    assert icrl.evaluate(policy, env=Combo, n_episodes=2)["rollouts"] == 2


def test_too_many_multidiscrete_combinations_give_advice_that_exists():
    from icrl.types import agent_action_space

    with pytest.raises(ValueError, match="ActionWrapper") as e:
        agent_action_space(gym.spaces.MultiDiscrete([100, 100]))
    assert "Gymnasium has no wrapper" in str(e.value)


class Plain(gym.Env):
    """An env of the user's own, without a Gymnasium spec."""

    observation_space = gym.spaces.Discrete(2)
    action_space = gym.spaces.Discrete(2)


def test_an_instance_without_a_spec_says_what_to_pass():
    from icrl.envs.user import resolve_env

    with pytest.raises(ValueError) as e:
        resolve_env(gym.wrappers.TimeLimit(Plain(), 10))
    assert "env=Plain" in str(e.value) and "env=TimeLimit" not in str(e.value)


def test_a_spaces_record_that_describes_a_huge_space_is_refused_before_allocating_it(in_tmp):
    from icrl.spaces_json import MAX_SPACE_ELEMENTS, space_from_json

    for bad in ({"type": "Box", "shape": [100_000, 100_000], "dtype": "float32", "low": 0, "high": 1},
                {"type": "Box", "shape": [-3], "dtype": "float32", "low": 0, "high": 1},
                {"type": "Discrete", "n": 10**15},
                {"type": "MultiBinary", "n": [10**6, 10**6]},
                {"type": "Dict", "spaces": [[str(k), {"type": "Box", "shape": [MAX_SPACE_ELEMENTS // 2], "dtype": "uint8",
                                                      "low": 0, "high": 1}] for k in range(3)]}):
        with pytest.raises(ValueError, match="refused before allocating|not a shape"):
            space_from_json(bad)
    icrl.train(tiny("runs/x"))
    record = json.loads((in_tmp / "runs/x/spaces.json").read_text())
    record["observation_space"] = {"type": "Box", "shape": [10**6, 10**6], "dtype": "float32", "low": 0, "high": 1}
    (in_tmp / "runs/x/spaces.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match="refused before allocating"):
        icrl.load("runs/x")


def test_an_observation_too_large_for_memory_is_one_line_before_the_agent_is_built():
    from icrl.config import ConfigError
    from icrl.run.components import build_agent
    from icrl.types import ActionSpec

    obs = gym.spaces.Dict({"obs": gym.spaces.Box(0, 1, (1 << 21,), np.float32)})  # 2M numbers: ~8 MB of bounds
    cfg = ExperimentConfig().replace(tstep_hidden=1 << 16)  # 2M x 65,536 weights: far beyond any machine
    with pytest.raises(ConfigError, match="observations of 2,097,152 numbers.*ResizeObservation"):
        build_agent(cfg, obs, ActionSpec.from_space(gym.spaces.Discrete(2)), "cpu")
