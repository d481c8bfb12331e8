"""What `--resume` promises and does: the docs say it is not a bit-exact continuation, a resumed run may get more
budget and keeps its schedule, and checkpoints come by wall time too, so a stopped run says what it can resume."""

import json

import pytest

import icrl

from helpers import ROOT, Combo, cli, tiny


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
    for run_dir, said in (("runs/new", "wrote no checkpoint yet"),
                          ("runs/t", "newest: runs/t/checkpoints/ckpt-000003")):
        with pytest.raises(SystemExit) as e:
            run_stoppable(interrupted, log_dir=run_dir)
        assert e.value.code == 130 and said in capsys.readouterr().err


def _snapshot(folder):
    """Every file under `folder` with its bytes: what "nothing changed" compares."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("edit, field", [
    (lambda c: c["model"].update(d_model=32), "model.d_model"),  # the checkpoints no longer fit the agent
    (lambda c: c["env"].update(env_kwargs='{"length": 4}'), "env.env_kwargs"),  # they fit, but it is another task
    (lambda c: c["loss"].update(tau=0.01), "loss.tau"),  # they fit, the learning rule changed under them
])
def test_a_resumed_run_whose_config_json_was_edited_is_refused_and_left_as_it_was(in_tmp, capsys, edit, field):
    """config.json edited after the run (another width, env or learning rule), then `--resume`: before, the
    checkpoints that no longer fitted were set aside as inconsistent and the run started over, replacing the
    metrics and the final weights, exit 0. Now one line names the field, and the run dir is byte-identical."""
    icrl.train(tiny("runs/r", total_env_steps=64))
    path = in_tmp / "runs/r/config.json"
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config))
    before = _snapshot(in_tmp / "runs/r")
    capsys.readouterr()
    assert cli("train", "--run-dir", "runs/r", "--resume") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err and "another run dir" in err, err
    with pytest.raises(icrl.config.ConfigError, match=field.replace(".", r"\.")):
        icrl.train(icrl.config.ExperimentConfig.from_json(path.read_text()).replace(run_dir="runs/r", resume=True))
    assert _snapshot(in_tmp / "runs/r") == before


def test_a_resume_where_no_checkpoint_fits_is_refused_not_started_over(in_tmp, capsys):
    """Checkpoints that record no config (an older icrl) and no longer fit the agent: refused, nothing set aside."""
    icrl.train(tiny("runs/r", total_env_steps=64))
    run = in_tmp / "runs/r"
    for state in run.glob("checkpoints/*/state.json"):
        record = json.loads(state.read_text())
        record["extra"].pop("config")
        state.write_text(json.dumps(record))
    (run / "spaces.json").unlink()
    config = json.loads((run / "config.json").read_text())
    config["model"]["d_model"] = 32
    (run / "config.json").write_text(json.dumps(config))
    before = _snapshot(run)
    capsys.readouterr()
    assert cli("train", "--run-dir", "runs/r", "--resume") == 2
    err = capsys.readouterr().err
    assert "none of the checkpoints" in err and "nothing was changed" in err, err
    assert not list(run.glob("checkpoints/rejected-*"))
    assert ({k: v for k, v in _snapshot(run).items() if k != ".lock"}
            == {k: v for k, v in before.items() if k != ".lock"})


def test_a_run_resumes_only_with_the_command_that_started_it(in_tmp, capsys):
    """`icrl learn --resume` on a finished `icrl train` run was accepted, reported 0 env steps and wrote async files
    into it; `icrl train --resume` on a run of `icrl learn` would count the collectors' steps as its own. Each is
    refused in one line naming the right command, and the run dir is left as it was."""
    icrl.train(tiny("runs/sync", total_env_steps=64))
    run = in_tmp / "runs/sync"
    before = _snapshot(run)
    capsys.readouterr()
    assert cli("learn", "runs/sync", "--resume") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "resume it as it was started, with `icrl train`" in err, err
    assert not (run / "async").exists() and _snapshot(run) == before
    (run / "async").mkdir()  # what a run of `icrl learn` holds beside its checkpoints
    assert cli("train", "--run-dir", "runs/sync", "--resume") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "icrl learn" in err, err


def test_a_data_parallel_epoch_is_split_exactly_or_refused():
    """Each process takes --steps-per-epoch / processes; a remainder was announced and then dropped."""
    from icrl.config import ConfigError, ExperimentConfig
    from icrl.run.schedule import Plan
    from icrl.run.sources import OwnEnvs

    cfg = ExperimentConfig().replace(steps_per_epoch=1_000, total_env_steps=3_000, parallel_envs=8)
    with pytest.raises(ConfigError, match="does not split evenly over 3 processes: pass a multiple of 3, e.g. 999"):
        OwnEnvs.prepare(cfg, 3)
    assert OwnEnvs.prepare(cfg, 2) is cfg
    plan = Plan.of(cfg, 2)
    assert (plan.steps_per_env, plan.steps_per_epoch, plan.env_steps) == (63, 1_008, 3_024)
    assert "3 epochs x 2 processes x 8 envs x 63 steps = 3,024 env steps (asked 3,000" in plan.line()
