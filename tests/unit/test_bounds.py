"""Bounded work (issue 20): every size and count of a config has an upper bound, or a one-line refusal
before anything is allocated (an estimate of the memory one update needs, against the machine's)."""

from __future__ import annotations

import json

import pytest

from icrl.cli import main
from icrl.config import ConfigError, ExperimentConfig

HUGE = 10**12


def refused(argv: list[str], capsys) -> str:
    """Run the CLI in-process; it must exit 2 with one line on stderr, which is returned."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("icrl: error: "), err
    return err


@pytest.mark.parametrize("name", ["batch_size", "d_model", "d_ff", "head_hidden", "max_seq_len", "num_critics",
                                  "tstep_hidden"])
def test_a_size_that_cannot_fit_in_memory_is_refused_with_the_estimate(name):
    cfg = ExperimentConfig().replace(**{name: HUGE})
    with pytest.raises(ConfigError, match="GiB of memory.*more than this machine's"):
        cfg.validate()


@pytest.mark.parametrize("flag", ["--batch-size", "--eval-rollouts", "--layers", "--head-layers", "--n-step",
                                  "--num-workers", "--eval-max-steps", "--d-model", "--d-ff", "--head-hidden",
                                  "--max-seq-len", "--num-critics", "--updates-per-epoch", "--replay-ratio"])
def test_the_cli_refuses_every_unbounded_size_in_one_line(flag, capsys, tmp_path):
    err = refused(["train", flag, str(HUGE), "--run-dir", str(tmp_path / "r")], capsys)
    assert flag in err or "GiB" in err
    assert not (tmp_path / "r").exists()


def test_memory_error_compares_against_the_memory_given():
    from icrl.config.validation import memory_error

    cfg = ExperimentConfig()
    assert memory_error(cfg, available=2**40) is None
    assert "lower batch_size" in memory_error(cfg.replace(batch_size=10**6), available=2**30)


def test_loading_a_run_whose_config_json_is_too_wide_is_refused(tmp_path):
    import icrl
    from icrl.run.load import RunDirError

    raw = json.loads(ExperimentConfig().to_json())
    raw["model"]["d_model"] = 10**7
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(RunDirError, match="config.json.*GiB of memory"):
        icrl.load(tmp_path)


def test_a_sigterm_while_the_command_imports_stops_it_in_one_line(monkeypatch, capsys):
    import os
    import signal
    import time

    from icrl.cli import commands

    def importing(self):  # a SIGTERM arriving while `icrl train` imports torch and the envs
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)

    monkeypatch.setattr(commands.Train, "run", importing)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as e:
        main(["train", "--env", "tmaze"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 143 and err == "icrl: train stopped by SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize("name", ["parallel_envs", "goal_dim", "num_value_samples", "threads", "eval_rollouts",
                                  "eval_max_steps", "layers", "head_layers", "num_workers", "n_step"])
def test_counts_that_cost_time_or_processes_have_an_upper_bound(name):
    extra = {"steps_per_epoch": HUGE, "total_env_steps": HUGE} if name == "parallel_envs" else {}
    with pytest.raises(ConfigError, match=name + " (must be in|.* must be below)"):
        ExperimentConfig().replace(**{name: HUGE}, **extra).validate(check_device=False)


@pytest.mark.parametrize("flag", ["--rollouts", "--parallel-envs", "--video"])
def test_icrl_eval_bounds_its_counts_before_reading_the_run(flag, capsys, tmp_path):
    err = refused(["eval", str(tmp_path), flag, str(HUGE)], capsys)
    assert f"{flag} must be <=" in err
