"""Hostile files and a full disk (issue 20): one line, exit 2, nothing already on disk lost."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError

from icrl.cli.errors import run_stoppable
from icrl.config import EnvConfig, ExperimentConfig, LossConfig, ModelConfig
from icrl.run import checkpoint as ckpt_mod
from icrl.run.checkpoint import CheckpointError, list_checkpoints, save_checkpoint


def tiny_cfg(run_dir) -> ExperimentConfig:
    return ExperimentConfig(
        env=EnvConfig(env="tmaze", env_kwargs='{"length": 1}', parallel_envs=2),
        model=ModelConfig(d_model=16, layers=1, heads=2, max_seq_len=8, max_time=16, head_hidden=16, head_layers=1),
        loss=LossConfig(num_critics=2, redq_subset=2, gammas=(0.9, 0.99)),
    ).replace(run_dir=str(run_dir), device="cpu", batch_size=4, steps_per_epoch=8)


def objects(cfg: ExperimentConfig):
    from icrl.agent.exploration import Exploration
    from icrl.agent.learner import Learner
    from icrl.agent.model import Agent
    from icrl.config import resolve
    from icrl.envs import Collector, make_vector_env
    from icrl.types import ActionSpec

    venv = make_vector_env(cfg.env.env, cfg.env.kwargs, cfg.env.parallel_envs)
    spec = ActionSpec.from_space(venv.single_action_space)
    agent = Agent(venv.single_observation_space["obs"], spec, cfg.model, cfg.loss)
    return dict(agent=agent, learner=Learner(agent, cfg, torch.device("cpu")), collector=Collector(venv, spec, seed=0),
                exploration=Exploration(resolve(cfg).explore, spec, cfg.env.parallel_envs, seed=1))


def test_a_full_disk_during_a_checkpoint_is_one_line_exit_2_and_keeps_the_previous_one(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    parts = objects(tiny_cfg(run))
    first = save_checkpoint(run, epoch=1, **parts)
    before = (first / "agent.safetensors").read_bytes()

    def full_disk(model, filename, *a, **k):
        with open(filename, "wb") as f:
            f.write(b"partial")
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "
                              '"No space left on device" })')

    monkeypatch.setattr(ckpt_mod, "save_model", full_disk)
    with pytest.raises(CheckpointError, match="No space left on device.*previous checkpoints are kept"):
        save_checkpoint(run, epoch=2, **parts)
    assert list_checkpoints(run) == [first] and (first / "agent.safetensors").read_bytes() == before
    assert (run / "checkpoints/latest").read_text().strip() == first.name
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".tmp-")]

    with pytest.raises(SystemExit) as e:  # the CLI's wrapper: one line, exit 2
        run_stoppable(lambda: save_checkpoint(run, epoch=3, **parts))
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and "No space left on device" in err


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    return objects(tiny_cfg(tmp_path_factory.mktemp("a")))["agent"]


def _published(agent, tmp_path, tensors=None):
    from safetensors.torch import save_file, save_model

    path = tmp_path / "weights.safetensors"
    if tensors is None:
        save_model(agent, str(path), metadata={"updates": "3", "utd": "1.0"})
    else:
        save_file(tensors, str(path))
    return path


@pytest.mark.parametrize("kind", ["corrupt", "truncated", "foreign", "nan", "missing", "fifo"])
def test_the_collector_refuses_a_broken_published_weights_file_before_loading_it(agent, tmp_path, kind):
    from icrl.asynchronous.protocol import WeightsFileError, load_weights

    path = _published(agent, tmp_path)
    good = {k: v.clone() for k, v in agent.state_dict().items()}
    if kind == "corrupt":
        path.write_bytes(b"\xff" * 64)
    elif kind == "truncated":
        path.write_bytes(path.read_bytes()[:100])
    elif kind == "foreign":
        _published(agent, tmp_path, {"some.other.model": torch.zeros(3)})
    elif kind == "fifo":  # blocked the collector's open for ever
        path.unlink()
        os.mkfifo(path)
    elif kind == "nan":
        from safetensors.torch import load_file
        tensors = load_file(str(path))
        first = next(k for k, t in tensors.items() if t.is_floating_point())
        tensors[first] = torch.full_like(tensors[first], float("nan"))
        _published(agent, tmp_path, tensors)
    else:
        from safetensors.torch import load_file
        tensors = load_file(str(path))
        tensors.pop(next(k for k in tensors if "critic" in k))
        _published(agent, tmp_path, tensors)
    with pytest.raises(WeightsFileError, match=str(path)) as e:
        load_weights(agent, path)
    assert len(str(e.value).splitlines()) == 1
    for k, v in agent.state_dict().items():
        assert torch.equal(v, good[k]), f"{k} changed by a refused file"


def test_a_good_published_file_loads_and_a_later_broken_one_only_warns(agent, tmp_path, capsys):
    import os

    from icrl.asynchronous.protocol import AsyncPaths, WeightsWatcher

    paths = AsyncPaths(tmp_path)
    paths.root.mkdir(parents=True)
    _published(agent, paths.root)
    watcher = WeightsWatcher(agent, paths)
    assert watcher.meta["updates"] == "3"
    paths.weights.write_bytes(b"junk")
    os.utime(paths.weights, ns=(watcher.stamp + 10**9, watcher.stamp + 10**9))
    assert watcher.poll()["updates"] == "3" and watcher.reloads == 0
    assert "warning" in capsys.readouterr().out


def test_icrl_load_refuses_nan_weights(tmp_path):
    import icrl
    from icrl.run.load import RunDirError

    cfg = tiny_cfg(tmp_path / "run").replace(total_env_steps=8, updates_per_epoch=1, eval_every=100,
                                             eval_rollouts=1, threads=1)
    icrl.train(cfg)
    from safetensors.torch import load_file, save_file

    weights = tmp_path / "run" / "agent.safetensors"
    tensors = {k: torch.full_like(t, float("nan")) if t.is_floating_point() else t
               for k, t in load_file(str(weights)).items()}
    save_file(tensors, str(weights))
    import shutil
    shutil.rmtree(tmp_path / "run" / "checkpoints", ignore_errors=True)
    with pytest.raises(RunDirError, match="NaN or inf"):
        icrl.load(tmp_path / "run")


@pytest.mark.parametrize(("kind", "words"), [
    ("raise_reset", "at step 0 of a rollout: reset\\(\\) raised RuntimeError: the user's reset is broken"),
    ("raise_step", "at step 2 of a rollout: step\\(\\) raised KeyError"),
    ("none_reward", "returned None as the reward"),
    ("array_reward", "shape \\(3,\\)"),
    ("str_reward", "returned '1' as the reward"),
    ("object_obs", "returned an observation <object"),
    ("bad_tuple", "not \\(obs, reward, terminated, truncated, info\\)"),
    ("huge_reward", "non-finite reward \\(1e\\+300\\)"),
])
def test_a_broken_user_env_is_one_line_naming_the_env_the_step_and_the_problem(tmp_path, kind, words):
    import icrl
    from icrl.envs.wrapper import EnvError
    from icrl.guards import NonFiniteError

    from hostile_envs import HostileEnv

    cfg = tiny_cfg(tmp_path / "run").replace(env_kwargs=json.dumps({"kind": kind}), total_env_steps=16,
                                             updates_per_epoch=1, eval_every=100, eval_rollouts=1, threads=1)
    with pytest.raises((EnvError, NonFiniteError), match=f"HostileEnv.*{words}") as e:
        icrl.train(cfg, env=HostileEnv)
    assert len(str(e.value).splitlines()) == 1
    if isinstance(e.value, EnvError) and kind.startswith("raise"):
        assert "the user's" in str(e.value.__cause__)  # their own exception, traceback and all, is kept
        assert "hostile_envs.py" in e.value.user_traceback


@pytest.mark.parametrize("async_envs", [False, True])  # in env subprocesses too: one line, the traceback kept
def test_the_cli_reports_a_raising_env_in_one_line_and_keeps_its_traceback_in_a_file(tmp_path, capsys, async_envs):
    from icrl.cli import main

    run = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        main(["train", "--env", "hostile_envs:HostileEnv", "--env-kwargs", '{"kind": "raise_step"}',
              "--run-dir", str(run), "--parallel-envs", "2", "--d-model", "16", "--layers", "1", "--heads", "2",
              "--max-seq-len", "8", "--head-hidden", "16", "--batch-size", "4", "--steps-per-epoch", "8",
              "--total-env-steps", "16", "--device", "cpu", *(["--async-envs"] if async_envs else [])])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    assert "HostileEnv at step 2 of a rollout: step() raised KeyError" in err and "traceback:" in err
    log = err.rsplit("traceback: ", 1)[1].rstrip(")")
    assert "the user's step is broken" in open(log).read() and "hostile_envs.py" in open(log).read()


def test_a_full_disk_while_the_final_weights_are_written_is_an_os_error_keeping_the_old_file(tmp_path, monkeypatch):
    from icrl.run import artifacts

    agent = objects(tiny_cfg(tmp_path))["agent"]
    path = artifacts.save_weights(agent, tmp_path / "agent.safetensors")
    before = path.read_bytes()

    def full_disk(model, filename, *a, **k):
        raise SafetensorError("Error while serializing: No space left on device (os error 28)")

    monkeypatch.setattr(artifacts, "save_model", full_disk)
    with pytest.raises(OSError, match="could not write the weights .*No space left on device"):
        artifacts.save_weights(agent, path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["agent.safetensors"]


def test_an_observation_beyond_float32_is_refused_like_nan_without_a_numpy_warning(recwarn):
    import gymnasium as gym
    import numpy as np

    from icrl.envs import Collector, RandomPolicy, TimestepWrapper
    from icrl.guards import NonFiniteError
    from icrl.types import ActionSpec

    class Huge(gym.Env):
        observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float64)
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            return np.array([1e300, 0.0]), {}

        def step(self, action):
            return np.zeros(2), 0.0, True, False, {}

    venv = gym.vector.SyncVectorEnv([lambda: TimestepWrapper(Huge())] * 2,
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    spec = ActionSpec.from_space(venv.single_action_space)
    with pytest.raises(NonFiniteError, match="Huge \\(copy 0\\).*beyond float32 in key 'obs'"):
        Collector(venv, spec, seed=0).collect(RandomPolicy(spec, seed=0), 4)
    assert not [w for w in recwarn if "overflow" in str(w.message)]


def test_icrl_collect_on_a_corrupt_published_weights_file_is_one_line_exit_2(tmp_path, capsys):
    from icrl.cli import main

    run = tmp_path / "run"
    (run / "async").mkdir(parents=True)
    (run / "config.json").write_text(tiny_cfg(run).to_json())
    (run / "async" / "weights.safetensors").write_bytes(b"\x00" * 10)
    with pytest.raises(SystemExit) as e:
        main(["collect", str(run), "--wait", "5", "--max-env-steps", "8"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    assert "weights.safetensors" in err and "corrupt" in err


def test_an_env_traceback_is_never_written_through_a_symlink_in_the_run_dir(tmp_path, capsys):
    """RUN_DIR/env_error.txt symlinked to a file outside (or a FIFO there): that file is left alone and the
    traceback goes to a fresh temp file, which the one-line message names."""
    from icrl.cli.errors import fail_input

    class EnvFailed(ValueError):
        user_traceback = "Traceback: the user's env raised"

    run, outside = tmp_path / "run", tmp_path / "precious.txt"
    run.mkdir()
    outside.write_text("keep me")
    (run / "env_error.txt").symlink_to(outside)
    with pytest.raises(SystemExit) as e:
        fail_input(EnvFailed("the env raised"), str(run))
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and outside.read_text() == "keep me"
    log = err.rsplit("traceback: ", 1)[1].rstrip(")")
    assert Path(log).parent != run and "the user's env raised" in Path(log).read_text()
    (run / "env_error.txt").unlink()
    os.mkfifo(run / "env_error.txt")  # would block a plain open() forever
    with pytest.raises(SystemExit):
        fail_input(EnvFailed("the env raised"), str(run))
    assert "traceback: " in capsys.readouterr().err


def test_checkpoint_callback_weights_never_leave_the_run_dir(tmp_path, monkeypatch):
    """RUN_DIR/weights symlinked outside: CheckpointCallback refuses in one line instead of writing there."""
    import icrl
    from icrl.fileio import OutsideRunDirError
    from icrl.run.callbacks import CheckpointCallback

    run, outside = tmp_path / "run", tmp_path / "elsewhere"
    run.mkdir()
    outside.mkdir()
    (run / "weights").symlink_to(outside, target_is_directory=True)
    with pytest.raises(OutsideRunDirError, match="leads outside"):
        icrl.train(tiny_cfg(run).replace(total_env_steps=16, updates_per_epoch=1, eval_rollouts=2),
                   callbacks=[CheckpointCallback(every=1)])
    assert list(outside.iterdir()) == []
