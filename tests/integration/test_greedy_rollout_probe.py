"""benchmarks/greedy_rollout_probe.py end to end on a tiny Meta-Frozen-Lake run: it reads the run's own env from
config.json, plays the asked number of first episodes greedily and accounts for every step and every episode."""

from __future__ import annotations

import json
import subprocess
import sys

from helpers import CLI_ENV, ROOT, TINY


def test_the_probe_plays_the_runs_env_and_counts_every_step(tmp_path):
    run_dir = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "icrl", "train", "--env", "meta_frozen_lake", "--env-kwargs",
                    '{"size": 3, "max_episode_steps": 6}', *TINY, "--device", "cpu", "--run-dir", str(run_dir)],
                   check=True, env=CLI_ENV, cwd=tmp_path, capture_output=True)
    out = tmp_path / "probe.jsonl"
    printed = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "greedy_rollout_probe.py"), str(run_dir),
                              "--episodes", "5", "--out", str(out)],
                             check=True, env=CLI_ENV, cwd=tmp_path, capture_output=True, text=True).stdout
    line = json.loads(printed)
    assert json.loads(out.read_text()) == line
    assert line["episodes"] == 5 and sum(line["ends"].values()) == 5
    assert 5 <= line["steps"] <= 5 * 6  # every episode ends by its time limit
    assert len(line["action_share"]) == 4 and abs(sum(line["action_share"]) - 1) < 1e-2
    assert 0.0 <= line["unchanged_share"] <= 1.0
