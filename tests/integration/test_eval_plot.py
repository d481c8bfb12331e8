"""`icrl eval` and `icrl.evaluate`, `icrl plot`, `icrl.run.load.load_agent` and the logging back-ends, on tiny
real runs."""

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import icrl
import icrl.agent.model
from icrl.agent.model import Agent, AgentPolicy
from icrl.config.presets import tmaze
from icrl.envs import Collector, make_vector_env
from icrl.run.load import load_agent
from icrl.run.reporting import BackendUnavailable, JsonlLogger, Logger, make_loggers, read_metrics, scalars
from icrl.types import ActionSpec

from helpers import cli, run_icrl, tiny


def tmaze_config(run_dir, seed=0, episodes_per_rollout=1):
    c = tmaze(length=3)
    return dataclasses.replace(
        c,
        env=dataclasses.replace(c.env, parallel_envs=2, episodes_per_rollout=episodes_per_rollout),
        model=dataclasses.replace(c.model, d_model=16, layers=1, heads=2, head_hidden=16, max_seq_len=32),
    ).replace(run_dir=str(run_dir), seed=seed, total_env_steps=64, steps_per_epoch=32, updates_per_epoch=1,
              batch_size=2, eval_every=1, eval_rollouts=2, log_every=1, device="cpu", threads=1)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three tiny runs: seeds 0 and 1 of one config, and a 3-episode (meta-RL) variant; keeps the agents."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("runs")
    agents = []

    class Recording(Agent):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            agents.append(self)

    mp = pytest.MonkeyPatch()
    mp.setattr(icrl.agent.model, "Agent", Recording)  # the one place agents are built
    try:
        out = {}
        for name, seed, k in (("s0", 0, 1), ("s1", 1, 1), ("meta", 0, 3)):
            icrl.train(tmaze_config(root / name, seed=seed, episodes_per_rollout=k))
            out[name] = root / name
    finally:
        mp.undo()
    out["agent_s0"] = agents[0]
    return out


def listing(d: Path) -> dict[str, float]:
    return {str(p.relative_to(d)): p.stat().st_mtime_ns for p in sorted(d.rglob("*"))}


def test_eval_prints_table_and_writes_json(runs):
    out = run_icrl("eval", runs["meta"], "--rollouts", "4", "--seed", "3", "--parallel-envs", "2")
    assert out.returncode == 0, out.stderr
    assert "return (mean ± std over rollouts)" in out.stdout and "success rate" in out.stdout
    assert "adaptation curve" in out.stdout  # 3 episodes per rollout
    result = json.loads((runs["meta"] / "eval.json").read_text())
    for key in ("return_mean", "return_std", "success_rate", "rollouts", "episode_length_mean", "weights", "seed",
                "return_by_episode", "success_by_episode"):
        assert key in result, key
    assert result["rollouts"] == 4 and result["seed"] == 3 and len(result["return_by_episode"]) == 3
    assert not list(runs["meta"].glob(".eval.json.*"))  # no temp file left behind


def test_eval_explicit_checkpoint_and_final_weights(runs):
    run = runs["s0"]
    ckpts = sorted(p for p in (run / "checkpoints").iterdir() if p.is_dir()) if (run / "checkpoints").is_dir() else []
    targets = [run / "agent.safetensors"] + ([ckpts[-1], ckpts[-1].name] if ckpts else [])
    for target in targets:
        out = run_icrl("eval", run, "--checkpoint", target, "--rollouts", "2")
        assert out.returncode == 0, out.stderr
        assert json.loads((run / "eval.json").read_text())["rollouts"] == 2


def test_load_agent_matches_trained_agent(runs):
    trained = runs["agent_s0"]
    loaded, cfg = load_agent(runs["s0"], checkpoint=runs["s0"] / "agent.safetensors")
    assert cfg.run.seed == 0 and cfg.env.env == "tmaze"
    a, b = trained.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    default, _ = load_agent(runs["s0"])  # latest checkpoint (or final weights): the same weights after training
    assert all(torch.equal(a[k], default.state_dict()[k]) for k in a)

    actions = []
    for agent in (trained, loaded):
        venv = make_vector_env("tmaze", {"length": 3}, 2)
        collector = Collector(venv, ActionSpec.from_space(venv.single_action_space), seed=7)
        rollouts, _ = collector.collect_rollouts(AgentPolicy(agent, 2, greedy=True), 4, seed=7)
        venv.close()
        actions.append(np.concatenate([r.action for r in rollouts]))
    np.testing.assert_array_equal(actions[0], actions[1])


def test_plot_one_run_and_grouped_seeds(runs, tmp_path):
    out = run_icrl("plot", runs["s0"], "--out", tmp_path / "one.png")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "one.png").stat().st_size > 1000
    assert not (tmp_path / "one_adaptation.png").exists()  # single-episode task: no adaptation curve

    out = run_icrl("plot", runs["s0"], runs["s1"], runs["meta"], "--out", tmp_path / "all.png", "--x", "wall_time")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "all.png").stat().st_size > 1000
    assert (tmp_path / "all_adaptation.png").stat().st_size > 1000

    from icrl.run.artifacts import group_runs

    groups = group_runs([runs["s0"], runs["s1"], runs["meta"]])
    assert [len(d) for _, d in groups] == [2, 1]  # the two seeds are one group
    assert "episodes_per_rollout=1" in groups[0][0] and "2 seeds" in groups[0][0]


def test_error_paths_exit_2_with_one_line(runs, tmp_path):
    no_config = tmp_path / "no_config"
    no_config.mkdir()
    shutil.copy(runs["s0"] / "metrics.jsonl", no_config)
    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    shutil.copy(runs["s0"] / "config.json", no_weights)
    empty_ckpt = tmp_path / "empty_ckpt"
    empty_ckpt.mkdir()
    cases = [
        ("eval", tmp_path / "missing"),
        ("eval", no_config),
        ("eval", no_weights),
        ("eval", runs["s1"], "--checkpoint", tmp_path / "nope"),
        ("eval", runs["s1"], "--checkpoint", empty_ckpt),
        ("eval", runs["s1"], "--checkpoint", runs["s1"] / "config.json"),  # not a safetensors file
        ("eval", runs["s1"], "--rollouts", "zero"),
        ("eval", runs["s1"], "--device", "nodevice"),
        ("plot", no_weights),  # no metrics.jsonl
        ("plot", runs["s1"], "--x", "epochs"),
    ]
    before = {d: listing(d) for d in (no_config, no_weights, runs["s1"])}
    for args in cases:
        out = run_icrl(*args)
        assert out.returncode == 2, (args, out.stderr)
        assert out.stderr.startswith("icrl: error: ") and out.stderr.count("\n") == 1, (args, out.stderr)
        assert "Traceback" not in out.stderr
    assert before == {d: listing(d) for d in before}  # nothing written into any run dir


def test_jsonl_logger_round_trips(tmp_path):
    rows = [
        {"kind": "train", "epoch": 1, "env_steps": 32, "train/return_mean": -1.0, "time/update_s": 0.5,
         "train/nan": float("nan")},
        {"kind": "eval", "epoch": 1, "env_steps": 32, "return_mean": 0.5, "success_rate": None,
         "return_by_episode": [0.1, 0.2]},
    ]
    log = make_loggers(tmp_path, ("jsonl",), {"seed": 0})
    assert isinstance(log, Logger) and isinstance(log.loggers[0], JsonlLogger)
    for row in rows:
        log.write(row)
    log.close()
    back = read_metrics(tmp_path / "metrics.jsonl")
    assert back[0]["train/nan"] is None  # non-finite -> null
    assert back[1] == rows[1] and {k: v for k, v in back[0].items() if k != "train/nan"} == {
        k: v for k, v in rows[0].items() if k != "train/nan"}
    s = scalars(rows[1])
    assert s == {"eval/epoch": 1.0, "eval/return_mean": 0.5, "eval/return_by_episode/1": 0.1,
                 "eval/return_by_episode/2": 0.2}
    assert set(scalars(rows[0])) == {"train/epoch", "train/return_mean", "time/update_s"}


def test_missing_backends_name_pip_install(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("tensorboard", "wandb")
                        else real(name, *a))
    for backend in ("tensorboard", "wandb"):
        with pytest.raises(BackendUnavailable, match=f"pip install {backend}"):
            make_loggers(tmp_path / backend, ("jsonl", backend))
        assert not (tmp_path / backend).exists()  # checked before any file is created
    with pytest.raises(ValueError, match="unknown logging back-end"):
        make_loggers(tmp_path, ("csv",))


def test_tensorboard_logger(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is optional: pip install tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = make_loggers(tmp_path, ("jsonl", "tensorboard"), {"train": {"seed": 0}})
    log.write({"kind": "train", "env_steps": 32, "train/critic_loss": 1.5, "time/update_s": 0.1})
    log.write({"kind": "eval", "env_steps": 64, "return_mean": 0.25, "success_rate": 1.0})
    log.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/critic_loss", "time/update_s", "eval/return_mean", "eval/success_rate"} <= tags
    (event,) = acc.Scalars("eval/return_mean")
    assert event.step == 64 and event.value == pytest.approx(0.25)
    assert len(read_metrics(tmp_path / "metrics.jsonl")) == 2


def test_plot_leaves_out_rows_whose_numbers_are_not_numbers(tmp_path):
    """A hand-edited or foreign metrics row (strings where numbers belong) is left out, not a traceback."""
    from icrl.run.artifacts import plot_learning_curves

    run = tmp_path / "run"
    run.mkdir()
    rows = [{"kind": "eval", "epoch": 1, "env_steps": 100, "wall_time": 1.0, "return_mean": 0.5},
            {"kind": "eval", "epoch": "two", "env_steps": "x", "wall_time": 2.0, "return_mean": "high"},
            {"kind": "eval", "epoch": 3, "env_steps": 300, "wall_time": 3.0, "return_mean": 0.9}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\\n" for r in rows))
    assert plot_learning_curves([run], tmp_path / "out.png").is_file()


def test_evaluate_a_loaded_policy_agrees_with_icrl_eval(in_tmp, capsys):
    icrl.train(tiny("runs/t"))
    policy = icrl.load("runs/t")
    result = icrl.evaluate(policy, n_episodes=4, seed=3)  # the run's own env
    assert result["rollouts"] == 4 and len(result["returns"]) == 4 and len(result["successes"]) == 4
    assert result["return_mean"] == pytest.approx(sum(result["returns"]) / 4)
    assert result["success_rate"] is not None and result["return_std"] >= 0
    assert cli("eval", "runs/t", "--rollouts", "4", "--seed", "3") == 0
    on_cli = json.loads((in_tmp / "runs/t/eval.json").read_text())
    assert on_cli["returns"] == result["returns"] and on_cli["return_mean"] == result["return_mean"]
    other = icrl.evaluate("runs/t", env="tmaze", env_kwargs={"length": 3}, n_episodes=3, deterministic=False)
    assert other["rollouts"] == 3 and len(other["returns"]) == 3  # exactly n_episodes, with 2 env copies
    with pytest.raises(ValueError, match="does not fit"):
        icrl.evaluate(policy, env="CartPole-v1", n_episodes=2)


def test_plot_of_several_runs_keeps_each_runs_own_plot(in_tmp, monkeypatch):
    from icrl.run import artifacts

    icrl.train(tiny("runs/a"))
    icrl.train(tiny("runs/a", total_env_steps=128, resume=True, device="cpu"))  # resumed: only run-only fields differ
    icrl.train(tiny("runs/b", seed=1, d_model=32, total_env_steps=128))
    own = (in_tmp / "runs/a/learning_curve.png").read_bytes()
    assert cli("plot", "runs/a", "runs/b") == 0
    assert (in_tmp / "runs/a/learning_curve.png").read_bytes() == own and (in_tmp / "learning_curves.png").is_file()
    labels = [label for label, _ in artifacts.group_runs(["runs/a", "runs/b"])]
    assert labels == ["d_model=16", "d_model=32"]  # not resume=True
    figs = []
    monkeypatch.setattr(artifacts, "save_figure", lambda fig, out: figs.append(fig) or Path(out))
    artifacts.plot_learning_curves(["runs/a"], "x.png")
    assert any(t.endswith("(train)") for t in figs[0].axes[0].get_legend_handles_labels()[1])


def test_plot_labels_seeds_only_when_they_are_and_redraws_a_runs_own_plot_with_its_title(in_tmp, monkeypatch):
    import shutil

    from icrl.run import artifacts

    icrl.train(tiny("runs/s0"))
    for copy in ("runs/s0b", "runs/s0c"):  # the same config and seed three times: three runs, not three seeds
        shutil.copytree(in_tmp / "runs/s0", in_tmp / copy)
    assert [label for label, _ in artifacts.group_runs(["runs/s0", "runs/s0b", "runs/s0c"])] == ["s0 +2 (3 runs)"]
    icrl.train(tiny("runs/s1", seed=1))
    assert artifacts.group_runs(["runs/s0", "runs/s1"])[0][0].endswith("(2 seeds)")
    titles = []
    monkeypatch.setattr(artifacts, "save_figure", lambda fig, out: titles.append(fig._suptitle.get_text()) or Path(out))
    assert cli("plot", "runs/s0") == 0  # the run's own learning_curve.png, drawn again: with the run's title
    assert titles == ["tmaze {\"length\": 3}"]


def test_eval_and_plot_on_a_run_dir_they_cannot_write_say_so_in_one_line(runs, tmp_path, capsys):
    """A read-only run dir (a shared or mounted one; here the output paths are folders, which even root cannot
    overwrite): `icrl eval` prints its table, then one line naming eval.json; `icrl plot` one line and the way out
    (--out); neither a traceback."""
    run = tmp_path / "ro"
    shutil.copytree(runs["s0"], run)
    (run / "eval.json").unlink(missing_ok=True)
    (run / "eval.json").mkdir()
    (run / "learning_curve.png").unlink()
    (run / "learning_curve.png").mkdir()
    capsys.readouterr()
    assert cli("eval", str(run), "--rollouts", "2") == 2
    out, err = capsys.readouterr()
    assert "return" in out and "eval.json" in err and len(err.strip().splitlines()) == 1, err
    assert cli("plot", str(run)) == 2
    err = capsys.readouterr().err
    assert "--out" in err and len(err.strip().splitlines()) == 1, err
    assert cli("plot", str(run), "--out", str(tmp_path / "elsewhere.png")) == 0


def test_plot_skips_metrics_rows_nested_too_deeply_to_parse(runs, tmp_path):
    """A hand-edited or hostile metrics.jsonl row nested 100,000 deep was a RecursionError; now it is skipped."""
    run = tmp_path / "deep"
    shutil.copytree(runs["s0"], run)
    with open(run / "metrics.jsonl", "a") as f:
        f.write("[" * 100_000 + "]" * 100_000 + "\n" + '["a list, not a row"]\n')
    assert cli("plot", str(run), "--out", str(tmp_path / "deep.png")) == 0
