"""benchmarks/parity.py runs both libraries at the same settings: the icrl command parsed by icrl's own CLI
against the official command's flags, for every row (and the meta-RL rows' exploration anneal). Nothing is trained."""

import argparse
from pathlib import Path

import pytest

from benchmarks import parity

icrl_config = parity.icrl_config


def official_flags(task: parity.Task) -> dict[str, str]:
    args = argparse.Namespace(amago_venv=Path("venv"), amago_val_interval=1)
    cmd = parity.amago_command(task, 0, args, Path("/tmp/unused"))
    return {a: b for a, b in zip(cmd, cmd[1:]) if a.startswith("--")}


@pytest.mark.parametrize("name", sorted(parity.TASKS))
def test_both_libraries_get_the_same_model_context_envs_and_update_ratio(name):
    task = parity.TASKS[name]
    if task.icrl_env.startswith("popgym/"):
        pytest.importorskip("popgym")
    cfg, flags = icrl_config(task), official_flags(task)
    assert cfg.model.d_model == int(flags["--memory_size"]) == task.d_model
    assert cfg.model.layers == int(flags["--memory_layers"])
    assert cfg.model.max_seq_len == task.context
    assert cfg.env.parallel_envs == int(flags["--parallel_actors"])
    assert cfg.schedule.steps_per_epoch == cfg.env.parallel_envs * int(flags["--timesteps_per_epoch"])
    assert cfg.schedule.updates_per_epoch == int(flags["--batches_per_epoch"])
    assert cfg.optim.batch_size == int(flags["--batch_size"])
    if "--max_seq_len" in flags:
        assert int(flags["--max_seq_len"]) == task.context


@pytest.mark.parametrize("name", [n for n, t in parity.TASKS.items() if t.explore_as_icrl])
def test_meta_rows_explore_alike_see_whole_rollouts_and_evaluate_alike(name):
    task = parity.TASKS[name]
    cfg, flags = icrl_config(task), official_flags(task)
    assert cfg.explore.eps_anneal_steps == int(flags["--eps_anneal"])  # icrl's budget-relative anneal, per env
    assert (cfg.explore.eps_start, cfg.explore.eps_end, cfg.explore.per_env_scale) == (1.0, 0.05, True)
    kw = cfg.env.kwargs  # the context holds the whole rollout: every pull, or every step of every attempt
    rollout = kw["horizon"] if cfg.env.env == "bandit" else cfg.env.episodes_per_rollout * kw["max_episode_steps"]
    assert rollout == task.context
    assert int(flags["--val_steps"]) * cfg.env.parallel_envs >= cfg.eval.eval_rollouts * rollout


def test_success_by_attempt_reads_either_librarys_evaluation():
    assert parity.success_by_episode({"success_by_episode": [0.25, 0.5]}) == [0.25, 0.5]
    official = {"specials": {"Average Episode 1 Success in lake": 0.6, "Average Episode 0 Success in lake": 0.2,
                             "Average Mean Velocity in lake": 3.0}}
    assert parity.success_by_episode(official) == [0.2, 0.6]  # attempt order, other specials ignored
    assert parity.success_by_episode({"return": 1.0}) is None


def test_the_meta_table_shows_whether_the_return_holds_after_its_best():
    def run(lib, seed, returns, last_attempts):
        curve = [{"env_steps": i, "return": x} for i, x in enumerate(returns)]
        curve[-1]["success_by_episode"] = last_attempts
        return {"task": "metafrozenlake", "lib": lib, "seed": seed, "curve": curve,
                "best_return": max(returns), "final_return": returns[-1]}

    assert parity.SMOOTH == 3
    held = run("icrl", 0, [0.0, 1.0, 1.2, 0.8, 1.0, 1.0, 1.0], [0.2, 0.4, 0.4])  # noisy but flat at 1.0
    fell = run("icrl", 1, [1.0, 2.0, 2.0, 2.0, 1.0, 1.0, 1.0], [0.4, 0.6, 1.0])  # a fall from 2 to 1
    table = parity.meta_markdown([held, fell])
    [row] = [line for line in table.splitlines() if line.startswith("| metafrozenlake")]
    assert "| 1.20, 1.00 / 2.00, 1.00 |" in row  # the best single evaluation
    assert "| 1.00, 1.00 / 2.00, 1.00 | 1.00 / 0.50 | 0.30 / 0.50 / 0.70 |" in row
    assert parity.meta_markdown([{**held, "task": "tmaze20"}]) == ""  # not a row that runs its whole budget
