"""The goal-conditioned contract end to end: env -> wrapper -> collector -> disk -> relabeling loader -> agent."""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
import pytest
import torch

from icrl.agent.model import Agent
from icrl.config import LossConfig, ModelConfig
from icrl.data import DiskReplay, make_loader
from icrl.data.collate import collate_windows
from icrl.data.relabel import HindsightRelabeler
from icrl.envs.collect import Collector, RandomPolicy
from icrl.envs.wrapper import TimestepWrapper
from icrl.nets.goals import GoalEmbedder
from icrl.types import ActionSpec


class LineGoals(gym.Env):
    """Walk on a line of `n` cells; the instruction is `k` cells to visit in order (token = cell + 1)."""

    metadata = {"render_modes": [], "goal_vocab": 8, "achieved_slots": 1}

    def __init__(self, n: int = 8, k: int = 2, time_limit: int = 12):
        self.n, self.k, self.time_limit = n, k, time_limit
        self.observation_space = gym.spaces.Dict(
            {"pos": gym.spaces.Discrete(n), "goal": gym.spaces.Box(0, n, (k,), np.int64)}
        )
        self.action_space = gym.spaces.Discrete(2)

    def _obs(self):
        return {"pos": self.pos, "goal": self.goal.copy()}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos, self.t = 0, 0
        self.goal = self.np_random.choice(np.arange(2, self.n + 1), size=self.k, replace=False).astype(np.int64)
        return self._obs(), {"achieved": [self.pos + 1]}

    def step(self, action):
        self.pos = int(np.clip(self.pos + (1 if action == 1 else -1), 0, self.n - 1))
        self.t += 1
        reward = 0.0
        nz = np.flatnonzero(self.goal)
        if len(nz) and self.goal[nz[0]] == self.pos + 1:
            self.goal[nz[0]] = 0
            reward = 1.0
        done = not self.goal.any()
        info = {"achieved": [self.pos + 1]}
        if done:
            info["success"] = 1.0
        return self._obs(), reward, done, (not done) and self.t >= self.time_limit, info


def make_venv(num_envs=2):
    thunk = functools.partial(lambda: TimestepWrapper(LineGoals()))
    return gym.vector.SyncVectorEnv([thunk] * num_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def test_wrapper_exposes_achieved_goals_beside_the_observation():
    env = TimestepWrapper(LineGoals())
    assert env.achieved_slots == 1 and "achieved" in env.observation_space.spaces
    ts, _ = env.reset(seed=0)
    assert ts["achieved"].tolist() == [1] and "achieved" not in ts["obs"]
    assert ts["obs"]["goal"].dtype == np.int64
    ts, *_ = env.step(1)
    assert ts["achieved"].tolist() == [2]
    assert env.observation_space.contains(ts)


def test_wrapper_rejects_bad_achievement_reports():
    class TooMany(LineGoals):
        def step(self, action):
            obs, r, te, tr, info = super().step(action)
            return obs, r, te, tr, {"achieved": [1, 2]}

    env = TimestepWrapper(TooMany())
    env.reset(seed=0)
    with pytest.raises(ValueError, match="achieved_slots"):
        env.step(0)


def test_collector_stores_achievements_and_relabeling_loader_leaves_files_untouched(tmp_path):
    venv = make_venv()
    spec = ActionSpec.from_space(venv.single_action_space)
    collector = Collector(venv, spec, seed=0)
    rollouts, _ = collector.collect(RandomPolicy(spec, seed=0), 200)
    assert rollouts
    replay = DiskReplay(tmp_path / "replay", capacity_timesteps=10_000)
    for r in rollouts:
        assert r.achieved is not None and r.achieved.shape == (len(r), 1)
        # the position observation and the achievement record agree: token = cell + 1
        np.testing.assert_array_equal(r.achieved[:, 0], r.obs["pos"].argmax(-1) + 1)
        replay.write(r)
    files = sorted((tmp_path / "replay").rglob("*.npz"))
    before = {f: f.read_bytes() for f in files}
    relabeler = HindsightRelabeler("all")
    loader = make_loader(
        replay.root, batch_size=8, max_seq_len=16, action_spec=spec, seed=0, transform=relabeler
    )
    successes = 0
    for _ in range(5):
        batch = next(loader)
        assert batch.achieved is not None and batch.achieved.shape[:2] == batch.mask.shape
        assert batch.inputs.obs["goal"].dtype == torch.int64
        successes += int(batch.terminated.sum())
    loader.close()
    assert successes > 0  # relabeled to successes (random walks rarely finish the original instruction)
    assert before == {f: f.read_bytes() for f in sorted((tmp_path / "replay").rglob("*.npz"))}
    venv.close()


def test_goal_embedder_shapes_and_views():
    goals = torch.tensor([[[3, 4, 0], [0, 4, 0], [0, 0, 0]]])  # [1, 3, 3]
    assert GoalEmbedder.current_goal(goals).squeeze(-1).tolist() == [[3, 4, 0]]
    full = GoalEmbedder(vocab=5, slots=3, d_out=16)
    cur = GoalEmbedder(vocab=5, slots=3, d_out=16, view="current")
    assert full(goals).shape == (1, 3, 16) and cur(goals).shape == (1, 3, 16)
    # the current view cannot tell apart instructions that share the current goal; the full view can
    a, b = torch.tensor([[[3, 4, 0]]]), torch.tensor([[[3, 5, 0]]])
    assert torch.allclose(cur(a), cur(b)) and not torch.allclose(full(a), full(b))
    with pytest.raises(ValueError, match="slots"):
        full(torch.zeros(1, 1, 2, dtype=torch.long))


def test_agent_embeds_the_instruction_and_learns_from_it():
    env = TimestepWrapper(LineGoals())
    spec = ActionSpec.from_space(env.action_space)
    agent = Agent(env.observation_space["obs"], spec, ModelConfig(d_model=32), LossConfig())
    assert agent.tstep_encoder.goal_embedder is not None
    venv = make_venv()
    rollouts, _ = Collector(venv, spec, seed=0).collect(RandomPolicy(spec, seed=0), 40)
    batch = collate_windows([(r, 0) for r in rollouts[:2]], max(len(r) for r in rollouts[:2]), spec)
    s = agent(batch.inputs)
    s.sum().backward()
    assert agent.tstep_encoder.goal_embedder.token.weight.grad.abs().sum() > 0  # the instruction matters
    venv.close()


def test_bad_goal_space_is_named():
    class FloatGoal(LineGoals):
        def __init__(self):
            super().__init__()
            self.observation_space = gym.spaces.Dict(
                {"pos": gym.spaces.Discrete(8), "goal": gym.spaces.Box(0, 1, (2,), np.float32)}
            )

    env = TimestepWrapper(FloatGoal())
    spec = ActionSpec.from_space(env.action_space)
    with pytest.raises(ValueError, match="integer Box"):
        Agent(env.observation_space["obs"], spec, ModelConfig(d_model=32), LossConfig())


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("goal_grid", {"size": 4, "num_goals": 2}),
        ("mazerunner", {"size": 7, "num_goals": 2, "time_limit": 40}),
        ("package_delivery", {"length": 10, "min_packages": 1, "max_packages": 2, "time_limit": 40}),
        ("crafter", {"size": 32, "area": 32, "episode_length": 30, "instruction_length": 2}),
    ],
)
def test_builtin_goal_tasks_follow_the_contract_the_relabeler_checks(name, kwargs):
    """Collected rollouts of every built-in goal task pass the relabeler's contract check (stored rewards and
    goal observations equal what the instruction and the achievement record imply) and relabel cleanly."""
    if name == "crafter":
        pytest.importorskip("crafter", reason="crafter is not installed: pip install 'icrl[crafter]'")
    from icrl.envs.make import make_vector_env

    venv = make_vector_env(name, kwargs, 2)
    spec = ActionSpec.from_space(venv.single_action_space)
    rollouts, _ = Collector(venv, spec, seed=0).collect(RandomPolicy(spec, seed=0), 160)
    venv.close()
    assert rollouts
    rng = np.random.default_rng(0)
    for r in rollouts:
        for mode in ("some", "all"):
            out = HindsightRelabeler(mode)(r, rng)  # raises GoalContractError on a contract breach
            out.validate()
            assert out.reward.sum() >= r.reward.sum()  # keeps the goals it reached, may add more
