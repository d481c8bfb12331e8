"""The config tree: groups by concern, field names unique across groups, and old config.json files load."""

import dataclasses
import json

import pytest

from icrl.config import GROUPS, ConfigError, ExperimentConfig, apply_overrides, field_groups
from icrl.config.experiment import ABSENT_MEANS


def test_every_group_is_a_field_and_field_names_are_unique():
    assert [f.name for f in dataclasses.fields(ExperimentConfig)] == list(GROUPS)
    names = [f.name for cls in GROUPS.values() for f in dataclasses.fields(cls)]
    assert len(names) == len(set(names)), "flags omit the group prefix, so a name may live in one group only"
    assert len(field_groups()) == len(names)


def test_replace_routes_each_field_to_its_group_and_refuses_unknown_names():
    cfg = ExperimentConfig().replace(lr=3e-4, run_dir="runs/x", eval_rollouts=3, d_model=16)
    assert (cfg.optim.lr, cfg.run.run_dir, cfg.eval.eval_rollouts, cfg.model.d_model) == (3e-4, "runs/x", 3, 16)
    assert cfg.loss == ExperimentConfig().loss
    with pytest.raises(ConfigError, match="no field learning_rate"):
        ExperimentConfig().replace(learning_rate=1.0)


def test_config_json_round_trips_and_an_old_single_train_group_still_loads():
    cfg = ExperimentConfig().replace(lr=3e-4, gammas=(0.9, 0.99), seed=3, eval_max_steps=10)
    assert ExperimentConfig.from_json(cfg.to_json()) == cfg
    raw = json.loads(cfg.to_json())
    old = {"env": {**raw["env"], "eval_max_steps": 10}, "model": raw["model"], "loss": raw["loss"],
           "explore": raw["explore"], "train": {**raw["optim"], **raw["replay"], **raw["schedule"], **raw["run"],
                                                 "eval_every": raw["eval"]["eval_every"]}}
    old["env"]["eval_rollouts"] = raw["eval"]["eval_rollouts"]
    assert ExperimentConfig.from_json(json.dumps(old)) == cfg
    with pytest.raises(ConfigError, match="no field bogus"):
        ExperimentConfig.from_json(json.dumps({"train": {"bogus": 1}}))


def test_a_config_json_without_a_field_whose_default_changed_loads_with_the_value_it_was_trained_with():
    """`reward_action_input` was added off and is on by default now: a run written before it existed had no such
    input, so its config.json (and the checkpoints' shapes) load with it off; a file that names it keeps its value."""
    assert ExperimentConfig().model.reward_action_input is True
    raw = json.loads(ExperimentConfig().to_json())
    del raw["model"]["reward_action_input"]
    assert ExperimentConfig.from_json(json.dumps(raw)).model.reward_action_input is False
    assert ExperimentConfig.from_json(ExperimentConfig().to_json()).model.reward_action_input is True
    assert set(ABSENT_MEANS) <= set(field_groups())  # every entry names a real field


def test_overrides_take_a_field_with_or_without_its_group():
    cfg = apply_overrides(ExperimentConfig(), ["lr=0.001", "loss.gammas=[0.9, 0.99]"])
    assert cfg.optim.lr == 0.001 and cfg.loss.gammas == (0.9, 0.99)
    with pytest.raises(ConfigError, match="model.lr"):
        apply_overrides(cfg, ["model.lr=1"])


def test_actor_and_position_options_default_off_validate_and_old_configs_load():
    """The policy / actor-head / RoPE fields: defaults as before the options existed, a config.json written
    without them loads with those defaults, and impossible combinations are refused with the flag's name."""
    m = ExperimentConfig().model
    assert (m.continuous_dist, m.actor_head, m.pos_emb, m.gmm_components) == ("tanh_gaussian", "mlp", "sinusoidal", 5)
    raw = json.loads(ExperimentConfig().to_json())
    for name in ("continuous_dist", "gmm_components", "actor_head"):
        del raw["model"][name]
    assert ExperimentConfig.from_json(json.dumps(raw)) == ExperimentConfig()
    ok = ExperimentConfig().replace(continuous_dist="gmm", gmm_components=3, actor_head="residual", pos_emb="rope")
    ok.validate(check_device=False)
    ExperimentConfig().replace(continuous_dist="beta").validate(check_device=False)
    bad = [
        (dict(pos_emb="rope", d_model=12, heads=4), "pos_emb='rope' rotates"),  # head width 3
        (dict(gmm_components=3), "gmm_components applies to continuous_dist='gmm'"),
        (dict(continuous_dist="gmm", gmm_components=0), "gmm_components must be in"),
        (dict(continuous_dist="gaussian"), "continuous_dist must be one of"),
        (dict(actor_head="resnet"), "actor_head must be one of"),
    ]
    for kw, message in bad:
        with pytest.raises(ConfigError, match=message):
            ExperimentConfig().replace(**kw).validate(check_device=False)


def test_first_line_quotes_icrl_errors_whole_and_caps_only_where_asked():
    """The CLI prints icrl's own errors through `first_line`: their fix comes last, so they are never cut; a user's
    env's exception is quoted with a cap (its message may hold a whole array)."""
    from icrl.config.errors import first_line

    long = "--flag: " + "x" * 400 + "; pass --other-flag instead"
    assert first_line(ConfigError(long + "\nsecond line")) == long
    capped = first_line(ValueError("y" * 1_000), limit=300)
    assert len(capped) == 300 and capped.endswith("...")
    assert first_line(KeyError()) == "KeyError"  # no message: its type
