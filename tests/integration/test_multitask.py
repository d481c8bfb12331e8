"""The `multitask` preset (AMAGO-2's recipe on popgym_multi) builds, validates and trains a tiny budget; its metrics
rows, `icrl eval`'s table and eval.json carry return per task (`info["task"]`, docs/CONTRACTS.md)."""

from __future__ import annotations

import json

import pytest
import torch

import icrl
from icrl.config.presets import MULTITASK_GAMES, MULTITASK_VALUE_BOUND, multitask, preset_config
from icrl.run.reporting import read_metrics

from helpers import run_icrl

pytest.importorskip("popgym.envs", reason="popgym is not installed: pip install 'icrl[popgym]'")


def test_the_preset_is_amago2s_recipe_on_popgym_multi():
    cfg = multitask().validate()
    loss = cfg.loss
    assert cfg.env.env == "popgym_multi" and cfg.env.kwargs == {"names": list(MULTITASK_GAMES)}
    assert (loss.critic_kind, loss.online_coeff, loss.offline_coeff, loss.num_value_samples) == ("twohot", 0.0, 1.0, 3)
    assert -loss.critic_min_value == loss.critic_max_value == MULTITASK_VALUE_BOUND >= 2 * loss.reward_scale
    assert loss.discrete_action_input is True  # AMAGO-2's critic: Q(s, one-hot a)
    assert cfg.model.max_seq_len == 52  # a whole 51-step game
    assert preset_config("multitask", {"names": ["RepeatFirstEasy"]}).env.kwargs == {"names": ["RepeatFirstEasy"]}


def test_a_tiny_run_logs_return_per_task_and_icrl_eval_shows_it(tmp_path):
    torch.set_num_threads(1)
    run = tmp_path / "mt"
    cfg = multitask().replace(run_dir=str(run), total_env_steps=400, steps_per_epoch=200, parallel_envs=2,
                              updates_per_epoch=2, batch_size=4, warmup_updates=1, eval_every=1, eval_rollouts=6,
                              log_every=1, device="cpu", threads=1)
    result = icrl.train(cfg)
    rows = read_metrics(run / "metrics.jsonl")
    train = [r for r in rows if r["kind"] == "train"]
    evals = [r for r in rows if r["kind"] == "eval"]
    assert len(train) == len(evals) == 2 and train[-1]["updates"] > 0
    for row, prefix in [(r, "train/") for r in train] + [(r, "") for r in evals]:
        tasks = {k.removeprefix(f"{prefix}rollouts/") for k in row if k.startswith(f"{prefix}rollouts/")}
        assert tasks and tasks <= set(MULTITASK_GAMES), row
        for t in tasks:
            assert row[f"{prefix}rollouts/{t}"] > 0 and -1.0 <= row[f"{prefix}return/{t}"] <= 1.0
            assert f"{prefix}success/{t}" not in row  # POPGym reports no success
    for row in evals:  # every evaluation rollout counts for its task
        assert sum(v for k, v in row.items() if k.startswith("rollouts/")) == row["rollouts"] == 6
    assert result["return_mean"] == evals[-1]["return_mean"]

    out = run_icrl("eval", run, "--rollouts", "6", "--parallel-envs", "2")
    assert out.returncode == 0, out.stderr
    assert "by task" in out.stdout and "success" not in out.stdout.split("by task")[1]  # POPGym reports none
    ev = json.loads((run / "eval.json").read_text())
    assert len(ev["tasks"]) == 6 and set(ev["tasks"]) <= set(MULTITASK_GAMES)
    for t in set(ev["tasks"]):
        assert ev[f"rollouts/{t}"] == ev["tasks"].count(t) and f"return/{t}" in ev
        table_row = next(line for line in out.stdout.splitlines() if line.strip("│ ").startswith(t))
        cells = [c.strip() for c in table_row.split("│")[1:-1]]  # task, rollouts, return
        assert cells == [t, str(ev[f"rollouts/{t}"]), f"{ev[f'return/{t}']:+.3f}"]
