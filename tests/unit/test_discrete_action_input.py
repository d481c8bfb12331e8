"""`LossConfig.discrete_action_input` (AMAGO-2's discrete critic Q(s, one-hot a)): the straight-through Gumbel-softmax
sample, the (s, a) critic over one-hot actions, the exact V(s) and its sampled alternative, with hand-checked values
where the math is new. Gradient routing and the learner update with the option: tests/unit/test_agent.py."""

from __future__ import annotations

import json
import math

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from icrl.agent.critic_kind import CriticReader
from icrl.agent.learner import target_values
from icrl.agent.losses import actor_loss, align_next, td_targets
from icrl.agent.model import Agent
from icrl.config import ExperimentConfig, LossConfig, ModelConfig
from icrl.nets import dists
from icrl.nets.dists import GUMBEL_TEMPERATURE, Categorical, straight_through_gumbel
from icrl.nets.heads import Critic
from icrl.types import ActionSpec, Batch, Timesteps

D, H = 6, 16
TWOHOT = {"critic_kind": "twohot", "critic_bins": 8, "critic_min_value": -20.0, "critic_max_value": 20.0}


# ---------------------------------------------------------------- the straight-through Gumbel-softmax sample


def test_straight_through_value_is_the_gumbel_max_one_hot_and_its_gradient_the_relaxed_probabilities():
    """Logits log(4, 2, 1) without noise at τ = 0.5: the relaxed probabilities are softmax(2 logits) = (16, 4, 1) / 21,
    the value is one-hot at action 0, and the gradient of c·a (c = e_0) is
    ∂y_0/∂l = y_0 (e_0 - y) / τ = 2 · 16/21 · (5, -4, -1)/21 = (160, -128, -32) / 441."""
    logits = torch.log(torch.tensor([4.0, 2.0, 1.0], dtype=torch.float64)).requires_grad_()
    a = straight_through_gumbel(logits, torch.zeros(3, dtype=torch.float64), 0.5)
    assert a.tolist() == [1.0, 0.0, 0.0]  # exactly one-hot, not merely close
    (a * torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)).sum().backward()
    torch.testing.assert_close(logits.grad, torch.tensor([160.0, -128.0, -32.0], dtype=torch.float64) / 441)
    # noise moves the argmax (log 2 + 2 > log 4): the value follows, the gradient is the relaxation's at that noise
    logits.grad = None
    noise = torch.tensor([0.0, 2.0, 0.0], dtype=torch.float64)
    a = straight_through_gumbel(logits, noise, 0.5)
    assert a.tolist() == [0.0, 1.0, 0.0]
    (a * torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)).sum().backward()
    y = torch.softmax((logits.detach() + noise) / 0.5, -1)
    torch.testing.assert_close(logits.grad, y[1] * (torch.eye(3, dtype=torch.float64)[1] - y) / 0.5)


def test_categorical_straight_through_sample_follows_the_policy_and_rsample_still_refuses():
    probs = torch.tensor([[0.6, 0.3, 0.1], [0.05, 0.05, 0.9]])
    logits = probs.log().requires_grad_()
    dist = Categorical(logits)
    torch.manual_seed(0)
    a = dist.straight_through_sample((20000,))
    assert a.shape == (20000, 2, 3) and GUMBEL_TEMPERATURE == 0.5  # the official DiscreteLikeContinuous's
    assert set(a.detach().unique().tolist()) == {0.0, 1.0} and (a.detach().sum(-1) == 1).all()
    torch.testing.assert_close(a.detach().mean(0), probs, atol=0.015, rtol=0)  # an exact sample of π
    a.sum(0)[:, 0].sum().backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0
    with pytest.raises(TypeError, match="exact expectation"):  # the default discrete path keeps its contract
        dist.rsample()


# ---------------------------------------------------------------- the critic over one-hot actions


@pytest.mark.parametrize("num_bins", [None, 8])
def test_action_input_critic_every_action_is_the_critic_at_each_one_hot(num_bins):
    """`every_action` evaluates the A one-hot actions in one call: equal to calling the (s, a) critic at each
    e_a (the same for every discount), stacked on the action dim, for every member subset."""
    A, G, C = 5, 3, 4
    torch.manual_seed(0)
    critic = Critic(D, ActionSpec("discrete", A), G, num_critics=C, hidden=H, num_bins=num_bins, action_input=True)
    assert not critic.discrete and critic.w_action.shape == (C, A, H)
    assert critic.w_out.shape == (C, H, G) + (() if num_bins is None else (num_bins,))  # no per-action outputs
    s = torch.randn(2, 3, D)
    members = torch.tensor([3, 1])
    with torch.no_grad():
        for m in (None, members):
            got = critic.every_action(s, members=m)  # [2, 3, C', G, A(, K)]
            ref = torch.stack([critic(s, torch.eye(A)[a].expand(2, 3, 1, A), members=m) for a in range(A)],
                              dim=4)
            torch.testing.assert_close(got, ref)
    per_action = Critic(D, ActionSpec("discrete", A), G, num_critics=C, hidden=H)  # the default: every_action = forward
    torch.testing.assert_close(per_action.every_action(s), per_action(s))


def test_sums_over_actions_while_actions_are_no_more_than_discounts_and_other_kinds_ignore_the_option():
    def critic(kind: str, A: int, G: int, action_input: bool = True) -> Critic:
        return Critic(D, ActionSpec(kind, A), G, num_critics=2, hidden=H, action_input=action_input)

    assert critic("discrete", 4, 7).sums_over_actions and critic("discrete", 7, 7).sums_over_actions
    assert not critic("discrete", 18, 7).sums_over_actions
    assert critic("discrete", 18, 7, action_input=False).sums_over_actions  # the per-action critic: always
    for kind in ("continuous", "multibinary"):  # their critic takes actions anyway: the same network
        on, off = critic(kind, 3, 2), critic(kind, 3, 2, action_input=False)
        assert [(n, p.shape) for n, p in on.named_parameters()] == [(n, p.shape) for n, p in off.named_parameters()]
        assert not on.sums_over_actions
        with pytest.raises(ValueError, match="needs discrete actions"):
            on.every_action(torch.zeros(1, D))


# ------------------------------------------------------------- the actor loss: exact V(s), straight-through online term


def _linear_critic(q_table: torch.Tensor):
    """q_fn of a critic whose member c values action a at q_table[c, a]: a [..., G, A] -> [..., C, G]."""
    return lambda a: torch.einsum("...ga,ca->...cg", a, q_table)


Q_TABLE = torch.tensor([[1.0, 4.0, -2.0], [3.0, 0.0, 2.0]], dtype=torch.float64)  # [C, A]; ensemble mean (2, 2, 0)
PROBS = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)


def test_exact_value_and_advantage_by_hand():
    """π = (1/2, 1/4, 1/4), mean Q = (2, 2, 0): V(s) = 1 + 1/2 + 0 = 3/2; a_t = action 1 with Q(s, a_t) = mean(4, 0)
    = 2 gives A = 1/2 > 0, so the binary filter keeps it and the BC term is -log π(a_t) = log 4."""
    dist = Categorical(PROBS.log().view(1, 1, 1, 3))
    action = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64).view(1, 1, 3)
    q_all = Q_TABLE.view(1, 1, 2, 1, 3)  # [B, L, C, G, A]
    q_data = Q_TABLE[:, 1].view(1, 1, 2, 1)  # [B, L, C, G]: the critic loss's Q(s, a_t)
    loss, m = actor_loss(dist, action, torch.ones(1, 1, dtype=torch.bool), q_all=q_all,
                         q_fn=_linear_critic(Q_TABLE), q_data=q_data, online_coeff=0.0, offline_coeff=1.0)
    assert float(m["advantage"]) == pytest.approx(0.5) and float(m["bc_weight"]) == 1.0
    assert float(m["actor_online"]) == pytest.approx(-1.5)  # with the online term off: -V(s), exact
    assert float(loss) == pytest.approx(math.log(4.0))
    # without q_all, V(s) is the sampled actions' mean Q: here the sample is action 0 (noise-free Gumbel-max)
    _, m = actor_loss(dist, action, torch.ones(1, 1, dtype=torch.bool), q_fn=_linear_critic(Q_TABLE),
                      q_data=q_data, online_coeff=0.0, offline_coeff=1.0)
    assert float(m["advantage"]) in (0.0, 2.0)  # Q(a_t) - Q(a_k): a_k = 0 or 1 gives 0, a_k = 2 gives 2


def test_online_term_gradient_through_the_straight_through_sample_by_hand(monkeypatch):
    """Without noise the sample is argmax π = action 0 (online term -mean Q(s, e_0) = -2) and the gradient is the
    relaxed probabilities' y = softmax(2 log π) = (2/3, 1/6, 1/6): ∂(y · Q̄)/∂l = y (Q̄ - y · Q̄) / τ with y · Q̄ = 5/3,
    = 2 (2/3 · 1/3, 1/6 · 1/3, 1/6 · -5/3) = (4/9, 1/9, -5/9); the loss is its negative."""
    monkeypatch.setattr(dists, "_gumbel", lambda shape, like: torch.zeros(shape, dtype=like.dtype))
    logits = PROBS.log().view(1, 1, 1, 3).clone().requires_grad_()
    action = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64).view(1, 1, 3)
    loss, m = actor_loss(Categorical(logits), action, torch.ones(1, 1, dtype=torch.bool),
                         q_all=Q_TABLE.view(1, 1, 2, 1, 3), q_fn=_linear_critic(Q_TABLE),
                         online_coeff=1.0, offline_coeff=0.0)
    assert float(loss.detach()) == pytest.approx(-2.0) and float(m["actor_online"]) == pytest.approx(-2.0)
    loss.backward()
    torch.testing.assert_close(logits.grad.view(3), -torch.tensor([4.0, 1.0, -5.0], dtype=torch.float64) / 9)


# ---------------------------------------------------------------- the TD target's V(s')


def _agent_and_batch(A: int, G: int, critic_kw: dict) -> tuple[Agent, Batch, LossConfig]:
    obs = gym.spaces.Dict({"obs": gym.spaces.Box(-1.0, 1.0, (3,), np.float32)})
    loss = LossConfig(gammas=tuple(np.linspace(0.5, 0.95, G).tolist()), num_critics=3, redq_subset=2,
                      discrete_action_input=True, **critic_kw)
    model = ModelConfig(traj_encoder="ff", d_model=16, max_seq_len=5, max_time=16, head_hidden=16, head_layers=1)
    torch.manual_seed(0)
    agent = Agent(obs, ActionSpec("discrete", A), model, loss)
    agent.popart.mu.fill_(0.3)
    agent.popart.nu.fill_(2.0)  # non-trivial denormalisation
    g = torch.Generator().manual_seed(1)
    B, L = 2, 5
    act = F.one_hot(torch.randint(A, (B, L), generator=g), A).float()
    ts = Timesteps(obs={"obs": torch.rand(B, L, 3, generator=g)}, prev_action=act, prev_reward=torch.zeros(B, L),
                   time=torch.arange(L).expand(B, L).clone(), reset=torch.zeros(B, L, dtype=torch.int8))
    ones = torch.ones(B, L, dtype=torch.bool)
    batch = Batch(inputs=ts, action=act, reward=torch.randn(B, L, generator=g), terminated=~ones, truncated=~ones,
                  mask=ones, has_action=ones)
    return agent, batch, loss


@pytest.mark.parametrize("critic_kw", [{}, TWOHOT], ids=["regression", "twohot"])
@pytest.mark.parametrize(("A", "G"), [(3, 4), (5, 2)], ids=["exact", "sampled"])
def test_target_value_is_the_policy_weighted_sum_over_one_hot_actions_or_one_sample(A, G, critic_kw):
    """A <= G: V(s') = Σ_a π̄(a|s') Q̄(s', e_a), the target critic called once per one-hot action here (reduced over
    REDQ's members after the sum, as the per-action critic's target). A > G: Q̄(s', a') at one a' ~ π̄ per discount."""
    agent, batch, cfg = _agent_and_batch(A, G, critic_kw)
    read = CriticReader.of(agent, cfg, torch.device("cpu"))
    members = torch.tensor([2, 0])
    with torch.no_grad():
        s = agent(batch.inputs)
        valid = batch.has_action & align_next(batch.mask)
        torch.manual_seed(4)
        y = target_values(agent, s, batch, valid, cfg, members, read)
        probs = agent.target_actor(s).probs  # [B, L, G, A]
        if A <= G:
            per_action = [read.raw(agent.target_critic(s, torch.eye(A)[a].expand(*s.shape[:-1], 1, A), members=members))
                          for a in range(A)]  # A x [B, L, k, G]
            v = sum(probs[..., a].unsqueeze(-2) * per_action[a] for a in range(A))
        else:
            torch.manual_seed(4)
            v = read.raw(agent.target_critic(s, agent.target_actor(s).sample(), members=members))
        ref = td_targets(batch.reward, batch.terminated, valid, align_next(v.amin(-2)), agent.gammas, cfg.reward_scale)
    torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-5)


def test_an_agent_built_for_the_other_critic_form_is_refused():
    agent, _, cfg = _agent_and_batch(3, 4, {})
    with pytest.raises(ValueError, match="discrete_action_input false but the agent's critic"):
        CriticReader.of(agent, LossConfig(gammas=cfg.gammas, num_critics=3), torch.device("cpu"))


def test_config_field_defaults_off_validates_and_old_configs_load():
    assert LossConfig().discrete_action_input is False
    ExperimentConfig().replace(discrete_action_input=True).validate(check_device=False)
    raw = json.loads(ExperimentConfig().to_json())
    del raw["loss"]["discrete_action_input"]
    assert ExperimentConfig.from_json(json.dumps(raw)) == ExperimentConfig()


def test_the_straight_through_online_term_alone_drives_the_policy_to_the_best_action():
    """-Q(s, a~π) through one straight-through sample per step, against a fixed critic Q̄ = (1, 2, 0, 1.5): a biased
    but useful gradient, π(best) > 0.95 after 150 Adam steps from the uniform policy."""
    torch.manual_seed(0)
    q_table = torch.tensor([[1.0, 2.0, 0.0, 1.5]])
    logits = torch.zeros(1, 1, 1, 4, requires_grad=True)
    opt = torch.optim.Adam([logits], lr=0.05)
    for _ in range(150):
        loss, _ = actor_loss(Categorical(logits), torch.zeros(1, 1, 4), torch.ones(1, 1, dtype=torch.bool),
                             q_fn=_linear_critic(q_table), online_coeff=1.0, offline_coeff=0.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(torch.softmax(logits.detach(), -1)[..., 1]) > 0.95
