"""Helpers the test groups share (tests/ is on sys.path: pyproject's `pythonpath`), e.g. `from helpers import
run_icrl`. Fixtures live in the conftest.py files next to the tests that use them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

ROOT = Path(__file__).resolve().parents[1]

# The command line as a user runs it, importing this checkout (and tests/probe_envs.py for hostile envs):
# one OpenMP thread (tiny models on shared cores) and wide help text. Warnings stay on: some tests expect them.
CLI_ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
    "COLUMNS": "200",
}


# `icrl train` flags for a tiny run: 2 epochs of 32 env steps, one update each, an evaluation after each epoch.
TINY = ["--total-env-steps", "64", "--steps-per-epoch", "32", "--parallel-envs", "2", "--updates-per-epoch", "1",
        "--batch-size", "2", "--eval-rollouts", "2", "--eval-every", "1", "--d-model", "16", "--layers", "1",
        "--heads", "2", "--head-hidden", "16", "--max-seq-len", "64"]


def tiny(run_dir=None, env="tmaze", env_kwargs='{"length": 3}', **fields):
    """An ExperimentConfig of two epochs of 32 env steps, one update each, an evaluation of 2 rollouts at the end
    (about a second); `fields` are set on top (`ExperimentConfig.replace`)."""
    from icrl.config import EnvConfig, ExperimentConfig, ModelConfig

    cfg = ExperimentConfig(
        env=EnvConfig(env=env, env_kwargs=env_kwargs, parallel_envs=2),
        model=ModelConfig(d_model=16, layers=1, heads=2, head_hidden=16, max_seq_len=32),
    ).replace(run_dir=None if run_dir is None else str(run_dir), total_env_steps=64, steps_per_epoch=32,
              updates_per_epoch=1, batch_size=2, eval_every=2, eval_rollouts=2, device="cpu", threads=1)
    return cfg.replace(**fields)


def cli(*args: str) -> int:
    """`icrl ARGS` in this process; its exit code (0 when it returns). Errors are in Python words again after."""
    from icrl.cli import main as cli_main
    from icrl.config.errors import speak_cli

    try:
        cli_main(list(args))
    except SystemExit as e:
        return int(e.code or 0)
    finally:
        speak_cli(False)
    return 0


class Combo(gym.Env):
    """A user's env: Tuple observations, MultiDiscrete actions; reward 1 when the action's entries sum to the
    observed id."""

    observation_space = gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.Box(0.0, 1.0, (2,), np.float32)))
    action_space = gym.spaces.MultiDiscrete([2, 3], start=[0, 1])

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.actions = 0, []
        return self._obs(), {}

    def _obs(self):
        return int(self.np_random.integers(3)), np.zeros(2, np.float32)

    def step(self, action):
        assert self.action_space.contains(np.asarray(action)), action
        self.actions.append(np.asarray(action).tolist())
        self.t += 1
        return self._obs(), float(sum(action) % 3 == 0), False, self.t >= 4, {}


def run_icrl(*args: object, cwd: str | Path | None = None, timeout: float = 120,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python -m icrl ARGS` in a fresh process; stdout and stderr captured as text."""
    return subprocess.run([sys.executable, "-m", "icrl", *map(str, args)], cwd=cwd, env=env or CLI_ENV,
                          capture_output=True, text=True, timeout=timeout)


def assert_same(a: Any, b: Any, where: str = "") -> None:
    """Nested tuples / dicts / arrays / object arrays equal in value, dtype and shape (NaN equal to NaN): the
    batched and vector envs against their per-copy envs."""
    if isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
        return
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{where}: keys {list(a)} vs {list(b)}"  # order is no contract
        for k in a:
            assert_same(a[k], b[k], f"{where}/{k}")
        return
    if isinstance(a, np.ndarray) and a.dtype == object:
        assert isinstance(b, np.ndarray) and b.dtype == object and a.shape == b.shape, where
        for i, (x, y) in enumerate(zip(a, b)):
            assert (x is None) == (y is None), f"{where}[{i}]"
            if x is not None:
                assert_same(x, y, f"{where}[{i}]")
        return
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
    np.testing.assert_array_equal(a, b, err_msg=where)


def tiny_run_tasks(env: str, env_kwargs: dict[str, Any], run_dir: Path, tasks: set[str]) -> None:
    """Train a tiny agent on a multi-task env for 96 env steps (2 envs, an evaluation of 4 rollouts after each of 2
    epochs) and check that its metrics rows name only `tasks`: `return/<task>` in every evaluation, whose
    per-task rollouts add up to all of them, and `train/return/<task>` in a train row."""
    import json

    import torch

    import icrl
    from icrl.config import EnvConfig, ExperimentConfig, ModelConfig
    from icrl.run.reporting import read_metrics

    torch.set_num_threads(1)
    cfg = ExperimentConfig(
        env=EnvConfig(env=env, env_kwargs=json.dumps(env_kwargs), parallel_envs=2),
        model=ModelConfig(d_model=16, layers=1, heads=2, head_hidden=16, tstep_hidden=16, max_seq_len=16),
    ).replace(run_dir=str(run_dir), total_env_steps=96, steps_per_epoch=48, updates_per_epoch=1,
              batch_size=2, eval_every=1, eval_rollouts=4, log_every=1, device="cpu", threads=1)
    icrl.train(cfg)
    rows = read_metrics(run_dir / "metrics.jsonl")
    evals = [r for r in rows if r["kind"] == "eval"]
    assert evals and any(r["kind"] == "train" for r in rows)
    for row in evals:
        played = {k.removeprefix("return/") for k in row if k.startswith("return/")}
        assert played and played <= tasks, row
        assert sum(row[f"rollouts/{t}"] for t in played) == row["rollouts"] == 4
    trained = {k.removeprefix("train/return/") for r in rows for k in r if k.startswith("train/return/")}
    assert trained and trained <= tasks


def assert_missing_extra_reported(monkeypatch: Any, capsys: Any, module: str, names: list[str], family: str,
                                  extra: str) -> None:
    """With `module` unimportable, building each env of `names` raises an ImportError naming
    `pip install 'icrl[<extra>]'`, and `icrl envs <family>` exits with that hint in one line."""
    import re

    import pytest

    from icrl.cli import main as cli_main
    from icrl.envs import make_env

    monkeypatch.setitem(sys.modules, module, None)  # `import <module>` now raises ImportError
    for name in names:
        with pytest.raises(ImportError, match=re.escape(f"pip install 'icrl[{extra}]'")):
            make_env(name)
    with pytest.raises(SystemExit):
        cli_main(["envs", family])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"icrl[{extra}]" in err


def explore_config(**fields: Any):
    """An ExploreConfig with `fields` set and every other field resolved as a run resolves it without a task
    (`icrl.config.resolve`: the library's defaults), as `icrl.agent.exploration.Exploration` takes it."""
    from icrl.config import ExperimentConfig, ExploreConfig, resolve

    return resolve(ExperimentConfig(explore=ExploreConfig(**fields))).explore
