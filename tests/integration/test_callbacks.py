"""Callbacks passed to `icrl.train` (a user's own hooks, the built-in ones) and `--stop-at-return`: they see
every row and can stop a run, which keeps its checkpoint and final weights."""

import json

import pytest

import icrl

from helpers import Combo, cli, tiny


class Recorder:
    """A user's own logging: no base class, just the hooks it wants."""

    def __init__(self, stop_at_epoch=None):
        self.calls, self.stop_at_epoch = [], stop_at_epoch

    def on_train_start(self, run):
        self.calls.append(("start", str(run.run_dir)))

    def on_epoch_end(self, row):
        self.calls.append(("epoch", row["kind"], row["epoch"]))
        return row["epoch"] == self.stop_at_epoch

    def on_eval(self, row):
        self.calls.append(("eval", row["kind"], row["epoch"]))

    def on_train_end(self, result):
        self.calls.append(("end", result["epoch"]))


def test_callbacks_see_every_row_and_can_stop_the_run(in_tmp):
    rec = Recorder()
    icrl.train(tiny("runs/a"), callbacks=[rec])
    assert rec.calls == [("start", "runs/a"), ("epoch", "train", 1), ("epoch", "train", 2), ("eval", "eval", 2),
                         ("end", 2)]
    stopper = Recorder(stop_at_epoch=1)
    result = icrl.train(tiny("runs/b", total_env_steps=128), callbacks=stopper)  # 4 epochs planned
    assert result["epoch"] == 1 and stopper.calls[-1] == ("end", 1)
    assert (in_tmp / "runs/b/checkpoints/ckpt-000001").is_dir() and (in_tmp / "runs/b/agent.safetensors").is_file()
    with pytest.raises(TypeError, match="none of the hooks"):
        icrl.train(tiny("runs/c"), callbacks=[object()])
    assert not (in_tmp / "runs/c").exists()


def test_stop_at_return_flag_stops_after_n_evaluations_in_a_row(in_tmp):
    args = ["--env", "tmaze", "--env-kwargs", '{"length": 3}', "--parallel-envs", "2", "--total-env-steps", "192",
            "--steps-per-epoch", "32", "--updates-per-epoch", "1", "--batch-size", "2", "--eval-rollouts", "2",
            "--eval-every", "1", "--d-model", "16", "--layers", "1", "--heads", "2", "--max-seq-len", "8"]
    assert cli("train", *args, "--run-dir", "runs/s", "--stop-at-return", "-5", "--stop-patience", "2") == 0
    rows = [json.loads(line) for line in (in_tmp / "runs/s/metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows if r["kind"] == "eval"] == [1, 2]  # 6 epochs planned, stopped after 2
    assert (in_tmp / "runs/s/checkpoints/ckpt-000002").is_dir()


def test_builtin_callbacks(in_tmp):
    from icrl.run.callbacks import CheckpointCallback, EvalCallback, StopTrainingOnRewardThreshold

    stop = StopTrainingOnRewardThreshold(0.5, patience=2)
    assert [stop.on_eval({"return_mean": r}) for r in (0.6, 0.4, 0.6, 0.7)] == [False, False, False, True]
    ev, ck = EvalCallback(n_episodes=2), CheckpointCallback(every=1)
    icrl.train(tiny("runs/e"), callbacks=[ev, ck])
    assert len(ev.results) == 1 and (in_tmp / "runs/e/best_agent.safetensors").is_file()
    assert icrl.load("runs/e/best_agent.safetensors").config.env.env == "tmaze"
    assert sorted(p.name for p in (in_tmp / "runs/e/weights").iterdir()) == [
        "agent-000000032.safetensors", "agent-000000064.safetensors"]
    on_own_env = EvalCallback(n_episodes=2)  # the run's env is a factory of this script: evaluated all the same
    icrl.train(tiny("runs/f", env_kwargs="{}"), env=lambda: Combo(), callbacks=[on_own_env])
    assert len(on_own_env.results) == 1
