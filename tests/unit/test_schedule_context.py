"""What a run resolves from its task and config before it starts, and how many updates an epoch makes: the context a
task recommends, presets built for the env kwargs given, the replay-ratio update budget, the compile rule and
its eager fallback."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from icrl.agent.learner import Learner
from icrl.config import ConfigError, EnvConfig, ExperimentConfig, LossConfig, ModelConfig, TaskDefaults, resolve
from icrl.config.model import DEFAULT_CONTEXT
from icrl.config.presets import preset_config
from icrl.config.training import DEFAULT_ENV_STEPS
from icrl.envs.make import task_budget, task_context
from icrl.run.build import with_task_defaults
from icrl.run.schedule import UpdateBudget


def test_tasks_recommend_the_context_of_their_whole_rollout():
    assert task_context("tmaze", {"length": 500}) == 501
    assert task_context("tmaze", {"length": 50, "horizon": 80}) == 80  # the last decision can come at step 79
    assert task_context("tmaze_active", {"length": 10}) == 12  # left to the cue first
    assert task_context("cue_recall", {"delay": 7}) == 8
    assert task_context("CartPole-v1", {}) is None and task_context("tmaze", {"length": "x"}) is None


def test_popgym_games_recommend_their_episode_length():
    pytest.importorskip("popgym")
    assert task_context("popgym/RepeatPreviousEasy", {}) == 51
    assert task_context("popgym/RepeatFirstHard", {}) == 831  # longer than the default 256: the cue stays in view
    assert task_context("popgym/HigherLowerEasy", {}) is None  # no fixed length: the default context


def test_an_unset_context_resolves_from_the_task_and_meta_rl_rollouts_hold_every_episode():
    cfg = ExperimentConfig(env=EnvConfig(env="tmaze", env_kwargs='{"length": 500}'))
    assert cfg.model.max_seq_len is None and cfg.model.context == DEFAULT_CONTEXT
    assert with_task_defaults(cfg).model.max_seq_len == 501
    assert with_task_defaults(cfg.replace(max_seq_len=64)).model.max_seq_len == 64  # a set value is kept
    assert with_task_defaults(cfg.replace(env="CartPole-v1", env_kwargs="{}")).model.max_seq_len == DEFAULT_CONTEXT
    episode = TaskDefaults(context=11)
    meta = ExperimentConfig().replace(episodes_per_rollout=3)
    assert resolve(meta, episode).model.max_seq_len == 3 * 12  # each episode's final timestep stays in the rollout
    assert resolve(ExperimentConfig().replace(rollout_horizon=40), episode).model.max_seq_len == 40
    assert resolve(meta).model.max_seq_len == DEFAULT_CONTEXT


def test_an_unset_budget_resolves_from_the_task_and_a_set_one_is_kept():
    cfg = ExperimentConfig(env=EnvConfig(env="tmaze", env_kwargs='{"length": 500}'))
    assert cfg.schedule.total_env_steps is None and cfg.schedule.env_steps == DEFAULT_ENV_STEPS
    assert with_task_defaults(cfg).schedule.total_env_steps == 1_000_000  # 2,000 per cell
    assert task_budget("tmaze", {"length": 20}) == DEFAULT_ENV_STEPS  # short corridors: the floor
    assert with_task_defaults(cfg.replace(total_env_steps=5_000)).schedule.total_env_steps == 5_000
    gym_id = with_task_defaults(cfg.replace(env="CartPole-v1", env_kwargs="{}"))
    assert gym_id.schedule.total_env_steps == DEFAULT_ENV_STEPS  # Gymnasium ids recommend nothing

    class OwnTask:  # a user's env class recommends its own budget through the same hook
        @staticmethod
        def recommended_budget(size: int = 1, **_: object) -> int:
            return 3_000 * size

    assert task_budget("mine", {"size": 4}, factory=OwnTask) == 12_000
    assert task_budget("mine", {}, factory=type("Bad", (), {"recommended_budget": staticmethod(lambda: -1)})) is None


def test_presets_follow_the_env_kwargs_they_are_given():
    cfg = preset_config("tmaze", {"length": 50})
    assert cfg.env.kwargs == {"length": 50} and cfg.run.run_dir == "runs/tmaze50"
    assert cfg.schedule.total_env_steps == 25_000  # 500 x length, not the length-20 budget
    assert with_task_defaults(cfg).model.max_seq_len == 51  # was the preset's fixed 21: the cue out of reach
    kept = preset_config("tmaze", {"length": 30, "horizon": 40})  # a kwarg the preset does not take passes through
    assert kept.env.kwargs == {"length": 30, "horizon": 40}
    assert preset_config("tmaze") == preset_config("tmaze", {})
    with pytest.raises(ConfigError, match="preset tmaze cannot take"):
        preset_config("tmaze", {"length": "long"})
    with pytest.raises(ConfigError, match="unknown preset"):
        preset_config("nope")


def _budget(**kw) -> UpdateBudget:
    base = dict(batch_size=4, max_seq_len=9, replay_ratio=8.0, steps_per_epoch=100)
    return UpdateBudget(ExperimentConfig().replace(**{**base, **kw}))


def test_the_update_budget_trains_replay_ratio_timesteps_per_collected_one():
    b = _budget()  # training window 10; 4 windows per update
    # rollouts of 5 and 15 timesteps: windows hold 5 and 10 -> 4 * 7.5 = 30 timesteps per update
    assert b.updates(100, [5, 15]) == 26  # 8 * 100 = 800 timesteps: 26 updates, 20 carried
    assert b.carry == pytest.approx(20.0)
    assert b.updates(100, [5, 15]) == 27  # 820 -> 27 updates, 10 carried: the long-run ratio is exact
    assert b.updates(100, []) == 0 and b.carry == pytest.approx(10.0)  # nothing to sample: nothing accrues
    short = _budget()
    assert short.updates(100, [3] * 4) == 800 // 12  # short episodes: more, cheaper updates
    assert _budget(updates_per_epoch=7).updates(100, [5]) == 7  # a fixed count wins
    assert UpdateBudget(ExperimentConfig().replace(batch_size=4, max_seq_len=9, replay_ratio=8.0), world_size=2
                        ).updates(100, [10]) == 800 // 80  # every rank's batch counts


def test_fixed_update_counts_where_one_is_needed_come_from_the_ratio():
    cfg = ExperimentConfig().replace(batch_size=24, max_seq_len=255, replay_ratio=64.0, steps_per_epoch=1000)
    assert cfg.epoch_updates == round(64 * 1000 / (24 * 256))
    assert cfg.replace(updates_per_epoch=3).epoch_updates == 3


def test_compiling_is_decided_by_the_size_and_length_of_the_run():
    big = ExperimentConfig(model=ModelConfig(max_seq_len=501)).replace(total_env_steps=400_000, updates_per_epoch=100,
                                                                       device="cpu")

    def compiles(cfg: ExperimentConfig) -> bool | None:
        return resolve(cfg).optim.compile

    assert compiles(big)  # 24 x 502 timesteps per batch, 40,000 updates
    assert not compiles(big.replace(total_env_steps=5_000))  # 500 updates: the compile would not pay back
    assert not compiles(big.replace(max_seq_len=21))  # 528 timesteps per batch
    assert not compiles(big.replace(traj_encoder="gru"))
    assert compiles(big.replace(total_env_steps=5_000, compile=True)) and not compiles(big.replace(compile=False))
    # captured updates (a CUDA device, told by the caller: a config never asks the machine) leave a compile less to
    # save per update, so it needs a longer run to repay itself
    short = big.replace(total_env_steps=30_000)  # 3,000 updates
    assert resolve(short).optim.compile and not resolve(short, on_cuda=True).optim.compile
    assert resolve(short.replace(cuda_graphs=False), on_cuda=True).optim.compile


def test_a_failed_compile_falls_back_to_eager_with_one_warning(tmp_path, monkeypatch):
    from test_agent import _experiment, build_agent, real_batch

    batch, obs_space, spec = real_batch("discrete", tmp_path / "replay")
    agent = build_agent(obs_space, spec)
    calls = []

    def broken_compile(fn):
        def compiled(*args, **kwargs):
            calls.append(1)
            raise RuntimeError("inductor: no C++ compiler\nlong details")
        return compiled

    monkeypatch.setattr(torch, "compile", broken_compile)
    learner = Learner(agent, _experiment().replace(compile=True), torch.device("cpu"))
    with pytest.warns(UserWarning, match="torch.compile of the learner failed .*RuntimeError: inductor: no C"):
        m1 = learner.update(batch)
    m2 = learner.update(batch)  # eager from now on: no second attempt, no second warning
    assert len(calls) == 1 and np.isfinite(float(m1["loss"])) and np.isfinite(float(m2["loss"]))


@pytest.mark.slow
def test_the_compiled_learner_computes_what_the_eager_one_does(tmp_path):
    from test_agent import _experiment, build_agent, real_batch

    batch, obs_space, spec = real_batch("discrete", tmp_path / "replay")
    losses = {}
    for compile in (False, True):
        agent = build_agent(obs_space, spec)
        learner = Learner(agent, _experiment().replace(compile=compile), torch.device("cpu"))
        with torch.random.fork_rng():
            torch.manual_seed(0)
            losses[compile] = [float(learner.update(batch)["loss"]) for _ in range(3)]
    np.testing.assert_allclose(losses[True], losses[False], rtol=1e-4)


def test_long_contexts_get_the_popart_floor_and_n_step_returns_where_exploration_keeps_windows_greedy():
    tmaze = lambda length: ExperimentConfig(env=EnvConfig(env="tmaze", env_kwargs=json.dumps({"length": length})))  # noqa: E731
    short, long = with_task_defaults(tmaze(100)).loss, with_task_defaults(tmaze(500)).loss
    assert (short.n_step, short.popart_max_ratio, short.popart_floor) == (1, 0.0, None)  # context 101
    assert (long.n_step, long.popart_max_ratio, long.popart_floor) == (7, 5.0, 5.0)  # context 501: 501 // 64
    assert with_task_defaults(tmaze(1000)).loss.n_step == 15
    at_default = with_task_defaults(ExperimentConfig(env=EnvConfig(env="CartPole-v1"))).loss
    assert (at_default.n_step, at_default.popart_floor) == (1, None)  # the default context, 256, is not long
    flat = with_task_defaults(ExperimentConfig(env=EnvConfig(env="CartPole-v1"),
                                               model=ModelConfig(max_seq_len=500))).loss
    assert (flat.n_step, flat.popart_floor) == (1, 5.0)  # long, but flat ε-greedy: n-step windows hold random actions
    flat_tmaze = with_task_defaults(tmaze(500).replace(eps_shape="flat")).loss
    assert (flat_tmaze.n_step, flat_tmaze.popart_floor) == (1, 5.0)
    kept = with_task_defaults(tmaze(500).replace(n_step=3, popart_max_ratio=0.0)).loss  # set values are kept
    assert (kept.n_step, kept.popart_floor) == (3, None)
    unresolved = ExperimentConfig().loss  # the Python API without a run: the short-context loss
    assert (unresolved.td_steps, unresolved.popart_floor) == (1, None)
    with pytest.raises(ConfigError, match="n_step 64 must be below max_seq_len 64"):
        ExperimentConfig().replace(n_step=64, max_seq_len=64).validate()


def test_the_entropy_bonus_defaults_by_the_kind_of_action_space_and_is_recorded_as_a_number():
    """Unset, `entropy_coeff` resolves from the action space once the envs exist: CATEGORICAL_ENTROPY_COEFF for
    Discrete actions, 0 for continuous and multi-binary ones; a set value, or (resuming) the run's recorded one,
    is kept; a config built by hand reads the same rule (`entropy_for`)."""
    from icrl.config.loss import CATEGORICAL_ENTROPY_COEFF

    assert ExperimentConfig().loss.entropy_coeff is None and resolve(ExperimentConfig()).loss.entropy_coeff is None
    assert resolve(ExperimentConfig(), discrete=True).loss.entropy_coeff == CATEGORICAL_ENTROPY_COEFF > 0
    assert resolve(ExperimentConfig(), discrete=False).loss.entropy_coeff == 0.0
    assert resolve(ExperimentConfig().replace(entropy_coeff=0.0), discrete=True).loss.entropy_coeff == 0.0  # AMAGO's
    once = resolve(ExperimentConfig(), discrete=True)
    assert resolve(once, discrete=False) == once  # idempotent: a resolved value is a set value
    trained_without = resolve(ExperimentConfig().replace(entropy_coeff=0.0), discrete=True)  # e.g. an older run
    assert resolve(ExperimentConfig(), recorded=trained_without, discrete=True).loss.entropy_coeff == 0.0  # resumed
    assert (LossConfig().entropy_for(True), LossConfig().entropy_for(False)) == (CATEGORICAL_ENTROPY_COEFF, 0.0)
    assert LossConfig(entropy_coeff=0.1).entropy_for(False) == 0.1
    assert json.loads(once.to_json())["loss"]["entropy_coeff"] == CATEGORICAL_ENTROPY_COEFF


@pytest.mark.parametrize("env, expected", [("tmaze", 0.03), ("Pendulum-v1", 0.0)])
def test_a_run_records_the_entropy_bonus_its_action_space_gets(tmp_path, env, expected):
    """The run builder resolves the bonus once the envs exist, so config.json (and the learner) hold the number."""
    from icrl.run.build import build_run
    from icrl.run.sources import OwnEnvs

    cfg = ExperimentConfig(env=EnvConfig(env=env)).replace(run_dir=str(tmp_path / "run"), total_env_steps=64,
                                                            device="cpu", seed=0)
    run = build_run(cfg, kind=OwnEnvs)
    try:
        assert run.cfg.loss.entropy_coeff == expected == run.learner.cfg.loss.entropy_coeff
    finally:
        run.close()
        if run.lock is not None:
            run.lock.release()


def test_the_learner_is_freed_by_reference_counting(tmp_path):
    """No cycle through the learner: a data-parallel learner's DDP wrapper (and the gloo work its reducer
    holds) is freed with the run, not by a garbage collection that may first run at interpreter shutdown,
    where freeing it aborts the process. A loss module holding the learner's bound method was such a cycle."""
    import gc
    import weakref

    from test_agent import _experiment, build_agent, real_batch

    batch, obs_space, spec = real_batch("discrete", tmp_path / "replay")
    torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])  # torch's first optimizer leaks its frames: not ours
    gc.collect()
    learner = Learner(build_agent(obs_space, spec), _experiment(), torch.device("cpu"))
    learner.update(batch)
    alive, loss = weakref.ref(learner), weakref.ref(learner.loss)
    gc.disable()
    try:
        del learner
        assert alive() is None and loss() is None
    finally:
        gc.enable()


def test_release_wrapper_leaves_a_learner_that_still_updates(tmp_path):
    from test_agent import _experiment, build_agent, real_batch

    batch, obs_space, spec = real_batch("discrete", tmp_path / "replay")
    learner = Learner(build_agent(obs_space, spec), _experiment(), torch.device("cpu"))
    learner.release_wrapper()
    assert learner.loss is learner.loss_module and np.isfinite(float(learner.update(batch)["loss"]))
