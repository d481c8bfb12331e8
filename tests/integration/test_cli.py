import json
import subprocess
import sys

import pytest

from icrl.cli import _preset_arg
from icrl.config.presets import PRESETS


def test_preset_arg_forms():
    assert _preset_arg(["--a", "1", "--preset", "tmaze", "--b"]) == "tmaze"
    assert _preset_arg(["--preset=cue_recall"]) == "cue_recall"
    assert _preset_arg(["RUN_DIR", "--seed", "3", "--help"]) is None


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_are_valid_configs(name):
    cfg = PRESETS[name]().validate()
    assert json.loads(cfg.to_json())["env"]["env"]


def test_preset_with_flags_on_top(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "icrl", "train", "--preset", "tmaze", "--env-kwargs", '{"length": 3}',
         "--total-env-steps", "32", "--steps-per-epoch", "16", "--parallel-envs", "2", "--updates-per-epoch", "1",
         "--eval-rollouts", "2", "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())
    assert cfg["env"]["env_kwargs"] == '{"length": 3}' and cfg["model"]["d_model"] == 32  # preset kept, flag applied
    assert cfg["schedule"]["total_env_steps"] == 32


def test_unknown_preset_and_command_exit_2():
    for args in (["train", "--preset", "nope"], ["frobnicate"]):
        out = subprocess.run([sys.executable, "-m", "icrl", *args], capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and "Traceback" not in out.stderr and out.stderr.count("\n") == 1


def test_envs_lists_builtin_tasks():
    out = subprocess.run([sys.executable, "-m", "icrl", "envs"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "tmaze" in out.stdout and "cue_recall" in out.stdout


def test_wandb_backend_logs_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is an optional back-end (pip install wandb)")
    from icrl.run.loggers import make_loggers

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    log = make_loggers(tmp_path, ("wandb",), {"seed": 0})
    log.write({"kind": "train", "env_steps": 10, "train/loss": 1.5})
    log.write({"kind": "eval", "env_steps": 10, "return_mean": 0.5})
    log.close()
    assert list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 2
