"""TD targets, REDQ, critic and actor losses: hand-computed values, masking, gradient routing."""

from __future__ import annotations

import copy
import inspect
import itertools
import math

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from icrl.agent.critic_kind import CriticReader
from icrl.agent.losses import (
    ValueBins,
    actor_loss,
    advantage_filter,
    align_next,
    conservative_term,
    critic_loss,
    frozen_critic,
    redq_members,
    td_targets,
)
from icrl.agent.model import Agent
from icrl.config import LossConfig, ModelConfig
from icrl.data.collate import collate_windows
from icrl.nets.dists import Categorical
from icrl.nets.heads import Actor, Critic
from icrl.nets.popart import PopArt
from icrl.types import ActionSpec, Rollout

NAN = float("nan")


# ---------------------------------------------------------------- TD targets


def _td_case():
    """Three windows of L=5, padding marked NaN where it must never be read.

    row 0: terminal after step 2 (no bootstrap there); row 1: time-limit truncation after step 2
    (bootstraps; the window's transitions end there); row 2: four transitions, no terminal.
    """
    reward = torch.tensor([[1.0, 2.0, 3.0, NAN, NAN], [1.0, 1.0, 1.0, NAN, NAN], [0.0, 0.0, 0.0, 0.0, NAN]])
    terminated = torch.tensor([[0, 0, 1, 0, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 0]], dtype=torch.bool)
    valid = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0]], dtype=torch.bool)
    nv = torch.tensor([[10.0, 20.0, 30.0, NAN, NAN], [5.0, 6.0, 7.0, NAN, NAN], [1.0, 2.0, 3.0, 4.0, NAN]])
    gammas = torch.tensor([0.5, 0.9])
    next_value = nv.unsqueeze(-1).expand(3, 5, 2).clone()
    next_value[..., 1] *= 2  # the second discount's critic predicts twice as much
    return reward, terminated, valid, next_value, gammas


def test_td_targets_one_step_table():
    reward, terminated, valid, next_value, gammas = _td_case()
    y = td_targets(reward, terminated, valid, next_value, gammas, reward_scale=2.0)
    assert y.shape == (3, 5, 2) and torch.isfinite(y).all()
    for gi, g in enumerate([0.5, 0.9]):
        k = 2.0 if gi == 1 else 1.0  # value multiplier of this discount
        expected = torch.tensor(
            [
                [2 * 1 + g * 10 * k, 2 * 2 + g * 20 * k, 2 * 3, 0, 0],  # terminal: no bootstrap
                [2 + g * 5 * k, 2 + g * 6 * k, 2 + g * 7 * k, 0, 0],  # truncation bootstraps
                [g * 1 * k, g * 2 * k, g * 3 * k, g * 4 * k, 0],
            ]
        )
        torch.testing.assert_close(y[..., gi], expected)


def test_td_targets_n_step_table():
    reward, terminated, valid, next_value, gammas = _td_case()
    y = td_targets(reward, terminated, valid, next_value, gammas, reward_scale=2.0, n_step=3)
    assert torch.isfinite(y).all()
    for gi, g in enumerate([0.5, 0.9]):
        k = 2.0 if gi == 1 else 1.0
        expected = torch.tensor(
            [
                # stops at the terminal after step 2, without bootstrapping
                [2 + g * 4 + g**2 * 6, 4 + g * 6, 6, 0, 0],
                # three steps, then two, then one as the window's transitions run out
                [2 + 2 * g + 2 * g**2 + g**3 * 7 * k, 2 + 2 * g + g**2 * 7 * k, 2 + g * 7 * k, 0, 0],
                [g**3 * 3 * k, g**3 * 4 * k, g**2 * 4 * k, g * 4 * k, 0],
            ]
        )
        torch.testing.assert_close(y[..., gi], expected)


def test_td_targets_n_step_one_equals_default():
    reward, terminated, valid, next_value, gammas = _td_case()
    y1 = td_targets(reward, terminated, valid, next_value, gammas, n_step=1)
    y = td_targets(reward, terminated, valid, next_value, gammas)
    assert torch.equal(y1, y) and y.shape == (3, 5, 2)


# AMAGO's discounts (Grigsby et al. 2024): the default a run trains with. Written out here on purpose, so
# the test fails when the running default changes and nobody updated this expectation.
AMAGO_GAMMAS = (0.1, 0.9, 0.95, 0.97, 0.99, 0.995, 0.999)


def _tiny_batch(spec: ActionSpec, T: int = 6):
    """One real-looking rollout of 3-dim observations, collated into a [1, T + 1] Batch."""
    rng = np.random.default_rng(0)
    action = rng.integers(spec.dim, size=T)
    prev_action = np.zeros((T + 1, spec.dim), np.float32)
    prev_action[1:] = spec.to_vector(action)
    reward = rng.normal(size=T).astype(np.float32)
    rollout = Rollout(
        obs={"obs": rng.normal(size=(T + 1, 3)).astype(np.float32)},
        prev_action=prev_action,
        prev_reward=np.concatenate([[0.0], reward]).astype(np.float32),
        time=np.arange(T + 1, dtype=np.int64),
        reset=np.arange(T + 1) == 0,
        action=action,
        reward=reward,
        terminated=np.arange(T) == T - 1,
        truncated=np.zeros(T, bool),
    )
    return collate_windows([(rollout, 0)], T + 1, spec)


def test_default_gammas_are_the_ones_the_critic_trains_with(monkeypatch):
    """The discounts that reach the TD targets of a default-config agent are AMAGO's: followed from
    `LossConfig()` through `Agent` into the `gammas` that `compute_loss` hands to `td_targets`."""
    import icrl.agent.learner as learner

    loss_cfg = LossConfig()
    assert tuple(loss_cfg.gammas) == AMAGO_GAMMAS
    spec = ActionSpec("discrete", 3)
    obs_space = gym.spaces.Dict({"obs": gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)})
    model = ModelConfig(d_model=16, layers=1, heads=2, max_seq_len=8, max_time=16, head_hidden=16, head_layers=1)
    agent = Agent(obs_space, spec, model, loss_cfg)
    assert agent.actor.num_gammas == agent.critic.num_gammas == len(AMAGO_GAMMAS)

    real, seen = learner.td_targets, []

    def spy(*args, **kwargs):
        seen.append(inspect.signature(real).bind(*args, **kwargs).arguments["gammas"])
        return real(*args, **kwargs)

    monkeypatch.setattr(learner, "td_targets", spy)
    _, _, y, _ = learner.compute_loss(agent, _tiny_batch(spec), loss_cfg, torch.Generator().manual_seed(0))
    assert len(seen) == 1
    torch.testing.assert_close(torch.as_tensor(seen[0]), torch.tensor(AMAGO_GAMMAS, dtype=torch.float32))
    assert y.shape[-1] == len(AMAGO_GAMMAS)


def test_align_next():
    v = torch.arange(6.0).view(1, 6, 1)
    assert align_next(v).flatten().tolist() == [1, 2, 3, 4, 5, 0]


# ---------------------------------------------------------------- REDQ


def test_redq_members_are_a_fresh_random_subset_per_draw():
    """One subset of `subset` distinct critics per draw (per update), reproducible from the generator."""
    C = 4
    gen = torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(60):
        idx = redq_members(C, 2, gen)
        assert idx.shape == (2,) and len(set(idx.tolist())) == 2 and all(0 <= i < C for i in idx.tolist())
        seen.add(tuple(sorted(idx.tolist())))
    assert seen == set(itertools.combinations(range(C), 2))  # every pair gets drawn
    again = torch.Generator().manual_seed(1)
    assert torch.equal(redq_members(C, 2, torch.Generator().manual_seed(1)), redq_members(C, 2, again))
    assert sorted(redq_members(C, C).tolist()) == list(range(C))


# ---------------------------------------------------------------- critic loss


def test_critic_loss_ignores_padding_exactly():
    B, L, C, G = 2, 4, 3, 2
    q = torch.randn(B, L, C, G, requires_grad=True)
    y = torch.randn(B, L, G)
    valid = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]], dtype=torch.bool)
    y_pad = y.clone()
    y_pad[~valid] = NAN
    with torch.no_grad():
        q_pad = q.clone()
        q_pad[~valid] = 1e6
    q_pad.requires_grad_(True)
    loss, metrics = critic_loss(q_pad, y_pad, valid)
    expected = ((q - y.unsqueeze(2)) ** 2)[valid].mean()
    torch.testing.assert_close(loss, expected)
    loss.backward()
    assert torch.all(q_pad.grad[~valid] == 0) and torch.isfinite(q_pad.grad).all()
    assert set(metrics) >= {"critic_loss", "q_norm", "y_norm", "td_abs_err"}


def test_conservative_term_values_padding_and_what_it_pushes():
    """logsumexp_a Q - Q(a_t), masked mean over real transitions x C x G; its gradient lowers every action by its
    softmax weight and raises the stored one, so an action never stored only goes down; padding (NaN) is never read."""
    B, L, C, G, A = 2, 3, 2, 2, 4
    q = torch.randn(B, L, C, G, A)
    a = torch.randint(0, A, (B, L))
    action = F.one_hot(a, A).float().unsqueeze(-2).expand(B, L, G, A)  # [B, L, G, A]
    valid = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    q_pad = q.clone()
    q_pad[~valid] = NAN
    q_pad.requires_grad_(True)
    term = conservative_term(q_pad, action, valid)
    gap = torch.logsumexp(q, -1) - (q * action.unsqueeze(2)).sum(-1)  # [B, L, C, G]
    torch.testing.assert_close(term, gap[valid].mean())
    term.backward()
    grad = q_pad.grad
    assert torch.all(grad[~valid] == 0) and torch.isfinite(grad).all()
    real = valid[..., None, None, None].expand_as(grad)
    stored = action.unsqueeze(2).expand_as(grad).bool() & real
    assert torch.all(grad[stored] < 0) and torch.all(grad[~stored & real] > 0)


def test_conservative_term_temperature():
    """τ · logsumexp(Q / τ) - Q(a_t): τ = 1 is CQL(H)'s term; the gradient's lowering sums to 1 per entry whatever τ,
    and at a small τ it falls on the actions valued above the stored one, not on those below it."""
    B, L, C, G, A = 2, 3, 2, 2, 4
    q = torch.randn(B, L, C, G, A)
    action = F.one_hot(torch.randint(0, A, (B, L)), A).float().unsqueeze(-2).expand(B, L, G, A)
    valid = torch.ones(B, L, dtype=torch.bool)
    torch.testing.assert_close(conservative_term(q, action, valid, 1.0), conservative_term(q, action, valid))
    q_data = (q * action.unsqueeze(2)).sum(-1)  # [B, L, C, G]
    expected = (0.5 * torch.logsumexp(q / 0.5, -1) - q_data).mean()
    torch.testing.assert_close(conservative_term(q, action, valid, 0.5), expected)

    # one state, three actions: stored = 1 (value 0), above it = 0 (value 1), below it = 2 (value -1)
    q1 = torch.tensor([1.0, 0.0, -1.0]).view(1, 1, 1, 1, 3).requires_grad_(True)
    a1 = F.one_hot(torch.tensor([[1]]), 3).float().unsqueeze(-2)  # [1, 1, 1, 3]
    one = torch.ones(1, 1, dtype=torch.bool)
    grads = {}
    for tau in (1.0, 0.1):
        q1.grad = None
        conservative_term(q1, a1, one, tau).backward()
        grads[tau] = q1.grad.flatten().clone()
        torch.testing.assert_close(grads[tau].sum(), torch.tensor(0.0))  # lowering and raising balance
    assert grads[0.1][0] > grads[1.0][0] > 0  # the action valued above the stored one is lowered more
    assert 0 < grads[0.1][2] < 1e-4 < grads[1.0][2]  # the one below it is left nearly alone
    assert grads[0.1][1] < grads[1.0][1] < 0  # the stored one is raised


# ---------------------------------------------------------------- actor loss values


def test_actor_loss_discrete_values():
    B, L, C, G, A = 1, 2, 2, 2, 3
    logits = torch.randn(B, L, G, A)
    q_all = torch.randn(B, L, C, G, A)
    action = F.one_hot(torch.tensor([[2, 0]]), A).float()  # [B, L, A]
    valid = torch.tensor([[True, False]])
    loss, m = actor_loss(Categorical(logits), action, valid, q_all=q_all, online_coeff=1.0, offline_coeff=0.1)
    p, q = logits.softmax(-1), q_all.mean(2)  # [B, L, G, A]
    v = (p * q).sum(-1)
    a_id = 2
    adv = q[0, 0, :, a_id] - v[0, 0]  # [G]
    bc = -(adv > 0).float() * logits.log_softmax(-1)[0, 0, :, a_id]
    expected = (-v[0, 0] + 0.1 * bc).mean()
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(m["advantage"], adv.mean())


def test_entropy_bonus_subtracts_c_times_the_policy_entropy_and_makes_softmax_q_over_c_the_optimum():
    """The bonus c adds -c · H(π) to each valid step's loss; with the online term alone the loss per state is
    -Σ_a π(a) Q(a) - c · H(π), least at π = softmax(Q / c): value differences well below c leave π spread."""
    B, L, C, G, A = 1, 2, 1, 1, 4
    logits = torch.randn(B, L, G, A)
    q_all = torch.randn(B, L, C, G, A)
    action = F.one_hot(torch.tensor([[1, 3]]), A).float()
    valid = torch.tensor([[True, False]])
    plain, _ = actor_loss(Categorical(logits), action, valid, q_all=q_all, offline_coeff=0.1)
    with_bonus, m = actor_loss(Categorical(logits), action, valid, q_all=q_all, offline_coeff=0.1, entropy_coeff=0.5)
    entropy = Categorical(logits).entropy()[0, 0].mean()  # the valid step only
    torch.testing.assert_close(with_bonus, plain - 0.5 * entropy)
    torch.testing.assert_close(m["entropy"], entropy)

    c, q = 0.03, torch.tensor([0.0, 0.01, 0.02, -0.01]).view(1, 1, 1, 1, A)  # a flat critic: differences < c
    optimum = (q[0, 0, 0] / c).log_softmax(-1).clone().requires_grad_(True)  # [G, A]
    loss, _ = actor_loss(Categorical(optimum.view(1, 1, G, A)), action[:, :1], valid[:, :1], q_all=q,
                         offline_coeff=0.0, entropy_coeff=c)
    (grad,) = torch.autograd.grad(loss, optimum)
    assert grad.abs().max() < 1e-6  # the optimum: no step away from it
    assert Categorical(optimum).entropy().item() > 0.75 * math.log(A)  # and it is spread


def test_online_reduce_min_takes_the_ensembles_minimum_of_each_members_expectation():
    """The official AMAGO's online term: -min_c E_{a~π} Q_c(s, a); the advantage's V(s) stays the ensemble mean."""
    B, L, C, G, A = 1, 2, 3, 2, 3
    logits = torch.randn(B, L, G, A, requires_grad=True)
    q_all = torch.randn(B, L, C, G, A)
    action = F.one_hot(torch.tensor([[2, 0]]), A).float()
    valid = torch.tensor([[True, True]])
    loss, m = actor_loss(Categorical(logits), action, valid, q_all=q_all, offline_coeff=0.0, online_reduce="min")
    p = logits.softmax(-1)
    expected = -(p.unsqueeze(2) * q_all).sum(-1).amin(2).mean()
    torch.testing.assert_close(loss, expected)
    mean_loss, _ = actor_loss(Categorical(logits), action, valid, q_all=q_all, offline_coeff=0.0)
    assert loss > mean_loss  # the minimum is below the mean: a larger loss


def test_a_clipped_categorical_is_the_official_discrete_policy():
    """--discrete-prob-clip LOW HIGH: probabilities clamped and renormalised by a detached sum; none at a bound gets
    a gradient; (0, 1) is never built (the plain softmax)."""
    logits = torch.tensor([[8.0, 0.0, -8.0]], requires_grad=True)
    dist = Categorical(logits, (0.001, 0.99))
    clipped = logits.softmax(-1).clamp(0.001, 0.99)
    torch.testing.assert_close(dist.probs, clipped / clipped.sum(-1, keepdim=True))
    dist.log_prob(torch.tensor([[1.0, 0.0, 0.0]])).sum().backward()
    assert torch.all(logits.grad == 0)  # the taken action is at the upper bound: no gradient at all
    assert dist.mode().argmax(-1).item() == 0


def test_advantage_filters():
    adv = torch.tensor([-1.0, 0.0, 0.5, 10.0])
    assert advantage_filter(adv).tolist() == [0.0, 0.0, 1.0, 1.0]
    torch.testing.assert_close(
        advantage_filter(adv, "exp", beta=0.5, clip=20.0), torch.tensor([math.exp(-2), 1.0, math.e, 20.0])
    )


def test_actor_loss_continuous_bc_selects_good_data_actions():
    """Q peaks at the data action: A > 0 there, so the BC term is exactly -log π(a_t) (online off)."""
    spec = ActionSpec("continuous", 2)
    B, L, G = 2, 3, 3
    actor = Actor(8, spec, G, hidden=16)
    dist = actor(torch.randn(B, L, 8))
    action = torch.full((B, L, 2), 0.3)
    valid = torch.ones(B, L, dtype=torch.bool)

    def q_fn(a):  # [..., B, L, G, A] -> [..., B, L, C=2, G]
        return (-(a - 0.3).square().sum(-1)).unsqueeze(-2).expand(*a.shape[:-2], 2, G)

    loss, m = actor_loss(dist, action, valid, q_fn=q_fn, online_coeff=0.0, offline_coeff=0.1)
    logp = dist.log_prob(action.unsqueeze(-2).expand(B, L, G, 2))
    torch.testing.assert_close(loss, -0.1 * logp.mean())
    assert m["bc_weight"].item() == 1.0


def test_actor_loss_masks_invalid_steps():
    spec = ActionSpec("discrete", 4)
    logits = torch.randn(2, 3, 2, 4, requires_grad=True)
    valid = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    action = F.one_hot(torch.randint(0, 4, (2, 3)), 4).float()
    loss, _ = actor_loss(Categorical(logits), action, valid, q_all=torch.randn(2, 3, 3, 2, spec.dim))
    loss.backward()
    assert torch.all(logits.grad[~valid] == 0) and logits.grad[valid].abs().sum() > 0


# ---------------------------------------------------------------- gradient routing


CRITICS = ["regression", "twohot"]


def _reader(critic: Critic) -> CriticReader:
    """How the learner reads `critic`: PopArt-normalised outputs, or 8 symlog bins over [-20, 20] (with PopArt
    statistics away from (0, 1), so the normalisation of the actor's values is exercised)."""
    popart = PopArt(critic.num_gammas)
    popart.mu.fill_(0.5)
    popart.nu.fill_(4.0)
    bins = None if critic.num_bins is None else ValueBins.evenly(critic.num_bins, -20.0, 20.0)
    return CriticReader(popart, bins)


def _setup(kind: str, critic_kind: str = "regression"):
    torch.manual_seed(1)
    spec = ActionSpec(kind, 3)
    B, L, G, d = 2, 4, 3, 8
    upstream = torch.nn.Linear(5, d)  # stands in for the shared encoder
    actor = Actor(d, spec, G, hidden=16)
    critic = Critic(d, spec, G, num_critics=2, hidden=16, num_bins=8 if critic_kind == "twohot" else None)
    x = torch.randn(B, L, 5)
    if kind == "discrete":
        action = F.one_hot(torch.randint(0, 3, (B, L)), 3).float()
    elif kind == "continuous":
        action = torch.rand(B, L, 3) * 2 - 1
    else:
        action = torch.randint(0, 2, (B, L, 3)).float()
    valid = torch.ones(B, L, dtype=torch.bool)
    valid[1, -1] = False
    return upstream, actor, critic, x, action, valid


def _actor_loss(actor, critic, s, action, valid, q_fn=None):
    dist, read = actor(s), _reader(critic)
    if isinstance(dist, Categorical):
        return actor_loss(dist, action, valid, q_all=read.normalized_per_action(critic(s)))[0]
    return actor_loss(dist, action, valid, q_fn=q_fn or read.frozen(critic, s))[0]


def _grads(module):
    return [p.grad for p in module.parameters()]


@pytest.mark.parametrize("critic_kind", CRITICS)
@pytest.mark.parametrize("kind", ["discrete", "continuous", "multibinary"])
def test_actor_loss_gradient_routing(kind, critic_kind):
    upstream, actor, critic, x, action, valid = _setup(kind, critic_kind)
    s = upstream(x)
    torch.manual_seed(2)
    _actor_loss(actor, critic, s, action, valid).backward()
    assert all(g is None for g in _grads(critic)), "the actor loss must never reach critic parameters"
    assert all(g is not None and g.abs().sum() > 0 for g in _grads(actor))
    assert all(g is not None and g.abs().sum() > 0 for g in _grads(upstream))

    # The encoder's gradient comes through the actor's input only: identical when the critic reads an
    # unrelated constant copy of the state and is a separate frozen network.
    got = [g.clone() for g in _grads(upstream)]
    upstream.zero_grad()
    frozen, read = copy.deepcopy(critic).requires_grad_(False), _reader(critic)
    s = upstream(x)
    s_const = s.detach().clone()
    torch.manual_seed(2)
    dist = actor(s)
    if kind == "discrete":
        ref = actor_loss(dist, action, valid, q_all=read.normalized_per_action(frozen(s_const)))[0]
    else:
        ref = actor_loss(dist, action, valid, q_fn=lambda a: read.normalized(frozen(s_const, a)))[0]
    ref.backward()
    for g, r in zip(got, _grads(upstream)):
        torch.testing.assert_close(g, r)


@pytest.mark.parametrize("kind", ["continuous", "multibinary"])
def test_online_term_differentiates_through_action(kind):
    """The online -Q term moves the policy: with BC off, the actor still gets a gradient via the action."""
    upstream, actor, critic, x, action, valid = _setup(kind)
    s = upstream(x)
    loss, _ = actor_loss(actor(s), action, valid, q_fn=frozen_critic(critic, s), offline_coeff=0.0)
    loss.backward()
    assert actor.net[-1].weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in critic.parameters())


def _actor_next_value(actor, critic, s: torch.Tensor, kind: str) -> torch.Tensor:
    """V(s_{t+1}) [B, L, G] as the update builds it, from the actor's next actions: the exact expectation
    under π for discrete actions, Q at a reparameterised sample otherwise (so the value is differentiable
    in the actor's parameters), min over the critic ensemble; unnormalised, as `CriticReader` reads it."""
    dist, read = actor(s), _reader(critic)
    if kind == "discrete":
        q_next = (dist.probs.unsqueeze(-3) * read.raw_per_action(critic(s))).sum(-1)  # [B, L, C, G]
    else:
        q_next = read.raw(critic(s, dist.rsample()))  # [B, L, C, G]
    return q_next.amin(-2)


@pytest.mark.parametrize("critic_kind", CRITICS)
@pytest.mark.parametrize("target", ["td_targets", "by_hand"])
@pytest.mark.parametrize("kind", ["discrete", "continuous", "multibinary"])
def test_critic_loss_gives_no_gradient_to_actor(kind, target, critic_kind):
    """The TD target is built from the actor's next actions, yet the critic loss must not train the actor.

    Two guards, one per case: `td_targets` builds its targets without a graph ("td_targets"), and
    `critic_loss` detaches the targets it is given ("by_hand": a one-step target computed with autograd
    on, as a careless caller would). Either guard removed, the actor's parameters get a gradient here.
    The two-hot critic's loss (`classification_critic_loss`) detaches its labels likewise.
    """
    upstream, actor, critic, x, action, valid = _setup(kind, critic_kind)
    s = upstream(x)
    G = actor.num_gammas
    gammas = torch.linspace(0.5, 0.9, G)
    reward, terminated = torch.randn(*valid.shape), torch.zeros(valid.shape, dtype=torch.bool)
    v_next = align_next(_actor_next_value(actor, critic, s, kind))  # [B, L, G]
    # the premise: the actor is in the graph of the values the target is built from
    from_actor = torch.autograd.grad(v_next.sum(), list(actor.parameters()), retain_graph=True)
    assert all(g.abs().sum() > 0 for g in from_actor)
    if target == "td_targets":
        y = td_targets(reward, terminated, valid, v_next, gammas)
        assert not y.requires_grad, "td_targets must build targets without a graph"
    else:
        y = reward.unsqueeze(-1) + gammas * v_next
        assert y.requires_grad
    a_g = action.unsqueeze(-2).expand(*action.shape[:2], G, 3)
    read = _reader(critic)
    out_sa = read.at_action(critic(s), a_g) if kind == "discrete" else critic(s, a_g)
    loss, _ = read.loss(out_sa, y, valid)  # `critic_loss` on PopArt-normalised y, or the cross-entropy
    loss.backward()
    assert all(g is None for g in _grads(actor)), "the critic loss reached the actor through the TD target"
    assert all(g is not None and g.abs().sum() > 0 for g in _grads(critic))
    assert all(g is not None and g.abs().sum() > 0 for g in _grads(upstream))  # the encoder learns from it


@pytest.mark.parametrize("kind", ["continuous", "multibinary"])
def test_passing_the_critic_loss_q_equals_evaluating_it_again(kind):
    """`q_data` (the critic loss's Q(s_t, a_t), computed once with a_t shared by every discount) gives the same
    loss, metrics and actor gradients as the actor loss evaluating Q(s, a_t) through q_fn itself."""
    upstream, actor, critic, x, action, valid = _setup(kind)
    s = upstream(x)
    q_sa = critic(s, action.unsqueeze(-2))  # [B, L, C, G], as compute_loss does
    out = []
    for q_data in (None, q_sa):
        actor.zero_grad()
        torch.manual_seed(5)
        loss, m = actor_loss(actor(s), action, valid, q_fn=frozen_critic(critic, s), q_data=q_data)
        loss.backward(retain_graph=True)
        out.append((loss.detach(), m, [p.grad.clone() for p in actor.parameters()]))
    (l0, m0, g0), (l1, m1, g1) = out
    torch.testing.assert_close(l0, l1)
    for k in m0:
        torch.testing.assert_close(m0[k], m1[k], atol=1e-6, rtol=1e-5)
    for a, b in zip(g0, g1, strict=True):
        torch.testing.assert_close(a, b)
