"""What `--resume` promises and does: the docs say it is not a bit-exact continuation, a resumed run may get more
budget and keeps its schedule, and checkpoints come by wall time too, so a stopped run says what it can resume."""

import json

import pytest
from helpers import ROOT, Combo, cli, tiny

import icrl


def test_the_docs_say_resume_is_not_a_bit_exact_continuation():
    readme, runs = (ROOT / "README.md").read_text(), (ROOT / "docs/runs.md").read_text()
    for text in (readme, runs):
        assert "not a bit-exact continuation" in text and "counters, ε, RNG, replay" not in text
    section = runs.split("## Checkpoints and resume", 1)[1].split("\n## ", 1)[0]
    for what in ("optimiser", "RNG states", "reseeded", "rollouts written after the checkpoint"):
        assert what in section, what


def test_resume_with_more_budget_keeps_the_runs_schedule(in_tmp, capsys):
    """`--resume --total-env-steps N` gives a run more budget, in Python and on the command line, where the
    exploration schedule derived from the old budget once blocked it; `--resume` alone (no --env) reads the
    run's own config, so only what the flags change differs."""
    cfg = tiny("runs/r", env_kwargs="{}", total_env_steps=64)
    icrl.train(cfg, env=lambda: Combo())
    out = icrl.train(cfg.replace(resume=True, total_env_steps=128), env=lambda: Combo())
    assert out["env_steps"] == 128
    assert "exploration schedule and the warm-up stay the run's" in capsys.readouterr().out
    icrl.train(tiny("runs/b", total_env_steps=64))
    assert cli("train", "--run-dir", "runs/b", "--resume", "--total-env-steps", "128") == 0
    rows = [json.loads(line) for line in (in_tmp / "runs/b/metrics.jsonl").read_text().splitlines()]
    assert max(r["env_steps"] for r in rows) == 128
    saved = json.loads((in_tmp / "runs/b/config.json").read_text())
    assert saved["env"]["env"] == "tmaze" and saved["model"]["d_model"] == 16  # the run's, not the CLI's defaults


def test_checkpoints_come_by_wall_time_too_and_a_stop_says_what_it_left(in_tmp, capsys):
    """A run stopped a minute in can resume (a checkpoint every --checkpoint-seconds, whatever the epochs), and
    the stop message says whether there is a checkpoint to resume from at all."""
    from icrl.cli.errors import run_stoppable
    from icrl.run.checkpoint import list_checkpoints

    icrl.train(tiny("runs/t", total_env_steps=96, checkpoint_every=1000, checkpoint_seconds=1e-6))
    assert [p.name for p in list_checkpoints("runs/t")] == ["ckpt-000001", "ckpt-000002", "ckpt-000003"]

    def interrupted() -> None:
        raise KeyboardInterrupt

    (in_tmp / "runs/new").mkdir()
    for run_dir, said in (("runs/new", "wrote no checkpoint yet"), ("runs/t", "newest: runs/t/checkpoints/ckpt-000003")):
        with pytest.raises(SystemExit) as e:
            run_stoppable(interrupted, log_dir=run_dir)
        assert e.value.code == 130 and said in capsys.readouterr().err
