"""Hostile input through the Python API and the config files (issue 20): clear TypeError / ValueError,
never an internal error, a RecursionError traceback or a silent surprise."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import icrl
from icrl.config import ConfigError, EnvConfig, ExperimentConfig, LossConfig, ModelConfig


def tiny_cfg(run_dir) -> ExperimentConfig:
    return ExperimentConfig(
        env=EnvConfig(env="tmaze", env_kwargs='{"length": 1}', parallel_envs=2),
        model=ModelConfig(d_model=16, layers=1, heads=2, max_seq_len=8, max_time=16, head_hidden=16, head_layers=1),
        loss=LossConfig(num_critics=2, redq_subset=2, gammas=(0.9, 0.99)),
    ).replace(run_dir=str(run_dir), device="cpu", batch_size=4, steps_per_epoch=8, total_env_steps=8,
              updates_per_epoch=1, eval_every=100, eval_rollouts=1, threads=1)


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    run = tmp_path_factory.mktemp("p") / "run"
    icrl.train(tiny_cfg(run))
    return icrl.load(run)


DEEP = "[" * 100_000 + "]" * 100_000


def test_deeply_nested_json_is_a_config_error_not_a_recursion_error(tmp_path):
    with pytest.raises(ConfigError, match="env_kwargs is nested too deeply"):
        ExperimentConfig().replace(env_kwargs='{"a": ' + DEEP + "}").validate()
    with pytest.raises(ConfigError, match="nested too deeply"):
        ExperimentConfig.from_json(DEEP)
    (tmp_path / "config.json").write_text('{"model": ' + DEEP + "}")
    from icrl.run.load import RunDirError, load_config

    with pytest.raises(RunDirError, match="config.json"):
        load_config(tmp_path)


@pytest.mark.parametrize("cfg", ["runs/x", {"lr": 1e-3}, 3])
def test_train_refuses_what_is_not_a_config_with_a_type_error(cfg):
    with pytest.raises(TypeError, match="takes an icrl.config.ExperimentConfig"):
        icrl.train(cfg)


def test_resume_on_a_run_dir_that_does_not_exist_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="resume=True: run_dir=.*does not exist"):
        icrl.train(tiny_cfg(tmp_path / "typo").replace(resume=True))
    assert not (tmp_path / "typo").exists()


def test_resume_without_a_checkpoint_says_it_starts_from_the_beginning(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    icrl.train(tiny_cfg(tmp_path / "run").replace(resume=True))
    assert "has no checkpoint yet; starting the run from the beginning" in capsys.readouterr().out


@pytest.mark.parametrize(("kwargs", "error", "words"), [
    (dict(state={"a": 1}), TypeError, "state must be None"),
    (dict(observation=np.zeros((0, 4), np.float32)), ValueError, "empty"),
    (dict(observation=np.full(4, np.nan, np.float32)), ValueError, "NaN or inf"),
    (dict(observation=np.array([np.inf, 0, 0, 0], np.float32)), ValueError, "NaN or inf"),
])
def test_predict_refuses_bad_arguments_clearly(policy, kwargs, error, words):
    args = {"observation": policy.observation_space.sample(), **kwargs}
    with pytest.raises(error, match=words):
        policy.predict(args.pop("observation"), **args)


@pytest.mark.parametrize("reward", [float("nan"), float("inf"), "1", 1e300, [1.0, 2.0, 3.0]])
def test_predict_refuses_a_reward_that_is_not_a_finite_number(policy, reward):
    obs = policy.observation_space.sample()
    _, state = policy.predict(obs)
    with pytest.raises(ValueError, match="reward"):
        policy.predict(obs, state, episode_start=False, reward=reward)
    action, _ = policy.predict(obs, state, episode_start=False, reward=1.0)  # the state is still usable
    assert policy.action_space.contains(action)


def test_a_checkpoint_state_json_nested_too_deeply_is_a_checkpoint_error(tmp_path):
    from icrl.run.checkpoint import CheckpointError, read_checkpoint

    for f in ("agent.safetensors", "optimizer.pt"):
        (tmp_path / f).write_bytes(b"")
    (tmp_path / "state.json").write_text(DEEP)
    with pytest.raises(CheckpointError, match="state.json is corrupt"):
        read_checkpoint(tmp_path)


def test_config_json_with_a_width_that_cannot_fit_is_refused_by_icrl_load(tmp_path):
    raw = json.loads(tiny_cfg(tmp_path).to_json())
    raw["model"]["d_model"] = 10**7
    (tmp_path / "config.json").write_text(json.dumps(raw))
    (tmp_path / "agent.safetensors").write_bytes(b"")
    from icrl.run.load import RunDirError

    with pytest.raises(RunDirError, match="GiB"):
        icrl.load(tmp_path)


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"length": 1.5}, "'length' must be an integer .* got 1.5"),
    ({"length": True}, "'length' must be an integer .* got true"),
])
def test_env_kwargs_of_the_wrong_number_type_are_refused_naming_the_kwarg(kwargs, words):
    from icrl.envs import make_env

    with pytest.raises(ValueError, match=words):
        make_env("tmaze", kwargs)
    make_env("tmaze", {"length": 2.0})  # an integral float (1e6 in JSON) still stands for an int


def test_a_popgym_typo_is_an_unknown_env_when_popgym_is_installed():
    pytest.importorskip("popgym")
    from icrl.envs import make_env

    with pytest.raises(ValueError, match="popgym \\(installed\\) has no env 'RepeatPreviousEasyy'.*"
                                         "Did you mean 'popgym/RepeatPreviousEasy'"):
        make_env("popgym/RepeatPreviousEasyy")


def test_main_module_env_on_a_fresh_train_does_not_speak_of_a_trained_run():
    from icrl.envs import make_env

    with pytest.raises(ValueError, match="running script") as e:
        make_env("__main__:NoSuchEnv")
    assert "trained the run" not in str(e.value)


class _Broken(RuntimeError):
    pass


def _raise(*_args, **_kwargs):
    raise _Broken("the metrics log cannot be opened")


@pytest.mark.parametrize("entry", ["train", "learn"])
def test_a_run_that_fails_after_taking_its_run_dir_frees_it_and_closes_its_envs(entry, tmp_path, monkeypatch):
    """`icrl.train` and `icrl learn` run one loop (icrl.run.loop.fit, in run_scope): a failure once the run dir
    is taken (here the metrics log, as with a missing tensorboard) releases the run lock at once and closes the
    envs, so the next attempt can start in the same folder."""
    import fcntl
    import os

    import gymnasium as gym

    from icrl.asynchronous.learn import learn

    closed = []
    real_close = gym.vector.VectorEnv.close  # every vector env icrl builds: Sync, Async, batched (icrl.envs.batched)
    monkeypatch.setattr(gym.vector.VectorEnv, "close",
                        lambda self, **kw: (closed.append(self), real_close(self, **kw))[1])
    monkeypatch.setattr("icrl.run.loop.open_log", _raise)
    cfg = tiny_cfg(tmp_path / "run")
    with pytest.raises(_Broken):
        learn(cfg) if entry == "learn" else icrl.train(cfg)
    fd = os.open(tmp_path / "run" / ".lock", os.O_RDONLY)  # as another process would: flock on its own descriptor
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError while the failed run still holds it
    finally:
        os.close(fd)
    assert closed and all(v.closed for v in closed)


def test_the_async_learner_logs_the_collectors_own_epsilon():
    """Each collector anneals ε over its own env steps per env copy, as `train`'s collector does; the learner
    logs that level (averaged over the collectors), not the level at all collectors' steps summed."""
    from icrl.agent.exploration import Exploration
    from icrl.asynchronous.learn import CollectorFiles
    from icrl.asynchronous.protocol import RunCounters
    from icrl.config import resolve
    from icrl.types import ActionSpec

    cfg = tiny_cfg("unused").replace(eps_start=1.0, eps_end=0.0, eps_anneal_steps=100)
    spec = ActionSpec("discrete", 4)
    learning = CollectorFiles.__new__(CollectorFiles)  # only the pieces `epsilon` reads
    learning.schedule = Exploration(resolve(cfg).explore, spec, cfg.env.parallel_envs, seed=0)
    learning.counts = RunCounters.__new__(RunCounters)
    learning.counts.collector_env_steps = [100, 100]  # two collectors of 2 envs: each env copy took 50 steps
    own = Exploration(resolve(cfg).explore, spec, cfg.env.parallel_envs, seed=1).level(100)
    assert learning.epsilon() == pytest.approx(own) == pytest.approx(0.5)
    learning.counts.collector_env_steps = []
    assert learning.epsilon() == pytest.approx(1.0)  # no collector yet: the schedule's start


def test_the_python_api_says_what_the_cli_says(policy, tmp_path):
    """The Python API's wrong inputs get the CLI's one-line errors: a field of the wrong type at `replace` (not a
    TypeError from arithmetic deep in a run), a device this machine lacks at `icrl.load`, and RecurrentPPO's
    positional `deterministic` at `predict`, which would otherwise be read as the reward."""
    from icrl.config import ConfigError, ExperimentConfig

    with pytest.raises(ConfigError, match="total_env_steps must be an integer"):
        ExperimentConfig().replace(total_env_steps="lots")
    cfg = ExperimentConfig()
    object.__setattr__(cfg.schedule, "total_env_steps", "lots")  # past `replace`: icrl.train checks it first
    with pytest.raises(ConfigError, match="total_env_steps must be an integer"):
        icrl.train(cfg)
    for device, words in (("tpu", "not a torch device"), (5, "must be a str or torch.device")) + (
            () if torch.cuda.is_available() else (("cuda", "no usable CUDA device"),)):
        with pytest.raises(ConfigError, match=words):
            icrl.load(tmp_path / "run", device=device)
    obs = policy.observation_space.sample()
    _, state = policy.predict(obs)
    with pytest.raises(TypeError, match="positional"):
        policy.predict(obs, state, False, True)


@pytest.mark.parametrize(("kwargs", "words"), [
    (dict(n_episodes=10**12), "n_episodes must be a whole number from 1"),  # would run for ever
    (dict(n_episodes=0), "n_episodes must be a whole number from 1"),
    (dict(max_steps=0), "max_steps must be a whole number from 1"),  # returned `rollouts: 0` silently
    (dict(parallel_envs=-1), "parallel_envs must be a whole number from 1"),
])
def test_evaluate_refuses_counts_that_hang_or_play_nothing(policy, kwargs, words):
    from icrl.config import ConfigError

    with pytest.raises(ConfigError, match=words):
        icrl.evaluate(policy, **kwargs)


def test_callbacks_refuse_arguments_that_never_stop_or_divide_by_zero():
    from icrl.run.callbacks import CheckpointCallback, EvalCallback, StopTrainingOnRewardThreshold

    for make, words in ((lambda: StopTrainingOnRewardThreshold(float("nan")), "finite"),
                        (lambda: CheckpointCallback(every=0), r"every=\.\.\.\) must be a whole number >= 1"),
                        (lambda: EvalCallback(every=0), r"every=\.\.\.\) must be"),
                        (lambda: EvalCallback(n_episodes=0), r"n_episodes=\.\.\.\) must be")):
        with pytest.raises(ValueError, match=words):
            make()
