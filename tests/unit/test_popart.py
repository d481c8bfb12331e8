"""EMA target updates and PopArt: exact arithmetic, output preservation, convergence of the statistics."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from icrl.nets.ema import ema_update_
from icrl.nets.heads import Critic
from icrl.nets.popart import PopArt
from icrl.types import ActionSpec

G = 3


def _dyadic(shape):
    """Values exactly representable so EMA arithmetic can be checked with ==."""
    return torch.randint(-64, 64, shape).float() / 8


def test_ema_update_exact():
    online = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    target = copy.deepcopy(online)
    with torch.no_grad():
        for p in [*online.parameters(), *target.parameters()]:
            p.copy_(_dyadic(p.shape))
        online[1].running_mean.copy_(_dyadic((4,)))
        online[1].num_batches_tracked.fill_(7)
    t_before = [p.clone() for p in target.parameters()] + [target[1].running_mean.clone()]
    o_vals = list(online.parameters()) + [online[1].running_mean]
    ema_update_(target, online, tau=0.25)
    for t_old, o, t_new in zip(t_before, o_vals, list(target.parameters()) + [target[1].running_mean]):
        assert torch.equal(t_new, 0.75 * t_old + 0.25 * o)
    assert target[1].num_batches_tracked.item() == 7  # non-float buffers are copied
    assert all(p.grad is None for p in target.parameters())


def test_ema_tau_one_copies_and_zero_keeps():
    online, target = nn.Linear(3, 2), nn.Linear(3, 2)
    before = [p.clone() for p in target.parameters()]
    ema_update_(target, online, tau=0.0)
    assert all(torch.equal(a, b) for a, b in zip(before, target.parameters()))
    ema_update_(target, online, tau=1.0)
    assert all(torch.equal(a, b) for a, b in zip(online.parameters(), target.parameters()))


@pytest.mark.parametrize("kind", ["discrete", "continuous"])
@pytest.mark.parametrize("scale", [1.0, 100.0])
def test_popart_preserves_unnormalised_outputs(kind, scale):
    spec = ActionSpec(kind, 3)
    critic = Critic(8, spec, G, num_critics=2, hidden=16)
    target_critic = copy.deepcopy(critic)
    popart = PopArt(G, beta=0.3)  # a large step so the statistics really move
    s = torch.randn(4, 5, 8)
    a = torch.rand(4, 5, G, 3)

    def unnormalised(c):
        if kind == "discrete":
            return popart.denormalize(c(s).transpose(-1, -2))  # [.., C, A, G]: G last for the stats
        return popart.denormalize(c(s, a))

    def batch():
        return scale * (torch.randn(4, 5, G) * torch.tensor([0.5, 1.0, 3.0]) + torch.tensor([1.0, -2.0, 5.0]))

    # The first update initialises the statistics from the batch and keeps the *normalised* outputs of the
    # (random) critics: there is nothing to preserve yet (test_popart_first_update_initialises).
    popart.update_(batch(), torch.ones(4, 5, dtype=torch.bool), [critic, target_critic])
    for _step in range(5):
        before, before_t = unnormalised(critic), unnormalised(target_critic)
        y = batch()
        mu, sigma = popart.mu.clone(), popart.sigma.clone()
        popart.update_(y, torch.ones(4, 5, dtype=torch.bool), [critic, target_critic])
        assert not torch.allclose(popart.sigma, sigma) and not torch.allclose(popart.mu, mu)
        # float32 outputs of magnitude ~|μ| cannot be closer than a few ulps of |μ|: scale atol with it.
        atol = 1e-5 * scale
        torch.testing.assert_close(unnormalised(critic), before, atol=atol, rtol=1e-5)
        torch.testing.assert_close(unnormalised(target_critic), before_t, atol=atol, rtol=1e-5)


def test_popart_first_update_initialises_from_the_batch():
    """Bias correction: the first update takes the batch's moments exactly (no arbitrary prior), and the
    critics' normalised outputs stay as they were (their random unnormalised outputs are not preserved)."""
    popart = PopArt(G, beta=5e-4)
    critic = Critic(8, ActionSpec("discrete", 3), G, num_critics=2, hidden=16)
    s = torch.randn(4, 5, 8)
    q_norm = critic(s).clone()
    y = torch.randn(4, 5, G) * torch.tensor([0.01, 1.0, 30.0]) + torch.tensor([0.0, 5.0, -100.0])
    popart.update_(y, torch.ones(4, 5, dtype=torch.bool), critic)
    flat = y.reshape(-1, G)
    torch.testing.assert_close(popart.mu, flat.mean(0))
    torch.testing.assert_close(popart.sigma, flat.std(0, unbiased=False).clamp_min(popart.min_std),
                               rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(critic(s), q_norm)
    assert int(popart.count) == 1


def test_popart_tracks_small_targets_within_a_few_updates():
    """The regression behind issue 11: with β = 5e-4 an uncorrected EMA from ν = 1 kept σ near 1 for
    thousands of updates, so targets of std 0.05 reached the critic shrunk ~20x. Corrected, σ is the
    running average of the batches: right after 10 updates and still right after 1,000."""
    popart = PopArt(G, beta=5e-4)
    std = torch.tensor([0.05, 0.5, 5.0])
    mask = torch.ones(16, 8, dtype=torch.bool)
    for step in range(1000):
        popart.update_(torch.randn(16, 8, G) * std, mask)
        if step in (9, 999):
            torch.testing.assert_close(popart.sigma, std, rtol=0.1, atol=0.0)


def test_popart_statistics_converge_and_ignore_padding():
    popart = PopArt(G, beta=0.02)
    mean, std = torch.tensor([3.0, -20.0, 400.0]), torch.tensor([2.0, 5.0, 50.0])
    mask = torch.ones(16, 8, dtype=torch.bool)
    mask[:, 6:] = False
    for _ in range(1500):
        y = torch.randn(16, 8, G) * std + mean
        y[~mask] = float("nan")  # padding never counts
        popart.update_(y, mask)
    torch.testing.assert_close(popart.mu, mean, rtol=0.03, atol=0.1)
    torch.testing.assert_close(popart.sigma, std, rtol=0.05, atol=0.1)
    y = torch.randn(16, 8, G) * std + mean
    torch.testing.assert_close(popart.denormalize(popart.normalize(y)), y, rtol=1e-5, atol=1e-4)


def test_popart_empty_batch_and_disabled_and_state_dict():
    popart = PopArt(G, beta=0.5)
    popart.update_(torch.randn(2, 3, G), torch.zeros(2, 3, dtype=torch.bool))
    assert torch.equal(popart.mu, torch.zeros(G)) and torch.equal(popart.nu, torch.ones(G))
    assert int(popart.count) == 0  # an empty batch is not counted either
    assert set(popart.state_dict()) == {"mu", "nu", "count"}  # the default: no floor, no floor statistic
    assert set(PopArt(G, max_ratio=5.0).state_dict()) == {"mu", "nu", "max_dev", "count"}

    off = PopArt(G, enabled=False)
    y = torch.randn(2, 3, G)
    critic = Critic(8, ActionSpec("continuous", 2), G, num_critics=2, hidden=8)
    w = critic.w_out.clone()
    off.update_(y * 100, torch.ones(2, 3, dtype=torch.bool), critic)
    assert torch.equal(off.normalize(y), y) and torch.equal(off.denormalize(y), y)
    assert torch.equal(critic.w_out, w)


def test_popart_scale_floor_keeps_rare_large_targets_within_max_ratio():
    """A sparse target (one 10 among 999 zeros): the plain std puts it ~32 σ away; the floor at most 5 σ."""
    y = torch.zeros(1, 1000, 1)
    y[0, 0] = 10.0
    mask = torch.ones(1, 1000, dtype=torch.bool)
    plain, floored = PopArt(1, max_ratio=None), PopArt(1, max_ratio=5.0)
    plain.update_(y, mask)
    floored.update_(y, mask)
    assert float(plain.normalize(y).max()) > 30
    assert float(floored.normalize(y).max()) == pytest.approx(5.0, rel=1e-4)
    assert float(floored.max_dev) == pytest.approx(10.0 - float(floored.mu), rel=1e-5)


def test_popart_scale_floor_leaves_dense_targets_alone():
    """Gaussian targets lie within ~4 σ of their mean in a batch of this size: the floor does not bind."""
    torch.manual_seed(0)
    y = torch.randn(24, 256, 3) * torch.tensor([0.1, 1.0, 30.0]) + 5.0
    mask = torch.ones(24, 256, dtype=torch.bool)
    plain, floored = PopArt(3, max_ratio=None), PopArt(3, max_ratio=5.0)
    plain.update_(y, mask)
    floored.update_(y, mask)
    assert torch.equal(plain.sigma, floored.sigma)


def test_popart_loads_weights_saved_without_the_floor_statistic():
    old = {"mu": torch.full((G,), 2.0), "nu": torch.full((G,), 5.0), "count": torch.tensor(7)}
    popart = PopArt(G, max_ratio=5.0)
    popart.load_state_dict(old)  # strict: a missing max_dev is filled with zeros (no floor until updated)
    assert torch.equal(popart.max_dev, torch.zeros(G))
    assert torch.allclose(popart.sigma, torch.ones(G))


def test_denormalize_per_action_scales_each_discount_of_every_action():
    popart = PopArt(3, beta=0.3)
    popart.update_(torch.randn(4, 5, 3) * torch.tensor([1.0, 10.0, 100.0]), torch.ones(4, 5, dtype=torch.bool))
    q = torch.randn(2, 7, 3, 4)  # [B, L, G, A]
    expected = torch.stack([popart.denormalize(q[..., a]) for a in range(4)], dim=-1)
    torch.testing.assert_close(popart.denormalize_per_action(q), expected, atol=0, rtol=0)
