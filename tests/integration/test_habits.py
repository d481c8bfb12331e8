"""Habits users bring from SB3, CleanRL and the official AMAGO (issue 21): run dirs that never collide, the
public names of `icrl`, vector envs and env instances handed to `icrl.train`, one-line failures, `icrl envs`
for every family, `icrl.evaluate`, callbacks, `--config FILE`, export / load of a zip."""

import json
import re
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import icrl
from icrl.cli import main as cli_main
from icrl.config import ConfigError, EnvConfig, ExperimentConfig, ModelConfig
from icrl.config.errors import speak_cli

ROOT = Path(__file__).resolve().parents[2]


def tiny(run_dir=None, env="tmaze", env_kwargs='{"length": 3}', **fields) -> ExperimentConfig:
    """Two epochs of 32 env steps, one update each, an evaluation of 2 rollouts at the end (about a second)."""
    cfg = ExperimentConfig(
        env=EnvConfig(env=env, env_kwargs=env_kwargs, parallel_envs=2),
        model=ModelConfig(d_model=16, layers=1, heads=2, head_hidden=16, max_seq_len=32),
    ).replace(run_dir=None if run_dir is None else str(run_dir), total_env_steps=64, steps_per_epoch=32,
              updates_per_epoch=1, batch_size=2, eval_every=2, eval_rollouts=2, device="cpu", threads=1)
    return cfg.replace(**fields)


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """The working directory is a fresh folder (default run dirs go to ./runs); errors in Python words."""
    monkeypatch.chdir(tmp_path)
    speak_cli(False)
    yield tmp_path
    speak_cli(False)


def cli(*args: str) -> int:
    """`icrl ARGS` in this process; its exit code (0 when it returns)."""
    try:
        cli_main(list(args))
    except SystemExit as e:
        return int(e.code or 0)
    finally:
        speak_cli(False)
    return 0


# -------------------------------------------------------------------------------- 2: run dirs never collide
def test_default_run_dirs_never_collide(in_tmp):
    """The README's snippet (a notebook cell) run twice, and a second seed: each run gets its own folder."""
    first = icrl.train(tiny())
    again = icrl.train(tiny())
    seed1 = icrl.train(tiny(seed=1))
    dirs = [Path(r["run_dir"]) for r in (first, again, seed1)]
    assert len(set(dirs)) == 3 and all(d.parent == Path("runs") and (in_tmp / d / "agent.safetensors").is_file()
                                      for d in dirs)
    assert dirs[0].name.startswith("tmaze-0-") and dirs[2].name.startswith("tmaze-1-")
    assert json.loads((in_tmp / dirs[1] / "config.json").read_text())["run"]["run_dir"] == str(dirs[1])


def test_a_named_run_dir_that_holds_a_run_is_refused_in_the_readers_words(in_tmp, capsys):
    icrl.train(tiny("runs/mine"))
    with pytest.raises(ConfigError, match=r"resume=True") as e:  # Python words in Python
        icrl.train(tiny("runs/mine"))
    assert "--resume" not in str(e.value)
    with pytest.raises(ConfigError, match="run_dir"):  # nothing to resume when no run is named
        icrl.train(tiny(resume=True))
    capsys.readouterr()
    code = cli("train", "--env", "tmaze", "--env-kwargs", '{"length": 3}', "--run-dir", "runs/mine",
               "--total-env-steps", "64", "--steps-per-epoch", "32", "--parallel-envs", "2")
    err = capsys.readouterr().err
    assert code == 2 and "pass --resume" in err and "resume=True" not in err


def test_a_presets_folder_gives_way_when_it_holds_a_run(in_tmp):
    """`icrl train --preset tmaze` twice: runs/tmaze20, then runs/tmaze20-2; naming it is still refused."""
    assert cli("train", "--preset", "tmaze", *TINY) == 0
    assert cli("train", "--preset", "tmaze", *TINY) == 0
    assert (in_tmp / "runs/tmaze20/agent.safetensors").is_file() and (in_tmp / "runs/tmaze20-2/agent.safetensors").is_file()
    assert cli("train", "--preset", "tmaze", "--run-dir", "runs/tmaze20", *TINY) == 2


# -------------------------------------------------------------------------------- 10: the public names
def test_dir_and_version():
    names = dir(icrl)
    assert {"train", "load", "evaluate", "InContextPolicy", "__version__"} <= set(names)
    assert set(icrl.__all__) <= set(names) and all(callable(getattr(icrl, n)) for n in icrl.__all__ if n[0] != "_")
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert icrl.__version__ == version


def test_cli_version(capsys):
    assert cli("--version") == 0
    assert capsys.readouterr().out.strip() == f"icrl {icrl.__version__}"


# -------------------------------------------------------------------------------- 3: a user's vector env
def test_make_vec_with_kwargs_trains(in_tmp):
    """make_vec's closures already hold their kwargs (map_name, is_slippery): they are not passed again."""
    venv = gym.make_vec("FrozenLake-v1", num_envs=2, vectorization_mode="sync", is_slippery=True)
    result = icrl.train(tiny("runs/lake", env_kwargs="{}"), env=venv)
    cfg = json.loads((in_tmp / "runs/lake/config.json").read_text())
    assert cfg["env"]["env"] == "FrozenLake-v1" and json.loads(cfg["env"]["env_kwargs"])["is_slippery"] is True
    assert result["rollouts"] == 2


# -------------------------------------------------------------------------------- 4: --video without pygame
def test_video_without_pygame_is_one_line_exit_2(in_tmp, monkeypatch, capsys):
    icrl.train(tiny("runs/pole", env="CartPole-v1", env_kwargs='{"max_episode_steps": 8}'))
    monkeypatch.setitem(sys.modules, "pygame", None)  # `import pygame` raises ImportError: as if not installed
    capsys.readouterr()
    code = cli("eval", "runs/pole", "--rollouts", "2", "--video", "1")
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "pygame" in err and "CartPole-v1" in err


# -------------------------------------------------------------------------------- 7: icrl envs FAMILY
def test_envs_lists_popgym_as_a_family(capsys):
    pytest.importorskip("popgym")
    assert cli("envs", "popgym") == 0
    out = capsys.readouterr().out.split()
    assert "popgym/RepeatPreviousEasy" in out and all(n.startswith("popgym/") for n in out)


def test_envs_shows_popgym_without_the_extra(monkeypatch, capsys):
    from icrl.envs import registry

    monkeypatch.setattr(registry, "TASKS", {k: v for k, v in registry.TASKS.items() if "popgym" not in k})
    assert cli("envs") == 0
    out = capsys.readouterr().out
    assert "popgym/<name>" in out and "pip install 'icrl[popgym]'" in out
    assert cli("envs", "popgym") == 2
    assert "pip install 'icrl[popgym]'" in capsys.readouterr().err


# -------------------------------------------------------------------------------- icrl.evaluate
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


# -------------------------------------------------------------------------------- --config FILE
def test_train_from_another_runs_config_with_flags_on_top(in_tmp, capsys):
    icrl.train(tiny("runs/theirs"))
    assert cli("train", "--config", "runs/theirs/config.json", "--seed", "5") == 0
    theirs = json.loads((in_tmp / "runs/theirs/config.json").read_text())
    (mine,) = [p for p in (in_tmp / "runs").iterdir() if p.name.startswith("tmaze-5-")]  # a folder of its own
    cfg = json.loads((mine / "config.json").read_text())
    assert cfg["run"]["seed"] == 5 and cfg["run"]["run_dir"] == str(mine.relative_to(in_tmp))
    for group in ("env", "model", "schedule"):
        assert cfg[group] == theirs[group]
    capsys.readouterr()
    assert cli("train", "--config", "nowhere/config.json") == 2
    assert "nowhere/config.json does not exist" in capsys.readouterr().err
    assert cli("train", "--config", "runs/theirs", "--preset", "tmaze") == 2


# -------------------------------------------------------------------------------- callbacks, --stop-at-return
class Recorder:
    """A user's own logging: no base class, just the hooks it wants."""

    def __init__(self, stop_at_epoch=None):
        self.calls, self.stop_at_epoch = [], stop_at_epoch

    def on_train_start(self, run):
        self.calls.append(("start", str(run.run_dir)))

    def on_epoch_end(self, row):
        self.calls.append(("epoch", row["kind"], row["epoch"]))
        return row["epoch"] == self.stop_at_epoch

    def on_eval(self, row):
        self.calls.append(("eval", row["kind"], row["epoch"]))

    def on_train_end(self, result):
        self.calls.append(("end", result["epoch"]))


def test_callbacks_see_every_row_and_can_stop_the_run(in_tmp):
    rec = Recorder()
    icrl.train(tiny("runs/a"), callbacks=[rec])
    assert rec.calls == [("start", "runs/a"), ("epoch", "train", 1), ("epoch", "train", 2), ("eval", "eval", 2),
                         ("end", 2)]
    stopper = Recorder(stop_at_epoch=1)
    result = icrl.train(tiny("runs/b", total_env_steps=128), callbacks=stopper)  # 4 epochs planned
    assert result["epoch"] == 1 and stopper.calls[-1] == ("end", 1)
    assert (in_tmp / "runs/b/checkpoints/ckpt-000001").is_dir() and (in_tmp / "runs/b/agent.safetensors").is_file()
    with pytest.raises(TypeError, match="none of the hooks"):
        icrl.train(tiny("runs/c"), callbacks=[object()])
    assert not (in_tmp / "runs/c").exists()


def test_stop_at_return_flag_stops_after_n_evaluations_in_a_row(in_tmp):
    args = ["--env", "tmaze", "--env-kwargs", '{"length": 3}', "--parallel-envs", "2", "--total-env-steps", "192",
            "--steps-per-epoch", "32", "--updates-per-epoch", "1", "--batch-size", "2", "--eval-rollouts", "2",
            "--eval-every", "1", "--d-model", "16", "--layers", "1", "--heads", "2", "--max-seq-len", "8"]
    assert cli("train", *args, "--run-dir", "runs/s", "--stop-at-return", "-5", "--stop-patience", "2") == 0
    rows = [json.loads(line) for line in (in_tmp / "runs/s/metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows if r["kind"] == "eval"] == [1, 2]  # 6 epochs planned, stopped after 2
    assert (in_tmp / "runs/s/checkpoints/ckpt-000002").is_dir()


def test_builtin_callbacks(in_tmp):
    from icrl.run.callbacks import CheckpointCallback, EvalCallback, StopTrainingOnRewardThreshold

    stop = StopTrainingOnRewardThreshold(0.5, patience=2)
    assert [stop.on_eval({"return_mean": r}) for r in (0.6, 0.4, 0.6, 0.7)] == [False, False, False, True]
    ev, ck = EvalCallback(n_episodes=2), CheckpointCallback(every=1)
    icrl.train(tiny("runs/e"), callbacks=[ev, ck])
    assert len(ev.results) == 1 and (in_tmp / "runs/e/best_agent.safetensors").is_file()
    assert icrl.load("runs/e/best_agent.safetensors").config.env.env == "tmaze"
    assert sorted(p.name for p in (in_tmp / "runs/e/weights").iterdir()) == [
        "agent-000000032.safetensors", "agent-000000064.safetensors"]
    on_own_env = EvalCallback(n_episodes=2)  # the run's env is a factory of this script: evaluated all the same
    icrl.train(tiny("runs/f", env_kwargs="{}"), env=lambda: Combo(), callbacks=[on_own_env])
    assert len(on_own_env.results) == 1


# -------------------------------------------------------------------------------- export / load a zip
def test_export_and_load_a_zip(in_tmp, capsys):
    import zipfile

    import torch

    icrl.train(tiny("runs/x"))
    assert cli("export", "runs/x", "shared/x.zip") == 0
    names = set(zipfile.ZipFile(in_tmp / "shared/x.zip").namelist())
    assert names == {"agent.safetensors", "config.json", "spaces.json", "metrics.jsonl", "learning_curve.png",
                     "icrl_export.json"}  # no pickle: no optimiser state, no replay
    a, b = icrl.load("runs/x"), icrl.load("shared/x.zip")
    assert all(torch.equal(p, q) for p, q in zip(a.agent.state_dict().values(), b.agent.state_dict().values()))
    assert icrl.evaluate(b, n_episodes=2)["returns"] == icrl.evaluate(a, n_episodes=2)["returns"]
    capsys.readouterr()
    assert cli("export", "runs/x", "shared/x.zip") == 2 and "--overwrite" in capsys.readouterr().err


def test_export_packs_no_file_from_outside_the_run_dir(in_tmp, capsys):
    """A symlinked metrics.jsonl (or plot) would put an outside file into the zip to share, and a checkpoints/latest
    naming another run's checkpoint would export that run's weights: refused / not followed."""
    import json
    import zipfile

    icrl.train(tiny("runs/x"))
    icrl.train(tiny("runs/other", checkpoint_every=1))
    secret = in_tmp / "secret.txt"
    secret.write_text("not for sharing")
    metrics = in_tmp / "runs/x/metrics.jsonl"
    kept = metrics.read_text()
    metrics.unlink()
    metrics.symlink_to(secret)
    capsys.readouterr()
    assert cli("export", "runs/x", "x.zip") == 2 and "leads outside" in capsys.readouterr().err
    assert not (in_tmp / "x.zip").exists()
    metrics.unlink()
    metrics.write_text(kept)
    latest = in_tmp / "runs/x/checkpoints/latest"
    latest.parent.mkdir(exist_ok=True)
    other = sorted(p.name for p in (in_tmp / "runs/other/checkpoints").iterdir() if p.name.startswith("ckpt"))[-1]
    latest.write_text(f"../../other/checkpoints/{other}\n")
    assert cli("export", "runs/x", "x.zip") == 0
    manifest = json.loads(zipfile.ZipFile(in_tmp / "x.zip").read("icrl_export.json"))
    assert manifest["weights"] == str(Path("runs/x/agent.safetensors"))  # its own final weights, not the other run's


@pytest.mark.parametrize("member", ["../evil.txt", "/tmp/evil.txt", "sub/config.json", "..\\evil.txt"])
def test_a_zip_with_paths_leaving_the_archive_is_refused(in_tmp, member):
    import zipfile

    from icrl.run.load import RunDirError

    icrl.train(tiny("runs/x"))
    assert cli("export", "runs/x", "x.zip") == 0
    with zipfile.ZipFile(in_tmp / "x.zip", "a") as z:
        z.writestr(member, "gotcha")
    with pytest.raises(RunDirError, match="outside the archive"):
        icrl.load("x.zip")
    assert not (in_tmp.parent / "evil.txt").exists()


def test_an_oversized_member_is_refused(in_tmp, monkeypatch):
    from icrl.run import load
    from icrl.run.load import RunDirError

    icrl.train(tiny("runs/x"))
    assert cli("export", "runs/x", "x.zip") == 0
    monkeypatch.setattr(load, "MAX_OTHER_BYTES", 100)  # config.json is larger
    with pytest.raises(RunDirError, match="limit"):
        icrl.load("x.zip")


# -------------------------------------------------------------------------------- 6: env instances, spaces
def test_an_env_made_by_gymnasium_make_is_accepted(in_tmp):
    """SB3's first habit: an instance. icrl re-creates it from its spec (kwargs and time limit kept)."""
    result = icrl.train(tiny("runs/inst", env_kwargs="{}"), env=gym.make("CartPole-v1", max_episode_steps=6))
    cfg = json.loads((in_tmp / "runs/inst/config.json").read_text())
    assert cfg["env"]["env"] == "CartPole-v1" and json.loads(cfg["env"]["env_kwargs"]) == {"max_episode_steps": 6}
    assert result["episode_length_mean"] <= 6


class Combo(gym.Env):
    """Tuple observations, MultiDiscrete actions: reward 1 when the action's entries sum to the observed id."""

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


def test_tuple_observations_and_multidiscrete_actions_train_and_act(in_tmp):
    icrl.train(tiny("runs/combo", env_kwargs="{}"), env=Combo)
    policy = icrl.load("runs/combo")
    env = Combo()
    obs, _ = env.reset(seed=0)
    action, state = policy.predict(obs)
    assert env.action_space.contains(np.asarray(action))
    assert icrl.evaluate(policy, env=Combo, n_episodes=2)["rollouts"] == 2


def test_too_many_multidiscrete_combinations_give_advice_that_exists():
    from icrl.types import agent_action_space

    with pytest.raises(ValueError, match="ActionWrapper") as e:
        agent_action_space(gym.spaces.MultiDiscrete([100, 100]))
    assert "Gymnasium has no wrapper" in str(e.value)


class Plain(gym.Env):
    """An env of the user's own, without a Gymnasium spec."""

    observation_space = gym.spaces.Discrete(2)
    action_space = gym.spaces.Discrete(2)


def test_an_instance_without_a_spec_says_what_to_pass():
    from icrl.envs.user import resolve_env

    with pytest.raises(ValueError) as e:
        resolve_env(gym.wrappers.TimeLimit(Plain(), 10))
    assert "env=Plain" in str(e.value) and "env=TimeLimit" not in str(e.value)


# -------------------------------------------------------------------------------- 8: progress lines, plots
def test_lines_show_an_evaluation_only_when_it_is_new(in_tmp, capsys):
    icrl.train(tiny("runs/p", total_env_steps=128, eval_every=2))  # 4 epochs, evaluations at 2 and 4
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("epoch")]
    assert [("eval return" in ln) for ln in lines] == [False, True, False, True]


def test_the_live_line_fits_80_columns():
    import io

    from rich.console import Console

    from icrl.run.reporting import progress_bar, progress_line

    row = {"epoch": 123, "env_steps": 49_000, "updates": 12_345, "time/env_steps_per_s": 1234.0,
           "time/updates_per_s": 98.7, "train/return_mean": -0.906}
    bar, task = progress_bar(50_000)
    bar.update(task, completed=49_000, description=progress_line(row, {"return_mean": 0.95}, live=True))
    out = io.StringIO()
    Console(file=out, width=80, force_terminal=False, color_system=None).print(bar.make_tasks_table(bar.tasks))
    text = out.getvalue()
    assert "98.7 upd/s" in text and "train -0.91" in text and "eval +0.95" in text and "49000/50000" in text
    assert max(len(ln) for ln in text.splitlines()) <= 80


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
    monkeypatch.setattr(artifacts, "_save", lambda fig, out: figs.append(fig) or Path(out))
    artifacts.plot_learning_curves(["runs/a"], "x.png")
    assert any(t.endswith("(train)") for t in figs[0].axes[0].get_legend_handles_labels()[1])


# -------------------------------------------------------------------------------- the README, one after another
TINY = ["--total-env-steps", "64", "--steps-per-epoch", "32", "--parallel-envs", "2", "--updates-per-epoch", "1",
        "--batch-size", "2", "--eval-rollouts", "2", "--eval-every", "1", "--d-model", "16", "--layers", "1",
        "--heads", "2", "--head-hidden", "16", "--max-seq-len", "64"]
MY_PACKAGE = '''
import gymnasium as gym


def make_env(difficulty: int = 1):
    return gym.make("CartPole-v1", max_episode_steps=5 * difficulty)
'''


def readme_daily_use() -> list[list[str]]:
    """The commands of the README's "Daily use" block, comments dropped."""
    import shlex

    block = (ROOT / "README.md").read_text().split("## Daily use", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return [shlex.split(line, comments=True) for line in block.splitlines() if line.strip()]


@pytest.mark.slow
def test_readme_daily_use_runs_one_after_another_in_a_fresh_folder(in_tmp, capsys):
    (in_tmp / "my_package").mkdir()
    (in_tmp / "my_package/__init__.py").write_text("")
    (in_tmp / "my_package/envs.py").write_text(MY_PACKAGE)
    commands = readme_daily_use()
    assert len(commands) >= 12 and all(c[0] == "icrl" for c in commands)
    sys.path.insert(0, str(in_tmp))
    try:
        for command in commands:
            args = command[1:]
            if args[:1] == ["train"] and "--help" not in args:  # tiny budgets on top of every flag
                args = [*args, *TINY] + (["--total-env-steps", "96"] if "--resume" in args else [])
            code = cli(*args)
            out = capsys.readouterr()
            assert code == 0, (command, out.err[-2000:])
            assert "already holds" not in out.err, command
    finally:
        sys.path.remove(str(in_tmp))
        sys.modules.pop("my_package.envs", None)
        sys.modules.pop("my_package", None)
    runs = sorted(p.name for p in (in_tmp / "runs").iterdir())
    assert {"demo", "tmaze20", "tmaze50"} <= set(runs)  # presets name their own folders
    assert any(r.startswith("CartPole-v1-0-") for r in runs) and any(r.startswith("tmaze-2-") for r in runs)
    assert (in_tmp / "demo.zip").is_file() and (in_tmp / "runs/demo/eval_video.gif").is_file()


# -------------------------------------------------------------------------------- 9: what resume restores
def test_the_docs_say_resume_is_not_a_bit_exact_continuation():
    readme, runs = (ROOT / "README.md").read_text(), (ROOT / "docs/runs.md").read_text()
    for text in (readme, runs):
        assert "not a bit-exact continuation" in text and "counters, ε, RNG, replay" not in text
    section = runs.split("## Checkpoints and resume", 1)[1].split("\n## ", 1)[0]
    for what in ("optimiser", "RNG states", "reseeded", "rollouts written after the checkpoint"):
        assert what in section, what


def test_resume_with_more_budget_keeps_the_runs_schedule(in_tmp, capsys):
    """`--resume --total-env-steps N` gives a run more budget, in Python and on the command line, where the
    exploration schedule derived from the old budget once blocked it; `--resume` alone (no --env) reads the
    run's own config, so only what the flags change differs."""
    cfg = tiny("runs/r", env_kwargs="{}", total_env_steps=64)
    icrl.train(cfg, env=lambda: Combo())
    out = icrl.train(cfg.replace(resume=True, total_env_steps=128), env=lambda: Combo())
    assert out["env_steps"] == 128
    assert "exploration schedule and the warm-up stay the run's" in capsys.readouterr().out
    icrl.train(tiny("runs/b", total_env_steps=64))
    assert cli("train", "--run-dir", "runs/b", "--resume", "--total-env-steps", "128") == 0
    rows = [json.loads(line) for line in (in_tmp / "runs/b/metrics.jsonl").read_text().splitlines()]
    assert max(r["env_steps"] for r in rows) == 128
    saved = json.loads((in_tmp / "runs/b/config.json").read_text())
    assert saved["env"]["env"] == "tmaze" and saved["model"]["d_model"] == 16  # the run's, not the CLI's defaults


def test_checkpoints_come_by_wall_time_too_and_a_stop_says_what_it_left(in_tmp, capsys):
    """A run stopped a minute in can resume (a checkpoint every --checkpoint-seconds, whatever the epochs), and
    the stop message says whether there is a checkpoint to resume from at all."""
    from icrl.cli.errors import run_stoppable
    from icrl.run.checkpoint import list_checkpoints

    icrl.train(tiny("runs/t", total_env_steps=96, checkpoint_every=1000, checkpoint_seconds=1e-6))
    assert [p.name for p in list_checkpoints("runs/t")] == ["ckpt-000001", "ckpt-000002", "ckpt-000003"]

    def interrupted() -> None:
        raise KeyboardInterrupt

    (in_tmp / "runs/new").mkdir()
    for run_dir, said in (("runs/new", "wrote no checkpoint yet"), ("runs/t", "newest: runs/t/checkpoints/ckpt-000003")):
        with pytest.raises(SystemExit) as e:
            run_stoppable(interrupted, log_dir=run_dir)
        assert e.value.code == 130 and said in capsys.readouterr().err


def test_a_run_says_what_it_rounded_and_why_a_callback_stopped_it(in_tmp, capsys):
    class Enough:
        def on_epoch_end(self, row):
            return row["epoch"] >= 1

    icrl.train(tiny("runs/n", env_kwargs="{}", total_env_steps=70, eval_rollouts=3), env=lambda: Combo(),
               callbacks=[Enough()])  # a user's env: evaluated on the run's 2 copies
    out = capsys.readouterr().out
    assert "the run takes 64 env steps, not --total-env-steps 70: 2 whole epochs of --steps-per-epoch 32" in out
    assert "evaluations run 4 rollouts, not --eval-rollouts 3" in out
    assert "stopping: the callback Enough.on_epoch_end returned True" in out


def test_an_epoch_that_is_not_whole_steps_of_the_envs_is_said(in_tmp, capsys):
    """Each process takes whole vector steps of its envs: 33 env steps per epoch of 2 envs are 34, said once."""
    result = icrl.train(tiny("runs/n", total_env_steps=66, steps_per_epoch=33))
    out = capsys.readouterr().out
    assert "the run takes 68 env steps, not --total-env-steps 66: 2 epochs of 34, not --steps-per-epoch 33" in out
    assert result["env_steps"] == 68


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
    monkeypatch.setattr(artifacts, "_save", lambda fig, out: titles.append(fig._suptitle.get_text()) or Path(out))
    assert cli("plot", "runs/s0") == 0  # the run's own learning_curve.png, drawn again: with the run's title
    assert titles == ["tmaze {\"length\": 3}"]


def _rewrite_zip(src: Path, dst: Path, change) -> None:
    """A copy of the zip `src` with each member's (ZipInfo, bytes) passed through `change`, members stored."""
    import zipfile

    with zipfile.ZipFile(src) as a, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as b:
        for info in a.infolist():
            name, data = change(info.filename, a.read(info))
            b.writestr(zipfile.ZipInfo(name, info.date_time), data)


def _flip_in_member(path: Path, member: str, offset: int = 10) -> None:
    """Flip one byte of a stored member's data in place (its CRC then fails)."""
    import zipfile

    with zipfile.ZipFile(path) as z:
        info = z.getinfo(member)
    raw = bytearray(path.read_bytes())
    name_len, extra_len = int.from_bytes(raw[info.header_offset + 26:info.header_offset + 28], "little"), \
        int.from_bytes(raw[info.header_offset + 28:info.header_offset + 30], "little")
    start = info.header_offset + 30 + name_len + extra_len
    raw[start + offset] ^= 0xFF
    path.write_bytes(bytes(raw))


def _set_header_field(path: Path, member: str, field: str, value: int) -> None:
    """Set `flags` (encryption bit) or `method` (compression) of a member in its local and central headers."""
    import zipfile

    with zipfile.ZipFile(path) as z:
        info = z.getinfo(member)
    raw = bytearray(path.read_bytes())
    local = info.header_offset + (6 if field == "flags" else 8)
    raw[local:local + 2] = value.to_bytes(2, "little")
    central = raw.find(b"PK\x01\x02")  # the first central directory header
    while central != -1:
        n = int.from_bytes(raw[central + 28:central + 30], "little")
        if raw[central + 46:central + 46 + n].decode() == member:
            at = central + (8 if field == "flags" else 10)
            raw[at:at + 2] = value.to_bytes(2, "little")
            break
        central = raw.find(b"PK\x01\x02", central + 4)
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("damage", ["manifest_list", "manifest_deep", "manifest_no_hashes", "crc", "encrypted",
                                    "method", "deflate"])
def test_a_zip_whose_members_cannot_be_read_is_refused_in_one_line(in_tmp, damage):
    """Reading a zip's members (not only opening it) is guarded: a bad manifest, a CRC or deflate error, an
    encrypted member or a compression method zipfile cannot read is one RunDirError, never a traceback."""
    import zipfile

    from icrl.run.load import RunDirError

    icrl.train(tiny("runs/x"))
    assert cli("export", "runs/x", "x.zip") == 0
    bad = in_tmp / "bad.zip"
    if damage.startswith("manifest"):
        body = {"manifest_list": b"[]", "manifest_deep": b"[" * 100_000 + b"]" * 100_000,
                "manifest_no_hashes": b'{"sha256": 3}'}[damage]
        _rewrite_zip(in_tmp / "x.zip", bad, lambda n, d: (n, body if n == "icrl_export.json" else d))
    elif damage == "deflate":
        with zipfile.ZipFile(in_tmp / "x.zip") as a, zipfile.ZipFile(bad, "w", zipfile.ZIP_DEFLATED) as b:
            for info in a.infolist():
                b.writestr(info.filename, a.read(info))
        with zipfile.ZipFile(bad) as z:
            size = z.getinfo("config.json").compress_size
        _flip_in_member(bad, "config.json", offset=size // 2)
    else:
        _rewrite_zip(in_tmp / "x.zip", bad, lambda n, d: (n, d))
        if damage == "crc":
            _flip_in_member(bad, "config.json")
        else:
            _set_header_field(bad, "config.json", "flags" if damage == "encrypted" else "method",
                              1 if damage == "encrypted" else 99)
    with pytest.raises(RunDirError, match=r"bad\.zip") as e:
        icrl.load("bad.zip")
    assert "\n" not in str(e.value)


def test_a_spaces_record_that_describes_a_huge_space_is_refused_before_allocating_it(in_tmp):
    from icrl.spaces_json import MAX_SPACE_ELEMENTS, space_from_json

    for bad in ({"type": "Box", "shape": [100_000, 100_000], "dtype": "float32", "low": 0, "high": 1},
                {"type": "Box", "shape": [-3], "dtype": "float32", "low": 0, "high": 1},
                {"type": "Discrete", "n": 10**15},
                {"type": "MultiBinary", "n": [10**6, 10**6]},
                {"type": "Dict", "spaces": [[str(k), {"type": "Box", "shape": [MAX_SPACE_ELEMENTS // 2], "dtype": "uint8",
                                                      "low": 0, "high": 1}] for k in range(3)]}):
        with pytest.raises(ValueError, match="refused before allocating|not a shape"):
            space_from_json(bad)
    icrl.train(tiny("runs/x"))
    record = json.loads((in_tmp / "runs/x/spaces.json").read_text())
    record["observation_space"] = {"type": "Box", "shape": [10**6, 10**6], "dtype": "float32", "low": 0, "high": 1}
    (in_tmp / "runs/x/spaces.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match="refused before allocating"):
        icrl.load("runs/x")


def test_an_observation_too_large_for_memory_is_one_line_before_the_agent_is_built():
    from icrl.config import ConfigError
    from icrl.run.components import build_agent
    from icrl.types import ActionSpec

    obs = gym.spaces.Dict({"obs": gym.spaces.Box(0, 1, (1 << 21,), np.float32)})  # 2M numbers: ~8 MB of bounds
    cfg = ExperimentConfig().replace(tstep_hidden=1 << 16)  # 2M x 65,536 weights: far beyond any machine
    with pytest.raises(ConfigError, match="observations of 2,097,152 numbers.*ResizeObservation"):
        build_agent(cfg, obs, ActionSpec.from_space(gym.spaces.Discrete(2)), "cpu")
