"""End to end: `icrl.train` is reproducible from its seed, and the `icrl` command line works.

Tiny runs on the T-Maze: two epochs of 32 env steps, two updates each, a one-layer Transformer.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from icrl import train
from icrl.config import EXPLORE_DEFAULTS, EnvConfig, ExperimentConfig, LossConfig, ModelConfig, resolve
from icrl.config.loss import CATEGORICAL_ENTROPY_COEFF
from icrl.data import list_rollout_files, load_rollout
from icrl.run.build import with_task_defaults
from icrl.run.reporting import read_metrics

from helpers import run_icrl


def tiny_config(run_dir: Path, seed: int) -> ExperimentConfig:
    return ExperimentConfig(
        env=EnvConfig(env="tmaze", env_kwargs='{"length": 4}', parallel_envs=2),
        model=ModelConfig(
            d_model=32, layers=1, heads=2, max_seq_len=16, max_time=64, head_hidden=32, head_layers=1
        ),
        loss=LossConfig(num_critics=2, redq_subset=2),
    ).replace(
        eval_rollouts=2, run_dir=str(run_dir), seed=seed, total_env_steps=64, steps_per_epoch=32, updates_per_epoch=2,
        batch_size=4, warmup_updates=1, lr=1e-3, device="cpu",
        threads=1,  # tiny models: more threads only add contention on a shared CPU
    )


def _rows(run_dir: Path) -> list[dict]:
    rows = read_metrics(run_dir / "metrics.jsonl")
    return [{k: v for k, v in r.items() if k != "wall_time" and not k.startswith("time/")} for r in rows]


def _rollouts(run_dir: Path) -> list[dict[str, np.ndarray]]:
    files = list_rollout_files(run_dir / "replay" / "fifo")  # creation order == write order
    return [load_rollout(f.path).to_arrays() for f in files]


def _same_rollouts(a: list[dict[str, np.ndarray]], b: list[dict[str, np.ndarray]]) -> bool:
    if len(a) != len(b):
        return False
    for ra, rb in zip(a, b):
        if ra.keys() != rb.keys():
            return False
        if not all(ra[k].dtype == rb[k].dtype and np.array_equal(ra[k], rb[k]) for k in ra):
            return False
    return True


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("runs")
    threads = torch.get_num_threads()  # train(threads=1) sets it process-wide; give it back afterwards
    out = {}
    try:
        for name, seed in (("a", 3), ("b", 3), ("c", 4)):
            train(tiny_config(base / name, seed))
            out[name] = base / name
    finally:
        torch.set_num_threads(threads)
    return out


def test_same_seed_same_metrics_and_data(runs):
    rows_a, rows_b = _rows(runs["a"]), _rows(runs["b"])
    assert [r["kind"] for r in rows_a] == ["train", "train", "eval"]
    assert rows_a[-1]["env_steps"] == 64 and rows_a[-1]["updates"] == 4
    assert "train/critic_loss" in rows_a[-2]
    assert rows_a == rows_b
    data_a, data_b = _rollouts(runs["a"]), _rollouts(runs["b"])
    assert len(data_a) > 0
    assert _same_rollouts(data_a, data_b)


def test_different_seed_different_data(runs):
    assert not _same_rollouts(_rollouts(runs["a"]), _rollouts(runs["c"]))
    assert _rows(runs["a"]) != _rows(runs["c"])


def test_run_dir_contents(runs):
    run = runs["a"]
    cfg = ExperimentConfig.from_json((run / "config.json").read_text())
    # config.json records what ran: the config with its exploration resolved (task recommendation, defaults) and,
    # once the envs exist, the entropy bonus of its Discrete actions
    assert cfg == resolve(with_task_defaults(tiny_config(run, 3)), discrete=True)
    assert cfg.loss.entropy_coeff == CATEGORICAL_ENTROPY_COEFF
    assert all(getattr(cfg.explore, f) is not None for f in EXPLORE_DEFAULTS
               if f not in ("shape_horizon", "window_eps"))
    assert (run / "agent.safetensors").stat().st_size > 0
    assert (run / "learning_curve.png").stat().st_size > 0


# ------------------------------------------------------------------------------------------ command line
def test_cli_train_smoke(tmp_path):
    run_dir = tmp_path / "cli_run"
    proc = run_icrl(
            "train",
            "--env", "tmaze",
            "--env-kwargs", '{"length": 3}',
            "--parallel-envs", "2",
            "--total-env-steps", "32",
            "--steps-per-epoch", "16",
            "--updates-per-epoch", "1",
            "--batch-size", "4",
            "--d-model", "32",
            "--layers", "1",
            "--heads", "2",
            "--head-hidden", "32",
            "--head-layers", "1",
            "--max-seq-len", "8",
            "--eval-rollouts", "2",
            "--eval-every", "1",
            "--device", "cpu",
            "--seed", "1",
            "--threads", "1",
            "--run-dir", str(run_dir),
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert any(line.startswith("result") for line in proc.stdout.splitlines()), proc.stdout[-2000:]
    rows = read_metrics(run_dir / "metrics.jsonl")
    evals = [r for r in rows if r["kind"] == "eval"]
    assert len(evals) == 2  # --eval-every 1, two epochs
    for r in evals:
        for key in ("kind", "env_steps", "wall_time", "return_mean", "success_rate"):
            assert key in r, (key, r)
        assert r["return_mean"] is not None and 0.0 <= r["success_rate"] <= 1.0
    assert [r["env_steps"] for r in evals] == [16, 32]
    assert (run_dir / "learning_curve.png").stat().st_size > 0
    assert json.loads((run_dir / "config.json").read_text())["model"]["d_model"] == 32


def _one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_cli_unknown_env_exits_2_with_one_line(tmp_path):
    proc = run_icrl("train", "--env", "nonexistent_env", "--run-dir", str(tmp_path / "r"), cwd=tmp_path)
    line = _one_line_error(proc)
    assert "nonexistent_env" in line


def test_cli_bad_env_kwargs_json_exits_2(tmp_path):
    proc = run_icrl("train", "--env-kwargs", "{length: 3", "--run-dir", str(tmp_path / "r"), cwd=tmp_path)
    line = _one_line_error(proc)
    assert "env-kwargs" in line
    assert not (tmp_path / "r").exists()  # rejected before anything is written
