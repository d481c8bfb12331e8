"""The classification critic (`LossConfig.critic_kind = "twohot"`): label and read-out functions with
hand-computed values, the K-logit critic head, its loss, its config, and the agent and learner built with it."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch
import torch.nn.functional as F
from test_agent import KINDS, _experiment, build_agent, loss_cfg, real_batch

from icrl.agent.critic_kind import CriticReader, value_bins
from icrl.agent.learner import Learner, compute_loss
from icrl.agent.losses import (
    ValueBins,
    actor_loss,
    bins_to_value,
    classification_critic_loss,
    hl_gauss,
    symexp,
    symlog,
    two_hot,
)
from icrl.config import ConfigError, ExperimentConfig, LossConfig
from icrl.nets.dists import Categorical
from icrl.nets.heads import Actor, Critic, logits_at_action, q_at_action
from icrl.nets.popart import PopArt
from icrl.types import ActionSpec

NAN = float("nan")
TWOHOT = {"critic_kind": "twohot", "critic_bins": 16, "critic_min_value": -50.0, "critic_max_value": 50.0}


# ---------------------------------------------------------------- pure functions, by hand


def test_symexp_inverts_symlog():
    x = torch.tensor([-1e4, -3.0, -0.5, 0.0, 0.5, 3.0, 1e4], dtype=torch.float64)
    torch.testing.assert_close(symexp(symlog(x)), x)
    torch.testing.assert_close(symexp(torch.tensor([1.0, -2.0])), torch.tensor([math.e - 1, -(math.e**2 - 1)]))


def test_two_hot_by_hand():
    bins = torch.tensor([0.0, 1.0, 2.0, 4.0])
    values = torch.tensor([0.25, 1.0, 3.0, -5.0, 10.0, 4.0, 0.0, 3.5])
    expected = torch.tensor([
        [0.75, 0.25, 0.0, 0.0],  # a quarter of the way from bin 0 to bin 1
        [0.0, 1.0, 0.0, 0.0],  # exact at a centre
        [0.0, 0.0, 0.5, 0.5],  # halfway across the uneven gap 2 -> 4
        [1.0, 0.0, 0.0, 0.0],  # below the range: clamped to the first bin
        [0.0, 0.0, 0.0, 1.0],  # above: the last bin
        [0.0, 0.0, 0.0, 1.0],  # the last centre
        [1.0, 0.0, 0.0, 0.0],  # the first centre
        [0.0, 0.0, 0.25, 0.75],
    ])
    labels = two_hot(values, bins)
    torch.testing.assert_close(labels, expected)
    torch.testing.assert_close(labels.sum(-1), torch.ones(8))
    torch.testing.assert_close((labels * bins).sum(-1), values.clamp(0.0, 4.0))  # the expectation is the value
    assert two_hot(values.view(2, 4), bins).shape == (2, 4, 4)


def test_hl_gauss_by_hand():
    """Bins 0, 1, 2 span [-0.5, 2.5] (edges -0.5, 0.5, 1.5, 2.5); N(1, 0.5²) has Φ(±1), Φ(±3) at the edges."""
    bins = torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64)

    def phi(z: float) -> float:
        return 0.5 * (1 + math.erf(z / math.sqrt(2)))

    side, centre = phi(-1) - phi(-3), phi(1) - phi(-1)  # 0.157305, 0.682689
    total = phi(3) - phi(-3)
    torch.testing.assert_close(hl_gauss(torch.tensor([1.0], dtype=torch.float64), bins, 0.5),
                               torch.tensor([[side, centre, side]], dtype=torch.float64) / total)
    torch.testing.assert_close(
        hl_gauss(torch.tensor([1.0], dtype=torch.float64), bins, 0.5),
        torch.tensor([[0.157731, 0.684538, 0.157731]], dtype=torch.float64), atol=1e-6, rtol=0)
    labels = hl_gauss(torch.tensor([-3.0, 0.3, 7.0]), bins.float(), 0.75)
    torch.testing.assert_close(labels.sum(-1), torch.ones(3))
    torch.testing.assert_close(labels[0], labels[2].flip(0))  # both clamped to an end: mirror images
    assert labels[0].argmax() == 0 and labels[2].argmax() == 2
    sharp = hl_gauss(torch.tensor([1.0]), bins.float(), 1e-3)  # a narrow Gaussian: one-hot at its bin
    torch.testing.assert_close(sharp, torch.tensor([[0.0, 1.0, 0.0]]))
    with pytest.raises(ValueError, match="sigma > 0"):
        hl_gauss(torch.tensor([1.0]), bins, 0.0)


def test_bins_to_value_by_hand_and_round_trips_two_hot():
    bins = torch.tensor([0.0, 1.0, 4.0])
    logits = torch.tensor([0.25, 0.5, 0.25]).log()
    torch.testing.assert_close(bins_to_value(logits, bins), torch.tensor(0.25 * 0 + 0.5 * 1 + 0.25 * 4))
    v = torch.tensor([0.0, 0.7, 2.5, 4.0])
    torch.testing.assert_close(bins_to_value(two_hot(v, bins).log(), bins), v)
    logits = torch.randn(5, 3, requires_grad=True)
    bins_to_value(logits, bins).sum().backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0


def test_value_bins_symlog_spacing_labels_and_read_out():
    vb = ValueBins.evenly(5, -100.0, 100.0, symlog_spaced=True)
    s100 = math.log(101.0)
    torch.testing.assert_close(vb.centres, torch.tensor([-s100, -s100 / 2, 0.0, s100 / 2, s100]))
    # a centre's value is one-hot there; the read-out inverts the labels exactly (inside the range)
    torch.testing.assert_close(vb.labels(torch.tensor(symexp(torch.tensor(s100 / 2)).item())),
                               torch.tensor([0.0, 0.0, 0.0, 1.0, 0.0]))
    y = torch.tensor([-100.0, -7.0, 0.0, 0.3, 42.0, 100.0, 1e6])
    torch.testing.assert_close(vb.value(vb.labels(y).log()), y.clamp(-100, 100), atol=1e-4, rtol=1e-5)
    linear = ValueBins.evenly(3, -1.0, 1.0, symlog_spaced=False, sigma_bins=0.75)
    torch.testing.assert_close(linear.centres, torch.tensor([-1.0, 0.0, 1.0]))
    assert linear.sigma == pytest.approx(0.75) and not linear.symlog
    torch.testing.assert_close(linear.labels(torch.tensor(0.0)), hl_gauss(torch.tensor(0.0), linear.centres, 0.75))


def test_classification_critic_loss_by_hand_and_ignores_padding():
    B, L, C, G, K = 2, 3, 2, 2, 4
    logits = torch.randn(B, L, C, G, K)
    labels = torch.softmax(torch.randn(B, L, G, K), -1)
    valid = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    labels_pad, logits_pad = labels.clone(), logits.clone()
    labels_pad[~valid] = NAN
    logits_pad[~valid] = 1e6
    logits_pad.requires_grad_(True)
    q, y = torch.randn(B, L, C, G), torch.randn(B, L, G)
    loss, metrics = classification_critic_loss(logits_pad, labels_pad, valid, q, y)
    ce = -(labels.unsqueeze(2) * logits.log_softmax(-1)).sum(-1)  # [B, L, C, G]
    torch.testing.assert_close(loss, ce[valid].mean())
    loss.backward()
    assert torch.all(logits_pad.grad[~valid] == 0) and torch.isfinite(logits_pad.grad).all()
    torch.testing.assert_close(metrics["q_norm"], q[valid].mean())
    torch.testing.assert_close(metrics["td_abs_err"], (q - y.unsqueeze(2)).abs()[valid].mean())


# ---------------------------------------------------------------- the K-logit critic head

SPECS = [ActionSpec("discrete", 3), ActionSpec("continuous", 2), ActionSpec("multibinary", 3)]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kind)
def test_classification_critic_shapes_and_parameters(spec):
    torch.manual_seed(0)
    B, L, G, C, K, d = 2, 3, 4, 3, 5, 8
    reg = Critic(d, spec, G, num_critics=C, hidden=16)
    cls = Critic(d, spec, G, num_critics=C, hidden=16, num_bins=K)
    shapes, shapes_k = {n: p.shape for n, p in reg.named_parameters()}, {n: p.shape for n, p in cls.named_parameters()}
    assert shapes.keys() == shapes_k.keys()
    assert [n for n in shapes if shapes[n] != shapes_k[n]] == ["w_out", "b_out"]
    assert shapes_k["w_out"] == (*shapes["w_out"], K) and shapes_k["b_out"] == (*shapes["b_out"], K)
    s = torch.randn(B, L, d)
    if spec.kind == "discrete":
        assert cls(s).shape == (B, L, C, G, spec.dim, K)
        a = F.one_hot(torch.randint(0, 3, (B, L, G)), 3).float()
        out = logits_at_action(cls(s), a)
        assert out.shape == (B, L, C, G, K)
        torch.testing.assert_close(out[..., 0], q_at_action(cls(s)[..., 0], a))
    else:
        a = torch.rand(B, L, G, spec.dim) * 2 - 1
        out = cls(s, a)
        assert out.shape == (B, L, C, G, K)
        # discount g reads its own action: equal to the shared-action call at that action
        for g in range(G):
            shared = cls(s, a[..., g : g + 1, :])  # [B, L, C, G, K]
            torch.testing.assert_close(out[..., g, :], shared[..., g, :], atol=1e-5, rtol=1e-5)
        k_samples = cls(s, a.unsqueeze(0).expand(2, *a.shape))
        assert k_samples.shape == (2, B, L, C, G, K)
        torch.testing.assert_close(k_samples[1], out, atol=1e-5, rtol=1e-5)
    members = torch.tensor([2, 0])
    full = cls(s) if spec.kind == "discrete" else cls(s, a)
    part = cls(s, members=members) if spec.kind == "discrete" else cls(s, a, members=members)
    dim = -4 if spec.kind == "discrete" else -3
    torch.testing.assert_close(part, full.index_select(dim, members), atol=1e-5, rtol=1e-5)
    with pytest.raises(RuntimeError, match="not rescaled by PopArt"):
        cls.rescale_output_(torch.ones(G), torch.zeros(G))


def test_classification_critic_first_layers_equal_the_regression_ones():
    """Only the output layer differs: the same hidden weights give the same features, so a K-bin critic whose
    bins' logits are the regression outputs' copies reads a uniform distribution (the expectation is the mean)."""
    spec = ActionSpec("continuous", 2)
    torch.manual_seed(0)
    reg = Critic(8, spec, 2, num_critics=2, hidden=16)
    cls = Critic(8, spec, 2, num_critics=2, hidden=16, num_bins=3)
    state = reg.state_dict()
    for name in ("w_out", "b_out"):
        state[name] = state[name].unsqueeze(-1).expand_as(getattr(cls, name)).clone()
    cls.load_state_dict(state)
    s, a = torch.randn(4, 8), torch.rand(4, 2, 2)
    torch.testing.assert_close(cls(s, a), reg(s, a).unsqueeze(-1).expand(4, 2, 2, 3))


# ---------------------------------------------------------------- config


def test_defaults_are_the_regression_critic():
    lo = LossConfig()
    assert lo.critic_kind == "regression" and value_bins(lo) is None
    assert (lo.critic_bins, lo.critic_min_value, lo.critic_max_value, lo.critic_symlog_bins) == (128, -1e5, 1e5, True)
    assert lo.critic_hl_gauss_sigma == 0.0
    ExperimentConfig().replace(critic_kind="twohot", critic_hl_gauss_sigma=0.75).validate(check_device=False)


@pytest.mark.parametrize(("fields", "message"), [
    ({"critic_bins": 64}, "critic_bins only apply to critic_kind='twohot'"),
    ({"critic_min_value": -1.0, "critic_hl_gauss_sigma": 0.75},
     "critic_min_value, critic_hl_gauss_sigma only apply to critic_kind='twohot'"),
    ({"critic_kind": "twohot", "critic_min_value": 5.0, "critic_max_value": 5.0},
     "critic_min_value 5.0 must be below critic_max_value 5.0"),
    ({"critic_kind": "twohot", "critic_bins": 1}, "critic_bins must be in [2, 65536]"),
    ({"critic_kind": "twohot", "critic_hl_gauss_sigma": -0.5}, "critic_hl_gauss_sigma must be >= 0.0"),
    ({"critic_kind": "classification"}, "critic_kind must be one of 'regression', 'twohot'"),
])
def test_bad_critic_combinations_are_refused_in_one_line(fields, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        ExperimentConfig().replace(**fields).validate(check_device=False)
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------- the agent and the learner


def test_the_agent_builds_the_critic_of_the_configs_kind(tmp_path):
    _, obs_space, spec = real_batch("discrete", tmp_path / "replay")
    plain_agent, agent = build_agent(obs_space, spec), build_agent(obs_space, spec, **TWOHOT)
    assert plain_agent.critic.num_bins is None
    assert agent.critic.num_bins == agent.target_critic.num_bins == 16
    assert not any(p.requires_grad for p in agent.target_critic.parameters())
    plain = {k: v.shape for k, v in plain_agent.state_dict().items()}
    twohot = {k: v.shape for k, v in agent.state_dict().items()}
    assert plain.keys() == twohot.keys()
    assert {k for k in plain if plain[k] != twohot[k]} == {f"{c}.{w}" for c in ("critic", "target_critic")
                                                           for w in ("w_out", "b_out")}
    with pytest.raises(ValueError, match="build the agent from the same LossConfig"):
        compute_loss(build_agent(obs_space, spec), *_batch_cfg(tmp_path))


def _batch_cfg(tmp_path):
    batch, _, _ = real_batch("discrete", tmp_path / "replay2")
    return batch, loss_cfg(**TWOHOT)


@pytest.mark.parametrize("kind", ["discrete", "continuous"])
def test_twohot_targets_read_the_expectation_of_the_target_critic(kind, tmp_path):
    """y is built from symexp(E_bins[symlog-space centres]) of the sampled target critics, min-reduced; the
    critic loss is the cross-entropy against y's labels (unnormalised, whatever PopArt's statistics)."""
    from icrl.agent.losses import align_next, redq_members, td_targets

    batch, obs_space, spec = real_batch(kind, tmp_path / "replay")
    cfg = loss_cfg(**TWOHOT)
    agent = build_agent(obs_space, spec, **TWOHOT)
    agent.popart.mu.fill_(0.3)
    agent.popart.nu.fill_(2.0)  # must not touch the targets or the labels
    torch.manual_seed(5)
    _, metrics, y, valid = compute_loss(agent, batch, cfg, torch.Generator().manual_seed(9))
    vb = value_bins(cfg)
    torch.manual_seed(5)
    with torch.no_grad():
        s = agent(batch.inputs)
        dist = agent.target_actor(s)
        if kind == "discrete":
            q = symexp((agent.target_critic(s).softmax(-1) * vb.centres).sum(-1))  # [B, L, C, G, A]
            v = (dist.probs.unsqueeze(-3) * q).sum(-1)
        else:
            v = symexp((agent.target_critic(s, dist.sample()).softmax(-1) * vb.centres).sum(-1))
        v = v.index_select(-2, redq_members(v.shape[-2], cfg.redq_subset, torch.Generator().manual_seed(9)))
        ref = td_targets(batch.reward, batch.terminated, valid, align_next(v.amin(-2)), agent.gammas, cfg.reward_scale)
        a_vec = batch.action.unsqueeze(-2).expand(*batch.action.shape[:-1], len(cfg.gammas), batch.action.shape[-1])
        logits = logits_at_action(agent.critic(s), a_vec) if kind == "discrete" else agent.critic(s, a_vec)
        labels = two_hot(symlog(ref), vb.centres)
        ce = -(labels.unsqueeze(-3) * logits.log_softmax(-1)).sum(-1)
    torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(metrics["critic_loss"], ce[valid].mean(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_twohot_learner_update_tracks_popart_without_rescaling(kind, tmp_path):
    batch, obs_space, spec = real_batch(kind, tmp_path / "replay")
    cfg = dataclasses.replace(_experiment(), loss=loss_cfg(tau=0.25, popart_beta=0.2, **TWOHOT))
    torch.manual_seed(0)
    agent = build_agent(obs_space, spec, **TWOHOT)
    learner = Learner(agent, cfg, torch.device("cpu"))
    target_before = agent.target_critic.w_out.detach().clone()
    for _ in range(2):
        metrics = learner.update(batch)
    assert all(torch.isfinite(v).all() for v in metrics.values())
    assert learner.guard.skipped == 0 and int(agent.popart.count) == 2
    assert float(agent.popart.sigma[-1]) != 1.0  # the statistics follow the targets
    assert not torch.equal(agent.target_critic.w_out, target_before)  # EMA moved the target critic


def test_reader_of_a_regression_critic_passes_its_normalised_outputs_through():
    popart = PopArt(4)
    popart.mu.fill_(0.5)
    popart.nu.fill_(4.0)
    read, out = CriticReader(popart, None), torch.randn(2, 3, 4)
    assert read.normalized(out) is out and read.normalized_per_action(out) is out
    torch.testing.assert_close(read.raw(out), popart.denormalize(out))
    vb = ValueBins.evenly(8, -10.0, 10.0)
    logits = torch.randn(2, 3, 4, 8)
    torch.testing.assert_close(CriticReader(popart, vb).normalized(logits), popart.normalize(vb.value(logits)))


# ---------------------------------------------------------------- actor coefficients: filtered BC alone


@pytest.mark.parametrize("kind", ["discrete", "continuous"])
def test_online_zero_offline_one_is_filtered_bc_only(kind):
    """`online_coeff=0, offline_coeff=1` (the official MultiTaskAgent's defaults): the actor loss and its
    gradient are exactly those of -1[A > 0] log π(a_t | s_t), the online term contributing nothing."""
    torch.manual_seed(0)
    B, L, G, C, d = 2, 3, 2, 2, 8
    spec = ActionSpec(kind, 3)
    actor = Actor(d, spec, G, hidden=16)
    critic = Critic(d, spec, G, num_critics=C, hidden=16)
    s = torch.randn(B, L, d)
    valid = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    if kind == "discrete":
        action = F.one_hot(torch.randint(0, 3, (B, L)), 3).float()
        kw: dict = {"q_all": critic(s).detach()}
    else:
        action = torch.rand(B, L, 3) * 2 - 1
        kw = {"q_fn": lambda a: critic(s, a).detach()}
    torch.manual_seed(1)
    loss, m = actor_loss(actor(s), action, valid, online_coeff=0.0, offline_coeff=1.0, **kw)
    grads = torch.autograd.grad(loss, list(actor.parameters()))
    # by hand, with the same draws: the advantage, its binary filter, the masked mean of -f(A) log π(a_t)
    torch.manual_seed(1)
    dist = actor(s)
    a_g = action.unsqueeze(-2).expand(B, L, G, 3)
    if kind == "discrete":
        q = kw["q_all"].mean(-3)
        adv = (q * a_g).sum(-1) - (dist.probs * q).sum(-1).detach()
    else:
        a_pi = dist.rsample((1,))  # num_value_samples = 1
        adv = kw["q_fn"](a_g).mean(-2) - kw["q_fn"](a_pi).mean(-2).mean(0)
    per_step = -(adv > 0).float() * dist.log_prob(a_g)  # [B, L, G]
    hand = per_step[valid].mean()
    torch.testing.assert_close(loss, hand)
    torch.testing.assert_close(m["actor_loss"], m["actor_bc"])
    for g, h in zip(grads, torch.autograd.grad(hand, list(actor.parameters())), strict=True):
        torch.testing.assert_close(g, h)
    assert isinstance(dist, Categorical) == (kind == "discrete")
