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
