"""Units behind the hostile-input probe (tests/integration/test_probe.py): field validation, non-finite guards, the
run-dir lock, checkpoint consistency checks, env-kwarg errors and the evaluation step cap."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from icrl.config import ConfigError, EnvConfig, ExperimentConfig, LossConfig, ModelConfig
from icrl.config.bounds import field_range
from icrl.config.validation import field_errors
from icrl.data import DiskReplay, make_loader
from icrl.data.storage import CorruptRolloutError, load_rollout, save_rollout
from icrl.envs import Collector, RandomPolicy, make_env, make_vector_env
from icrl.guards import NonFiniteError, assert_finite_weights, first_nonfinite, nonfinite_env_error
from icrl.run.rundir import RunDirLockedError, RunLock, check_not_locked
from icrl.types import ActionSpec

CFG = ExperimentConfig(
    env=EnvConfig(env="tmaze", env_kwargs='{"length": 2}', parallel_envs=2),
    model=ModelConfig(d_model=16, layers=1, heads=2, max_seq_len=8, max_time=16, head_hidden=16, head_layers=1),
    loss=LossConfig(num_critics=2, redq_subset=2, gammas=(0.9, 0.99)),
).replace(eval_rollouts=2, total_env_steps=16, steps_per_epoch=8, batch_size=4, warmup_updates=1, device="cpu")


def _with(group: str, **kw) -> ExperimentConfig:
    return dataclasses.replace(CFG, **{group: dataclasses.replace(getattr(CFG, group), **kw)})


def test_every_range_names_its_flag():
    assert not field_errors(CFG.validate())
    ranged = [(g.name, f.name) for g in dataclasses.fields(CFG) for f in dataclasses.fields(getattr(CFG, g.name))
              if field_range(f) is not None]  # declared on the field: bounded(default, ge=...)
    assert len(ranged) >= 70
    for group, name in ranged:
        hint = type(getattr(getattr(CFG, group), name))
        bad = -(10**6) if hint in (int, type(None)) else -1e6  # below every lower bound
        if name == "seed":
            bad = -1
        errors = field_errors(_with(group, **{name: bad}))
        assert errors and errors[0].startswith(name), (group, name, errors)


@pytest.mark.parametrize(("group", "kw", "word"), [
    ("model", {"heads": "4"}, "integer"),  # a string where config.json should hold an int
    ("loss", {"gammas": (0.9, float("inf"))}, "finite"),
    ("model", {"traj_encoder": "banana"}, "one of"),
    ("optim", {"grad_clip": 0.0}, "> 0"),
    ("run", {"run_dir": " "}, "run_dir"),
])
def test_types_and_finiteness_are_checked(group, kw, word):
    with pytest.raises(ConfigError, match=word):
        _with(group, **kw).validate()


def test_device_checked_unless_asked_not_to():
    cfg = _with("run", device="cuda:99")
    with pytest.raises(ConfigError, match="device"):
        cfg.validate()
    cfg.validate(check_device=False)


def test_env_outputs_must_be_finite():
    """The collector's door: the first env (and key) of a step whose reward or observation is not finite."""
    obs = {"obs": np.ones((2, 2), np.float32), "img": np.zeros((2, 2, 2), np.uint8)}
    assert first_nonfinite(obs, np.array([0.5, 1.0])) is None
    assert first_nonfinite(obs, np.array([0.5, float("inf")])) == (1, "reward")
    assert first_nonfinite({"obs/pos": np.array([[0.0], [np.nan]], np.float32)}) == (1, "obs/pos")
    with pytest.raises(NonFiniteError, match=r"reward \(inf\) at step 4"):
        raise nonfinite_env_error("E", 4, "reward", float("inf"))
    with pytest.raises(NonFiniteError, match="key 'obs/pos'"):
        raise nonfinite_env_error("E", 0, "obs/pos")


def _batch(tmp_path: Path):
    venv = make_vector_env("tmaze", {"length": 2}, 2)
    spec = ActionSpec.from_space(venv.single_action_space)
    rollouts, _ = Collector(venv, spec, seed=0).collect(RandomPolicy(spec, seed=1), 40)
    replay = DiskReplay(tmp_path / "replay", capacity_timesteps=10_000, fsync=False)
    paths = [replay.write(r) for r in rollouts]
    with make_loader(replay.root, batch_size=4, max_seq_len=8, action_spec=spec, seed=0) as loader:
        batch = next(loader)
    return venv, spec, batch, paths


def test_replay_file_with_nan_is_corrupt(tmp_path):
    venv, _, _, paths = _batch(tmp_path)
    venv.close()
    r = load_rollout(paths[0])
    r.reward[0] = np.nan
    save_rollout(paths[0], r, fsync=False)
    with pytest.raises(CorruptRolloutError, match="non-finite"):
        load_rollout(paths[0])


def test_non_finite_update_is_skipped_and_applies_nothing(tmp_path):
    from icrl.agent.learner import Learner
    from icrl.agent.model import Agent

    venv, spec, batch, _ = _batch(tmp_path)
    agent = Agent(venv.single_observation_space["obs"], spec, CFG.model, CFG.loss)
    venv.close()
    learner = Learner(agent, CFG, torch.device("cpu"))
    # parameters, PopArt statistics and EMA targets (σReparam's power-iteration vectors and the observation
    # normaliser legitimately move in the forward pass, from finite weights and observations)
    def learned() -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in agent.state_dict().items()
                if not k.endswith((".u", ".v")) and "obs_norm" not in k}

    before = learned()
    poisoned = dataclasses.replace(batch, reward=batch.reward.clone().fill_(float("nan")))
    learner.update(poisoned)  # decided on the device: no host read, no warning yet
    with pytest.warns(RuntimeWarning, match="non-finite"):
        learner.read_metrics()  # the epoch's one read says so
    after = learned()
    assert [k for k in before if not torch.equal(before[k], after[k])] == [] and learner.guard.skipped == 1
    assert learner.scheduler.last_epoch == 1  # the warm-up counts every update
    assert all(float(s["step"]) == 0 for s in learner.optimizer.state.values())  # AdamW took no step
    assert_finite_weights(agent, "test")
    learner.update(batch)  # a finite batch trains again
    assert any(not torch.equal(before[k], v) for k, v in learned().items() if "critic" in k)
    with torch.no_grad():
        next(agent.parameters()).fill_(float("nan"))
    with pytest.raises(NonFiniteError, match="not finite"):
        assert_finite_weights(agent, "checkpoint ckpt-000001")


def test_a_non_finite_loss_on_another_rank_skips_the_update_here_too(tmp_path):
    """Data parallel: each rank sees only its own loss, but every rank must take the same steps or their
    weights part. The learner skips when the losses summed over the ranks are not finite, so a finite
    update on this rank applies nothing when another rank's loss was NaN (its gradients may still be finite,
    e.g. a NaN in a masked-out term), exactly as one process skips its own NaN loss."""
    from icrl.agent.learner import Learner
    from icrl.agent.model import Agent
    from icrl.parallel import OneProcess

    class OtherRankNaN(OneProcess):
        """Rank 0's view of two ranks whose gradients agree (the all-reduce of identical batches) and whose
        other rank's loss was NaN."""

        world_size = 2

        def reduce_sum(self, x: torch.Tensor) -> torch.Tensor:
            return x + float("nan")

    venv, spec, batch, _ = _batch(tmp_path)
    agent = Agent(venv.single_observation_space["obs"], spec, CFG.model, CFG.loss)
    venv.close()
    learner = Learner(agent, CFG, torch.device("cpu"), OtherRankNaN())
    learned = [k for k in agent.state_dict() if not k.endswith((".u", ".v")) and "obs_norm" not in k]
    before = {k: agent.state_dict()[k].clone() for k in learned}
    metrics = learner.update(batch)
    with pytest.warns(RuntimeWarning, match="non-finite"):
        learner.read_metrics()
    assert torch.isfinite(metrics["loss"]) and torch.isfinite(metrics["grad_norm"])  # this rank's were fine
    assert [k for k in learned if not torch.equal(before[k], agent.state_dict()[k])] == []
    assert learner.guard.skipped == 1


def test_too_many_skipped_updates_in_a_row_stop_the_run_at_the_next_read(tmp_path):
    """The guard counts on the device; the epoch's read raises once max_consecutive updates in a row were
    skipped (then the data or weights are broken), and an applied update between skips restarts the count."""
    from icrl.agent.learner import Learner
    from icrl.agent.model import Agent

    venv, spec, batch, _ = _batch(tmp_path)
    agent = Agent(venv.single_observation_space["obs"], spec, CFG.model, CFG.loss)
    venv.close()
    learner = Learner(agent, CFG, torch.device("cpu"))
    learner.guard.max_consecutive = 3
    poisoned = dataclasses.replace(batch, reward=batch.reward.clone().fill_(float("nan")))
    for b in (poisoned, poisoned, batch, poisoned, poisoned):  # runs of 2: under the limit
        learner.update(b)
    with pytest.warns(RuntimeWarning, match="4 so far"):
        learner.read_metrics()
    learner.update(poisoned)  # the run in progress (2) continues across the read: 3 in a row now
    with pytest.raises(NonFiniteError, match="3 updates in a row"):
        learner.read_metrics()


def test_run_lock_excludes_other_processes(tmp_path):
    run = tmp_path / "run"
    lock = RunLock.acquire(run)
    code = ("import sys; from icrl.run.rundir import RunLock\n"
            "try:\n    RunLock.acquire(sys.argv[1])\nexcept Exception as e:\n    print(e); sys.exit(3)\n")
    out = subprocess.run([sys.executable, "-c", code, str(run)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 3 and "in use by process pid" in out.stdout, out
    check_not_locked(run)  # this process holds it: not a conflict
    lock.release()
    out = subprocess.run([sys.executable, "-c", code, str(run)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out  # released: free again (and freed again by that process's exit)
    RunLock.acquire(run).release()


def test_ranks_checking_a_run_dir_at_once_do_not_see_each_other_as_holders(tmp_path):
    """Every rank of a data-parallel run tests the lock before the barrier; one rank's test in progress (a
    shared lock on its own descriptor, here) is not a holder to another, while an exclusive holder is."""
    import fcntl
    import os

    run = tmp_path / "run"
    RunLock.acquire(run).release()  # leaves RUN_DIR/.lock, as a finished run does
    fd = os.open(run / ".lock", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # another rank's test, mid-way
        check_not_locked(run)
        fcntl.flock(fd, fcntl.LOCK_UN)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a real holder
        with pytest.raises(RunDirLockedError, match="in use by"):
            check_not_locked(run)
    finally:
        os.close(fd)


def test_lock_error_is_a_config_error():
    assert issubclass(RunDirLockedError, ConfigError)


@pytest.mark.parametrize(("kwargs", "word"), [
    ({"length": None}, "'length' must be a number"),
    ({"length": "abc"}, "'length' must be a number"),
    ({"length": 0}, "length=0"),
    ({"horizon": 1}, "horizon=1"),
])
def test_env_kwarg_errors_name_the_kwarg(kwargs, word):
    with pytest.raises(ValueError, match=word):
        make_env("tmaze", kwargs)


def test_evaluation_step_cap_ends_endless_rollouts():
    venv = make_vector_env("tmaze", {"length": 10**11}, 2)
    spec = ActionSpec.from_space(venv.single_action_space)
    collector = Collector(venv, spec, seed=0)
    rollouts, stats = collector.collect_rollouts(RandomPolicy(spec, seed=0), 4, seed=0, max_steps=15)
    venv.close()
    assert collector.capped_rollouts == 2 and len(rollouts) == 2 and len(stats) == 2
    assert all(r.truncated[-1] and len(r.action) == 15 for r in rollouts)


@pytest.mark.parametrize(("at", "step"), [(0, 0), (4, 4)])  # the reset observation, an episode's final one
def test_collector_checks_reset_and_final_observations(at, step):
    import functools

    import gymnasium as gym

    from icrl.envs import TimestepWrapper

    from probe_envs import BadValueEnv

    thunk = functools.partial(lambda: TimestepWrapper(BadValueEnv("obs", at=at, length=4)))
    venv = gym.vector.SyncVectorEnv([thunk] * 2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    spec = ActionSpec.from_space(venv.single_action_space)
    with pytest.raises(NonFiniteError, match=rf"BadValueEnv \(copy 0\) .*'obs'\) at step {step} "):
        Collector(venv, spec, seed=0).collect(RandomPolicy(spec, seed=0), 16)
    venv.close()
