"""Helpers the test groups share (tests/ is on sys.path: pyproject's `pythonpath`), e.g. `from helpers import
run_icrl`. Fixtures live in the conftest.py files next to the tests that use them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

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
