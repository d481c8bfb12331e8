"""The distributions' common base, the continuous policies beside the TanhGaussian (a tanh-squashed Gaussian
mixture, a Beta on [-1, 1]) and the residual actor trunk: shapes, densities against torch.distributions, bounds,
gradients, the actor's output width and acting path."""

from __future__ import annotations

import math

import pytest
import torch
from torch import distributions as pyd

from icrl.nets import dists
from icrl.nets.actor_parts import ResidualTrunk
from icrl.nets.dists import (
    BETA_MIN_CONCENTRATION,
    GMM_MIN_STD,
    ActionDistribution,
    Bernoulli,
    Categorical,
    ContinuousOutput,
    Distribution,
    ShiftedBeta,
    TanhGaussian,
    TanhGMM,
)
from icrl.nets.heads import Actor
from icrl.types import ActionSpec

B, L, G, A, M = 3, 4, 2, 2, 3

# hand-picked actions: the centre, both sides, and close to each bound
ACTIONS = torch.tensor([[0.0, 0.0], [-0.9, 0.5], [0.3, -0.25], [0.999, -0.999], [-0.5, 0.95]], dtype=torch.float64)


def _gmm_params(dtype=torch.float64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Hand-picked means, stds [M, A] and mixture logits [M] (leaf tensors that record gradients)."""
    means = torch.tensor([[-1.0, 0.5], [0.2, -0.3], [1.5, 1.0]], dtype=dtype)
    stds = torch.tensor([[0.3, 0.8], [1.0, 0.2], [0.5, 0.5]], dtype=dtype)
    logits = torch.tensor([0.3, -1.0, 0.8], dtype=dtype)
    return means.requires_grad_(), stds.requires_grad_(), logits.requires_grad_()


def _gmm(dtype=torch.float64) -> TanhGMM:
    return TanhGMM(*_gmm_params(dtype))


def _torch_tanh_gmm(d: TanhGMM) -> pyd.Distribution:
    comp = pyd.Independent(pyd.Normal(d.means, d.stds), 1)
    mix = pyd.MixtureSameFamily(pyd.Categorical(logits=d.log_w), comp)
    return pyd.TransformedDistribution(mix, [pyd.TanhTransform()])


# ---------------------------------------------------------------- the common base


def test_every_distribution_shares_the_base():
    classes = {c for c in vars(dists).values() if isinstance(c, type) and c.__module__ == dists.__name__}
    classes -= {ContinuousOutput, dists._TanhSquashed}  # the layout and the squashed policies' shared part
    assert classes == {ActionDistribution, Categorical, TanhGaussian, Bernoulli, TanhGMM, ShiftedBeta}
    assert all(issubclass(c, ActionDistribution) for c in classes) and Distribution is ActionDistribution


def test_the_base_and_an_incomplete_distribution_cannot_be_built():
    with pytest.raises(TypeError, match="abstract"):
        ActionDistribution(torch.Size([G]), torch.float32)  # type: ignore[abstract]

    class NoEntropy(ActionDistribution):
        def rsample(self, shape=()):
            return torch.zeros(G, A)

        def log_prob(self, a_vec):
            return torch.zeros(G)

        def mode(self):
            return torch.zeros(G, A)

    with pytest.raises(TypeError, match="entropy"):
        NoEntropy(torch.Size([G]), torch.float32)  # type: ignore[abstract]


def test_sample_is_rsample_without_a_graph():
    mean = torch.randn(G, A, requires_grad=True)
    d = TanhGaussian(mean, torch.zeros(G, A))
    torch.manual_seed(3)
    a = d.sample((4,))
    torch.manual_seed(3)
    torch.testing.assert_close(a, d.rsample((4,)).detach(), rtol=0, atol=0)
    assert not a.requires_grad and a.shape == (4, G, A)


# ---------------------------------------------------------------- the Gaussian mixture


def test_gmm_log_prob_matches_torch_on_hand_picked_actions():
    d = _gmm()
    ref = _torch_tanh_gmm(d)
    with torch.no_grad():
        torch.testing.assert_close(d.log_prob(ACTIONS), ref.log_prob(ACTIONS), atol=1e-8, rtol=1e-8)


def test_gmm_shapes_bounds_and_sample_log_prob():
    gen = torch.Generator().manual_seed(0)
    means, stds = torch.randn(B, L, G, M, A, generator=gen), torch.rand(B, L, G, M, A, generator=gen) + 0.1
    d = TanhGMM(means, stds, torch.randn(B, L, G, M, generator=gen))
    assert d.batch_shape == (B, L, G) and d.dtype == torch.float32
    a, logp = d.rsample_with_log_prob((5,))
    assert a.shape == (5, B, L, G, A) and logp.shape == (5, B, L, G)
    assert d.sample().shape == (B, L, G, A) and d.log_prob(a).shape == (5, B, L, G)
    assert d.entropy().shape == (B, L, G) and d.mode().shape == (B, L, G, A)
    assert a.abs().max() <= 1.0 and d.mode().abs().max() <= 1.0
    inside = (a.abs() < 0.999).all(-1)  # where atanh(a) recovers u to float32 precision
    torch.testing.assert_close(d.log_prob(a)[inside], logp[inside], atol=1e-3, rtol=1e-4)


def test_gmm_density_integrates_to_one_and_samples_follow_the_weights():
    f64 = torch.float64  # M=3 components, A=1
    d = TanhGMM(torch.tensor([[-1.5], [0.0], [2.0]], dtype=f64), torch.tensor([[0.2], [0.3], [0.4]], dtype=f64),
                torch.tensor([0.0, 1.0, 2.0], dtype=f64))
    grid = torch.linspace(-1 + 1e-7, 1 - 1e-7, 400001, dtype=torch.float64)
    p = d.log_prob(grid[:, None]).exp()
    assert abs(torch.trapezoid(p, grid).item() - 1.0) < 1e-3
    torch.manual_seed(0)
    u = torch.atanh(d.sample((20000,))[:, 0].clamp(-1 + 1e-12, 1 - 1e-12))
    freq = torch.stack([(u < -0.75).double().mean(), ((u > -0.75) & (u < 1.0)).double().mean(),
                        (u > 1.0).double().mean()])
    torch.testing.assert_close(freq, torch.softmax(torch.tensor([0.0, 1.0, 2.0]).double(), 0), atol=0.02, rtol=0)


def test_gmm_rsample_reaches_means_and_stds_not_the_weights():
    """Reparameterised within the drawn component: -Q(a~π) moves the components; the mixture weights learn
    from log-likelihood terms (documented; the official GMM has no rsample at all)."""
    means, stds, logits = _gmm_params()
    TanhGMM(means, stds, logits).rsample((64,)).sum().backward()
    assert means.grad is not None and means.grad.abs().sum() > 0
    assert stds.grad is not None and stds.grad.abs().sum() > 0
    assert logits.grad is None or logits.grad.abs().sum() == 0
    means, stds, logits = _gmm_params()
    TanhGMM(means, stds, logits).log_prob(ACTIONS).sum().backward()  # the BC term reaches the weights
    assert logits.grad is not None and logits.grad.abs().sum() > 0


def test_gmm_is_finite_on_the_bounds_and_mode_is_the_likeliest_component():
    means, stds, logits = _gmm_params(torch.float32)
    d = TanhGMM(means, stds, logits)
    edge = torch.tensor([[1.0, -1.0], [-1.0, 1.0]])
    logp = d.log_prob(edge)
    assert torch.isfinite(logp).all()
    logp.sum().backward()
    assert torch.isfinite(means.grad).all() and torch.isfinite(stds.grad).all()
    torch.testing.assert_close(d.mode(), torch.tanh(means[2]).detach())  # logits: component 2 is likeliest
    assert torch.isfinite(d.entropy()).all()


def test_gmm_entropy_estimate_averages_to_the_true_entropy():
    d = _gmm()
    torch.manual_seed(1)
    with torch.no_grad():
        mc = torch.stack([d.entropy() for _ in range(4000)]).mean()
        ref_dist = _torch_tanh_gmm(d)  # torch's own sampler, independent of TanhGMM's
        ref = -ref_dist.log_prob(ref_dist.sample((20000,)).clamp(-1 + 1e-12, 1 - 1e-12)).mean()
    assert abs(mc.item() - ref.item()) < 0.05


# ---------------------------------------------------------------- the Beta


def _beta(requires_grad=False) -> ShiftedBeta:
    alpha = torch.tensor([[1.5, 4.0], [2.0, 1.0001], [30.0, 3.0]], dtype=torch.float64, requires_grad=requires_grad)
    beta = torch.tensor([[1.5, 2.0], [6.0, 1.2], [2.0, 30.0]], dtype=torch.float64, requires_grad=requires_grad)
    return ShiftedBeta(alpha, beta)


def test_beta_log_prob_and_entropy_match_torch_on_hand_picked_actions():
    d = _beta()
    ref = pyd.TransformedDistribution(pyd.Beta(d.alpha, d.beta), [pyd.AffineTransform(-1.0, 2.0)])
    a = ACTIONS[:, None, :].expand(-1, 3, A)  # [5, 3, A]
    torch.testing.assert_close(d.log_prob(a), ref.log_prob(a).sum(-1), atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(d.entropy(), (pyd.Beta(d.alpha, d.beta).entropy() + math.log(2.0)).sum(-1))
    uniform = ShiftedBeta(torch.ones(4, dtype=torch.float64), torch.ones(4, dtype=torch.float64))
    torch.testing.assert_close(uniform.entropy(), torch.tensor(4 * math.log(2.0), dtype=torch.float64))


def test_beta_samples_mode_and_gradients():
    d = _beta(requires_grad=True)
    torch.manual_seed(0)
    a = d.rsample((20000,))
    assert a.shape == (20000, 3, A) and a.abs().max() < 1.0 and d.sample((2,)).shape == (2, 3, A)
    assert d.batch_shape == (3,) and d.dtype == torch.float64
    torch.testing.assert_close(a.mean(0), d.mode().detach(), atol=0.02, rtol=0)  # mode() is the mean
    assert d.mode().abs().max() < 1.0
    a.mean().backward()
    assert d.alpha.grad.abs().sum() > 0 and d.beta.grad.abs().sum() > 0  # reparameterised


def test_beta_is_finite_on_the_bounds():
    alpha = torch.full((2, A), 50.0, requires_grad=True)
    d = ShiftedBeta(alpha, torch.full((2, A), 1.0001))
    edge = torch.tensor([[1.0, -1.0], [-1.0, 1.0]])
    logp = d.log_prob(edge)
    assert torch.isfinite(logp).all()
    logp.sum().backward()
    assert torch.isfinite(alpha.grad).all()


# ---------------------------------------------------------------- the actor's outputs and trunks


@pytest.mark.parametrize(("kind", "width", "cls"), [("tanh_gaussian", 2 * A, TanhGaussian),
                                                     ("gmm", M * (2 * A + 1), TanhGMM), ("beta", 2 * A, ShiftedBeta)])
@pytest.mark.parametrize("trunk", ["mlp", "residual"])
def test_actor_output_width_follows_the_distribution(kind, width, cls, trunk):
    torch.manual_seed(0)
    actor = Actor(8, ActionSpec("continuous", A), G, hidden=16, layers=2, continuous_dist=kind, gmm_components=M,
                  trunk=trunk)
    assert actor._out_layer().out_features == G * width
    s = torch.randn(B, L, 8)
    dist = actor(s)
    assert isinstance(dist, cls) and dist.batch_shape == (B, L, G)
    a = dist.rsample((2,))
    assert a.shape == (2, B, L, G, A) and a.abs().max() <= 1.0
    (-a.sum() + 0.1 * dist.log_prob(a.detach()[0]).sum()).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in actor.parameters())
    with torch.no_grad():  # the acting path computes the policy discount alone, the same distribution
        torch.testing.assert_close(actor.policy(s).mode(), actor(s).mode()[..., -1, :])
        probe = torch.rand(B, L, A) * 1.8 - 0.9
        torch.testing.assert_close(actor.policy(s).log_prob(probe),
                                   actor(s).log_prob(probe[..., None, :].expand(B, L, G, A))[..., -1])


def test_initial_policies_are_centred():
    """The small output layer starts GMM components at mean 0, std softplus(0) + min, uniform weights; the Beta
    at alpha = beta = softplus(0) + min (symmetric about 0)."""
    out = torch.zeros(G, M * (2 * A + 1))
    gmm = ContinuousOutput("gmm", M)(out)
    torch.testing.assert_close(gmm.stds, torch.full((G, M, A), math.log(2.0) + GMM_MIN_STD))
    torch.testing.assert_close(gmm.log_w.exp(), torch.full((G, M), 1 / M))
    beta = ContinuousOutput("beta")(torch.zeros(G, 2 * A))
    torch.testing.assert_close(beta.alpha, torch.full((G, A), math.log(2.0) + BETA_MIN_CONCENTRATION))
    torch.testing.assert_close(beta.mode(), torch.zeros(G, A))


def test_default_actor_keeps_its_parameter_names_and_residual_is_the_official_shape():
    torch.manual_seed(0)
    spec = ActionSpec("continuous", A)
    mlp_names = [n for n, _ in Actor(8, spec, G, hidden=16, layers=2).named_parameters()]
    assert mlp_names == ["net.0.weight", "net.0.bias", "net.1.weight", "net.1.bias", "net.3.weight", "net.3.bias",
                         "net.4.weight", "net.4.bias", "net.6.weight", "net.6.bias"]
    res = Actor(8, spec, G, hidden=16, layers=3, trunk="residual")
    assert isinstance(res.net, ResidualTrunk) and len(res.net.blocks) == 3
    assert res.net.blocks[0][0].out_features == 32 and res.net.out.in_features == 16
    x = torch.randn(5, 16)
    torch.testing.assert_close(res.net.blocks[1](x) + x, _block_by_hand(res.net.blocks[1], x))
    with pytest.raises(ValueError, match="unknown actor trunk"):
        Actor(8, spec, G, trunk="transformer")  # type: ignore[arg-type]


def _block_by_hand(block: torch.nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """x + LN(W2 leaky_relu(LN(W1 x))), the official residual block."""
    lin1, ln1, _, lin2, ln2 = block
    h = torch.nn.functional.leaky_relu(ln1(lin1(x)), 0.01)
    return x + ln2(lin2(h))
