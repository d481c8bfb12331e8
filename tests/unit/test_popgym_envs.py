"""POPGym envs: every env of popgym.envs.ALL builds, wraps, collects, keeps returns in [-1, 1], is seeded;
the multi-task mix keeps its task within a rollout and changes it across rollouts."""

from __future__ import annotations

from importlib.util import find_spec

import gymnasium as gym
import numpy as np
import pytest

popgym_envs = pytest.importorskip("popgym.envs", reason="popgym is not installed: pip install 'icrl[popgym]'")

from icrl.envs import Collector, RandomPolicy, TimestepWrapper  # noqa: E402
from icrl.envs.tasks.popgym_envs import (  # noqa: E402
    DEFAULT_MULTI_TASKS,
    FlatDiscreteAction,
    PopGymMulti,
    TupleToDictObs,
    make_popgym,
    popgym_builtin_envs,
    popgym_multi,
)

HAS_MAZELIB = find_spec("mazelib") is not None
_LABYRINTHS = [
    f"Labyrinth{kind}{level}" for kind in ("Escape", "Explore") for level in ("Easy", "Medium", "Hard")
]
# Every env of popgym.envs.ALL, plus the Labyrinth ones (skipped, with the reason) when mazelib is missing.
ALL_NAMES = [cls.__name__ for cls in popgym_envs.ALL] + ([] if HAS_MAZELIB else _LABYRINTHS)
PARAMS = [
    pytest.param(n, marks=pytest.mark.skip(reason="the Labyrinth envs need mazelib (pip install mazelib)"))
    if n.startswith("Labyrinth") and not HAS_MAZELIB
    else n
    for n in ALL_NAMES
]


def _vector(name: str, num_envs: int = 2) -> gym.vector.SyncVectorEnv:
    return gym.vector.SyncVectorEnv(
        [lambda: TimestepWrapper(make_popgym(name))] * num_envs,
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )


def _random_episodes(env: gym.Env, seed: int, episodes: int) -> tuple[list[float], list[float]]:
    """Returns of `episodes` full random episodes and the flat reward sequence."""
    env.action_space.seed(seed)
    env.reset(seed=seed)
    returns, rewards, ret = [], [], 0.0
    while len(returns) < episodes:
        _, r, term, trunc, info = env.step(env.action_space.sample())
        assert "success" not in info  # POPGym defines no success criterion
        ret += r
        rewards.append(r)
        if term or trunc:
            returns.append(ret)
            ret = 0.0
            env.reset()
    return returns, rewards


def test_all_is_covered():
    assert len(popgym_envs.ALL) == 42 + (6 if HAS_MAZELIB else 0)
    names = set(popgym_builtin_envs())
    assert {f"popgym/{cls.__name__}" for cls in popgym_envs.ALL} | {"popgym_multi"} == names


@pytest.mark.parametrize("name", PARAMS)
def test_env_wraps_collects_and_is_bounded(name):
    env = make_popgym(name)
    wrapped = TimestepWrapper(env)  # every observation / action space is accepted
    assert wrapped.observation_space.contains(wrapped.reset(seed=0)[0])

    # ~50 random steps through the vectorised collector
    venv = _vector(name)
    spec = venv.envs[0].action_spec
    collector = Collector(venv, spec, chunk_len=16, seed=0)
    rollouts, _ = collector.collect(RandomPolicy(spec, seed=0), 50)
    assert rollouts and sum(len(r.reward) for r in rollouts) > 0
    venv.close()

    # full random episodes have returns in [-1, 1], and the same seed gives the same rollout
    returns, rewards = _random_episodes(TimestepWrapper(make_popgym(name)), seed=1, episodes=2)
    assert all(-1.0 - 1e-6 <= g <= 1.0 + 1e-6 for g in returns), returns
    assert _random_episodes(TimestepWrapper(make_popgym(name)), seed=1, episodes=2)[1] == rewards


def test_space_adapters():
    env = make_popgym("AutoencodeEasy")
    assert isinstance(env, TupleToDictObs) and isinstance(env.observation_space, gym.spaces.Dict)
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs) and set(obs) == {"0", "1"}
    env = make_popgym("BattleshipEasy")  # MultiDiscrete([8, 8]) board cell -> Discrete(64), row-major
    assert isinstance(env, FlatDiscreteAction) and env.action_space == gym.spaces.Discrete(64)
    assert env.action(8 * 3 + 5).tolist() == [3, 5]
    with pytest.raises(ValueError):
        env.action(64)


def test_names_ids_kwargs_and_errors():
    assert type(make_popgym("popgym-RepeatPreviousEasy-v0").unwrapped).__name__ == "RepeatPreviousEasy"
    with pytest.raises(ValueError, match="Did you mean 'RepeatPreviousEasy'"):
        make_popgym("RepeatPreviusEasy")
    with pytest.raises(ValueError, match="Available .*RepeatFirstHard"):
        make_popgym("nothing_like_it")
    if not HAS_MAZELIB:
        with pytest.raises(ValueError, match="mazelib"):
            make_popgym("LabyrinthEscapeEasy")
    env = make_popgym("RepeatPrevious", num_decks=2, k=3)  # kwargs reach the class
    assert env.unwrapped.k == 3
    with pytest.raises(TypeError):
        make_popgym("RepeatPreviousEasy", bogus=1)


# ------------------------------------------------------------------------------------------- multi-task
def test_multi_common_spaces_and_defaults():
    env = popgym_multi(seed=0)
    assert env.names == list(DEFAULT_MULTI_TASKS)
    assert isinstance(env.observation_space, gym.spaces.Box) and env.observation_space.shape == (13,)
    assert env.action_space == gym.spaces.Discrete(27)  # CountRecallEasy's 27 answers
    wrapped = TimestepWrapper(env)
    for _ in range(10):
        ts, _ = wrapped.reset()
        assert wrapped.observation_space.contains(ts)
        for _ in range(5):
            ts, *_ = wrapped.step(wrapped.action_space.sample())
            assert wrapped.observation_space.contains(ts)
    with pytest.raises(ValueError, match="discrete-action"):
        popgym_multi(["RepeatPreviousEasy", "PositionOnlyPendulumEasy"])
    with pytest.raises(ValueError, match="Unknown POPGym env"):
        popgym_multi(["RepeatPreviousEasy", "Nope"])


def test_multi_task_fixed_within_rollout_and_resampled_across():
    env = PopGymMulti(["RepeatPreviousEasy", "MultiarmedBanditEasy", "MineSweeperEasy"])
    tasks = []
    for rollout in range(30):
        _, info = env.reset(seed=rollout) if rollout == 0 else env.reset(options={"new_task": True})
        task = info["task_id"]
        assert info["task"] == env.task_name == env.names[task]  # the name icrl logs per-task returns under
        tasks.append(task)
        for _ in range(3):  # further episodes of the same rollout keep the task
            _, info = env.reset(options={"new_task": False})
            assert info["task_id"] == task == env.task
    assert len(set(tasks)) >= 2
    assert len({env.reset()[1]["task_id"] for _ in range(30)}) >= 2  # options=None also resamples

    # through TimestepWrapper's meta-RL rollouts: 3 episodes, one task
    wrapped = TimestepWrapper(PopGymMulti(["MineSweeperEasy", "RepeatPreviousEasy"]), episodes_per_rollout=3)
    for seed in range(4):
        _, info = wrapped.reset(seed=seed)
        task, done, episodes = info["task_id"], False, 0
        while not done:
            _, _, term, trunc, info = wrapped.step(wrapped.action_space.sample())
            assert info["task_id"] == task and info["task"] == wrapped.unwrapped.names[task]
            episodes += bool(info.get("episode_end"))
            done = term or trunc
        assert episodes == 3


def test_multi_padding_invalid_actions_and_seeding():
    env = PopGymMulti(["MultiarmedBanditEasy", "CountRecallEasy"], seed=3)
    obs, info = env.reset()
    while env.task_name != "MultiarmedBanditEasy":
        obs, info = env.reset()
    assert obs.shape == (4,) and np.all(obs[2:] == 0)  # Discrete(2) one-hot, zero-padded to 4
    _, _, _, _, info = env.step(26)  # bandit has 10 arms: 26 is executed as arm 0
    assert info["invalid_action"] is True
    _, _, _, _, info = env.step(9)
    assert "invalid_action" not in info

    def rollout(seed):
        e = popgym_multi(seed=seed)
        e.action_space.seed(seed)
        out = []
        for _ in range(4):
            o, i = e.reset()
            out.append((i["task_id"], o.tolist()))
            for _ in range(10):
                o, r, term, trunc, _ = e.step(e.action_space.sample())
                out.append((r, o.tolist()))
                if term or trunc:
                    break
        return out

    assert rollout(5) == rollout(5)
    assert rollout(5) != rollout(6)


def test_multi_through_collector():
    venv = gym.vector.SyncVectorEnv(
        [lambda: TimestepWrapper(popgym_multi())] * 2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    spec = venv.envs[0].action_spec
    rollouts, stats = Collector(venv, spec, seed=0).collect(RandomPolicy(spec, seed=0), 400)
    assert rollouts and stats and all(-1.0 - 1e-6 <= s.ret <= 1.0 + 1e-6 for s in stats)
    venv.close()


def test_multi_task_episode_stats_name_each_rollouts_task():
    """The collector's EpisodeStats carry `info["task"]`: every episode of a 2-episode rollout names the task the
    rollout played (its rewards come from that task: CountRecall's, Bandit's and RepeatPrevious' differ)."""
    from icrl.envs import make_vector_env

    names = ["RepeatPreviousEasy", "MultiarmedBanditEasy", "CountRecallEasy"]
    venv = make_vector_env("popgym_multi", {"names": names}, 3, episodes_per_rollout=2)
    col = Collector(venv, venv.envs[0].action_spec, seed=0)
    rollouts, stats = col.collect(RandomPolicy(col.action_spec, 0), 3 * 450)
    assert rollouts and stats and all(s.task in names for s in stats)
    by_rollout: dict = {}
    for s in stats:
        by_rollout.setdefault((s.env_index, s.rollout_id), set()).add(s.task)
    assert all(len(tasks) == 1 for tasks in by_rollout.values())  # one task per rollout
    assert len({s.task for s in stats}) >= 2  # and another across rollouts
    venv.close()


def test_multi_reward_scales_multiply_each_tasks_rewards_and_nothing_else():
    names = ["RepeatFirstEasy", "HigherLowerEasy"]
    plain = PopGymMulti(names, seed=3)
    scaled = PopGymMulti(names, seed=3, reward_scales={"HigherLowerEasy": 100.0, "popgym-RepeatFirstEasy-v0": 0.5})
    assert scaled.reward_scales == [0.5, 100.0]
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(6):
        (o1, i1), (o2, i2) = plain.reset(), scaled.reset()
        assert i1["task"] == i2["task"] and np.array_equal(o1, o2)
        factor = {"RepeatFirstEasy": 0.5, "HigherLowerEasy": 100.0}[i1["task"]]
        done = False
        while not done:
            a = int(rng.integers(plain.action_space.n))
            o1, r1, t1, tr1, _ = plain.step(a)
            o2, r2, t2, tr2, _ = scaled.step(a)
            assert np.array_equal(o1, o2) and (t1, tr1) == (t2, tr2)
            assert r2 == pytest.approx(r1 * factor)
            if r1 != 0:
                seen.add(i1["task"])
            done = t1 or tr1
    assert seen == set(names)  # both tasks paid rewards, so both factors were checked
    with pytest.raises(ValueError, match="not in names"):
        PopGymMulti(names, reward_scales={"RepeatPreviousEasy": 10.0})
    with pytest.raises(ValueError, match="> 0"):
        PopGymMulti(names, reward_scales={"HigherLowerEasy": 0.0})
    with pytest.raises(ValueError, match="> 0"):
        PopGymMulti(names, reward_scales={"HigherLowerEasy": float("inf")})
