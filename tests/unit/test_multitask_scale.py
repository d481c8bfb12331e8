"""benchmarks/multitask_scale.py compares what it says it compares (issue 22): the `multitask` preset against the
library's default update on the same model and schedule, and the official run at the same settings; and it
scores a run by each game's return divided by its hidden factor. Config and arithmetic only; nothing is trained."""

from pathlib import Path

import pytest

from benchmarks import multitask_scale as ms
from icrl.config import LossConfig
from icrl.config.presets import multitask

SAME = ("model", "explore", "optim", "replay", "schedule")


def test_the_twohot_update_is_the_preset_with_one_value_range_for_both_mixes():
    preset = multitask()
    for mix in ms.MIXES:
        cfg = ms.icrl_config("twohot", mix, 20_000, 1, Path("r"), 1)
        assert cfg.eval.eval_rollouts == ms.EVAL_ROLLOUTS
        for group in SAME[:-1] + ("loss",):
            assert getattr(cfg, group) == getattr(preset, group), group
        assert cfg.env.kwargs == {"names": list(ms.GAMES), "reward_scales": ms.scales(mix)}
        assert cfg.schedule.total_env_steps == 20_000 and cfg.run.seed == 1
    # every discounted value of the scaled mix inside the bins: POPGym's returns lie in [-1, 1]
    assert preset.loss.critic_max_value >= max(ms.SCALES) * preset.loss.reward_scale


def test_the_regression_update_changes_only_the_loss_to_the_library_defaults():
    two, reg = (ms.icrl_config(u, "scaled", 20_000, 0, Path("r"), 1) for u in ("twohot", "regression"))
    for group in SAME + ("env", "eval"):
        assert getattr(two, group) == getattr(reg, group), group
    assert reg.loss == LossConfig(gammas=two.loss.gammas)
    assert reg.loss.critic_kind == "regression" and reg.loss.online_coeff > 0 and reg.loss.popart
    reg.validate(), two.validate()


def test_a_runs_score_divides_each_game_by_its_factor_and_waits_for_every_game():
    run = {"mix": "scaled", "curve": [
        {"env_steps": 1, "tasks": {"RepeatFirstEasy": 0.5}},
        {"env_steps": 2, "tasks": {g: 0.5 * s for g, s in zip(ms.GAMES, ms.SCALES)}},
        {"env_steps": 3,
         "tasks": {g: (-1.0 if i == 0 else 1.0) * s for i, (g, s) in enumerate(zip(ms.GAMES, ms.SCALES))}},
    ]}
    rows = ms.normalised(run)
    assert rows[0]["mean"] is None and rows[0]["per_task"] == {"RepeatFirstEasy": 0.5}
    assert rows[1]["mean"] == pytest.approx(0.5)
    assert rows[2]["mean"] == pytest.approx((-1 + 1 + 1 + 1) / 4)
    unscaled = {**run, "mix": "unscaled"}
    assert ms.normalised(unscaled)[1]["per_task"]["MineSweeperEasy"] == pytest.approx(500.0)  # no factor to undo


def test_the_summary_averages_the_last_two_evaluations_per_seed():
    def run(seed, last):
        tasks = lambda v: {g: v * s for g, s in zip(ms.GAMES, ms.SCALES)}  # noqa: E731
        return {"mix": "scaled", "update": "twohot", "seed": seed, "wall_s": 1.0,
                "curve": [{"env_steps": 10, "tasks": tasks(-1.0)}, {"env_steps": 20, "tasks": tasks(last[0])},
                          {"env_steps": 30, "tasks": tasks(last[1])}]}

    [row] = ms.summarize([run(0, (0.0, 0.5)), run(1, (1.0, 1.0))])
    assert row["score_last2"] == pytest.approx([0.25, 1.0])
    assert row["score_mean"] == pytest.approx(0.625) and row["env_steps"] == 30
    assert row["per_task_last2"]["MineSweeperEasy"] == pytest.approx((0.25 + 1.0) / 2)
    assert "twohot" in ms.markdown([row])


def test_the_official_run_gets_icrls_resolved_settings():
    cmd = ms.amago_command("scaled", 0, 20_000, Path("w"), Path("venv"))
    assert "None" not in cmd
    flag = lambda name: cmd[cmd.index(name) + 1]  # noqa: E731
    cfg = multitask()
    assert int(flag("--eps_anneal")) == 20_000 // cfg.env.parallel_envs // 2  # icrl's budget-relative anneal, per env
    assert int(flag("--memory_size")) == cfg.model.d_model and int(flag("--max_seq_len")) == cfg.model.max_seq_len
    per_env = int(flag("--timesteps_per_epoch"))
    assert int(flag("--parallel_actors")) * per_env == cfg.schedule.steps_per_epoch
    assert int(flag("--batches_per_epoch")) == cfg.schedule.updates_per_epoch
    assert float(flag("--value_bound")) == cfg.loss.critic_max_value and int(flag("--bins")) == cfg.loss.critic_bins
    scales = cmd[cmd.index("--scales") + 1: cmd.index("--scales") + 1 + len(ms.GAMES)]
    assert [float(x) for x in scales] == list(ms.SCALES)


def test_random_play_is_near_each_games_chance_level():
    pytest.importorskip("popgym")
    rand = ms.random_play(rollouts=400)
    assert set(rand) == set(ms.GAMES)
    assert -0.75 < rand["RepeatFirstEasy"] < -0.25  # 1 card in 4 right on average: (1 - 3) / 4
    assert -0.2 < rand["HigherLowerEasy"] < 0.2
