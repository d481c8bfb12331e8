"""The learning-suite benchmark script runs end to end on a tiny budget and writes its JSON and PNGs."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "learning_suite.py"


def load_script():
    spec = importlib.util.spec_from_file_location("learning_suite", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def test_learning_suite_tiny_budget(tmp_path, capsys):
    suite = load_script()
    out = tmp_path / "results" / "ls"
    argv = ["--suite", "tmaze_lengths", "meta_frozen_lake", "--lengths", "3", "5", "--steps", "64",
            "--seeds", "0", "--threads", "1", "--device", "cpu", "--out", str(out), "--run-root", str(tmp_path / "runs")]  # fmt: skip
    result = suite.main(argv)

    data = json.loads(out.with_name("ls.json").read_text())
    assert data["settings"]["steps"] == 64
    assert set(data["suites"]) == {"tmaze_lengths", "meta_frozen_lake"}
    assert [r["length"] for r in data["suites"]["tmaze_lengths"]["return_vs_length"]] == [3, 5]
    mfl = data["suites"]["meta_frozen_lake"]["success_by_episode"]
    assert isinstance(mfl, list) and len(mfl) == 3
    assert len(data["runs"]) == 3
    for run in data["runs"]:
        for key in (
            "final_return",
            "final_success",
            "best_return",
            "env_steps",
            "wall_time_s",
            "config",
            "curve",
        ):
            assert key in run, key
        assert run["env_steps"] >= 64
        assert run["config"]["schedule"]["total_env_steps"] == 64
        assert Path(run["run_dir"]).parent.parent == tmp_path / "runs"
        assert not (Path(run["run_dir"]) / "replay").exists()
    assert data["runs"][2]["config"]["env"]["episodes_per_rollout"] == 3
    assert data["published_amago"]["popgym_mean"] == 0.63
    for key in ("tmaze_lengths", "meta_frozen_lake", "curves"):
        png = Path(data["plots"][key])
        assert png.is_file() and png.stat().st_size > 1000, png
    assert "popgym_easy" not in data["plots"]
    assert result["markdown"] == data["markdown"]
    printed = capsys.readouterr().out
    assert "64 env steps per run, seeds 0" in printed and "| tmaze_lengths | N3 |" in printed
