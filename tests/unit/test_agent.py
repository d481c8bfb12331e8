"""The whole Agent on real data: gradient routing of every loss term, one Learner update (EMA, PopArt),
acting step by step == the full forward pass with staggered resets, and exploration through AgentPolicy.

Batches come from real rollouts (RandomPolicy -> Collector -> DiskReplay -> make_loader), for discrete
(TMaze), continuous (Box(-1, 1, (2,))) and multi-binary action spaces. Models are tiny.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import re
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch

from icrl import device as probes
from icrl.agent import learner as learner_module
from icrl.agent.exploration import Exploration
from icrl.agent.learner import Learner, compute_loss
from icrl.agent.model import Agent, AgentPolicy
from icrl.config import ExperimentConfig, LossConfig, ModelConfig
from icrl.data import DiskReplay, make_loader
from icrl.envs import Collector, RandomPolicy, TimestepWrapper, TMaze, make_vector_env
from icrl.nets.transformer import SigmaReparamLinear
from icrl.types import ActionSpec, Batch, Timesteps

from helpers import explore_config

KINDS = ["discrete", "continuous", "multibinary"]
CRITICS = {"regression": {}, "twohot": {"critic_kind": "twohot", "critic_bins": 16, "critic_min_value": -50.0,
                                        "critic_max_value": 50.0}}  # LossConfig fields of each critic kind
GAMMAS = (0.5, 0.9, 0.99)
# `discrete_action_input` (discrete critics only): T-Maze's 4 actions take the exact sums over the one-hot actions
# with 4 discounts (A <= G) and sampled actions with GAMMAS' 3 (`Critic.sums_over_actions`)
ACTION_INPUT = {"exact": {"discrete_action_input": True, "gammas": (0.5, 0.9, 0.95, 0.99)},
                "sampled": {"discrete_action_input": True}}
ROUTING_CRITICS = {**CRITICS, **{f"{c}-action-input-{v}": {**CRITICS[c], **kw} for c in CRITICS
                                 for v, kw in ACTION_INPUT.items()}}
SEQ = 8


def model_cfg(traj: str = "transformer", max_seq_len: int = SEQ, **model_kw) -> ModelConfig:
    return ModelConfig(
        traj_encoder=traj,
        d_model=32,
        layers=1,
        heads=2,
        max_seq_len=max_seq_len,
        max_time=64,
        head_hidden=32,
        head_layers=1,
        **model_kw,
    )


def loss_cfg(**kw) -> LossConfig:
    return LossConfig(**{"gammas": GAMMAS, "num_critics": 3, "redq_subset": 2, **kw})


class ToyEnv(gym.Env):
    """A small task with a chosen action space; episodes of 3-6 steps that terminate or truncate."""

    def __init__(self, kind: str):
        self.kind = kind
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
        self.action_space = {
            "continuous": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
            "multibinary": gym.spaces.MultiBinary(3),
        }[kind]
        self._t, self._h, self._target = 0, 4, np.zeros(3, np.float32)

    def _obs(self) -> np.ndarray:
        return np.concatenate([self._target[:2], [self._t / 6.0]]).astype(np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t, self._h = 0, int(self.np_random.integers(3, 7))
        self._target = self.np_random.uniform(-1, 1, 3).astype(np.float32)
        return self._obs(), {}

    def step(self, action):
        a = np.asarray(action, dtype=np.float32).reshape(-1)
        reward = float(-np.abs(a - self._target[: len(a)]).sum())
        self._t += 1
        done = self._t >= self._h
        terminated = done and self._h % 2 == 0
        return self._obs(), reward, terminated, done and not terminated, {}


def _toy_wrapped(kind: str) -> TimestepWrapper:
    return TimestepWrapper(ToyEnv(kind))


def make_venv(kind: str, n: int = 2) -> gym.vector.VectorEnv:
    if kind == "discrete":
        return make_vector_env("tmaze", {"length": 2, "horizon": 6}, n)
    thunk = functools.partial(_toy_wrapped, kind)
    return gym.vector.SyncVectorEnv([thunk] * n, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def real_batch(kind: str, root, batch_size: int = 6) -> tuple[Batch, gym.spaces.Dict, ActionSpec]:
    """Random rollouts collected into a DiskReplay, sampled back with make_loader."""
    venv = make_venv(kind)
    spec = ActionSpec.from_space(venv.single_action_space)
    collector = Collector(venv, spec, seed=3)
    rollouts, _ = collector.collect(RandomPolicy(spec, seed=4), 60)
    venv.close()
    assert rollouts
    replay = DiskReplay(root, capacity_timesteps=10_000, fsync=False)
    for r in rollouts:
        replay.write(r)
    with make_loader(replay.root, batch_size=batch_size, max_seq_len=SEQ, action_spec=spec, seed=0) as loader:
        batch = next(loader)
    assert batch.has_action.any() and (batch.reward != 0).any()
    return batch, venv.single_observation_space["obs"], spec


def assert_every_part_moved(agent: Agent, before: dict, after: dict) -> None:
    """An update changed some parameter of each of the encoders, the actor and the critic."""
    for prefix in ("tstep_encoder.", "traj_encoder.", "actor.", "critic."):
        names = [n for n, p in agent.named_parameters() if n.startswith(prefix)]
        assert any(not torch.equal(before[n], after[n]) for n in names), prefix


def build_agent(obs_space, spec, traj: str = "transformer", max_seq_len: int = SEQ, model_kw: dict | None = None,
                **loss_kw) -> Agent:
    torch.manual_seed(0)
    loss = loss_cfg(**loss_kw)
    return Agent(obs_space, spec, model_cfg(traj, max_seq_len, **(model_kw or {})), loss)


def test_time_freqs_sets_the_timestep_encoders_time_inputs():
    space = gym.spaces.Dict({"obs": gym.spaces.Box(-1.0, 1.0, (3,), np.float32)})
    spec = ActionSpec.from_space(gym.spaces.Discrete(2))
    width = {f: build_agent(space, spec, model_kw={"time_freqs": f}).tstep_encoder.mlp[0].in_features for f in (0, 4)}
    assert width[4] - width[0] == 8  # a sine and a cosine per frequency


def test_the_reward_action_input_leaves_every_other_initial_weight_as_drawn_without_it():
    """The product's columns have their own generator: with the same seed, every weight but those A columns is
    the draw made without the input (so a task whose rewards are 0 runs as without it), and the columns differ
    between seeds (drawn from the run's seed, not a constant)."""
    space = gym.spaces.Dict({"obs": gym.spaces.Box(-1.0, 1.0, (3,), np.float32)})
    spec = ActionSpec.from_space(gym.spaces.Discrete(4))
    plain = build_agent(space, spec, model_kw={"reward_action_input": False}).state_dict()
    wide = build_agent(space, spec).state_dict()  # the default has the input
    assert plain.keys() == wide.keys()
    name = "tstep_encoder.mlp.0.weight"
    for key in plain:
        if key != name:
            assert torch.equal(plain[key], wide[key]), key
    assert torch.equal(wide[name][:, :-4], plain[name])
    columns = wide[name][:, -4:]
    bound = 1 / plain[name].shape[1] ** 0.5  # nn.Linear's bound for the inputs without the product
    assert columns.abs().max() <= bound and columns.std() > bound / 3  # drawn at that scale, not left at 0
    torch.manual_seed(1)
    other = Agent(space, spec, model_cfg("transformer", SEQ, reward_action_input=True), loss_cfg())
    assert not torch.equal(other.tstep_encoder.mlp[0].weight[:, -4:], columns)


# ------------------------------------------------------------------------------------------ gradient helpers
def groups(agent: Agent) -> dict[str, list[torch.nn.Parameter]]:
    return {
        "tstep_encoder": list(agent.tstep_encoder.parameters()),
        "traj_encoder": list(agent.traj_encoder.parameters()),
        "actor": list(agent.actor.parameters()),
        "critic": list(agent.critic.parameters()),
        "targets": [*agent.target_actor.parameters(), *agent.target_critic.parameters()],
    }


def has_grad(params) -> bool:
    return any(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in params)


def no_grad_at_all(params) -> bool:
    return all(p.grad is None or not bool(p.grad.any()) for p in params)


class InputGrads:
    """Records the gradient that reaches the encoder's output `s`, and the gradient that flows back
    through each head's own input (a fresh node per call, so the two can be told apart)."""

    def __init__(self, agent: Agent):
        self.s: list[torch.Tensor] = []
        self.inputs: dict[str, list[torch.Tensor]] = {"actor": [], "critic": []}
        self.handles = [
            agent.traj_encoder.register_forward_hook(self._out_hook),
            agent.actor.register_forward_pre_hook(functools.partial(self._in_hook, "actor")),
            agent.critic.register_forward_pre_hook(functools.partial(self._in_hook, "critic")),
        ]

    def _out_hook(self, module, args, out):
        if out.requires_grad:
            out.retain_grad()
            self.s.append(out)

    def _in_hook(self, name, module, args):
        x = args[0]
        if not x.requires_grad:
            return None
        y = x.clone()
        y.retain_grad()
        self.inputs[name].append(y)
        return (y, *args[1:])

    def grad_through(self, name: str) -> torch.Tensor:
        total = torch.zeros_like(self.s[0])
        for y in self.inputs[name]:
            if y.grad is not None:
                total = total + y.grad
        return total

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def backprop_alone(agent: Agent, batch: Batch, cfg: LossConfig) -> tuple[dict, InputGrads]:
    agent.zero_grad(set_to_none=True)
    torch.manual_seed(123)  # the same target-action samples in every call
    probe = InputGrads(agent)
    try:
        loss, metrics, _, _ = compute_loss(agent, batch, cfg, torch.Generator().manual_seed(0))
        loss.backward()
    finally:
        probe.close()
    assert len(probe.s) == 1, "one encoder pass per update"
    return metrics, probe


# ------------------------------------------------------------------------------------------ 1. routing
@pytest.fixture(scope="module", params=KINDS)
def kind_batch(request, tmp_path_factory):
    kind = request.param
    batch, obs_space, spec = real_batch(kind, tmp_path_factory.mktemp(f"replay_{kind}"))
    assert spec.kind == kind
    return kind, batch, obs_space, spec


@pytest.fixture(params=list(ROUTING_CRITICS))
def critic_kw(request, kind_batch) -> dict:
    """The LossConfig fields of a regression or a two-hot critic, each also with discrete actions as the critic's
    input (exact sums or sampled actions): every routing test runs with each. Non-discrete critics take actions as
    input anyway (the option changes nothing there), so they run the first two only."""
    if "action-input" in request.param and kind_batch[0] != "discrete":
        pytest.skip("discrete_action_input changes discrete critics only")
    return ROUTING_CRITICS[request.param]


def test_critic_loss_alone_reaches_critic_and_encoder_only(kind_batch, critic_kw):
    kind, batch, obs_space, spec = kind_batch
    agent = build_agent(obs_space, spec, **critic_kw)
    cfg = loss_cfg(online_coeff=0.0, offline_coeff=0.0, entropy_coeff=0.0, **critic_kw)  # no actor term at all
    metrics, probe = backprop_alone(agent, batch, cfg)
    g = groups(agent)
    assert has_grad(g["critic"]), kind
    assert has_grad(g["tstep_encoder"]) and has_grad(g["traj_encoder"]), kind
    assert no_grad_at_all(g["actor"]), kind
    assert all(p.grad is None and not p.requires_grad for p in g["targets"]), kind
    # Everything the encoder receives comes through the critic's input.
    s_grad = probe.s[0].grad
    assert s_grad is not None and s_grad.abs().sum() > 0
    torch.testing.assert_close(probe.grad_through("critic"), s_grad, atol=1e-7, rtol=1e-5)
    assert not probe.grad_through("actor").any()


@pytest.mark.parametrize("term", ["online", "bc"])
def test_actor_loss_alone_never_reaches_the_critic(kind_batch, term, critic_kw):
    kind, batch, obs_space, spec = kind_batch
    agent = build_agent(obs_space, spec, **critic_kw)
    coeffs = {"online": (1.0, 0.0), "bc": (0.0, 1.0)}[term]
    cfg = loss_cfg(critic_weight=0.0, online_coeff=coeffs[0], offline_coeff=coeffs[1], **critic_kw)
    metrics, probe = backprop_alone(agent, batch, cfg)
    if term == "bc":
        assert metrics["bc_weight"] > 0, "no positive advantage in the batch: the BC term would be empty"
    g = groups(agent)
    assert has_grad(g["actor"]), (kind, term)
    assert has_grad(g["tstep_encoder"]) and has_grad(g["traj_encoder"]), (kind, term)
    assert no_grad_at_all(g["critic"]), (kind, term)
    assert all(p.grad is None and not p.requires_grad for p in g["targets"]), (kind, term)
    # The actor loss reaches the encoder only through the actor head's input.
    s_grad = probe.s[0].grad
    assert s_grad is not None and s_grad.abs().sum() > 0
    torch.testing.assert_close(probe.grad_through("actor"), s_grad, atol=1e-7, rtol=1e-5)
    assert not probe.grad_through("critic").any()


def test_full_loss_gradients_are_the_sum_of_the_terms(kind_batch, critic_kw):
    """Default weights: critic and actor terms add up; the critic's gradient equals critic-only."""
    kind, batch, obs_space, spec = kind_batch
    agent = build_agent(obs_space, spec, **critic_kw)
    start = copy.deepcopy(agent.state_dict())
    backprop_alone(agent, batch, loss_cfg(**critic_kw))
    full = {n: p.grad.clone() for n, p in agent.critic.named_parameters()}
    # A training forward refines σReparam's u, v (and the observation statistics): without restoring them the
    # second pass ran another encoder, and whether the difference stayed inside a tolerance depended on the CPU.
    assert any(not torch.equal(t, start[n]) for n, t in agent.state_dict().items())
    agent.load_state_dict(start)
    backprop_alone(agent, batch, loss_cfg(online_coeff=0.0, offline_coeff=0.0, **critic_kw))
    for n, p in agent.critic.named_parameters():
        # the same weights and buffers, REDQ subset and TD targets (same generator seed): the same computation,
        # so only float rounding may differ; only sampling in the actor term differs, and it must not touch the critic
        torch.testing.assert_close(p.grad, full[n], atol=1e-7, rtol=1e-6)


# ------------------------------------------------------------------------------------------ 2. Learner.update
def _experiment(**train_kw) -> ExperimentConfig:
    return ExperimentConfig(
        model=model_cfg(),
        loss=loss_cfg(tau=0.25, popart_beta=0.2),
    ).replace(lr=1e-3, warmup_updates=1, seed=0, device="cpu", **train_kw)


@pytest.mark.parametrize("kind", KINDS)
def test_learner_update_moves_online_targets_by_ema_and_popart(kind, tmp_path):
    batch, obs_space, spec = real_batch(kind, tmp_path / "replay")
    cfg = _experiment()
    torch.manual_seed(0)
    agent = Agent(obs_space, spec, cfg.model, cfg.loss)
    agent.popart.count.fill_(1)  # statistics already initialised: this update rescales (see test_targets)
    learner = Learner(agent, cfg, torch.device("cpu"))
    before = {n: t.detach().clone() for n, t in agent.state_dict().items()}
    mu0, sigma0 = agent.popart.mu.clone(), agent.popart.sigma.clone()

    metrics = learner.update(batch)
    assert all(torch.isfinite(v).all() for v in metrics.values())
    after = agent.state_dict()
    tau = cfg.loss.tau

    # online parameters moved, in every part of the network
    assert_every_part_moved(agent, before, after)
    assert agent.tstep_encoder.obs_norm.count > 0  # the running obs statistics saw the batch

    # targets: exactly one EMA step toward the *updated* online weights (target_actor untouched by PopArt)
    for n, p in agent.target_actor.named_parameters():
        expected = (1 - tau) * before[f"target_actor.{n}"] + tau * after[f"actor.{n}"]
        torch.testing.assert_close(p.detach(), expected, atol=1e-6, rtol=1e-5)
    expected = (1 - tau) * before["target_critic.w_state"] + tau * after["critic.w_state"]
    torch.testing.assert_close(agent.target_critic.w_state.detach(), expected, atol=1e-6, rtol=1e-5)

    # PopArt statistics moved; the target critic's output layer was rescaled by them, then EMA'd
    mu1, sigma1 = agent.popart.mu, agent.popart.sigma
    assert not torch.equal(mu0, mu1) and not torch.equal(sigma0, sigma1)
    scale, shift = sigma0 / sigma1, (mu0 - mu1) / sigma1
    if kind == "discrete":
        w_rescaled = before["target_critic.w_out"] * scale[:, None]
        b_rescaled = before["target_critic.b_out"] * scale[:, None] + shift[:, None]
    else:  # continuous and multi-binary critics take (s, a): one output per member and discount
        w_rescaled = before["target_critic.w_out"] * scale
        b_rescaled = before["target_critic.b_out"] * scale + shift
    w_expected = (1 - tau) * w_rescaled + tau * after["critic.w_out"]
    b_expected = (1 - tau) * b_rescaled + tau * after["critic.b_out"]
    torch.testing.assert_close(agent.target_critic.w_out.detach(), w_expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(agent.target_critic.b_out.detach(), b_expected, atol=1e-6, rtol=1e-5)

    # targets never get gradients
    for p in [*agent.target_actor.parameters(), *agent.target_critic.parameters()]:
        assert not p.requires_grad and p.grad is None
    assert learner.updates == 1


@pytest.mark.parametrize("values", list(ACTION_INPUT))
@pytest.mark.parametrize("critic", list(CRITICS))
def test_learner_update_with_discrete_actions_as_critic_input(critic, values, tmp_path):
    """`discrete_action_input`: the critic is the (s, a) critic over one-hot actions (one output per member and
    discount, no per-action outputs), and a Learner update with it, for either critic kind and either V(s)
    estimate, is finite, moves every part of the network, and moves the targets by EMA (after PopArt's exact
    rescale of the regression critic's [C, H, G] output layer)."""
    batch, obs_space, spec = real_batch("discrete", tmp_path / "replay")
    cfg = _experiment().replace(**CRITICS[critic], **ACTION_INPUT[values])
    torch.manual_seed(0)
    agent = Agent(obs_space, spec, cfg.model, cfg.loss)
    C, G, H = cfg.loss.num_critics, len(cfg.loss.gammas), cfg.model.head_hidden
    bins = (cfg.loss.critic_bins,) if critic == "twohot" else ()
    assert not agent.critic.discrete and agent.critic.w_action.shape == (C, spec.dim, H)
    assert agent.critic.w_out.shape == (C, H, G, *bins)
    assert agent.critic.sums_over_actions is (values == "exact")
    agent.popart.count.fill_(1)  # statistics already initialised: this update rescales
    learner = Learner(agent, cfg, torch.device("cpu"))
    before = {n: t.detach().clone() for n, t in agent.state_dict().items()}
    mu0, sigma0 = agent.popart.mu.clone(), agent.popart.sigma.clone()
    metrics = learner.update(batch)
    assert learner.updates == 1 and all(torch.isfinite(v).all() for v in metrics.values())
    after = agent.state_dict()
    assert_every_part_moved(agent, before, after)
    assert not torch.equal(before["critic.w_action"], after["critic.w_action"])
    tau = cfg.loss.tau
    scale, shift = sigma0 / agent.popart.sigma, (mu0 - agent.popart.mu) / agent.popart.sigma
    w_out, b_out = before["target_critic.w_out"], before["target_critic.b_out"]
    if critic == "regression":  # rescaled per discount; a two-hot critic is never rescaled
        w_out, b_out = w_out * scale, b_out * scale + shift
    torch.testing.assert_close(agent.target_critic.w_out.detach(), (1 - tau) * w_out + tau * after["critic.w_out"],
                               atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(agent.target_critic.b_out.detach(), (1 - tau) * b_out + tau * after["critic.b_out"],
                               atol=1e-6, rtol=1e-5)
    for n in ("w_action", "w_state"):
        expected = (1 - tau) * before[f"target_critic.{n}"] + tau * after[f"critic.{n}"]
        torch.testing.assert_close(getattr(agent.target_critic, n).detach(), expected, atol=1e-6, rtol=1e-5)


ACTOR_OPTIONS = {  # ModelConfig fields of the actor's options (docs/method.md)
    "gmm": {"continuous_dist": "gmm", "gmm_components": 3},
    "beta": {"continuous_dist": "beta"},
    "residual": {"actor_head": "residual"},
    "residual-beta": {"actor_head": "residual", "continuous_dist": "beta"},
}


@pytest.mark.parametrize(("kind", "option"), [("continuous", o) for o in ACTOR_OPTIONS] + [("discrete", "residual")])
def test_learner_update_and_acting_with_each_actor_option(kind, option, tmp_path):
    """A learner update with the GMM or Beta policy, or the residual actor: finite metrics, every part of the
    network moves, the target actor by EMA; then the agent acts inside the action bounds."""
    batch, obs_space, spec = real_batch(kind, tmp_path / "replay")
    cfg = _experiment().replace(**ACTOR_OPTIONS[option])
    torch.manual_seed(0)
    agent = Agent(obs_space, spec, cfg.model, cfg.loss)
    learner = Learner(agent, cfg, torch.device("cpu"))
    before = {n: t.detach().clone() for n, t in agent.state_dict().items()}
    metrics = learner.update(batch)
    assert learner.updates == 1 and all(torch.isfinite(v).all() for v in metrics.values())
    after = agent.state_dict()
    assert_every_part_moved(agent, before, after)
    still = [n for n, _ in agent.actor.named_parameters() if torch.equal(before[f"actor.{n}"], after[f"actor.{n}"])]
    assert not still, f"actor parameters the update did not reach: {still}"
    for n, p in agent.target_actor.named_parameters():
        expected = (1 - cfg.loss.tau) * before[f"target_actor.{n}"] + cfg.loss.tau * after[f"actor.{n}"]
        torch.testing.assert_close(p.detach(), expected, atol=1e-6, rtol=1e-5)
    ts = first_timesteps(batch)
    for greedy in (True, False):
        actions = AgentPolicy(agent, ts.time.shape[0], greedy=greedy).act(ts, np.ones(ts.time.shape[0], bool))
        if kind == "continuous":
            assert actions.shape == (ts.time.shape[0], spec.dim) and np.abs(actions).max() <= 1.0


def test_weight_decay_only_on_weight_matrices():
    """Learner's AdamW groups: decay on weight matrices only; norms, biases, embeddings, σReparam gains
    and the critic ensemble's biases and LayerNorm gains/offsets ([C, H]-shaped, but not matrices) are
    left alone (icrl.agent.learner.param_groups docstring)."""
    obs_space = gym.spaces.Dict({"obs": gym.spaces.Box(-1, 1, (3,), np.float32)})
    for kind in ("discrete", "continuous"):
        torch.manual_seed(0)
        agent = Agent(obs_space, ActionSpec(kind, 3), model_cfg(), loss_cfg())
        cfg = ExperimentConfig(model=model_cfg(), loss=loss_cfg()).replace(weight_decay=0.1)
        learner = Learner(agent, cfg, torch.device("cpu"))
        names = {id(p): n for n, p in agent.named_parameters() if not n.startswith("target_")}
        groups_ = learner.optimizer.param_groups
        trained = {names[id(p)] for g in groups_ for p in g["params"]}
        assert trained == set(names.values())  # every online parameter, no target
        decayed = {names[id(p)] for g in groups_ if g["weight_decay"] > 0 for p in g["params"]}
        linear = {f"{m}.weight" for m, mod in agent.named_modules() if isinstance(mod, torch.nn.Linear)}
        linear |= {f"{m}.weight" for m, mod in agent.named_modules() if hasattr(mod, "gamma")}  # σReparam
        matrices = {n for n in trained if n in linear or re.fullmatch(r"critic\.w_\w+(\.\d+)?", n)}
        assert not decayed - matrices, (kind, "decayed but not a weight matrix", sorted(decayed - matrices))
        assert not matrices - decayed, (kind, "weight matrix without decay", sorted(matrices - decayed))


@pytest.mark.parametrize("kind", ["discrete", "continuous"])
def test_popart_rescale_preserves_unnormalised_outputs(kind):
    spec = ActionSpec(kind, 3)
    obs_space = gym.spaces.Dict({"obs": gym.spaces.Box(-1, 1, (3,), np.float32)})
    torch.manual_seed(0)
    agent = Agent(obs_space, spec, model_cfg(), loss_cfg(popart_beta=0.3))
    agent.popart.count.fill_(1)  # statistics already initialised: this update rescales (see test_targets)
    G = len(GAMMAS)
    s = torch.randn(2, 5, 32)
    a = torch.rand(2, 5, G, 3) * 2 - 1

    def unnormalised():
        out = []
        for critic in (agent.critic, agent.target_critic):
            if kind == "discrete":
                q = critic(s)  # [B, L, C, G, A]
                out.append(agent.popart.denormalize(q.transpose(-1, -2)).transpose(-1, -2))
            else:
                out.append(agent.popart.denormalize(critic(s, a)))
        return out

    with torch.no_grad():
        q_before = unnormalised()
        norm_before = agent.target_critic(s) if kind == "discrete" else agent.target_critic(s, a)
        y = 5.0 + 3.0 * torch.randn(2, 5, G)  # far from the initial mu=0, sigma=1
        valid = torch.ones(2, 5, dtype=torch.bool)
        valid[1, 3:] = False
        y[1, 3:] = float("nan")  # padding must not leak into the statistics
        agent.popart.update_(y, valid, [agent.critic, agent.target_critic])
        assert torch.isfinite(agent.popart.mu).all() and (agent.popart.mu > 0.5).all()
        q_after = unnormalised()
        norm_after = agent.target_critic(s) if kind == "discrete" else agent.target_critic(s, a)
    for b, c in zip(q_before, q_after):
        torch.testing.assert_close(c, b, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(norm_before, norm_after)  # the normalised outputs did change


# ------------------------------------------------------------------------------------------ 3. stepping
class SteppingProbe:
    """Drives the envs with random actions (so rollouts end at staggered moments) while feeding every
    timestep to a greedy AgentPolicy and to a hand-stepped copy of its encoders, recording both."""

    def __init__(self, agent: Agent, n: int):
        self.agent = agent
        self.policy = AgentPolicy(agent, n, greedy=True)
        self.random = RandomPolicy(agent.spec, seed=7)
        self.state = agent.traj_encoder.init_state(n, "cpu")
        self.log: list[tuple[Timesteps, np.ndarray, np.ndarray, torch.Tensor]] = []

    def act(self, ts: Timesteps, new_rollout: np.ndarray) -> np.ndarray:
        greedy = self.policy.act(ts, new_rollout)
        agent = self.agent
        with torch.no_grad():
            assert not agent.training  # act() leaves the agent in eval mode; the learner restores train
            agent.eval()
            if new_rollout.any():
                self.state = agent.traj_encoder.reset_state(self.state, torch.as_tensor(new_rollout))
            x = agent.tstep_encoder(ts)[:, 0]
            s, self.state = agent.traj_encoder.step(x, ts.time[:, 0], self.state)
            logits = agent.actor(s[:, None]).logits[:, 0]  # [N, G, A]
            agent.train()
        self.log.append((ts, new_rollout.copy(), greedy, logits))
        return self.random.act(ts, new_rollout)


def _cat_ts(parts: list[Timesteps]) -> Timesteps:
    return Timesteps(
        obs={k: torch.cat([p.obs[k] for p in parts], 1) for k in parts[0].obs},
        prev_action=torch.cat([p.prev_action for p in parts], 1),
        prev_reward=torch.cat([p.prev_reward for p in parts], 1),
        time=torch.cat([p.time for p in parts], 1),
        reset=torch.cat([p.reset for p in parts], 1),
    )


def _row(ts: Timesteps, i: int) -> Timesteps:
    return Timesteps(
        obs={k: v[i : i + 1] for k, v in ts.obs.items()},
        prev_action=ts.prev_action[i : i + 1],
        prev_reward=ts.prev_reward[i : i + 1],
        time=ts.time[i : i + 1],
        reset=ts.reset[i : i + 1],
    )


@pytest.mark.parametrize(
    "traj,context,episodes,pos_emb",
    [("transformer", 32, 1, "sinusoidal"), ("transformer", 4, 1, "sinusoidal"), ("transformer", 32, 2, "sinusoidal"),
     ("transformer", 4, 2, "rope"), ("gru", 32, 1, "sinusoidal"), ("gru", 32, 2, "sinusoidal")],
    ids=["transformer", "transformer-sliding", "transformer-2-episodes", "transformer-rope-sliding-2-episodes",
         "gru", "gru-2-episodes"],
)
def test_agent_policy_stepping_matches_full_forward(traj, context, episodes, pos_emb):
    """With several episodes per rollout, inner resets stay in context: only new_rollout clears it."""
    N = 3
    venv = make_vector_env("tmaze", {"length": 2, "horizon": 9}, N, episodes_per_rollout=episodes)
    spec = ActionSpec.from_space(venv.single_action_space)
    agent = build_agent(venv.single_observation_space["obs"], spec, traj=traj, max_seq_len=context,
                        model_kw={"pos_emb": pos_emb})
    # non-trivial observation statistics, so the normaliser is exercised too
    agent.tstep_encoder.obs_norm.mean.fill_(0.2)
    agent.tstep_encoder.obs_norm.var.fill_(0.5)
    probe = SteppingProbe(agent, N)
    Collector(venv, spec, seed=11).collect(probe, N * 36)
    venv.close()

    flags = np.stack([f for _, f, _, _ in probe.log])  # [steps, N]
    assert flags[0].all()
    staggered = flags[1:].any(1) & ~flags[1:].all(1)
    assert staggered.any(), "resets should happen at different moments in different envs"

    agent.eval()
    checked = max_len = inner_resets = 0
    for i in range(N):
        starts = list(np.flatnonzero(flags[:, i])) + [len(probe.log)]
        for a, b in zip(starts[:-1], starts[1:]):
            seq = _cat_ts([_row(probe.log[k][0], i) for k in range(a, b)])
            assert seq.time[0, 0] == 0 and (seq.time[0] == torch.arange(b - a)).all()
            inner_resets += int(seq.reset[0, 1:].sum())
            with torch.no_grad():
                full = agent.actor(agent(seq)).logits[0]  # [L, G, A]
            stepped = torch.stack([probe.log[k][3][i] for k in range(a, b)])  # [L, G, A]
            torch.testing.assert_close(stepped, full, atol=2e-5, rtol=1e-4)
            greedy = np.array([probe.log[k][2][i] for k in range(a, b)])
            top2 = full[:, -1].topk(2, -1).values
            clear = (top2[:, 0] - top2[:, 1]) > 1e-4  # ignore near-ties
            assert (greedy[clear.numpy()] == full[:, -1].argmax(-1).numpy()[clear.numpy()]).all()
            checked += b - a
            max_len = max(max_len, b - a)
    assert checked == len(probe.log) * N
    if context < 9:
        assert max_len > context, "some rollout should run past the attention window"
    assert (inner_resets > 0) == (episodes > 1)


# ------------------------------------------------------------------------------------------ 4. exploration
TS_KEYS = ("prev_action", "prev_reward", "time", "reset")


def _tiled_first_timestep(n: int) -> tuple[Timesteps, gym.spaces.Dict, ActionSpec]:
    env = TimestepWrapper(TMaze(length=3))
    step, _ = env.reset(seed=0)
    spec = env.action_spec
    batched = {
        "obs": {k: np.repeat(v[None], n, 0) for k, v in step["obs"].items()},
        **{k: np.repeat(np.asarray(step[k])[None], n, 0) for k in TS_KEYS},
    }
    return Timesteps.from_numpy(batched), env.observation_space["obs"], spec


def test_greedy_policy_takes_the_mode_and_ignores_exploration():
    N = 64
    ts, obs_space, spec = _tiled_first_timestep(N)
    agent = build_agent(obs_space, spec, traj="gru")
    with torch.no_grad():
        expected = agent.actor(agent(ts)).logits[:, 0, -1].argmax(-1).numpy()  # the policy's discount
    eps1 = Exploration(explore_config(eps_start=1.0, eps_end=1.0), spec, N, seed=0)
    eps1.scale[:] = 1.0
    for exploration in (None, eps1):
        for _ in range(3):
            r = AgentPolicy(agent, N, greedy=True, exploration=exploration).act(ts, np.zeros(N, bool))
            assert r.dtype == np.int64 and r.shape == (N,)
            np.testing.assert_array_equal(r, expected)


def test_exploration_through_agent_policy_is_uniform_at_eps_one():
    N = 4000
    ts, obs_space, spec = _tiled_first_timestep(N)
    agent = build_agent(obs_space, spec, traj="gru")
    G, A = len(GAMMAS), spec.dim
    with torch.no_grad():  # a policy that is all but certain to pick action 2
        agent.actor.net[-1].weight.zero_()
        agent.actor.net[-1].bias.view(G, A)[:, 2] = 30.0
    no_new = np.zeros(N, bool)

    sampled = AgentPolicy(agent, N, greedy=False).act(ts, no_new)
    assert (sampled == 2).all()

    exploration = Exploration(explore_config(eps_start=1.0, eps_end=1.0), spec, N, seed=1)
    exploration.scale[:] = 1.0  # eps = 1 in every env
    actions = AgentPolicy(agent, N, greedy=False, exploration=exploration).act(ts, no_new)
    counts = np.bincount(actions, minlength=A)
    assert counts.sum() == N
    sd = np.sqrt(N * (1 / A) * (1 - 1 / A))
    assert np.all(np.abs(counts - N / A) < 5 * sd), counts  # uniform over all actions, the mode included

    # per-env eps: each env draws its own scale at a new rollout; eps follows the env-step schedule
    annealed = explore_config(eps_start=1.0, eps_end=0.0, eps_anneal_steps=100)
    exploration = Exploration(annealed, spec, N, seed=2)
    actions = AgentPolicy(agent, N, greedy=False, exploration=exploration).act(ts, np.ones(N, bool))
    expected_off_mode = (1 - 1 / A) * exploration.scale.mean()
    assert abs((actions != 2).mean() - expected_off_mode) < 0.04
    late = AgentPolicy(agent, N, greedy=False, exploration=exploration, env_steps=lambda: 100 * N)
    assert (late.act(ts, no_new) == 2).all()  # eps annealed to 0


def test_continuous_greedy_is_tanh_of_the_mean_and_noise_perturbs_it():
    obs_space = gym.spaces.Dict({"obs": gym.spaces.Box(-1, 1, (3,), np.float32)})
    spec = ActionSpec("continuous", 2)
    agent = build_agent(obs_space, spec, traj="gru")
    N = 16
    gen = torch.Generator().manual_seed(0)
    ts = Timesteps(
        obs={"obs": torch.rand(N, 1, 3, generator=gen) * 2 - 1},
        prev_action=torch.zeros(N, 1, 2),
        prev_reward=torch.zeros(N, 1),
        time=torch.zeros(N, 1, dtype=torch.long),
        reset=torch.ones(N, 1, dtype=torch.bool),
    )
    with torch.no_grad():
        mode = agent.actor(agent(ts)).mean[:, 0, -1].tanh().numpy()
    a1 = AgentPolicy(agent, N, greedy=True).act(ts, np.ones(N, bool))
    a2 = AgentPolicy(agent, N, greedy=True).act(ts, np.ones(N, bool))
    assert a1.dtype == np.float32 and a1.shape == (N, 2)
    np.testing.assert_array_equal(a1, a2)
    np.testing.assert_allclose(a1, mode, atol=1e-6)
    exploration = Exploration(explore_config(noise_start=0.5, noise_end=0.5), spec, N, seed=0)
    noisy = AgentPolicy(agent, N, greedy=False, exploration=exploration).act(ts, np.ones(N, bool))
    assert np.abs(noisy).max() <= 1.0 and not np.allclose(noisy, a1)


# ------------------------------------------------------------------------------------------ 5. fast paths
def first_timesteps(batch: Batch) -> Timesteps:
    """The first timestep of every window of `batch`, as acting sees it: [B, 1, ...]."""
    x = batch.inputs
    return Timesteps(
        obs={k: v[:, :1] for k, v in x.obs.items()},
        prev_action=x.prev_action[:, :1],
        prev_reward=x.prev_reward[:, :1],
        time=x.time[:, :1],
        reset=x.reset[:, :1],
    )


def test_acting_leaves_eval_mode_learner_restores_train_and_acting_sees_new_weights(tmp_path):
    """The mode contract of AgentPolicy / Learner, and no stale σReparam acting snapshot after an update (the
    learner refreshes them; without that, acting would keep multiplying by the weights before the update)."""
    batch, obs_space, spec = real_batch("discrete", tmp_path / "replay")
    cfg = _experiment()
    torch.manual_seed(0)
    agent = Agent(obs_space, spec, cfg.model, cfg.loss)
    learner = Learner(agent, cfg, torch.device("cpu"))
    N = batch.shape[0]
    ts = first_timesteps(batch)
    sigma_layers = [m for m in agent.modules() if isinstance(m, SigmaReparamLinear)]
    assert sigma_layers

    def check_acting_matches_fresh_forward() -> None:
        policy = AgentPolicy(agent, N, greedy=True)
        actions = policy.act(ts, np.ones(N, bool))
        assert not agent.training  # acting mode, left on
        for m in sigma_layers:  # the snapshots hold the current weights
            assert torch.equal(m._acting_weight, m.effective_weight().detach())
        with torch.no_grad():
            logits = agent.actor(agent(ts)).logits[:, 0, -1]
        top2 = logits.topk(2, -1).values
        clear = ((top2[:, 0] - top2[:, 1]) > 1e-4).numpy()
        np.testing.assert_array_equal(actions[clear], logits.argmax(-1).numpy()[clear])

    check_acting_matches_fresh_forward()
    before = [m._acting_weight.clone() for m in sigma_layers]
    learner.update(batch)
    assert agent.training  # the learner switched back
    check_acting_matches_fresh_forward()
    assert any(not torch.equal(b, m._acting_weight) for b, m in zip(before, sigma_layers))


def test_acting_after_loading_published_weights_uses_them(tmp_path):
    """The async collector loads the learner's weights into an agent that has been acting: its next actions
    must come from the loaded weights, not from the σReparam snapshots of the old ones."""
    from safetensors.torch import save_model

    from icrl.asynchronous.protocol import load_weights

    batch, obs_space, spec = real_batch("discrete", tmp_path / "replay")
    N = batch.shape[0]
    ts = first_timesteps(batch)
    acting = build_agent(obs_space, spec)
    torch.manual_seed(1)
    published = Agent(obs_space, spec, model_cfg(), loss_cfg()).eval()
    save_model(published, str(tmp_path / "weights.safetensors"))

    def state_after_one_step(agent: Agent) -> torch.Tensor:
        policy = AgentPolicy(agent, N, greedy=True)
        policy.act(ts, np.ones(N, bool))
        with torch.no_grad():
            return agent.traj_encoder.step(agent.tstep_encoder(ts)[:, 0], ts.time[:, 0], policy.state)[0]

    old = state_after_one_step(acting)  # takes the snapshots of the old weights
    load_weights(acting, tmp_path / "weights.safetensors")
    new = state_after_one_step(acting)
    assert not torch.allclose(new, old)
    torch.testing.assert_close(new, state_after_one_step(published), atol=0, rtol=0)


def test_bf16_learner_update_keeps_float32_state(tmp_path):
    batch, obs_space, spec = real_batch("continuous", tmp_path / "replay")
    cfg = _experiment(dtype="bf16")
    torch.manual_seed(0)
    agent = Agent(obs_space, spec, cfg.model, cfg.loss)
    learner = Learner(agent, cfg, torch.device("cpu"))
    for _ in range(2):
        metrics = learner.update(batch)
    assert all(torch.isfinite(v).all() for v in metrics.values())
    assert metrics["loss"].dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in agent.parameters())
    assert all(p.grad is None or p.grad.dtype == torch.float32 for p in agent.parameters())
    assert agent.popart.mu.dtype == torch.float32


@pytest.mark.parametrize(("native", "amx", "dtype", "device", "warns"), [
    (False, False, "bf16", "cpu", "emulates"), (True, True, "bf16", "cpu", None), (None, None, "bf16", "cpu", None),
    (True, False, "bf16", "cpu", "without AMX"), (True, None, "bf16", "cpu", None),
    (False, False, "fp32", "cpu", None), (False, False, "bf16", "cuda", None), (True, False, "bf16", "cuda", None)])
def test_bf16_on_a_cpu_where_it_is_not_fast_is_warned_about(monkeypatch, native, amx, dtype, device, warns):
    """A bf16 run on a CPU without bf16 instructions is ~10x slower than fp32, and on x86 without AMX no faster,
    and nothing else says why."""
    monkeypatch.setattr(probes, "cpu_bf16_is_native", lambda: native)
    monkeypatch.setattr(probes, "cpu_has_amx", lambda: amx)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        said = probes.warn_if_bf16_is_emulated(dtype, torch.device(device))
    assert said is (warns is not None) and len(caught) == int(warns is not None)
    if warns:
        assert "--dtype fp32" in str(caught[0].message) and warns in str(caught[0].message)


def test_cpu_bf16_features_follow_what_torch_reports(monkeypatch):
    caps = {"architecture": "x86_64", "avx2": True, "avx512_bf16": False, "amx_bf16": False}
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: caps, raising=False)
    assert probes.cpu_bf16_is_native() is False
    assert probes.cpu_has_amx() is False
    caps["avx512_bf16"] = True
    assert probes.cpu_bf16_is_native() is True and probes.cpu_has_amx() is False
    caps["amx_bf16"] = True
    assert probes.cpu_bf16_is_native() is True and probes.cpu_has_amx() is True
    caps["architecture"] = "riscv64"
    assert probes.cpu_bf16_is_native() is None and probes.cpu_has_amx() is None
    monkeypatch.delattr(torch.cpu, "get_capabilities")
    assert probes.cpu_bf16_is_native() is None and probes.cpu_has_amx() is None


@pytest.mark.parametrize("reduce", ["min", "mean"])
@pytest.mark.parametrize("kind", ["discrete", "continuous"])
def test_redq_target_from_the_sampled_members_only_equals_the_full_ensemble(kind, reduce, tmp_path):
    """compute_loss evaluates only REDQ's sampled target critics; its targets equal the reference that
    evaluates all C and reduces over the members `redq_members` draws (same generator draw), for either
    `LossConfig.redq_reduce`."""
    from icrl.agent.losses import align_next, redq_members, td_targets

    batch, obs_space, spec = real_batch(kind, tmp_path / "replay")
    agent = build_agent(obs_space, spec)
    agent.popart.mu.fill_(0.3)
    agent.popart.nu.fill_(2.0)  # non-trivial denormalisation
    cfg = loss_cfg(redq_reduce=reduce)
    torch.manual_seed(5)
    _, _, y, valid = compute_loss(agent, batch, cfg, torch.Generator().manual_seed(9))

    torch.manual_seed(5)
    with torch.no_grad():
        s = agent(batch.inputs)
        dist = agent.target_actor(s)
        if kind == "discrete":
            q = agent.target_critic(s)
            q = agent.popart.denormalize(q.transpose(-1, -2)).transpose(-1, -2)
            v = (dist.probs.unsqueeze(-3) * q).sum(-1)
        else:
            v = agent.popart.denormalize(agent.target_critic(s, dist.sample()))
        v = v.index_select(-2, redq_members(v.shape[-2], cfg.redq_subset, torch.Generator().manual_seed(9)))
        v = v.amin(-2) if reduce == "min" else v.mean(-2)  # [B, L, G]
        ref = td_targets(batch.reward, batch.terminated, valid, align_next(v), agent.gammas, cfg.reward_scale)
    torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-5)
    other = loss_cfg(redq_reduce="mean" if reduce == "min" else "min")
    torch.manual_seed(5)
    _, _, y_other, _ = compute_loss(agent, batch, other, torch.Generator().manual_seed(9))
    assert not torch.allclose(y, y_other), "the reduction must change the target"


# ------------------------------------------------------------------------------------------ 5. config knobs
def test_actor_loss_knobs_reach_the_loss(monkeypatch, tmp_path):
    """LossConfig.exp_beta / exp_clip / num_value_samples are what compute_loss hands to actor_loss, and
    exp_beta changes the BC weights of the `exp` filter."""

    seen = {}
    real = learner_module.actor_loss

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(learner_module, "actor_loss", spy)
    batch, obs_space, spec = real_batch("continuous", tmp_path / "replay")
    agent = build_agent(obs_space, spec)
    weights = []
    for beta in (1.0, 0.05):
        cfg = loss_cfg(bc_filter="exp", exp_beta=beta, exp_clip=7.0, num_value_samples=5)
        torch.manual_seed(1)
        _, metrics, _, _ = compute_loss(agent, batch, cfg, torch.Generator().manual_seed(2))
        assert (seen["exp_beta"], seen["exp_clip"], seen["num_value_samples"]) == (beta, 7.0, 5)
        weights.append(float(metrics["bc_weight"]))
    assert weights[0] != pytest.approx(weights[1])


def test_model_knobs_shape_the_networks():
    """tstep_hidden, normalize_obs, clip_obs reach the timestep encoder; d_ff, attn_dropout, emb_dropout the
    Transformer; each changes the built agent."""
    obs_space = gym.spaces.Dict({"obs": gym.spaces.Box(-1.0, 1.0, (3,), np.float32)})
    spec = ActionSpec.from_space(gym.spaces.Discrete(4))

    def build(**kw) -> Agent:
        return Agent(obs_space, spec, dataclasses.replace(model_cfg(), **kw), loss_cfg())

    def count(agent: Agent) -> int:
        return sum(p.numel() for p in agent.parameters())

    base = build()
    assert base.tstep_encoder.obs_norm.clip == 10.0
    assert count(build(d_ff=4 * 32)) == count(base)  # unset: 4 x d_model
    assert count(build(d_ff=48)) < count(base)
    assert count(build(tstep_hidden=16)) < count(base)
    assert build(normalize_obs=False).tstep_encoder.obs_norm is None
    assert build(clip_obs=3.0).tstep_encoder.obs_norm.clip == 3.0
    enc = build(attn_dropout=0.2, emb_dropout=0.3).traj_encoder
    assert any(getattr(m, "attn_dropout", None) == 0.2 for m in enc.modules())
    assert 0.3 in {m.p for m in enc.modules() if isinstance(m, torch.nn.Dropout)}
    assert not any(getattr(m, "attn_dropout", 0.0) or getattr(m, "p", 0.0) for m in base.traj_encoder.modules())


@pytest.mark.parametrize(("choice", "fused"), [(None, True), (False, False), (True, True)])
def test_fused_adam_choice(choice, fused):
    """OptimConfig.fused_adam: unset is fused on the CPU (torch has the kernel there), as before the knob."""
    obs_space = gym.spaces.Dict({"obs": gym.spaces.Box(-1.0, 1.0, (3,), np.float32)})
    agent = Agent(obs_space, ActionSpec.from_space(gym.spaces.Discrete(4)), model_cfg(), loss_cfg())
    learner = Learner(agent, _experiment(fused_adam=choice), torch.device("cpu"))
    assert bool(learner.optimizer.defaults["fused"]) is fused


def _hand_update(agent: Agent, opt: torch.optim.Optimizer, sched, generator: torch.Generator, batch: Batch,
                 cfg: ExperimentConfig) -> dict[str, torch.Tensor]:
    """One learner step written out by hand, in the order the method prescribes (docs/design.md §4): the
    reference `Learner.update` must reproduce bit for bit in one process, whatever collectives it runs on."""
    from icrl.agent.losses import redq_members
    from icrl.nets.ema import ema_update_

    agent.train()
    members = redq_members(agent.target_critic.num_critics, cfg.loss.redq_subset, generator)
    agent.tstep_encoder.obs_norm.merge(*agent.tstep_encoder.normalization_moments(batch.inputs, batch.mask))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.optim.dtype == "bf16"):
        loss, metrics, y, valid = compute_loss(agent, batch, cfg.loss, members=members)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(agent.online_parameters(), cfg.optim.grad_clip)
    if bool(torch.isfinite(loss)) and bool(torch.isfinite(grad_norm)):
        opt.step()
        with torch.no_grad():
            agent.popart.update_(y, valid, [agent.critic, agent.target_critic])
            ema_update_(agent.target_actor, agent.actor, cfg.loss.tau)
            ema_update_(agent.target_critic, agent.critic, cfg.loss.tau)
    sched.step()  # the warm-up counts every update
    agent.refresh_acting_weights()
    metrics.update(loss=loss.detach(), grad_norm=grad_norm, lr=torch.tensor(sched.get_last_lr()[0]))
    metrics["popart_mu"], metrics["popart_sigma"] = agent.popart.mu[-1], agent.popart.sigma[-1]
    return {k: v.detach().float().reshape(()) for k, v in metrics.items()}


@pytest.mark.parametrize(("kind", "dtype"), [(k, "fp32") for k in KINDS] + [("continuous", "bf16")])
def test_single_process_update_is_the_hand_run_step_bit_for_bit(kind, dtype, tmp_path):
    """`Learner.update` in one process (no collectives given: the trivial ones) equals the hand-run step above
    exactly, over three steps: every weight, buffer, optimiser moment and logged metric, bit for bit. The
    data-parallel code path is the same code, so nothing of it may leak into one process's numbers."""
    from icrl.agent.learner import param_groups

    batch, obs_space, spec = real_batch(kind, tmp_path / "replay")
    cfg = _experiment(dtype=dtype, grad_clip=0.05)  # a small clip: the clipping is exercised too
    torch.manual_seed(0)
    agent = Agent(obs_space, spec, cfg.model, cfg.loss)
    ref = copy.deepcopy(agent)
    learner = Learner(agent, cfg, torch.device("cpu"))
    opt = torch.optim.AdamW(param_groups(ref, cfg.optim.weight_decay), lr=cfg.optim.lr,
                            fused=learner.optimizer.defaults["fused"])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda u: min(1.0, (u + 1) / max(cfg.optim.warmup_updates, 1)))
    generator = torch.Generator().manual_seed(cfg.run.seed)
    for step in range(3):
        torch.manual_seed(step)  # the continuous heads sample from the global generator: the same draws
        got = learner.update(batch)
        torch.manual_seed(step)
        want = _hand_update(ref, opt, sched, generator, batch, cfg)
        assert sorted(got) == sorted(want)
        assert [k for k in want if not torch.equal(got[k], want[k])] == []
        assert float(want["grad_norm"]) > cfg.optim.grad_clip  # clipped
    assert [k for k, v in ref.state_dict().items() if not torch.equal(agent.state_dict()[k], v)] == []
    got_opt, want_opt = learner.optimizer.state_dict()["state"], opt.state_dict()["state"]
    assert sorted(got_opt) == sorted(want_opt) and all(
        torch.equal(got_opt[i][k], want_opt[i][k]) for i in want_opt for k in want_opt[i])
    assert learner.scheduler.last_epoch == sched.last_epoch == 3 and learner.updates == 3


@pytest.mark.parametrize("kind", ["discrete", "continuous"])
def test_the_conservative_term_enters_only_the_critic_loss_and_only_where_asked(kind, tmp_path):
    """--conservative-coeff 0 computes AMAGO's loss; > 0 adds critic_weight x α x the term (CQL(H)) to
    a discrete critic's loss, reaching the critic and the encoders, never the actor; continuous critics ignore it."""
    batch, obs_space, spec = real_batch(kind, tmp_path / "replay")
    agent = build_agent(obs_space, spec)
    members = torch.tensor([0, 1])

    def loss_and_grads(cfg: LossConfig) -> tuple[torch.Tensor, dict, dict[str, list[torch.Tensor]]]:
        agent.zero_grad(set_to_none=True)
        torch.manual_seed(0)  # the same target-action samples in both calls
        loss, metrics, _, _ = compute_loss(agent, batch, cfg, members=members)
        loss.backward()
        grads = {k: [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in ps]
                 for k, ps in groups(agent).items()}
        return loss.detach(), metrics, grads

    base, m0, g0 = loss_and_grads(loss_cfg(conservative_coeff=0.0))
    with_term, m1, g1 = loss_and_grads(loss_cfg(conservative_coeff=0.5))
    assert "conservative" not in m0
    if kind == "continuous":
        assert "conservative" not in m1 and torch.equal(base, with_term)
        return
    assert m1["conservative"] > 0
    torch.testing.assert_close(with_term - base, loss_cfg().critic_weight * 0.5 * m1["conservative"])
    for a, b in zip(g0["actor"], g1["actor"]):  # the actor's gradient is unchanged (to the backward's float noise)
        torch.testing.assert_close(a, b)
    assert not all(torch.allclose(a, b) for a, b in zip(g0["critic"], g1["critic"]))
    assert not all(torch.allclose(a, b) for a, b in zip(g0["traj_encoder"], g1["traj_encoder"]))
