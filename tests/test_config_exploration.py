import dataclasses

import numpy as np
import pytest
import tyro

from icrl.config import ConfigError, ExperimentConfig, ExploreConfig, ModelConfig, TrainConfig
from icrl.exploration import Exploration
from icrl.seeding import derive_seed
from icrl.types import ActionSpec


def test_config_json_round_trip():
    cfg = ExperimentConfig(model=ModelConfig(d_model=64, traj_encoder="gru"), train=TrainConfig(seed=7))
    again = ExperimentConfig.from_json(cfg.to_json())
    assert again == cfg


def test_cli_flags_have_no_group_prefix():
    cfg = tyro.cli(
        ExperimentConfig,
        args=["--env", "tmaze", "--env-kwargs", '{"length": 20}', "--d-model", "64", "--layers", "1", "--seed", "3",
              "--traj-encoder", "lstm", "--gammas", "0.9", "0.99"],
        config=(tyro.conf.OmitArgPrefixes,),
    )
    assert cfg.env.kwargs == {"length": 20}
    assert (cfg.model.d_model, cfg.model.layers, cfg.model.traj_encoder) == (64, 1, "lstm")
    assert cfg.train.seed == 3 and cfg.loss.gammas == (0.9, 0.99)


@pytest.mark.parametrize(
    "change, words",
    [
        (dict(model=ModelConfig(d_model=65, heads=4)), ["--d-model", "--heads"]),
        (dict(env=dataclasses.replace(ExperimentConfig().env, env_kwargs="{length: 3}")), ["--env-kwargs", "JSON"]),
        (dict(env=dataclasses.replace(ExperimentConfig().env, env_kwargs="[1]")), ["--env-kwargs", "object"]),
        (dict(train=TrainConfig(steps_per_epoch=4)), ["--steps-per-epoch", "--parallel-envs"]),
    ],
)
def test_validation_names_the_fields(change, words):
    with pytest.raises(ConfigError) as info:
        ExperimentConfig(**change).validate()
    for w in words:
        assert w in str(info.value)


def test_derive_seed_is_stable_and_distinct():
    assert derive_seed(0, "a") == derive_seed(0, "a")
    assert len({derive_seed(s, n) for s in range(5) for n in ("a", "b", "c")}) == 15


def test_epsilon_greedy_is_uniform_per_env_and_decays():
    spec = ActionSpec("discrete", 5)
    cfg = ExploreConfig(eps_start=1.0, eps_end=0.0, eps_anneal_steps=100)
    explore = Exploration(cfg, spec, num_envs=4000, seed=0)
    explore.scale[:] = 1.0
    greedy = np.zeros(4000, dtype=np.int64)
    acts = explore(greedy, env_steps=0, time=np.zeros(4000))
    counts = np.bincount(acts, minlength=5) / 4000
    assert np.allclose(counts, 0.2, atol=0.03)  # uniform over all actions, the greedy one included
    assert (explore(greedy, env_steps=100, time=np.zeros(4000)) == 0).all()  # fully decayed
    assert explore.level(50) == pytest.approx(0.5)


def test_per_env_scales_are_redrawn_only_for_new_rollouts():
    explore = Exploration(ExploreConfig(), ActionSpec("discrete", 3), num_envs=6, seed=1)
    before = explore.scale.copy()
    mask = np.array([True, False, False, True, False, False])
    explore.new_rollouts(mask)
    assert (explore.scale[~mask] == before[~mask]).all() and (explore.scale[mask] != before[mask]).all()


def test_bilevel_decays_within_rollout_and_noise_for_continuous():
    cfg = ExploreConfig(eps_start=1.0, bilevel=True, rollout_decay_steps=10, bilevel_min=0.1, eps_anneal_steps=1)
    explore = Exploration(cfg, ActionSpec("discrete", 3), num_envs=2, seed=0)
    explore.scale[:] = 1.0
    level = explore.per_env_level(0, np.array([0, 10]))
    assert level[0] == pytest.approx(1.0) and level[1] == pytest.approx(0.1)
    cont = Exploration(ExploreConfig(noise_start=0.3), ActionSpec("continuous", 2), num_envs=500, seed=0)
    cont.scale[:] = 1.0
    out = cont(np.zeros((500, 2), np.float32), env_steps=0, time=np.zeros(500))
    assert out.dtype == np.float32 and np.abs(out).max() <= 1.0
    assert np.std(out) == pytest.approx(0.3, rel=0.1)


def test_apply_overrides_parses_json_and_names_bad_keys():
    from icrl.config import apply_overrides

    cfg = apply_overrides(ExperimentConfig(), ["train.lr=0.001", "loss.gammas=[0.9, 0.99]", "env.env=tmaze_active"])
    assert cfg.train.lr == 0.001 and cfg.loss.gammas == (0.9, 0.99) and cfg.env.env == "tmaze_active"
    with pytest.raises(ConfigError, match="train.nope"):
        apply_overrides(cfg, ["train.nope=1"])
