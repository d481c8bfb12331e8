"""Action distributions and the actor / critic-ensemble heads: shapes, log-probabilities, independence."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from icrl.nets.dists import Bernoulli, Categorical, TanhGaussian
from icrl.nets.heads import Actor, Critic, q_at_action
from icrl.types import ActionSpec

B, L, G, D = 3, 5, 4, 16
SPECS = [ActionSpec("discrete", 6), ActionSpec("continuous", 3), ActionSpec("multibinary", 5)]


# ---------------------------------------------------------------- distributions


def test_categorical_matches_torch():
    logits = torch.randn(B, L, G, 6)
    dist = Categorical(logits)
    ref = torch.distributions.Categorical(logits=logits)
    ids = torch.randint(0, 6, (B, L, G))
    a = F.one_hot(ids, 6).float()
    torch.testing.assert_close(dist.log_prob(a), ref.log_prob(ids))
    torch.testing.assert_close(dist.entropy(), ref.entropy())
    torch.testing.assert_close(dist.probs, ref.probs)
    torch.testing.assert_close(dist.mode(), F.one_hot(logits.argmax(-1), 6).float())
    s = dist.sample((2,))
    assert s.shape == (2, B, L, G, 6) and torch.all(s.sum(-1) == 1)


def test_categorical_sampling_frequencies():
    logits = torch.tensor([0.0, 1.0, 2.0]).log()  # probs proportional to 0, 1, 2
    s = Categorical(logits.expand(20000, 3)).sample()
    freq = s.mean(0)
    torch.testing.assert_close(freq, torch.tensor([0.0, 1 / 3, 2 / 3]), atol=0.02, rtol=0)


def _numeric_tanh_gauss_logp(a, mean, std):
    """log p(a) = log N(u) - log tanh'(u), u = atanh(a), with a central-difference tanh' (float64)."""
    h = 1e-5
    u = torch.atanh(a)
    da_du = (torch.tanh(u + h) - torch.tanh(u - h)) / (2 * h)
    return torch.distributions.Normal(mean, std).log_prob(u) - da_du.log()


def test_tanh_gaussian_log_prob_matches_change_of_variables():
    mean = torch.randn(B, L, G, 3, dtype=torch.float64)
    log_std = torch.randn(B, L, G, 3, dtype=torch.float64).clamp(-2, 1)
    dist = TanhGaussian(mean, log_std)
    a, logp = dist.rsample_with_log_prob()
    assert a.shape == (B, L, G, 3) and logp.shape == (B, L, G)
    ref = _numeric_tanh_gauss_logp(a, mean, log_std.exp()).sum(-1)
    torch.testing.assert_close(logp, ref, atol=1e-5, rtol=1e-5)
    inside = (a.abs() < 1 - 1e-6).all(-1)  # log_prob clips stored actions to [-1 + 1e-6, 1 - 1e-6]
    torch.testing.assert_close(dist.log_prob(a)[inside], logp[inside], atol=1e-6, rtol=1e-6)
    a = a.clamp(-0.999, 0.999)
    # And agrees with torch's TanhTransform on the same actions.
    td = torch.distributions.TransformedDistribution(
        torch.distributions.Normal(mean, log_std.exp()), [torch.distributions.TanhTransform()]
    )
    torch.testing.assert_close(dist.log_prob(a), td.log_prob(a).sum(-1), atol=1e-6, rtol=1e-6)


def test_tanh_gaussian_density_integrates_to_one():
    grid = torch.linspace(-1 + 1e-7, 1 - 1e-7, 400001, dtype=torch.float64)
    f64 = torch.float64
    dist = TanhGaussian(torch.tensor([[0.7]], dtype=f64), torch.tensor([[-0.3]], dtype=f64))
    p = dist.log_prob(grid[:, None, None]).exp()[:, 0]  # [N]
    assert abs(torch.trapezoid(p, grid).item() - 1.0) < 1e-3


def test_tanh_gaussian_stable_at_saturation():
    mean = torch.full((2, G, 3), 30.0, requires_grad=True)
    dist = TanhGaussian(mean, torch.full((2, G, 3), -5.0))
    a, logp = dist.rsample_with_log_prob()
    assert torch.isfinite(logp).all()
    logp.sum().backward()
    assert torch.isfinite(mean.grad).all()
    # Stored actions exactly on the bounds are clipped, not infinite.
    assert torch.isfinite(dist.log_prob(torch.ones(2, G, 3))).all()
    assert torch.isfinite(dist.log_prob(-torch.ones(2, G, 3))).all()
    assert torch.equal(dist.mode(), torch.tanh(mean.detach()))


def test_tanh_gaussian_rsample_has_gradient():
    mean = torch.zeros(B, G, 2, requires_grad=True)
    TanhGaussian(mean, torch.zeros(B, G, 2)).rsample().sum().backward()
    assert mean.grad.abs().sum() > 0


def test_bernoulli_matches_torch_and_straight_through():
    logits = torch.randn(B, L, G, 5, requires_grad=True)
    dist = Bernoulli(logits)
    ref = torch.distributions.Bernoulli(logits=logits)
    a = torch.randint(0, 2, (B, L, G, 5)).float()
    torch.testing.assert_close(dist.log_prob(a), ref.log_prob(a).sum(-1))
    torch.testing.assert_close(dist.entropy(), ref.entropy().sum(-1))
    torch.testing.assert_close(dist.mode(), (logits > 0).float())
    r = dist.rsample()
    assert set(r.detach().unique().tolist()) <= {0.0, 1.0}  # values are hard samples
    (r * torch.arange(5.0)).sum().backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0  # gradient of the probabilities
    assert dist.sample((7,)).shape == (7, B, L, G, 5)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kind)
def test_storage_round_trip(spec):
    if spec.kind == "discrete":
        stored = torch.tensor([0, 5, 2])
    elif spec.kind == "continuous":
        stored = torch.rand(3, spec.dim) * 2 - 1
    else:
        stored = torch.randint(0, 2, (3, spec.dim), dtype=torch.int8)
    vec = spec.to_vector(stored)
    assert vec.dtype == torch.float32 and vec.shape == (3, spec.dim)
    back = spec.from_vector(vec)
    dtypes = {"discrete": torch.int64, "continuous": torch.float32, "multibinary": torch.int8}
    assert back.dtype == dtypes[spec.kind]
    assert torch.equal(back, stored)


# ---------------------------------------------------------------- heads


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kind)
def test_actor_shapes(spec):
    actor = Actor(D, spec, G, hidden=32, layers=2)
    dist = actor(torch.randn(B, L, D))
    assert dist.batch_shape == (B, L, G)
    a = dist.sample()
    assert a.shape == (B, L, G, spec.dim)
    assert dist.mode().shape == (B, L, G, spec.dim)
    assert dist.log_prob(a).shape == (B, L, G)
    assert dist.entropy().shape == (B, L, G)
    if spec.kind == "continuous":
        assert a.abs().max() <= 1
        assert (dist.log_std >= -5).all() and (dist.log_std <= 2).all()


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kind)
def test_critic_shapes(spec):
    C = 3
    critic = Critic(D, spec, G, num_critics=C, hidden=32, layers=2)
    s = torch.randn(B, L, D)
    if spec.kind == "discrete":
        q = critic(s)
        assert q.shape == (B, L, C, G, spec.dim)
        a = F.one_hot(torch.randint(0, spec.dim, (B, L, G)), spec.dim).float()
        assert q_at_action(q, a).shape == (B, L, C, G)
    else:
        assert critic(s, torch.rand(B, L, G, spec.dim)).shape == (B, L, C, G)
        # Extra leading sample dims broadcast against s; each sample equals its own call.
        a = torch.rand(4, B, L, G, spec.dim)
        q = critic(s, a)
        assert q.shape == (4, B, L, C, G)
        torch.testing.assert_close(q[2], critic(s, a[2]))


def _reference_member(critic: Critic, c: int, s: torch.Tensor, a: torch.Tensor | None, g: int):
    """Member c, discount g as an ordinary MLP on concat(s, a_g)."""
    if a is None:
        x, w = s, critic.w_state[c]
    else:
        x, w = torch.cat([s, a[..., g, :]], -1), torch.cat([critic.w_state[c], critic.w_action[c]], 0)
    x = x @ w + critic.b_in[c]
    for i in range(len(critic.ln_w)):
        if i > 0:
            x = x @ critic.w_hidden[i - 1][c] + critic.b_hidden[i - 1][c]
        x = F.leaky_relu(F.layer_norm(x, x.shape[-1:], critic.ln_w[i][c], critic.ln_b[i][c]), 0.01)
    return x @ critic.w_out[c][:, g] + critic.b_out[c][g]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kind)
def test_critic_matches_per_member_reference(spec):
    C = 3
    critic = Critic(D, spec, G, num_critics=C, hidden=16, layers=3)
    s = torch.randn(B, L, D)
    a = None if spec.kind == "discrete" else torch.rand(B, L, G, spec.dim)
    q = critic(s) if a is None else critic(s, a)
    for c in range(C):
        for g in range(G):
            ref = _reference_member(critic, c, s, a, g)
            torch.testing.assert_close(q[:, :, c, g], ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kind)
def test_critic_members_independent(spec):
    C = 4
    critic = Critic(D, spec, G, num_critics=C, hidden=16, layers=2)
    s = torch.randn(B, L, D)
    args = (s,) if spec.kind == "discrete" else (s, torch.rand(B, L, G, spec.dim))
    before = critic(*args)
    with torch.no_grad():
        for p in critic.parameters():
            p[1] += torch.randn_like(p[1])  # every parameter has the member dim first
    after = critic(*args)
    changed = (after - before).abs().movedim(2, 0).flatten(1).amax(1)  # [C]
    assert changed[1] > 1e-3
    assert torch.all(changed[[0, 2, 3]] == 0)


def test_critic_discount_reads_its_own_action():
    spec = ActionSpec("continuous", 2)
    critic = Critic(D, spec, G, num_critics=2, hidden=16)
    s, a = torch.randn(B, L, D), torch.rand(B, L, G, 2)
    before = critic(s, a)
    a2 = a.clone()
    a2[..., 1, :] = -a2[..., 1, :]
    diff = (critic(s, a2) - before).abs().amax((0, 1, 2))  # [G]
    assert diff[1] > 0 and torch.all(diff[[0, 2, 3]] == 0)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kind)
def test_rescale_output(spec):
    critic = Critic(D, spec, G, num_critics=2, hidden=16)
    s = torch.randn(B, L, D)
    args = (s,) if spec.kind == "discrete" else (s, torch.rand(B, L, G, spec.dim))
    scale, shift = torch.rand(G) + 0.5, torch.randn(G)
    before = critic(*args)
    critic.rescale_output_(scale, shift)
    if spec.kind == "discrete":
        expected = before * scale[:, None] + shift[:, None]
    else:
        expected = before * scale + shift
    torch.testing.assert_close(critic(*args), expected, atol=1e-5, rtol=1e-5)


def test_actor_small_init_near_uniform():
    dist = Actor(D, SPECS[0], G, hidden=32)(torch.randn(B, L, D))
    assert (dist.entropy() > math.log(6) - 0.1).all()


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kind)
def test_critic_members_equal_indexing_the_full_ensemble(spec):
    """Critic(members=idx) evaluates only those members: equal to Critic()[..., idx, :] (up to rounding)."""
    C = 4
    critic = Critic(D, spec, G, num_critics=C, hidden=16, layers=3)
    s = torch.randn(B, L, D)
    args = (s,) if spec.kind == "discrete" else (s, torch.rand(2, B, L, G, spec.dim))
    full = critic(*args)
    member_dim = -3 if spec.kind == "discrete" else -2
    for idx in ([2, 0], [3], [0, 1, 2, 3]):
        idx = torch.tensor(idx)
        sub = critic(*args, members=idx)
        assert sub.shape[member_dim] == len(idx)
        torch.testing.assert_close(sub, full.index_select(member_dim, idx), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kind)
def test_actor_policy_is_the_last_discount(spec):
    actor = Actor(D, spec, G, hidden=32, layers=2)
    with torch.no_grad():
        actor.net[-1].weight.normal_()  # not the near-uniform init: make the discounts differ
    s = torch.randn(B, L, D)
    full, pol = actor(s), actor.policy(s)
    assert pol.batch_shape == (B, L)
    if spec.kind == "continuous":
        torch.testing.assert_close(pol.mean, full.mean[..., -1, :], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(pol.log_std, full.log_std[..., -1, :], atol=1e-6, rtol=1e-6)
    else:
        torch.testing.assert_close(pol.logits, full.logits[..., -1, :], atol=1e-6, rtol=1e-6)
    assert pol.sample().shape == (B, L, spec.dim)
    torch.testing.assert_close(pol.mode(), full.mode()[..., -1, :])


def test_heads_return_float32_under_autocast():
    spec = ActionSpec("continuous", 3)
    actor, critic = Actor(D, spec, G, hidden=32), Critic(D, spec, G, num_critics=2, hidden=32)
    s = torch.randn(B, L, D)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        dist = actor(s)
        q = critic(s, dist.sample())
    assert dist.mean.dtype == torch.float32 and q.dtype == torch.float32


def test_categorical_refuses_rsample_with_a_reason():
    with pytest.raises(TypeError, match="exact expectation"):
        Categorical(torch.zeros(2, 3)).rsample()


@pytest.mark.parametrize("A", [1, 2, 3])  # rank-1 updates (A <= 2) and the GEMM path (A > 2)
def test_critic_one_action_for_every_discount_equals_it_repeated(A):
    """a [..., 1, A] (the replay's a_t, the same for every discount) runs the hidden stack once for all G:
    the same values as that action repeated per discount, with extra leading sample dims too."""
    critic = Critic(D, ActionSpec("continuous", A), G, num_critics=3, hidden=16, layers=3)
    s = torch.randn(B, L, D)
    for a in (torch.rand(B, L, 1, A) * 2 - 1, torch.rand(2, B, L, 1, A) * 2 - 1):
        shared = critic(s, a)
        repeated = critic(s, a.expand(*a.shape[:-2], G, A).contiguous())
        assert shared.shape == repeated.shape == (*a.shape[:-2], 3, G)
        torch.testing.assert_close(shared, repeated, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="one per discount"):
        critic(s, torch.rand(B, L, 2, A))


@pytest.mark.parametrize("A", [1, 3])
def test_critic_sampled_actions_match_the_reference_and_broadcast_states(A):
    """K sampled actions [K, B, L, G, A] in one call equal the per-member MLP reference for every sample, and a
    state with a broadcast dim (s [B, 1, d] against a [B, L, ...]) equals the expanded state's call."""
    critic = Critic(D, ActionSpec("continuous", A), G, num_critics=2, hidden=16, layers=2)
    s = torch.randn(B, L, D)
    a = torch.rand(3, B, L, G, A) * 2 - 1
    q = critic(s, a)
    for k in range(3):
        for c in range(2):
            for g in range(G):
                torch.testing.assert_close(q[k, :, :, c, g], _reference_member(critic, c, s, a[k], g),
                                           atol=1e-5, rtol=1e-5)
    s1 = torch.randn(B, 1, D)
    torch.testing.assert_close(critic(s1, a[0]), critic(s1.expand(B, L, D), a[0]), atol=1e-6, rtol=1e-6)


def test_critic_gradients_match_the_reference():
    """The fused layout (in-place activation, addcmul) gives the same gradients for states, actions and weights."""
    critic = Critic(D, ActionSpec("continuous", 2), G, num_critics=2, hidden=16, layers=3)
    s = torch.randn(B, L, D, requires_grad=True)
    a = (torch.rand(2, B, L, G, 2) * 2 - 1).requires_grad_()
    critic(s, a).square().sum().backward()
    got = [s.grad.clone(), a.grad.clone()] + [p.grad.clone() for p in critic.parameters()]
    s.grad, a.grad = None, None
    critic.zero_grad()
    ref = torch.stack([torch.stack([_reference_member(critic, c, s, a[k], g) for c in range(2) for g in range(G)])
                       for k in range(2)])
    ref.square().sum().backward()
    want = [s.grad, a.grad] + [p.grad for p in critic.parameters()]
    for x, y in zip(got, want, strict=True):
        torch.testing.assert_close(x, y, atol=1e-4, rtol=1e-4)
