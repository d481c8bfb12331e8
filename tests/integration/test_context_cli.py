"""The context a run resolves, through the command line: presets built for the env kwargs given, and the one-line
notice when rollouts outlast the context."""

from __future__ import annotations

import json
import shutil

from helpers import run_icrl


def test_the_cli_preset_with_env_kwargs_trains_with_a_context_that_holds_the_cue(tmp_path):
    out = run_icrl("train", "--preset", "tmaze", "--env-kwargs", '{"length": 6}', "--total-env-steps", "200",
                   "--eval-rollouts", "2", "--run-dir", tmp_path / "r")
    assert out.returncode == 0, out.stderr
    cfg = json.loads((tmp_path / "r" / "config.json").read_text())
    assert cfg["model"]["max_seq_len"] == 7 and cfg["optim"]["compile"] is False


def test_a_run_says_once_when_rollouts_outlast_the_context(tmp_path):
    out = run_icrl("train", "--env", "tmaze", "--env-kwargs", '{"length": 12}', "--max-seq-len", "5",
                   "--d-model", "8", "--heads", "1", "--layers", "1", "--head-hidden", "8", "--total-env-steps", "256",
                   "--steps-per-epoch", "64", "--updates-per-epoch", "1", "--batch-size", "2", "--eval-rollouts", "1",
                   "--run-dir", tmp_path / "r")
    assert out.returncode == 0, out.stderr
    said = [line for line in (out.stdout + out.stderr).splitlines() if "the context is 5" in line]
    assert len(said) == 1 and "rollouts last 13 steps" in said[0] and "--max-seq-len 13" in said[0]


def test_the_nothing_stored_hint_waits_while_rollouts_can_still_be_filling_the_context(tmp_path):
    """T-Maze 12 (13-step rollouts, context 13) in epochs of 2 steps per env: no rollout can end before
    epoch 7, so epochs 1-3 are not a problem to report; the run's last epoch, with nothing stored, is."""
    out = run_icrl("train", "--env", "tmaze", "--env-kwargs", '{"length": 12}', "--d-model", "8", "--heads", "1",
                   "--layers", "1", "--head-hidden", "8", "--total-env-steps", "64", "--steps-per-epoch", "16",
                   "--eval-rollouts", "1", "--run-dir", tmp_path / "r")
    assert out.returncode == 0, out.stderr
    said = [line for line in " ".join((out.stdout + out.stderr).split()).split("icrl: ")
            if "finished no rollout" in line]
    assert len(said) == 1 and said[0].startswith("epoch 4 finished no rollout"), said


def test_a_resumed_run_counts_the_nothing_stored_hints_steps_from_its_own_start(tmp_path):
    """A resumed run whose replay is gone (deleted to save disk) starts its envs afresh: the hint names the steps
    its envs took since the resume, not the run's whole count, and waits as a new run does."""
    small = ["--env", "tmaze", "--env-kwargs", '{"length": 12}', "--d-model", "8", "--heads", "1", "--layers", "1",
             "--head-hidden", "8", "--steps-per-epoch", "16", "--eval-rollouts", "1", "--run-dir", tmp_path / "r"]
    out = run_icrl("train", *small, "--total-env-steps", "256")
    assert out.returncode == 0, out.stderr
    shutil.rmtree(tmp_path / "r" / "replay")
    out = run_icrl("train", *small, "--total-env-steps", "320", "--resume")
    assert out.returncode == 0, out.stderr
    said = [line for line in " ".join((out.stdout + out.stderr).split()).split("icrl: ")
            if "finished no rollout" in line]
    assert len(said) == 1, said
    assert said[0].startswith("epoch 20 finished no rollout: no episode ended within the 8 steps"), said
