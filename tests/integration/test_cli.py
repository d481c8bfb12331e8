import json
import os
import subprocess
import sys

import pytest
from helpers import run_icrl

from icrl.cli import _preset_arg
from icrl.config.presets import PRESETS


def test_preset_arg_forms():
    assert _preset_arg(["--a", "1", "--preset", "tmaze", "--b"]) == ("tmaze", {})
    assert _preset_arg(["--preset=cue_recall"]) == ("cue_recall", {})
    assert _preset_arg(["RUN_DIR", "--seed", "3", "--help"]) == (None, {})


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
        out = run_icrl(*args)
        assert out.returncode == 2 and "Traceback" not in out.stderr and out.stderr.count("\n") == 1


def test_envs_lists_builtin_tasks():
    out = run_icrl("envs")
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


def _max_lead_collect_uses(monkeypatch, cfg, flag):
    """The max_lead `icrl.asynchronous.collect.collect` throttles with, once the learner's config.json is read
    (the config is read after the collector waited for the learner, so a collector started first gets it)."""
    import icrl.asynchronous.collect as collect_module

    used = []

    class OneRound:
        waited, weights = 0.0, type("W", (), {"reloads": 0})()

        def __init__(self, *args):
            self.rounds = 0

        def wants_more(self, stop, max_env_steps):
            self.rounds += 1
            return self.rounds == 1

        def ahead_of_learner(self, max_lead):
            used.append(max_lead)
            return False

        def collect_round(self, stop):
            pass

        def finish(self, stop):
            counters.update(state="done", env_steps=0, stored_rollouts=0)

    counters: dict = {}
    monkeypatch.setattr(collect_module, "wait_for_run", lambda *args: cfg)
    monkeypatch.setattr(collect_module, "read_own_counters", lambda *args: counters)
    monkeypatch.setattr(collect_module, "make_run_envs", lambda *args, **kw: type("V", (), {"close": lambda self: None})())
    monkeypatch.setattr(collect_module, "Collecting", OneRound)
    collect_module.collect(cfg.run.run_dir, 0, max_lead=flag)
    monkeypatch.undo()
    return used[0]


def test_learn_and_collect_take_the_asynchronous_group(tmp_path, monkeypatch):
    """`icrl learn --utd --publish-every` reach `learn` in the config's asynchronous group; `icrl collect`
    passes --max-lead on, and without the flag `collect` takes the run's config.json value."""
    import icrl.asynchronous.collect as collect_module
    import icrl.asynchronous.learn as learn_module
    from icrl.cli import main

    seen: dict = {}
    monkeypatch.setattr(collect_module, "StopFlag", lambda: None)  # no signal handlers in the test process
    monkeypatch.setattr(learn_module, "learn", lambda cfg, **kw: seen.update(learn=kw, cfg=cfg))
    monkeypatch.setattr(collect_module, "collect", lambda run_dir, cid, **kw: seen.update(collect=kw))
    run = tmp_path / "run"
    main(["learn", str(run), "--utd", "0.5", "--publish-every", "3", "--max-lead", "7", "--device", "cpu"])
    a = seen["cfg"].asynchronous
    assert (a.utd, a.publish_every) == (0.5, 3)
    assert seen["cfg"].run.run_dir == str(run) and a.max_lead == 7
    main(["collect", str(run)])
    assert seen["collect"]["max_lead"] is None  # no flag: collect reads the run's value
    main(["collect", str(run), "--max-lead", "2"])
    assert seen["collect"]["max_lead"] == 2
    monkeypatch.undo()
    assert _max_lead_collect_uses(monkeypatch, seen["cfg"], None) == 7  # the run's config.json
    assert _max_lead_collect_uses(monkeypatch, seen["cfg"], 2) == 2  # the flag wins
    monkeypatch.setattr(learn_module, "learn", lambda cfg, **kw: seen.update(learn=kw, cfg=cfg))
    with pytest.raises(SystemExit) as stop:
        main(["learn", str(run), "--publish-every", "0"])
    assert stop.value.code == 2


def test_train_help_lists_the_flags_by_group():
    out = subprocess.run([sys.executable, "-m", "icrl", "train", "--preset", "tmaze", "--help"], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "COLUMNS": "120"})
    assert out.returncode == 0 and not out.stderr, out.stderr
    for group in ("env options", "model options", "loss options", "asynchronous options"):
        assert group in out.stdout
    assert "--d-model INT" in out.stdout and "(default: 32)" in out.stdout  # the preset's value is the default
