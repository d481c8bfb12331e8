"""Envs a user hands to `icrl.train`: a Gymnasium vector env or env instance (re-created from its spec), their own
env classes with Tuple observations and MultiDiscrete actions, and spaces too large to build, refused early."""

import json

import gymnasium as gym
import numpy as np
import pytest

import icrl
from icrl.config import ExperimentConfig

from helpers import Combo, tiny


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
                {"type": "Dict", "spaces": [[str(k), {"type": "Box", "shape": [MAX_SPACE_ELEMENTS // 2],
                                                      "dtype": "uint8", "low": 0, "high": 1}] for k in range(3)]}):
        with pytest.raises(ValueError, match="refused before allocating|not a shape"):
            space_from_json(bad)
    icrl.train(tiny("runs/x"))
    record = json.loads((in_tmp / "runs/x/spaces.json").read_text())
    record["observation_space"] = {"type": "Box", "shape": [10**6, 10**6], "dtype": "float32", "low": 0, "high": 1}
    (in_tmp / "runs/x/spaces.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match="refused before allocating"):
        icrl.load("runs/x")


def test_an_observation_too_large_for_memory_is_one_line_before_the_agent_is_built():
    from icrl.agent.model import build_agent
    from icrl.config import ConfigError
    from icrl.types import ActionSpec

    obs = gym.spaces.Dict({"obs": gym.spaces.Box(0, 1, (1 << 21,), np.float32)})  # 2M numbers: ~8 MB of bounds
    cfg = ExperimentConfig().replace(tstep_hidden=1 << 16)  # 2M x 65,536 weights: far beyond any machine
    with pytest.raises(ConfigError, match="observations of 2,097,152 numbers.*ResizeObservation"):
        build_agent(cfg, obs, ActionSpec.from_space(gym.spaces.Discrete(2)), "cpu")


class Reports(gym.Env):
    """One-step episodes that report `info["is_success"] = value` (Stable-Baselines3's key) when they end."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, value=True):
        self.value = value

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 1.0, True, False, {"is_success": self.value}


@pytest.mark.parametrize("value", [np.array([1, 0]), {"a": 1}, 7.0, float("nan"), float("inf"), "yes"])
def test_a_success_that_is_not_a_bool_or_0_or_1_is_refused_naming_the_env(in_tmp, value):
    """An array or a dict was a traceback deep in the summary; 7.0 gave "success rate 7.00", NaN printed as nan."""
    with pytest.raises(ValueError, match=r"Reports .*reported info\['is_success'\] = .*give a bool or 0 / 1"):
        icrl.train(tiny("runs/s", env_kwargs="{}"), env=lambda: Reports(value))


@pytest.mark.parametrize("value", [True, 1, np.float32(1.0), np.bool_(True)])
def test_a_success_given_as_a_bool_or_1_counts(in_tmp, value):
    assert icrl.train(tiny("runs/s", env_kwargs="{}"), env=lambda: Reports(value))["success_rate"] == 1.0


def test_a_factory_that_raises_is_one_line_with_its_traceback_in_a_file(in_tmp, capsys, monkeypatch):
    """`--env module:factory` whose factory raises: one line naming the env and the error, the user's traceback in a
    file, exit 2 (was the factory's traceback on the terminal)."""
    from helpers import cli

    (in_tmp / "broken_env.py").write_text("def make(**kwargs):\n    raise RuntimeError('no such level')\n")
    monkeypatch.syspath_prepend(str(in_tmp))
    capsys.readouterr()
    assert cli("train", "--env", "broken_env:make", "--run-dir", "runs/b") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'broken_env:make' could not be built" in err, err
    assert "RuntimeError: no such level" in err and "traceback" in err and not (in_tmp / "runs/b").exists()


def test_an_action_space_too_wide_to_allocate_is_refused_with_its_size(in_tmp):
    """Discrete(10^9) was an allocator error from inside the wrapper (a one-hot of 10^9 floats per timestep)."""

    class Wide(Reports):
        action_space = gym.spaces.Discrete(10**9)

    with pytest.raises(ValueError, match="1,000,000,000 numbers .* limit of 65,536"):
        icrl.train(tiny("runs/w", env_kwargs="{}"), env=lambda: Wide())
    assert not (in_tmp / "runs/w").exists()


def test_an_observation_of_a_million_numbers_is_refused_with_the_memory_it_needs(in_tmp):
    """A Box of 10^6 floats slipped under the check (it began at 2^20 numbers) and failed at the first update."""

    class Big(Reports):
        observation_space = gym.spaces.Box(-1.0, 1.0, (10**6,), np.float32)

        def reset(self, *, seed=None, options=None):
            return np.zeros(10**6, np.float32), {}

        def step(self, action):
            return np.zeros(10**6, np.float32), 1.0, True, False, {}

    cfg = tiny("runs/big", env_kwargs="{}").replace(batch_size=24, max_seq_len=256)
    with pytest.raises(icrl.config.ConfigError, match="observations of 1,000,000 numbers: this config needs"):
        icrl.train(cfg, env=lambda: Big())
