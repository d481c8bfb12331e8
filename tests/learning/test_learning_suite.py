"""The learning-suite benchmark script runs end to end on a tiny budget and writes its JSON and PNGs."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

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
    # the suite summaries are aggregates of the runs listed (one seed: the run's own numbers)
    by_name = {r["name"]: r for r in data["runs"]}
    for row in data["suites"]["tmaze_lengths"]["return_vs_length"]:
        run = by_name[f"N{row['length']}"]
        assert row["final_return"] == run["final_return"] and row["best_return"] == run["best_return"]
        assert row["seeds"] == 1
    assert mfl == by_name["meta_frozen_lake"]["success_by_episode"]
    for run in data["runs"]:  # best_return is the best evaluation on the run's curve
        returns = [c["return_mean"] for c in run["curve"]]
        assert run["best_return"] == (max(returns) if returns else run["final_return"])
    assert set(suite.SUITES) <= set(data["published_amago"])  # every suite's published number is quoted
    for key in ("tmaze_lengths", "meta_frozen_lake", "curves"):
        png = Path(data["plots"][key])
        assert png.is_file() and png.stat().st_size > 1000, png
    assert "popgym_easy" not in data["plots"]
    assert result["markdown"] == data["markdown"]
    printed = capsys.readouterr().out
    assert "64 env steps per run, seeds 0" in printed and "| tmaze_lengths | N3 |" in printed


@pytest.mark.parametrize("steps", [64, 20_000])
def test_every_suite_config_is_valid_under_its_budget(tmp_path, steps):
    """The config builders of every suite give valid configs, and `with_budget` does what its docstring
    says: the run trains for the budget, keeps the suite's updates per env step and spreads about
    EVALS_PER_RUN evaluations over it."""
    suite = load_script()
    args = suite.build_parser().parse_args(["--lengths", "3", "50"])
    for name in suite.SUITES:
        if name == "popgym_easy" and not suite.popgym_easy_names():
            continue  # popgym not installed
        runs = suite.suite_runs(name, args)
        assert runs
        for run_name, _, base in runs:
            run_dir = tmp_path / run_name
            cfg = suite.with_budget(base, steps=steps, seed=3, run_dir=run_dir, threads=1, device="cpu")
            cfg.validate(check_device=False)
            r, t, b = cfg.run, cfg.schedule, base.schedule
            assert (r.seed, r.run_dir, r.threads, r.device, r.resume) == (3, str(run_dir), 1, "cpu", False)
            assert t.total_env_steps >= steps and t.steps_per_epoch <= max(steps, cfg.env.parallel_envs)
            if b.updates_per_epoch:
                ratio = b.updates_per_epoch / b.steps_per_epoch
                assert abs(t.updates_per_epoch / t.steps_per_epoch - ratio) <= 0.5 / t.steps_per_epoch
            epochs = t.total_env_steps // t.steps_per_epoch
            evals = epochs // cfg.eval.eval_every
            if epochs < suite.EVALS_PER_RUN:
                assert evals == epochs
            else:
                assert suite.EVALS_PER_RUN <= evals < 2 * suite.EVALS_PER_RUN
            same = ("env", "model", "loss", "explore", "optim")  # the suite's own settings, untouched
            assert [getattr(cfg, g) for g in same] == [getattr(base, g) for g in same]


def _run(suite: str, name: str, seed: int, final: float, best: float, **about) -> dict:
    return {"suite": suite, "name": name, "seed": seed, "final_return": final, "final_success": final / 2,
            "best_return": best, "env_steps": 100 * (seed + 1), "wall_time_s": 1.0 + seed, **about}


def test_aggregate_means_over_seeds():
    """The per-suite numbers of the JSON: means over seeds per run name, T-Maze rows in length order,
    Meta-Frozen-Lake's curve averaged episode by episode, POPGym's mean and median over tasks."""
    suite = load_script()
    runs = [
        _run("tmaze_lengths", "N50", 0, 0.2, 0.5, length=50),
        _run("tmaze_lengths", "N50", 1, 0.6, 0.7, length=50),
        _run("tmaze_lengths", "N3", 0, 1.0, 1.0, length=3),
    ]
    out = suite.aggregate("tmaze_lengths", runs)
    per = out["per_run_name"]["N50"]
    assert per["final_return"] == pytest.approx(0.4) and per["best_return"] == pytest.approx(0.6)
    assert per["final_success"] == pytest.approx(0.2) and per["env_steps"] == 150 and per["seeds"] == 2
    assert [(r["length"], r["seeds"]) for r in out["return_vs_length"]] == [(3, 1), (50, 2)]
    assert out["return_vs_length"][1]["final_return"] == pytest.approx(0.4)

    curves = [[0.0, 0.5, 1.0], [0.2, 0.3, 0.4, 0.9]]
    mfl = [
        {**_run("meta_frozen_lake", "meta_frozen_lake", k, 0.0, 0.0), "success_by_episode": c,
         "return_by_episode": c}
        for k, c in enumerate(curves)
    ]
    out = suite.aggregate("meta_frozen_lake", mfl)
    assert out["success_by_episode"] == pytest.approx([0.1, 0.4, 0.7])  # the episodes every seed has
    assert out["success_by_episode_per_seed"] == curves

    pop = [_run("popgym_easy", n, 0, f, f) for n, f in (("A", 0.1), ("B", 0.2), ("C", 0.9))]
    out = suite.aggregate("popgym_easy", pop)
    assert out["tasks"] == 3
    assert out["mean_final_return"] == pytest.approx(0.4) and out["median_final_return"] == pytest.approx(0.2)
