"""A run directory may be shared or downloaded, so `icrl train --resume` must not trust what it holds (issue 20):
whatever sits in it (a symlink leading out, a FIFO, a folder, a forged rollout name), nothing outside it is ever
written, truncated or deleted, and a bad replay file is skipped with a warning naming it, or the run stops with
one line naming the path. Each test resumes a copy of one finished tiny run (well under a second each)."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from icrl import train
from icrl.config import ConfigError, EnvConfig, ExperimentConfig, LossConfig, ModelConfig
from icrl.data import load_rollout, save_rollout
from icrl.run.checkpoint import CheckpointError


def tiny(run_dir: Path, total: int) -> ExperimentConfig:
    """T-Maze of length 1 (2-step episodes, 2 envs): 8 env steps and 2 updates an epoch."""
    return ExperimentConfig(
        env=EnvConfig(env="tmaze", env_kwargs='{"length": 1}', parallel_envs=2),
        model=ModelConfig(d_model=16, layers=1, heads=2, max_seq_len=8, max_time=16, head_hidden=16, head_layers=1),
        loss=LossConfig(num_critics=2, redq_subset=2, gammas=(0.9, 0.99)),
    ).replace(run_dir=str(run_dir), seed=3, total_env_steps=total, steps_per_epoch=8, updates_per_epoch=2,
              batch_size=4, warmup_updates=1, device="cpu", threads=1, checkpoint_every=1, eval_rollouts=2)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("finished") / "run"
    train(tiny(run, total=16))
    return run


@pytest.fixture
def run(finished: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(finished, copy, symlinks=True)
    return copy


@pytest.fixture
def deadline():
    """A test that blocks (say, opening a FIFO that no one writes) fails after 60 s instead of hanging."""
    def _expired(signum, frame):
        raise TimeoutError("blocked for 60 s")

    previous = signal.signal(signal.SIGALRM, _expired)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def resume(run: Path, total: int = 24) -> None:
    train(tiny(run, total=total).replace(resume=True))


def snapshot(path: Path) -> dict[str, bytes]:
    """Every file under `path` (or `path` itself) and its bytes: what must not change outside the run."""
    if path.is_file():
        return {".": path.read_bytes()}
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_a_forged_rollout_length_evicts_no_genuine_rollout(run, capfd):
    fifo = run / "replay" / "fifo"
    genuine = sorted(os.listdir(fifo))
    forged = fifo / f"{time.time_ns():020d}-1-deadbeef-T{10**30}.npz"
    shutil.copy(fifo / genuine[-1], forged)
    resume(run)
    kept = set(os.listdir(fifo))
    assert set(genuine) <= kept, f"evicted {len(set(genuine) - kept)} genuine rollouts"
    assert forged.name in kept  # skipped, not deleted: it is not a file icrl wrote
    out = capfd.readouterr().out
    assert f"skipping corrupt rollout file {forged}" in out and "contents 3" in out


def _victim_dir(tmp_path: Path, run: Path, entry: str) -> Path:
    """A folder outside the run holding a copy of the run's `entry` folder: what a symlink there would lead to."""
    victim = tmp_path / "victim"
    shutil.copytree(run / entry, victim)
    return victim


@pytest.mark.parametrize("entry", ["replay", "replay/fifo", "replay/protected", "checkpoints"])
def test_a_folder_symlinked_out_of_the_run_is_refused(run, tmp_path, entry):
    victim = _victim_dir(tmp_path, run, entry)
    before = snapshot(victim)
    shutil.rmtree(run / entry)
    (run / entry).symlink_to(victim)
    with pytest.raises(ValueError, match=re.escape(f"{run / entry} leads outside")):
        resume(run)
    assert snapshot(victim) == before


@pytest.mark.parametrize("name", ["ckpt-000003", "ckpt-000009"])  # the next epoch's, a later one
def test_a_checkpoint_symlinked_out_of_the_run_is_ignored(run, tmp_path, name):
    victim = _victim_dir(tmp_path, run, "checkpoints/ckpt-000002")
    before = snapshot(victim)
    (run / "checkpoints" / name).symlink_to(victim)
    resume(run, total=48)  # writes epochs 3 to 6 and prunes to the last three checkpoints
    assert snapshot(victim) == before
    assert (run / "checkpoints/ckpt-000006").is_dir()


@pytest.mark.parametrize("entry", [".lock", "metrics.jsonl", "learning_curve.png", "config.json", "spaces.json",
                                   "agent.safetensors", "checkpoints/latest"])
def test_a_file_symlinked_out_of_the_run_is_never_written_through(run, tmp_path, entry):
    victim = tmp_path / "victim"
    shutil.copy(run / entry, victim) if (run / entry).exists() else victim.write_text("precious\n")
    before = snapshot(victim)
    (run / entry).unlink(missing_ok=True)
    (run / entry).symlink_to(victim)
    try:
        resume(run)
    except (ValueError, OSError) as e:  # a refusal names the path
        assert str(run / entry) in str(e) and "\n" not in str(e)
    assert snapshot(victim) == before


@pytest.mark.parametrize("kind", ["fifo", "folder"])
@pytest.mark.parametrize("entry", [".lock", "metrics.jsonl"])
def test_a_fifo_or_folder_as_a_run_file_is_refused_in_one_line(run, entry, kind, deadline):
    (run / entry).unlink(missing_ok=True)
    os.mkfifo(run / entry) if kind == "fifo" else (run / entry).mkdir()
    with pytest.raises((ValueError, OSError), match=re.escape(f"{run / entry} is not a regular file")) as e:
        resume(run)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("kind", ["fifo", "folder"])
@pytest.mark.parametrize("entry", ["config.json", "spaces.json", "learning_curve.png", "agent.safetensors",
                                   "checkpoints/latest"])
def test_a_fifo_or_folder_as_a_replaced_file_never_blocks(run, entry, kind, deadline):
    (run / entry).unlink()
    os.mkfifo(run / entry) if kind == "fifo" else (run / entry).mkdir()
    try:
        resume(run)
    except (ValueError, OSError, CheckpointError) as e:  # a folder cannot be replaced by a file: one line naming it
        assert str(run / entry) in str(e) and "\n" not in str(e)
    else:
        assert (run / entry).is_file()


def test_fifos_folders_and_symlinks_named_like_rollouts_are_skipped(run, tmp_path, capfd, deadline):
    fifo = run / "replay" / "fifo"
    outside = tmp_path / "outside.npz"
    shutil.copy(next(fifo.iterdir()), outside)
    stamp = time.time_ns()
    bad = {kind: fifo / f"{stamp + i:020d}-1-0000000{i}-T3.npz"
           for i, kind in enumerate(["fifo", "dir", "loop", "out"])}
    os.mkfifo(bad["fifo"])
    bad["dir"].mkdir()
    bad["loop"].symlink_to(bad["loop"].name)
    bad["out"].symlink_to(outside)
    before = snapshot(outside)
    resume(run, total=48)
    out = capfd.readouterr().out
    for path in bad.values():
        assert os.path.lexists(path) and f"skipping corrupt rollout file {path}" in out
    assert snapshot(outside) == before


def test_a_rollout_of_another_observation_width_is_skipped(run):
    fifo = run / "replay" / "fifo"
    rollout = load_rollout(sorted(fifo.iterdir())[0])
    wide = dataclasses.replace(rollout, obs={"obs": np.zeros((rollout.num_timesteps, 99), np.float32)})
    stamp = time.time_ns()
    for i in range(24):  # most draws land on one: the old code stopped every resume with a broadcast error
        save_rollout(fifo / f"{stamp + i:020d}-1-{i:08x}-T{rollout.num_timesteps}.npz", wide, fsync=False)
    with pytest.warns(RuntimeWarning, match=re.escape(f"{fifo}/") + r".*observations of shapes \{'obs': \(99,\)\}"):
        resume(run)


def test_export_minari_refuses_a_fifo_named_like_a_rollout_in_one_line(run, minari_home, deadline):
    from icrl.data.offline import export_run

    fifo = run / "replay" / "fifo"
    bad = fifo / f"{time.time_ns():020d}-1-0000000f-T3.npz"
    os.mkfifo(bad)
    with pytest.raises(ValueError, match=re.escape(f"corrupt rollout file {bad}: not a regular file")):
        export_run(run, "icrl/safety-v0")


def test_the_cli_refuses_a_symlinked_lock_in_one_line_with_exit_2(run, tmp_path):
    from helpers import run_icrl

    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (run / ".lock").unlink(missing_ok=True)
    (run / ".lock").symlink_to(victim)
    out = run_icrl("train", "--env", "tmaze", "--run-dir", run, "--resume")
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith(f"icrl: error: {run / '.lock'} is not a regular file")
    assert victim.read_text() == "precious\n"


def test_an_interrupted_import_manifest_deletes_only_rollout_files_in_protected(tmp_path):
    import json

    from icrl.data.offline import MANIFEST, _undo_interrupted
    from icrl.data.storage import rollout_file_name

    root = tmp_path / "run" / "replay"
    (root / "protected").mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    moved = root / "protected" / rollout_file_name(3)
    moved.write_bytes(b"")
    (root / MANIFEST).write_text(json.dumps({"source": "x", "status": "moving",
                                             "files": ["../../../victim", moved.name]}))
    _undo_interrupted(root)  # what the next import does first
    assert victim.read_text() == "precious\n" and not moved.exists()


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"files": []}', '{"source": "x", "files": 3}',
                                  "[" * 100_000 + "]" * 100_000, '{"source": "x", "status": "moving", "files": [1]}'])
def test_a_damaged_import_manifest_is_one_line_and_deletes_nothing(tmp_path, text):
    from icrl.data.offline import MANIFEST, _undo_interrupted
    from icrl.data.storage import rollout_file_name

    root = tmp_path / "run" / "replay"
    (root / "protected").mkdir(parents=True)
    genuine = root / "protected" / rollout_file_name(3)
    genuine.write_bytes(b"a rollout")
    (root / MANIFEST).write_text(text)
    if text.endswith("[1]}"):  # a record of the right shape whose names are not rollouts: nothing to undo
        _undo_interrupted(root)
        assert not (root / MANIFEST).exists()
    else:
        with pytest.raises(ConfigError, match=re.escape(f"{root / MANIFEST} is damaged")):
            _undo_interrupted(root)
        assert (root / MANIFEST).read_text() == text
    assert genuine.read_bytes() == b"a rollout"


@pytest.mark.parametrize("entry", ["async", "async/collectors"])
def test_the_asynchronous_folders_may_not_lead_out_of_the_run(tmp_path, entry):
    from icrl.asynchronous.protocol import AsyncPaths

    run, victim = tmp_path / "run", tmp_path / "victim"
    (run / entry).parent.mkdir(parents=True, exist_ok=True)
    victim.mkdir()
    (run / entry).symlink_to(victim)
    with pytest.raises(ValueError, match=re.escape(f"{run / entry} leads outside")):
        AsyncPaths(run).make_collectors_dir()
    assert list(victim.iterdir()) == []


def test_a_run_dir_given_through_a_symlink_resumes(run, tmp_path):
    link = tmp_path / "link"
    link.symlink_to(run)
    before = len(os.listdir(run / "replay" / "fifo"))
    train(tiny(link, total=24).replace(resume=True))
    assert len(os.listdir(run / "replay" / "fifo")) > before and (run / "checkpoints/ckpt-000003").is_dir()
