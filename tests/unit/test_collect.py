"""Collector and env factories on real vector envs (sync and async), checked against single-env replays."""

from __future__ import annotations

from collections import defaultdict

import gymnasium as gym
import numpy as np
import pytest

from icrl.envs import (
    BUILTIN_ENVS,
    Collector,
    RandomPolicy,
    TimestepWrapper,
    TMaze,
    make_env,
    make_vector_env,
    make_wrapped_env,
)
from icrl.types import Rollout

TASK = ("tmaze", {"length": 2, "horizon": 6})  # random actions often reach an end, episodes vary in length


class RecordingPolicy(RandomPolicy):
    """Random actions; records what it saw so the test can compare it with what was stored."""

    def __init__(self, spec, seed):
        super().__init__(spec, seed)
        self.seen: list[dict] = []

    def act(self, ts, new_rollout):
        actions = super().act(ts, new_rollout)
        self.seen.append(
            {
                "prev_action": ts.prev_action[:, 0].numpy().copy(),
                "prev_reward": ts.prev_reward[:, 0].numpy().copy(),
                "time": ts.time[:, 0].numpy().copy(),
                "new_rollout": new_rollout.copy(),
            }
        )
        return actions


def by_env(collector: Collector, rollouts: list[Rollout]) -> dict[int, list[tuple[int, Rollout]]]:
    out = defaultdict(list)
    for (i, rid), r in zip(collector.last_sources, rollouts):
        out[i].append((rid, r))
    return out


def replay_check(pieces: list[Rollout], seed: int, episodes_per_rollout: int, chunked: bool) -> None:
    """Replay one env's stored actions on a fresh single env: every stored timestep must match, in order."""
    env = make_wrapped_env(*TASK, episodes_per_rollout=episodes_per_rollout)
    ts, _ = env.reset(seed=seed)
    for piece in pieces:
        if piece.time[0] == 0:
            assert piece.reset[0] and not piece.prev_action[0].any() and piece.prev_reward[0] == 0
        np.testing.assert_array_equal(piece.obs["obs"][0], ts["obs"]["obs"])
        assert piece.time[0] == ts["time"]
        done = False
        for t, a in enumerate(piece.action):
            ts, r, term, trunc, _ = env.step(a)
            np.testing.assert_array_equal(piece.obs["obs"][t + 1], ts["obs"]["obs"])
            np.testing.assert_array_equal(piece.prev_action[t + 1], ts["prev_action"])
            assert piece.prev_reward[t + 1] == ts["prev_reward"] == np.float32(r) == piece.reward[t]
            assert piece.time[t + 1] == ts["time"] == piece.time[t] + 1
            assert piece.reset[t + 1] == bool(ts["reset"])
            assert (piece.terminated[t], piece.truncated[t]) == (term, trunc)
            done = term or trunc
            assert done == (t == len(piece.action) - 1) or (chunked and not done)
        if done:
            ts, _ = env.reset()


@pytest.mark.parametrize("asynchronous", [False, True])
@pytest.mark.parametrize("chunk_len", [None, 4])
def test_no_step_lost_or_duplicated(asynchronous, chunk_len):
    n, seed, k = 3, 11, 2
    venv = make_vector_env(*TASK, n, asynchronous=asynchronous, episodes_per_rollout=k)
    spec = TimestepWrapper(TMaze()).action_spec
    col = Collector(venv, spec, chunk_len=chunk_len, seed=seed)
    policy = RecordingPolicy(spec, seed=0)
    pieces = defaultdict(list)
    for _ in range(3):  # buffers persist across calls
        rollouts, _ = col.collect(policy, 40)
        for i, rs in by_env(col, rollouts).items():
            pieces[i].extend(r for _, r in rs)
    venv.close()
    steps = 3 * 14
    assert col.total_env_steps == steps * n
    ends = [r for rs in pieces.values() for r in rs if r.terminated[-1] or r.truncated[-1]]
    assert col.total_rollouts == len(ends) and any(r.terminated[-1] for r in ends)
    for i in range(n):
        assert pieces[i], "every env finished something"
        for r in pieces[i]:
            r.validate()
            assert r.action.dtype == np.int64 and r.time.dtype == np.int64 and r.reset.dtype == bool
            assert np.all(np.diff(r.time) == 1)
            if chunk_len is not None:
                assert len(r.action) <= chunk_len
                assert len(r.action) == chunk_len or r.terminated[-1] or r.truncated[-1]
        replay_check(pieces[i], seed + i, k, chunked=chunk_len is not None)
        # chunks of one rollout share their boundary timestep
        for a, b in zip(pieces[i], pieces[i][1:]):
            if not (a.terminated[-1] or a.truncated[-1]):
                assert b.time[0] == a.time[-1] and np.array_equal(b.obs["obs"][0], a.obs["obs"][-1])
            else:
                assert b.time[0] == 0
        # the policy saw exactly what was stored, and new_rollout only at hard resets
        stored_t = np.concatenate([p.time[:-1] for p in pieces[i]])  # every acted-on timestep, once
        seen_t = np.array([s["time"][i] for s in policy.seen])[: len(stored_t)]
        np.testing.assert_array_equal(seen_t, stored_t)
        stored_pa = np.concatenate([p.prev_action[:-1] for p in pieces[i]])
        seen_pa = np.stack([s["prev_action"][i] for s in policy.seen])[: len(stored_pa)]
        np.testing.assert_array_equal(seen_pa, stored_pa)
        stored_pr = np.concatenate([p.prev_reward[:-1] for p in pieces[i]])
        seen_pr = np.array([s["prev_reward"][i] for s in policy.seen])[: len(stored_pr)]
        np.testing.assert_array_equal(seen_pr, stored_pr)
        seen_new = np.array([s["new_rollout"][i] for s in policy.seen])[: len(stored_t)]
        np.testing.assert_array_equal(seen_new, stored_t == 0)


def test_episode_stats_match_rollouts():
    n, k = 2, 3
    venv = make_vector_env(*TASK, n, episodes_per_rollout=k)
    col = Collector(venv, TimestepWrapper(TMaze()).action_spec, seed=0)
    rollouts, stats = col.collect(RandomPolicy(col.action_spec, 1), 200)
    per_rollout = defaultdict(list)
    for s in stats:
        per_rollout[(s.env_index, s.rollout_id)].append(s)
    assert rollouts and len(per_rollout) == len(rollouts)
    for src, r in zip(col.last_sources, rollouts):
        eps = per_rollout[src]
        assert [e.episode_index for e in eps] == list(range(k))
        assert sum(e.ret for e in eps) == pytest.approx(float(r.reward.sum()))
        assert sum(e.length for e in eps) == len(r.action) - (k - 1)  # bridge steps belong to no episode
        assert all(e.success in (0.0, 1.0) for e in eps)
        assert all((e.ret > 0.25) == (e.success == 1.0) for e in eps)  # success: ret >= 1 - 3/6
        assert int(r.reset.sum()) == k


def test_same_seed_same_rollouts():
    def run():
        venv = make_vector_env(*TASK, 2, episodes_per_rollout=2)
        col = Collector(venv, TimestepWrapper(TMaze()).action_spec, seed=5)
        return col.collect(RandomPolicy(col.action_spec, 3), 60)

    (ra, sa), (rb, sb) = run(), run()
    assert len(ra) == len(rb) > 0 and sa == sb
    for a, b in zip(ra, rb):
        for key, arr in a.to_arrays().items():
            np.testing.assert_array_equal(arr, b.to_arrays()[key])


def test_collect_rollouts_count_and_prefix():
    venv = make_vector_env(*TASK, 3, episodes_per_rollout=2)
    col = Collector(venv, TimestepWrapper(TMaze()).action_spec, chunk_len=2)
    rollouts, stats = col.collect_rollouts(RandomPolicy(col.action_spec, 0), 4, seed=7)
    assert len(rollouts) == 6  # ceil(4 / 3) = 2 whole rollouts per env, chunking does not apply
    assert [i for i, _ in col.last_sources] == [0, 0, 1, 1, 2, 2]
    assert len(stats) == 12 and col.total_env_steps == 0 and col.eval_env_steps > 0
    for r in rollouts:
        assert r.time[0] == 0 and r.reset[0] and (r.terminated[-1] or r.truncated[-1])
    more, _ = col.collect_rollouts(RandomPolicy(col.action_spec, 0), 9, seed=7)
    assert len(more) == 9
    more_by_env = {i: [r for _, r in rs] for i, rs in by_env(col, more).items()}
    # the same seeds give the same first rollouts per env: the smaller result is a per-env prefix
    for j, r in enumerate(rollouts):
        np.testing.assert_array_equal(r.action, more_by_env[j // 2][j % 2].action)
        np.testing.assert_array_equal(r.obs["obs"], more_by_env[j // 2][j % 2].obs["obs"])
    # training collection afterwards starts from a hard reset, in chunks of 2 actions
    after, _ = col.collect(RandomPolicy(col.action_spec, 0), 30)
    for _i, rs in by_env(col, after).items():
        assert rs[0][1].time[0] == 0 and all(len(r.action) <= 2 for _, r in rs)


@pytest.mark.parametrize(
    "env_id, kind, dtype, shape",
    [("Pendulum-v1", "continuous", np.float32, (1,)), ("CartPole-v1", "discrete", np.int64, ())],
)
def test_gym_envs_action_storage(env_id, kind, dtype, shape):
    venv = make_vector_env(env_id, {"max_episode_steps": 5}, 2)
    spec = make_wrapped_env(env_id).action_spec
    assert spec.kind == kind
    col = Collector(venv, spec, seed=0)
    rollouts, stats = col.collect(RandomPolicy(spec, 0), 12)
    assert rollouts and all(r.action.dtype == dtype and r.action.shape[1:] == shape for r in rollouts)
    assert all(s.success is None for s in stats)
    if kind == "continuous":
        assert all(np.abs(r.action).max() <= 1 for r in rollouts)


def test_multibinary_collection():
    class Bits(gym.Env):
        observation_space = gym.spaces.Discrete(3)
        action_space = gym.spaces.MultiBinary(4)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.t = 0
            return 0, {}

        def step(self, action):
            self.t += 1
            return self.t % 3, float(np.sum(action)), False, self.t >= 3, {}

    venv = gym.vector.SyncVectorEnv(
        [lambda: TimestepWrapper(Bits())] * 2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    spec = venv.envs[0].action_spec
    col = Collector(venv, spec, seed=0)
    rollouts, _ = col.collect(RandomPolicy(spec, 0), 6)
    assert len(rollouts) == 2
    for r in rollouts:
        assert r.action.dtype == np.int8 and r.action.shape == (3, 4)
        np.testing.assert_array_equal(r.reward, r.action.sum(1))
        np.testing.assert_array_equal(r.prev_action[1:], r.action.astype(np.float32))


def test_collector_rejects_next_step_autoreset():
    venv = gym.vector.SyncVectorEnv([lambda: TimestepWrapper(TMaze())])
    with pytest.raises(ValueError, match="SAME_STEP"):
        Collector(venv, venv.envs[0].action_spec)


# --------------------------------------------------------------------------------------------- factories
def test_make_env_forms():
    assert isinstance(make_env("tmaze", {"length": 3}), TMaze) and "tmaze" in BUILTIN_ENVS
    assert make_env("CartPole-v1").spec.id == "CartPole-v1"
    env = make_env("icrl.envs.tasks.tmaze:TMaze", {"length": 4})
    assert isinstance(env, TMaze) and env.length == 4


def test_make_env_errors():
    with pytest.raises(ValueError, match="no-such-env") as e:
        make_env("no-such-env")
    # a few lines at most: the forms, the families and where the full list is, not every name (issue 12)
    assert "icrl envs" in str(e.value) and "module:factory" in str(e.value) and "popgym/" in str(e.value)
    assert len(str(e.value)) < 400 and "popgym/AutoencodeEasy" not in str(e.value)
    with pytest.raises(ValueError, match="Did you mean 'tmaze'"):
        make_env("tmaz")
    with pytest.raises(ValueError, match="has no 'HostilEnv'. Did you mean 'hostile_envs:HostileEnv'"):
        make_env("hostile_envs:HostilEnv")  # a typo after the colon (tests/hostile_envs.py)
    with pytest.raises(ValueError, match="Taxi-v4"):  # gymnasium's own advice is kept
        make_env("Taxi-v3")
    with pytest.raises(ValueError, match="corridor"):
        make_env("tmaze", {"corridor": 3})
    with pytest.raises(ValueError, match="bogus"):
        make_env("CartPole-v1", {"bogus": 1})
    with pytest.raises(ValueError, match="nonexistent_module"):
        make_env("nonexistent_module:factory")


# ------------------------------------------------------------------------------------------ per-task metrics
class NamedTasks(gym.Env):
    """A task per rollout, shown in the observation, with episodes of `lengths` steps in turn (1-3 at random when
    None); `info["task"]` only on the step that ends an episode (the contract's minimum)."""

    NAMES = ("go to/red ball", "plain", "x" * 80)  # becomes go_to_red_ball, plain, 64 x (icrl.types.task_key)
    observation_space = gym.spaces.Discrete(3)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, lengths: tuple[int, ...] | None = None):
        self.lengths, self.episode = lengths, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if options is None or options.get("new_task", True):
            self.task, self.episode = int(self.np_random.integers(3)), 0
        lengths = self.lengths or (int(self.np_random.integers(1, 4)),)
        self.t, self.length = 0, lengths[self.episode % len(lengths)]
        self.episode += 1
        return self.task, {}

    def step(self, action):
        self.t += 1
        done = self.t >= self.length
        return self.task, 1.0 + self.task, done, False, {"task": self.NAMES[self.task]} if done else {}


def named_venv(n: int, k: int, lengths=None, asynchronous: bool = False) -> gym.vector.VectorEnv:
    cls = gym.vector.AsyncVectorEnv if asynchronous else gym.vector.SyncVectorEnv
    return cls([lambda: TimestepWrapper(NamedTasks(lengths), episodes_per_rollout=k)] * n,
               autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


KEYS = ["go_to_red_ball", "plain", "x" * 64]


@pytest.mark.parametrize("asynchronous", [False, True])
def test_episode_stats_carry_the_task_of_their_rollout(asynchronous):
    """Every episode of a 3-episode rollout names its task: the inner ones from the step's info, the one that ends
    the rollout from `final_info` (SAME_STEP autoreset), also across `collect` calls."""
    venv = named_venv(3, 3, asynchronous=asynchronous)
    col = Collector(venv, TimestepWrapper(NamedTasks()).action_spec, seed=0)
    per_rollout = defaultdict(list)
    finished = []
    for _ in range(4):
        rollouts, stats = col.collect(RandomPolicy(col.action_spec, 0), 3 * 7)
        finished += list(zip(col.last_sources, rollouts))
        for s in stats:
            per_rollout[(s.env_index, s.rollout_id)].append(s)
    venv.close()
    assert len(finished) >= 6
    for src, r in finished:
        eps = per_rollout[src]
        task = KEYS[int(r.obs["obs"][0].argmax())]  # the task the rollout played, from its observation
        assert [e.episode_index for e in eps] == [0, 1, 2] and {e.task for e in eps} == {task}
        assert sum(e.ret for e in eps) == pytest.approx(float(r.reward.sum()))
    assert {e.task for eps in per_rollout.values() for e in eps} == set(KEYS)


def test_a_capped_evaluation_rollout_keeps_its_task():
    """At the evaluation step cap a rollout counts as it stands: its unfinished episode takes the task its
    finished episodes named; a rollout with none finished names none."""
    venv = named_venv(2, 2, lengths=(2, 100))  # the second episode outlasts the cap
    col = Collector(venv, TimestepWrapper(NamedTasks()).action_spec)
    rollouts, stats = col.collect_rollouts(RandomPolicy(col.action_spec, 0), 2, seed=3, max_steps=10)
    assert col.capped_rollouts == 2 and len(stats) == 4
    for (i, _), r in zip(col.last_sources, rollouts):
        task = KEYS[int(r.obs["obs"][0].argmax())]
        assert [s.task for s in stats if s.env_index == i] == [task, task]
    _, stats = Collector(named_venv(1, 1, lengths=(100,)), col.action_spec).collect_rollouts(
        RandomPolicy(col.action_spec, 0), 1, seed=3, max_steps=5)
    assert [s.task for s in stats] == [None]


def test_no_task_reported_no_task_stored():
    venv = make_vector_env(*TASK, 2, episodes_per_rollout=2)
    col = Collector(venv, TimestepWrapper(TMaze()).action_spec, seed=0)
    _, stats = col.collect(RandomPolicy(col.action_spec, 1), 40)
    assert stats and all(s.task is None for s in stats)


class SuccessByGymnasiumKey(gym.Env):
    """Episodes of 2 steps that report `info["is_success"]` (Gymnasium's and Stable-Baselines3's key), true when the
    last action was 1."""

    observation_space = gym.spaces.Discrete(2)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return 0, {}

    def step(self, action):
        self.t += 1
        done = self.t >= 2
        return 0, float(action), done, False, {"is_success": bool(action == 1)} if done else {}


def test_is_success_counts_as_success():
    venv = gym.vector.SyncVectorEnv([lambda: TimestepWrapper(SuccessByGymnasiumKey())] * 2,
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    col = Collector(venv, TimestepWrapper(SuccessByGymnasiumKey()).action_spec, seed=0)
    _, stats = col.collect(RandomPolicy(col.action_spec, 0), 40)
    venv.close()
    assert stats and all(s.success in (0.0, 1.0) for s in stats) and 0 < np.mean([s.success for s in stats]) < 1
