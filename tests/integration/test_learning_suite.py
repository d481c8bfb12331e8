"""benchmarks/learning_suite.py: every case is a command `icrl train` accepts, the meta-RL rows are the parity
harness's icrl runs, "solved" and "fell" follow their rules, and one tiny case runs end to end into the table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import learning_suite as suite
from benchmarks import parity


def config_of(case: suite.Case):
    from icrl.cli import parse
    from icrl.run.build import with_task_defaults

    cmd = case.command(0, Path("unused"))
    return with_task_defaults(parse(cmd[cmd.index("train"):]).config).validate(check_device=False)


@pytest.mark.parametrize("name", sorted(suite.CASES))
def test_every_case_is_a_valid_command_with_its_budget_and_seed(name):
    case = suite.CASES[name]
    if "popgym/" in " ".join(case.args):
        pytest.importorskip("popgym")
    cfg = config_of(case)
    assert cfg.schedule.total_env_steps == case.budget
    assert (cfg.run.seed, cfg.run.threads, cfg.run.device) == (0, 1, "cpu")
    if case.target is not None:
        assert case.target <= case.budget  # the budget can show whether the target was met


@pytest.mark.parametrize("name", ["bandit", "meta_frozen_lake"])
def test_meta_rows_train_what_the_parity_harness_trains(name):
    case = suite.CASES[name]
    ours = config_of(case)
    cmd = parity.icrl_command(parity.TASKS[case.parity], 0, Path("unused"), 1)
    from icrl.cli import parse
    from icrl.run.build import with_task_defaults

    theirs = with_task_defaults(parse(cmd[cmd.index("train"):]).config).validate(check_device=False)
    same = ("env", "model", "loss", "explore", "optim")
    assert [getattr(ours, g) for g in same] == [getattr(theirs, g) for g in same]
    assert ours.schedule.steps_per_epoch == theirs.schedule.steps_per_epoch
    assert ours.schedule.updates_per_epoch == theirs.schedule.updates_per_epoch


def curve(values, step=1000):
    return [{"env_steps": step * (i + 1), "updates": 10 * (i + 1), "wall_s": 5.0 * (i + 1), "eval_s": 1.0 * (i + 1),
             "return": v, "success": v} for i, v in enumerate(values)]


def test_solved_is_the_first_of_two_evaluations_in_a_row_and_a_fall_is_counted_after_it():
    case = suite.Case("c", "memory", (), 10_000, 0.95)
    s = suite.summarize_curve(case, curve([0.5, 0.96, 0.5, 0.97, 1.0, 0.9, 0.79, 1.0]))
    assert s["solved_env_steps"] == 4000 and s["solved_updates"] == 40
    assert s["solved_wall_s"] == pytest.approx(20.0 - 4.0)  # evaluation left out
    assert s["min_after"] == pytest.approx(0.79) and s["fell"] is True  # 0.79 < 0.95 - 0.15
    assert (s["best"], s["last"], s["evaluations"]) == (1.0, 1.0, 8)
    held = suite.summarize_curve(case, curve([0.96, 0.97, 0.81]))
    assert held["solved_env_steps"] == 1000 and held["fell"] is False
    never = suite.summarize_curve(case, curve([0.1, 0.96, 0.2]))
    assert never["solved_env_steps"] is None and never["fell"] is None and never["best"] == 0.96
    falls = [0.5, 0.96, 0.5, 0.97, 1.0, 0.7, 0.79, 1.0, 0.3]  # solved at 4,000; 0.7, 0.79 and 0.3 fall after it
    run = {**suite.summarize_curve(case, curve(falls)), "curve": curve(falls)}
    assert suite.falls_after_solving(case, run) == 3
    assert suite.falls_after_solving(case, {**never, "curve": curve([0.1, 0.96, 0.2])}) is None


def test_negative_thresholds_and_the_success_metric():
    pendulum = suite.Case("p", "control", (), 20_000, -200.0)
    s = suite.summarize_curve(pendulum, curve([-900, -190, -180, -240]))
    assert s["solved_env_steps"] == 2000 and s["fell"] is True  # -240 < -200 - 0.15 x 200
    goal = suite.Case("g", "goal", (), 12_000, 0.95, metric="success")
    rows = [{**r, "return": 0.0} for r in curve([0.5, 0.95, 0.96])]  # returns low, successes high
    assert suite.summarize_curve(goal, rows)["solved_env_steps"] == 2000


def test_a_tiny_case_runs_into_the_stored_runs_table_and_plot(tmp_path, monkeypatch, capsys):
    tiny = suite.Case("tiny", "memory", ("--env", "tmaze", "--env-kwargs", '{"length": 3}', "--steps-per-epoch", "80",
                                         "--eval-every", "1", "--eval-rollouts", "8"), 240, 0.95, target=240)
    monkeypatch.setattr(suite, "CASES", {"tiny": tiny})
    monkeypatch.setattr(suite, "OUT", tmp_path / "out")
    monkeypatch.setattr(suite, "RUN_ROOT", tmp_path / "runs")
    suite.main(["--cases", "tiny", "--seeds", "0"])
    record = json.loads((tmp_path / "out" / "runs" / "tiny_s0.json").read_text())
    assert record["case"] == "tiny" and record["seed"] == 0 and record["budget"] == 240
    assert len(record["curve"]) == 3 and record["curve"][-1]["env_steps"] == 240
    assert record["command"].startswith("icrl train --env tmaze") and "--seed 0" in record["command"]
    assert not (tmp_path / "runs" / "tiny_s0" / "run" / "replay").exists()
    table = (tmp_path / "out" / "learning_suite.md").read_text()
    assert "| tiny | defaults | return 0.95 | 0 |" in table
    assert (tmp_path / "out" / "learning_suite.png").stat().st_size > 1000
    assert json.loads((tmp_path / "out" / "learning_suite.json").read_text())["runs"][0]["case"] == "tiny"
    # a stored run is not run again; --report rebuilds from it
    mtime = (tmp_path / "out" / "runs" / "tiny_s0.json").stat().st_mtime
    suite.main(["--cases", "tiny", "--seeds", "0"])
    assert (tmp_path / "out" / "runs" / "tiny_s0.json").stat().st_mtime == mtime
    capsys.readouterr()
    suite.main(["--report"])
    assert "| tiny |" in capsys.readouterr().out


def test_unknown_cases_are_refused_in_one_line(capsys):
    with pytest.raises(SystemExit):
        suite.main(["--cases", "tmaze100", "nope"])
    assert "unknown case(s) nope" in capsys.readouterr().err


def test_a_variant_runs_apart_from_the_defaults_with_its_flags_kept(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(suite, "OUT", tmp_path / "learning_suite")
    suite.main(["--variant", "tau01", "--flags", "--tau 0.01", "--list", "--cases", "tmaze20"])
    assert capsys.readouterr().out.rstrip().endswith("--run-dir RUN_DIR --tau 0.01")  # last: it overrides the case
    assert (tmp_path / "learning_suite/variants/tau01/flags.txt").read_text() == "--tau 0.01\n"
    monkeypatch.setattr(suite, "OUT", tmp_path / "learning_suite")
    suite.main(["--variant", "tau01", "--list", "--cases", "tmaze20"])  # the variant's own flags, read back
    assert "--tau 0.01" in capsys.readouterr().out
    for argv in (["--variant", "tau01", "--flags", "--tau 0.02"], ["--flags", "--tau 0.02"], ["--variant", "../x"]):
        monkeypatch.setattr(suite, "OUT", tmp_path / "learning_suite")
        with pytest.raises(SystemExit):
            suite.main([*argv, "--list"])
    assert (tmp_path / "learning_suite/variants/tau01/flags.txt").read_text() == "--tau 0.01\n"


def test_the_held_out_meta_rl_env_is_a_plain_gymnasium_env_on_a_known_scale():
    """benchmarks/heldout_envs.GaussianArms, as a user writes an env (nothing from icrl): Gymnasium's checker passes,
    icrl builds it by its `module:factory` name, the hidden means are redrawn per reset, and its reference returns
    are where its docstring puts them (random ~0, always the best arm ~33.9 for 3 arms x 40 pulls)."""
    import numpy as np
    from gymnasium.utils.env_checker import check_env

    from benchmarks.heldout_envs import GaussianArms
    from icrl.envs.user import resolve_env

    env = GaussianArms()
    check_env(env, skip_render_check=True)
    assert resolve_env("benchmarks.heldout_envs:GaussianArms").name == "benchmarks.heldout_envs:GaussianArms"
    rng, best, random, means = np.random.default_rng(0), [], [], set()
    for seed in range(400):
        for returns, pick in ((best, None), (random, "random")):
            env.reset(seed=seed)
            means.add(tuple(env.means.round(6)))
            arm, total, info = int(np.argmax(env.means)), 0.0, {}
            for _ in range(env.horizon):
                _, r, done, _, info = env.step(rng.integers(env.arms) if pick else arm)
                total += r
            returns.append(total)
        assert info["success"] in (0.0, 1.0)
    assert len(means) == 400 and abs(np.mean(random)) < 5.0 and 31.0 < np.mean(best) < 37.0  # std of a mean ~1.2
    with pytest.raises(ValueError, match="arms >= 2"):
        GaussianArms(arms=1)


def test_every_committed_variant_records_flags_the_suite_can_rerun():
    """`--variant NAME` with no --flags reruns NAME's cases with the flags in its flags.txt: every committed one must
    parse as shell words and make a valid command with them (prose there once broke a rerun)."""
    import shlex

    from icrl.cli import parse

    recorded = sorted((suite.OUT / "variants").glob("*/flags.txt"))
    assert recorded
    for said in recorded:
        flags = tuple(shlex.split(said.read_text()))
        cmd = suite.CASES["tmaze20"].command(0, Path("unused"), flags)
        parse(cmd[cmd.index("train"):]).config.validate(check_device=False)
