"""Helpers the test groups share (tests/ is on sys.path: pyproject's `pythonpath`), e.g. `from helpers import
run_icrl`. Fixtures live in the conftest.py files next to the tests that use them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
