"""The Python API: its public names and version, `icrl.train` on any env form, `icrl.load` + `predict`,
spaces.json, and the acting path agreeing with the collector's (and so with `icrl eval`) on the same weights."""

import dataclasses
import functools
import json
import re
import shutil
from collections import OrderedDict
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import icrl
from icrl.agent.model import AgentPolicy
from icrl.config import EnvConfig, ExperimentConfig, ModelConfig
from icrl.envs import Collector, make_env, make_vector_env
from icrl.envs.user import resolve_env
from icrl.envs.wrapper import agent_to_env_action
from icrl.run.load import RunDirError, load_agent
from icrl.spaces_json import space_from_json, space_to_json
from icrl.types import ActionSpec

ROOT = Path(__file__).resolve().parents[2]


def tiny(run_dir, env="tmaze", env_kwargs="{}", **env_fields) -> ExperimentConfig:
    return ExperimentConfig(
        env=EnvConfig(env=env, env_kwargs=env_kwargs, parallel_envs=2, **env_fields),
        model=ModelConfig(d_model=16, layers=1, heads=2, head_hidden=16, max_seq_len=32),
    ).replace(run_dir=str(run_dir), total_env_steps=64, steps_per_epoch=32, updates_per_epoch=1, batch_size=2,
              eval_every=2, eval_rollouts=2, device="cpu", threads=1)


class Ring(gym.Env):
    """A module-level test env: a Dict observation with a Discrete leaf, a Box action with bounds [0, 4]."""

    def __init__(self, size: int = 5) -> None:
        self.size = size
        self.observation_space = gym.spaces.Dict(
            OrderedDict(pos=gym.spaces.Discrete(size), target=gym.spaces.Box(0.0, 1.0, (1,), np.float32)))
        self.action_space = gym.spaces.Box(0.0, 4.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos, self.t = int(self.np_random.integers(self.size)), 0
        return self._obs(), {}

    def _obs(self):
        return {"pos": self.pos, "target": np.array([0.5], np.float32)}

    def step(self, action):
        self.t += 1
        self.pos = (self.pos + int(np.asarray(action).reshape(-1)[0] > 2.0)) % self.size
        return self._obs(), float(self.pos == 0), False, self.t >= 6, {}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("api_runs")
    out = {}
    for name, cfg in {
        "tmaze": tiny(root / "tmaze", env_kwargs='{"length": 3}'),
        "meta": tiny(root / "meta", env="meta_frozen_lake", env_kwargs='{"size": 3}', episodes_per_rollout=2),
    }.items():
        icrl.train(cfg)
        out[name] = root / name
    out["ring"] = root / "ring"  # through the ExperimentConfig route, with an env class in EnvConfig.env
    icrl.train(dataclasses.replace(tiny(out["ring"]), env=EnvConfig(env=Ring, parallel_envs=2)))
    return out


# ---------------------------------------------------------------------------------------------- spaces
@pytest.mark.parametrize("space", [
    gym.spaces.Box(-np.inf, np.inf, (3,), np.float64),
    gym.spaces.Box(0, 255, (8, 8, 3), np.uint8),
    gym.spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([1.0, np.inf], np.float32)),
    gym.spaces.Box(0, np.iinfo(np.int64).max, (), np.int64),
    gym.spaces.Discrete(5, start=-2),
    gym.spaces.MultiDiscrete([3, 4]),
    gym.spaces.MultiBinary([2, 3]),
    gym.spaces.Dict(OrderedDict(z=gym.spaces.Discrete(2), a=gym.spaces.Dict({"x": gym.spaces.Box(-1, 1, (2,))}))),
    gym.spaces.Tuple([gym.spaces.Discrete(3), gym.spaces.Box(-1, 1, (1,))]),
])
def test_spaces_round_trip_through_strict_json(space):
    text = json.dumps(space_to_json(space), allow_nan=False)  # strict JSON: no Infinity / NaN tokens
    back = space_from_json(json.loads(text))
    assert back == space and back.dtype == space.dtype
    if isinstance(space, gym.spaces.Dict):
        assert list(back.spaces) == list(space.spaces)  # the env's key order, not sorted


def test_unsupported_space_is_refused():
    with pytest.raises(ValueError, match="no JSON form"):
        space_to_json(gym.spaces.Text(5))


# ------------------------------------------------------------------------------------ env forms in
def test_resolve_env_forms():
    assert resolve_env("CartPole-v1").rebuild == "gymnasium" and resolve_env("tmaze").rebuild == "builtin"
    src = resolve_env(Ring)
    assert src.name == f"{Ring.__module__}:Ring" and src.rebuild == "import" and src.factories == (Ring,)
    lam = resolve_env(lambda: Ring(3))
    assert lam.rebuild == "none" and "<lambda>" in lam.name
    part = resolve_env(functools.partial(Ring, size=3))  # its name alone would rebuild Ring(), not Ring(size=3)
    assert part.rebuild == "none" and part.name.endswith("(partial)")
    venv = gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode="sync")
    src = resolve_env(venv)
    fields = src.env_fields(tiny("x").env.env_kwargs)  # what the run's EnvConfig takes (icrl.run.build)
    assert (fields["env"], fields["parallel_envs"], fields["async_envs"], src.rebuild, len(src.factories)) == (
        "CartPole-v1", 3, False, "gymnasium", 3)
    src = resolve_env(gym.make_vec("CartPole-v1", num_envs=2))  # CartPole's own vector env
    fields = src.env_fields("{}")
    assert src.factories is None and fields["env"] == "CartPole-v1" and json.loads(fields["env_kwargs"]) == {
        "max_episode_steps": 500}
    assert "env_kwargs" not in src.env_fields('{"a": 1}')  # the config's own kwargs are kept
    with pytest.raises(ValueError, match="pass the class, env=Ring, a zero-arg factory"):
        resolve_env(Ring())
    with pytest.raises(ValueError, match="not a gymnasium.Env subclass"):
        resolve_env(dict)


def test_train_on_a_user_vector_env(tmp_path):
    """gymnasium.make_vec's default NEXT_STEP autoreset and unwrapped sub-envs need no user code."""
    venv = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync",
                        wrappers=[lambda e: gym.wrappers.TimeLimit(e, 8)])
    result = icrl.train(tiny(tmp_path / "vec"), env=venv)
    assert result["rollouts"] == 2
    record = json.loads((tmp_path / "vec" / "spaces.json").read_text())
    assert record["env"]["rebuild"] == "none"  # its wrappers cannot be rebuilt from a name
    assert space_from_json(record["observation_space"]) == gym.make("CartPole-v1").observation_space


def test_train_on_a_zero_arg_factory(tmp_path):
    icrl.train(tiny(tmp_path / "lam"), env=lambda: Ring(size=3))
    cfg = json.loads((tmp_path / "lam" / "config.json").read_text())
    assert "<lambda>" in cfg["env"]["env"]
    policy = icrl.load(tmp_path / "lam")
    assert policy.observation_space == Ring(size=3).observation_space


def test_all_extra_holds_every_extra():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    named = set(extras["all"][0].split("[", 1)[1].rstrip("]").split(","))
    assert named == set(extras) - {"all", "dev"}


# ------------------------------------------------------------------------------------------- load
def test_load_from_run_checkpoint_and_weights_file(runs):
    run = runs["ring"]
    assert json.loads((run / "config.json").read_text())["env"]["env"] == f"{Ring.__module__}:Ring"
    ckpt = sorted((run / "checkpoints").glob("ckpt-*"))[-1]
    policies = [icrl.load(run), icrl.load(ckpt), icrl.load(ckpt / "agent.safetensors"),
                icrl.load(run / "agent.safetensors")]
    env = Ring()
    obs, _ = env.reset(seed=3)
    acts = [p.predict(obs)[0] for p in policies]
    assert all(np.array_equal(a, acts[0]) for a in acts)
    assert acts[0].shape == (1,) and 0.0 <= acts[0][0] <= 4.0  # unscaled to the env's Box
    batch = {"pos": np.array([0, 1, 2]), "target": np.full((3, 1), 0.5, np.float32)}
    actions, state = policies[0].predict(batch)
    assert actions.shape == (3, 1) and state.num_envs == 3 and state.time.tolist() == [1, 1, 1]
    with pytest.raises(ValueError, match="reward"):
        policies[0].predict(batch, state)  # an in-context agent needs the previous reward
    with pytest.raises(ValueError, match="3 envs"):
        policies[0].predict(obs, state, reward=0.0)


def test_old_run_without_spaces_says_how(runs, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(runs["tmaze"], old)
    (old / "spaces.json").unlink()
    for state_file in (old / "checkpoints").glob("ckpt-*/state.json"):
        state = json.loads(state_file.read_text())
        del state["extra"]["spaces"]
        state_file.write_text(json.dumps(state))
    with pytest.raises(RunDirError, match=r"no spaces.json .*env="):
        icrl.load(old)
    policy = icrl.load(old, env="tmaze")  # the user's explicit choice: read the spaces from one env
    assert policy.action_space == gym.spaces.Discrete(4)


# -------------------------------------------------------------------------- predict == the collector
def _predict_rollouts(policy, envs, seed, per_env, k, deterministic=True):
    """The README loop over N envs in lockstep, with the multi-episode protocol of the predict docstring;
    returns each env's first `per_env` rollouts' actions (bridge actions included, as the collector stores)."""
    n = len(envs)
    obs = [env.reset(seed=seed + i, options={"new_task": True} if k > 1 else None)[0] for i, env in enumerate(envs)]
    start, rewards, state = np.ones(n, bool), np.zeros(n), None
    bridge, episodes = np.zeros(n, bool), np.zeros(n, int)
    done, current = [[] for _ in range(n)], [[] for _ in range(n)]
    while any(len(d) < per_env for d in done):
        batch = {k: np.stack([o[k] for o in obs]) for k in obs[0]} if isinstance(obs[0], dict) else np.stack(obs)
        actions, state = policy.predict(batch, state, episode_start=start, reward=rewards, deterministic=deterministic)
        for i, env in enumerate(envs):
            current[i].append(np.asarray(actions[i]).item())
            if bridge[i]:  # the final observation of an inner episode was shown; its action is ignored
                obs[i], _ = env.reset(options={"new_task": False})
                start[i], rewards[i], bridge[i] = True, 0.0, False
                continue
            obs[i], rewards[i], term, trunc, _ = env.step(actions[i])
            start[i] = False
            if term or trunc:
                episodes[i] += 1
                if episodes[i] < k:
                    bridge[i] = True
                else:
                    done[i].append(current[i])
                    current[i], episodes[i] = [], 0
                    obs[i], _ = env.reset(options={"new_task": True} if k > 1 else None)
                    start[i] = True
    return [d[:per_env] for d in done]


@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.parametrize("name", ["tmaze", "meta", "ring"])
def test_predict_acts_as_the_collector_on_the_same_weights(runs, name, greedy, monkeypatch):
    """predict (raw observations in, env actions out) feeds the agent exactly the timesteps the collector of
    `icrl eval` feeds it, batch by batch, with staggered resets (the meta-RL run also crosses episode
    boundaries inside rollouts; the ring run has Dict observations and Box actions rescaled to [0, 4]), so
    greedy actions agree and sampled ones too under one torch seed."""
    inputs: list[list] = [[], []]
    act = AgentPolicy.act

    def recording(self, ts, new_rollout):
        fields = [ts.prev_action, ts.prev_reward, ts.time, ts.reset, *(ts.obs[k] for k in sorted(ts.obs))]
        inputs[which].append([f.numpy().copy() for f in fields] + [new_rollout.copy()])
        return act(self, ts, new_rollout)

    monkeypatch.setattr(AgentPolicy, "act", recording)
    agent, cfg = load_agent(runs[name])
    e, n, per_env, seed = cfg.env, 3, 2, 1234
    factories = [Ring] if name == "ring" else None
    venv = make_vector_env(e.env, e.kwargs, n, episodes_per_rollout=e.episodes_per_rollout, factories=factories)
    spec = ActionSpec.from_space(venv.single_action_space)
    which = 0
    torch.manual_seed(0)
    rollouts, _ = Collector(venv, spec).collect_rollouts(AgentPolicy(agent, n, greedy=greedy), n * per_env, seed=seed)
    space = venv.get_attr("env_action_space")[0]
    venv.close()
    expected = [[[agent_to_env_action(space, a).item() for a in r.action]  # the collector's, mapped to the env's
                 for r in rollouts[i * per_env:(i + 1) * per_env]] for i in range(n)]
    policy = icrl.load(runs[name])
    which = 1
    torch.manual_seed(0)
    envs = [Ring() if name == "ring" else make_env(e.env, e.kwargs) for _ in range(n)]
    got = _predict_rollouts(policy, envs, seed, per_env, e.episodes_per_rollout, deterministic=greedy)
    assert len(inputs[0]) == len(inputs[1]) > 0
    for a, b in zip(*inputs):
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert got == expected
    if not greedy:  # sampled actions differ from step to step: the comparison is not of constants
        assert len({a for r in expected for roll in r for a in roll}) > 1
    if name == "meta":
        assert any(r.reset[1:].any() for r in rollouts)  # inner episode starts were exercised


def test_episode_start_schedule_follows_the_run(runs):
    """One episode per rollout: every episode start clears the memory. Two per rollout (meta): the second
    episode keeps it (time counts on), the third starts a new task; new_task forces one at once."""
    single, meta = icrl.load(runs["tmaze"]), icrl.load(runs["meta"])
    obs_t, obs_m = (make_env("tmaze", {"length": 3}).reset(seed=0)[0],
                    make_env("meta_frozen_lake", {"size": 3}).reset(seed=0)[0])
    _, s = single.predict(obs_t)
    _, s = single.predict(obs_t, s, episode_start=False, reward=0.0)
    _, s = single.predict(obs_t, s, episode_start=True)
    assert s.time.tolist() == [1]  # a new task: time restarted at 0
    _, s = meta.predict(obs_m)
    _, s = meta.predict(obs_m, s, episode_start=True)
    assert s.time.tolist() == [2] and s.episode.tolist() == [1]  # the next episode of the same task
    _, s = meta.predict(obs_m, s, episode_start=True)
    assert s.time.tolist() == [1] and s.episode.tolist() == [0]  # K=2 episodes done: a new task
    _, s = meta.predict(obs_m, s, reward=0.0, new_task=True)
    assert s.time.tolist() == [1]


def test_dir_and_version():
    names = dir(icrl)
    assert {"train", "load", "evaluate", "InContextPolicy", "__version__"} <= set(names)
    assert set(icrl.__all__) <= set(names) and all(callable(getattr(icrl, n)) for n in icrl.__all__ if n[0] != "_")
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert icrl.__version__ == version
