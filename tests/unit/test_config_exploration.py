import dataclasses

import numpy as np
import pytest
import tyro

from icrl.agent.exploration import Exploration
from icrl.config import (
    ConfigError,
    EnvConfig,
    ExperimentConfig,
    ExploreConfig,
    ModelConfig,
    ScheduleConfig,
    TaskDefaults,
    resolve,
)
from icrl.seeding import derive_seed
from icrl.types import ActionSpec

from helpers import explore_config


def test_config_json_round_trip():
    cfg = ExperimentConfig(model=ModelConfig(d_model=64, traj_encoder="gru")).replace(seed=7)
    again = ExperimentConfig.from_json(cfg.to_json())
    assert again == cfg


def test_cli_flags_have_no_group_prefix():
    cfg = tyro.cli(
        ExperimentConfig,
        args=["--env", "tmaze", "--env-kwargs", '{"length": 20}', "--d-model", "64", "--layers", "1", "--seed", "3",
              "--traj-encoder", "lstm", "--gammas", "0.9", "0.99"],
        config=(tyro.conf.OmitArgPrefixes,),
    )
    assert cfg.env.kwargs == {"length": 20}
    assert (cfg.model.d_model, cfg.model.layers, cfg.model.traj_encoder) == (64, 1, "lstm")
    assert cfg.run.seed == 3 and cfg.loss.gammas == (0.9, 0.99)


@pytest.mark.parametrize(
    "change, words",
    [
        (dict(model=ModelConfig(d_model=65, heads=4)), ["d_model", "heads"]),
        (dict(env=dataclasses.replace(ExperimentConfig().env, env_kwargs="{length: 3}")), ["env_kwargs", "JSON"]),
        (dict(env=dataclasses.replace(ExperimentConfig().env, env_kwargs="[1]")), ["env_kwargs", "object"]),
        (dict(schedule=ScheduleConfig(steps_per_epoch=4)), ["steps_per_epoch", "parallel_envs"]),
    ],
)
def test_validation_names_the_fields(change, words):
    with pytest.raises(ConfigError) as info:
        ExperimentConfig(**change).validate()
    for w in words:
        assert w in str(info.value)


def test_derive_seed_is_stable_and_distinct():
    assert derive_seed(0, "a") == derive_seed(0, "a")
    assert len({derive_seed(s, n) for s in range(5) for n in ("a", "b", "c")}) == 15


def test_epsilon_greedy_is_uniform_per_env_and_decays_over_each_envs_steps():
    spec = ActionSpec("discrete", 5)
    cfg = explore_config(eps_start=1.0, eps_end=0.0, eps_anneal_steps=100)
    explore = Exploration(cfg, spec, num_envs=4000, seed=0)
    explore.scale[:] = 1.0
    greedy = np.zeros(4000, dtype=np.int64)
    acts = explore(greedy, env_steps=0, time=np.zeros(4000))
    counts = np.bincount(acts, minlength=5) / 4000
    assert np.allclose(counts, 0.2, atol=0.03)  # uniform over all actions, the greedy one included
    # the anneal counts steps of each env copy: 100 steps each is 400,000 steps of the collector
    assert (explore(greedy, env_steps=100 * 4000, time=np.zeros(4000)) == 0).all()  # fully decayed
    assert explore.level(50 * 4000) == pytest.approx(0.5)
    assert Exploration(cfg, spec, num_envs=8, seed=0).level(50 * 8) == pytest.approx(0.5)  # any env count


def test_per_env_scales_are_redrawn_only_for_new_rollouts():
    explore = Exploration(explore_config(), ActionSpec("discrete", 3), num_envs=6, seed=1)
    before = explore.scale.copy()
    mask = np.array([True, False, False, True, False, False])
    explore.new_rollouts(mask)
    assert (explore.scale[~mask] == before[~mask]).all() and (explore.scale[mask] != before[mask]).all()
    flat = Exploration(explore_config(per_env_scale=False), ActionSpec("discrete", 3), num_envs=6, seed=1)
    flat.new_rollouts(mask)
    assert (flat.scale == 1.0).all()


def test_bilevel_decays_within_rollout_and_noise_for_continuous():
    cfg = explore_config(eps_start=1.0, eps_end=0.2, eps_shape="bilevel", shape_horizon=10, bilevel_end_start=0.1,
                         bilevel_end_end=0.0, eps_anneal_steps=100)
    explore = Exploration(cfg, ActionSpec("discrete", 3), num_envs=3, seed=0)
    explore.scale[:] = 1.0
    level = explore.per_env_level(0, np.array([0, 10, 10]))
    assert level[0] == pytest.approx(1.0) and level[1] == pytest.approx(0.1)
    level = explore.per_env_level(50 * 3, np.array([0, 5, 20]))  # half-way through the anneal
    assert level == pytest.approx([0.6, 0.6 - 0.5 * (0.6 - 0.05), 0.05])
    cont = Exploration(explore_config(noise_start=0.3), ActionSpec("continuous", 2), num_envs=500, seed=0)
    cont.scale[:] = 1.0
    out = cont(np.zeros((500, 2), np.float32), env_steps=0, time=np.zeros(500))
    assert out.dtype == np.float32 and np.abs(out).max() <= 1.0
    assert np.std(out) == pytest.approx(0.3, rel=0.1)


def test_window_shape_explores_at_the_ends_of_the_horizon_only():
    """T-Maze's recipe: the annealed ε at t <= window_start and t >= H - window_end, a fixed small ε between
    (not scaled per env)."""
    cfg = explore_config(eps_start=1.0, eps_shape="window", shape_horizon=100, window_start=1, window_end=4)
    assert cfg.window_eps == pytest.approx(0.005)  # 0.5 / H when unset
    explore = Exploration(cfg, ActionSpec("discrete", 4), num_envs=8, seed=0)
    explore.scale[:] = 0.5
    level = explore.per_env_level(0, np.array([0, 1, 50, 96, 97, 100, 101, 150]))
    assert level == pytest.approx([0.5, 0.005, 0.005, 0.005, 0.5, 0.5, 0.005, 0.005])


def test_unset_fields_take_the_task_recommendation_then_the_defaults():
    from icrl.config import EXPLORE_DEFAULTS
    from icrl.envs.make import task_exploration
    from icrl.run.build import with_task_defaults

    rec = task_exploration("tmaze", {"length": 100})
    assert rec["train_actions"] == "argmax" and rec["eps_shape"] == "window" and rec["shape_horizon"] == 100
    assert task_exploration("tmaze_active", {"length": 10})["shape_horizon"] == 11  # one step more: the cue
    assert task_exploration("cue_recall", {}) == {} and task_exploration("CartPole-v1", {}) == {}
    assert task_exploration("tmaze", {"length": "abc"}) == {}  # advisory: building the env reports the bad kwarg
    cfg = with_task_defaults(ExperimentConfig(env=EnvConfig(env="tmaze", env_kwargs='{"length": 100}')))
    assert cfg.explore.train_actions == "argmax" and cfg.explore.window_eps == pytest.approx(0.005)
    # a field the user sets wins over the task's recommendation; task_recommendation=False ignores it
    mine = ExperimentConfig(env=EnvConfig(env="tmaze"), explore=ExploreConfig(train_actions="sample"))
    assert with_task_defaults(mine).explore.train_actions == "sample"
    off = ExperimentConfig(env=EnvConfig(env="tmaze"), explore=ExploreConfig(task_recommendation=False))
    resolved = with_task_defaults(off).explore
    assert all(getattr(resolved, k) == v for k, v in EXPLORE_DEFAULTS.items() if k != "eps_anneal_steps")
    assert with_task_defaults(cfg) == cfg  # idempotent: resuming resolves to the same config
    with pytest.raises(ConfigError, match="shape_horizon=N"):
        ExperimentConfig(explore=ExploreConfig(eps_shape="window")).validate()


def test_apply_overrides_parses_json_and_names_bad_keys():
    from icrl.config import apply_overrides

    cfg = apply_overrides(ExperimentConfig(), ["optim.lr=0.001", "loss.gammas=[0.9, 0.99]", "env.env=tmaze_active"])
    assert cfg.optim.lr == 0.001 and cfg.loss.gammas == (0.9, 0.99) and cfg.env.env == "tmaze_active"
    with pytest.raises(ConfigError, match="train.nope"):
        apply_overrides(cfg, ["train.nope=1"])


def test_the_anneal_follows_the_budget_unless_a_task_or_the_user_sets_it():
    from icrl.config.explore import ANNEAL_FRACTION
    from icrl.run.build import with_task_defaults

    def anneal(**fields):
        return with_task_defaults(ExperimentConfig().replace(**fields)).explore.eps_anneal_steps

    # half of each env copy's share of the budget: CartPole-v1 with 8 envs and 50,000 env steps anneals over
    # 3,125 steps per env (the fixed 100,000 per env never ended: 800,000 env steps)
    assert ANNEAL_FRACTION == 0.5
    assert anneal(env="CartPole-v1", total_env_steps=50_000, parallel_envs=8) == 3_125
    assert anneal(env="CartPole-v1", total_env_steps=50_000, parallel_envs=16) == 1_562
    assert anneal(env="CartPole-v1") == 100_000 // 8 // 2  # the library's default budget
    assert anneal(env="CartPole-v1", total_env_steps=10_000_000, parallel_envs=8) == 100_000  # the cap
    assert anneal(env="CartPole-v1", total_env_steps=3, parallel_envs=8) == 1
    # a task's recommendation (T-Maze: 100,000) and the user's value win; so does a preset's
    assert anneal(env="tmaze", total_env_steps=50_000) == 100_000
    assert anneal(env="CartPole-v1", total_env_steps=50_000, eps_anneal_steps=777) == 777
    # the budget is resolved first, from the task where unset (T-Maze 500: 1,000,000 env steps)
    cfg = with_task_defaults(ExperimentConfig().replace(env="tmaze", env_kwargs='{"length": 500}',
                                                        task_recommendation=False))
    assert cfg.schedule.total_env_steps == 1_000_000 and cfg.explore.eps_anneal_steps == 62_500
    assert with_task_defaults(cfg) == cfg  # idempotent: a resumed run keeps its anneal


def test_the_warm_up_follows_the_planned_updates_unless_set(tmp_path):
    """10% of the planned updates, at most the official 500: a 10,000-env-step POPGym run (410 planned updates)
    no longer spends itself below the full learning rate; long runs keep 500; a resumed run keeps its own."""
    from icrl.config.training import WARMUP_FRACTION, WARMUP_UPDATES
    from icrl.run.build import with_task_defaults

    def warmup(**fields):
        cfg = with_task_defaults(ExperimentConfig().replace(**fields))
        assert resolve(cfg) == cfg  # recorded as resolved: resolving again changes nothing
        return cfg.optim.warmup_updates

    assert (WARMUP_FRACTION, WARMUP_UPDATES) == (0.1, 500)
    popgym = {"env": "CartPole-v1", "d_model": 128, "max_seq_len": 64, "parallel_envs": 8}
    assert warmup(total_env_steps=10_000, **popgym) == 41  # 10 epochs of round(64 * 1000 / (24 * 65)) = 41
    assert warmup(total_env_steps=10_000_000, **popgym) == 500  # the cap
    assert warmup(total_env_steps=10_000, updates_per_epoch=2, **popgym) == 2
    assert warmup(total_env_steps=8, **popgym) == 1  # at least one
    assert warmup(env="tmaze", env_kwargs='{"length": 100}') == 500  # its recommended budget: 200,000 env steps
    assert warmup(total_env_steps=10_000, warmup_updates=7, **popgym) == 7  # the user's value wins

    cfg = with_task_defaults(ExperimentConfig().replace(total_env_steps=10_000, run_dir=str(tmp_path), **popgym))
    (tmp_path / "config.json").write_text(cfg.to_json())
    resumed = ExperimentConfig().replace(total_env_steps=100_000, resume=True, run_dir=str(tmp_path), **popgym)
    assert with_task_defaults(resumed).optim.warmup_updates == 41  # not 410: derived from the old budget


def test_one_resolution_takes_the_flag_then_the_task_then_the_library_default():
    """`resolve(cfg, task)` is the one place unset fields get their values; the task's recommendations come in as
    plain data (the env layer asks the task: icrl.envs.make.task_defaults), and every derived value follows."""
    from icrl.config.training import DEFAULT_ENV_STEPS

    task = TaskDefaults(exploration={"train_actions": "argmax", "eps_shape": "window", "shape_horizon": 300},
                        context=301, budget=600_000)
    cfg = resolve(ExperimentConfig(), task)
    assert (cfg.schedule.total_env_steps, cfg.model.max_seq_len) == (600_000, 301)
    assert cfg.explore.train_actions == "argmax" and cfg.explore.window_eps == pytest.approx(0.5 / 300)
    assert cfg.explore.eps_anneal_steps == 600_000 // 8 // 2  # half of each env copy's share of the budget
    assert (cfg.loss.n_step, cfg.loss.popart_max_ratio) == (301 // 64, 5.0)  # a long context, greedy windows
    assert cfg.optim.warmup_updates == 500 and cfg.optim.compile is not None
    assert all(getattr(cfg.explore, f) is not None for f in ("eps_start", "per_env_scale", "noise_end"))
    assert resolve(cfg, task) == cfg  # idempotent
    mine = resolve(ExperimentConfig().replace(total_env_steps=2_000, max_seq_len=64, train_actions="sample"), task)
    assert (mine.schedule.total_env_steps, mine.model.max_seq_len, mine.explore.train_actions) == (2_000, 64, "sample")
    library = resolve(ExperimentConfig())
    assert (library.schedule.total_env_steps, library.explore.train_actions) == (DEFAULT_ENV_STEPS, "sample")
    assert resolve(ExperimentConfig().replace(total_env_steps=300)).schedule.steps_per_epoch == 300  # one epoch
    with pytest.raises(ConfigError, match="unknown fields"):
        resolve(ExperimentConfig(), TaskDefaults(exploration={"eps_strat": 0.5}))


def test_a_resumed_run_keeps_its_schedule_under_a_new_budget_and_says_so(tmp_path, capsys):
    """Resolving with the run's record (`recorded`) keeps its ε anneal and warm-up where the flags leave them unset,
    while a flag still wins; `with_task_defaults` reads the record on --resume and says what stayed."""
    from icrl.config.resolve import kept_on_resume
    from icrl.run.build import with_task_defaults

    first = resolve(ExperimentConfig().replace(total_env_steps=10_000))
    grown = ExperimentConfig().replace(total_env_steps=1_000_000)
    again = resolve(grown, recorded=first)
    assert (again.explore.eps_anneal_steps, again.optim.warmup_updates) == (
        first.explore.eps_anneal_steps, first.optim.warmup_updates)
    assert resolve(grown).explore.eps_anneal_steps != first.explore.eps_anneal_steps  # derived again without it
    assert resolve(grown.replace(eps_anneal_steps=7), recorded=first).explore.eps_anneal_steps == 7  # a flag wins
    assert "eps_anneal_steps" not in kept_on_resume(grown.replace(eps_anneal_steps=7), first)

    (tmp_path / "config.json").write_text(first.replace(run_dir=str(tmp_path)).to_json())
    resumed = with_task_defaults(grown.replace(resume=True, run_dir=str(tmp_path)))
    assert resumed.explore.eps_anneal_steps == first.explore.eps_anneal_steps
    out = " ".join(capsys.readouterr().out.split())
    assert "--resume: 10,000 -> 1,000,000 env steps" in out and "not derived again" in out
