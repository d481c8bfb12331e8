"""The learning update's math as plain functions (docs/design.md §4): TD targets, REDQ, critic and actor losses.

Everything works on all G discounts at once (last dimension G; the last discount is the policy's) and
on whole padded sequences [B, L]. No function here builds modules or owns state: the agent computes
the network outputs, these functions turn them into losses and return `(loss, metrics)`, where metrics
are detached 0-dim tensors (no host sync until the caller logs them).

Value spaces: critic outputs and the actor's Q are PopArt-normalised; TD targets are computed in
unnormalised space (`icrl.nets.popart.PopArt.denormalize` the target critic first, `normalize` y after).
A classification critic (`LossConfig.critic_kind = "twohot"`) emits logits over value bins instead: `ValueBins`
turns unnormalised targets into labels and logits into unnormalised values (`classification_critic_loss`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from torch.func import functional_call

from icrl.config.loss import DEFAULT_GAMMAS
from icrl.nets.dists import Categorical, Distribution
from icrl.nets.squash import symexp, symlog

__all__ = [  # DEFAULT_GAMMAS is re-exported: the loss functions' callers often want the default discounts too
    "DEFAULT_GAMMAS", "Metrics", "ValueBins", "actor_loss", "advantage_filter", "align_next", "bins_to_value",
    "classification_critic_loss", "conservative_term", "critic_loss", "frozen_critic", "hl_gauss", "redq_members",
    "symexp", "symlog", "td_targets", "two_hot",
]

Metrics = dict[str, torch.Tensor]


def align_next(x: torch.Tensor) -> torch.Tensor:
    """x[:, t + 1] moved to index t along the time dim 1, zero-filled at the end: [B, L, ...] -> [B, L, ...].

    Turns per-timestep values V(s_t) into the `next_value` that `td_targets` expects.
    """
    return torch.cat([x[:, 1:], torch.zeros_like(x[:, :1])], dim=1)


def _ahead(x: torch.Tensor, k: int) -> torch.Tensor:
    """x[:, t + k] at index t, zero/False-filled past the end."""
    if k == 0:
        return x
    pad = torch.zeros_like(x[:, : min(k, x.shape[1])])
    return torch.cat([x[:, k:], pad], dim=1)[:, : x.shape[1]]


@torch.no_grad()
def td_targets(
    reward: torch.Tensor,
    terminated: torch.Tensor,
    valid: torch.Tensor,
    next_value: torch.Tensor,
    gammas: Sequence[float] | torch.Tensor,
    reward_scale: float = 1.0,
    n_step: int = 1,
) -> torch.Tensor:
    """n-step TD targets y [B, L, G] for every discount, in unnormalised value space.

    reward, terminated [B, L]: r_t and whether s_{t+1} ends the task. valid [B, L] bool: the transition
    t -> t+1 exists in the window (`has_action[:, t] & mask[:, t+1]`). next_value [B, L, G]: V(s_{t+1})
    at index t (see `align_next`). One step: y_t = R r_t + γ (1 - terminated_t) V(s_{t+1}).
    n steps: Σ_{k<n} γ^k R r_{t+k} + γ^n V(s_{t+n}), cut short (no bootstrap) at a terminal, and falling
    back to fewer steps where the window's valid transitions end. Time-limit truncation is not a
    terminal: it bootstraps. y is 0 where `valid` is False; padding values (even NaN) never leak in.
    """
    dtype = next_value.dtype
    g = torch.as_tensor(gammas, dtype=dtype, device=next_value.device)  # [G]
    valid, term = valid.bool(), terminated.bool()
    r = reward.to(dtype) * reward_scale  # [B, L]
    zero = next_value.new_zeros(())
    y = torch.zeros_like(next_value)  # [B, L, G]
    alive = valid  # [B, L]: the k-step chain from t reaches transition t + k
    disc = torch.ones_like(g)  # γ^k, [G]
    for k in range(n_step):  # n is small; every op is batched over B, L, G
        term_k, v_next = _ahead(term, k), _ahead(valid, k + 1)
        y = y + torch.where(alive.unsqueeze(-1), disc * _ahead(r, k).unsqueeze(-1), zero)
        disc = disc * g
        chain_ends = ~v_next if k < n_step - 1 else torch.ones_like(v_next)
        bootstrap = alive & ~term_k & chain_ends  # [B, L]
        y = y + torch.where(bootstrap.unsqueeze(-1), disc * _ahead(next_value, k), zero)
        alive = alive & ~term_k & v_next
    return y


def redq_members(num_critics: int, subset: int, generator: torch.Generator | None = None,
                 device: torch.device | str | None = None) -> torch.Tensor:
    """REDQ's random subset of `subset` of the `num_critics` target critics, drawn once per update on `device`
    (from `generator`, else the device's default generator): the order of uniform draws, so the draw has a
    fixed shape and stays on the device (a captured update replays it, icrl.agent.graphs). The learner
    evaluates only these members and reduces over them (min or mean)."""
    return torch.rand(num_critics, generator=generator, device=device).argsort()[:subset]


def _td_error(q: torch.Tensor, y_norm: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """q [B, L, C, G] - y_norm [B, L, G] where the mask m [B, L, 1, 1] holds, else 0 (padding never read)."""
    return torch.where(m, q - y_norm.detach().unsqueeze(-2), q.new_zeros(()))


@torch.no_grad()
def _value_metrics(q: torch.Tensor, y_norm: torch.Tensor, err: torch.Tensor, m: torch.Tensor) -> Metrics:
    """The critic's logged means over the real transitions: Q, target and |TD error| (normalised values)."""
    C, G = q.shape[-2:]
    n = m.sum().clamp_min(1)
    return {"q_norm": torch.where(m, q, q.new_zeros(())).sum() / (n * C * G),
            "y_norm": torch.where(m[..., 0, :], y_norm, y_norm.new_zeros(())).sum() / (n * G),
            "td_abs_err": err.abs().sum() / (n * C * G)}


def critic_loss(
    q_sa: torch.Tensor, y_norm: torch.Tensor, valid: torch.Tensor
) -> tuple[torch.Tensor, Metrics]:
    """Masked mean squared TD error of every member and discount.

    q_sa [B, L, C, G]: normalised Q(s_t, a_t); y_norm [B, L, G]: normalised targets (detached here);
    valid [B, L] bool: real transitions. Averages over real transitions × C × G; padding contributes
    exactly nothing, whatever it holds. The ×10 weight of docs/design.md §4 is the caller's (`critic_weight`).
    """
    C, G = q_sa.shape[-2:]
    m = valid.bool()[..., None, None]  # [B, L, 1, 1]
    err = _td_error(q_sa, y_norm, m)  # [B, L, C, G]
    loss = err.square().sum() / (valid.sum().clamp_min(1) * C * G)
    return loss, {"critic_loss": loss.detach(), **_value_metrics(q_sa, y_norm, err, m)}


def conservative_term(
    q_all: torch.Tensor, action: torch.Tensor, valid: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """CQL(H)'s term, τ · logsumexp_a (Q(s_t, a) / τ) - Q(s_t, a_t), masked mean over real transitions × C × G.

    q_all [B, L, C, G, A]: a discrete critic's PopArt-normalised values of every action (differentiable);
    action [B, L, G, A]: a_t one-hot per discount; valid [B, L] bool; temperature τ > 0 (1: CQL(H)'s). Its
    gradient lowers every action in proportion to softmax_a (Q / τ) and raises the stored one, so an action the
    replay never holds at a state is pushed down until it falls below the stored ones, while a stored action's value
    is still fitted by the TD error. A small τ puts the lowering on the actions valued above the stored one only
    (docs/method.md). The values are in PopArt's units, so the term's weight means the same whatever the rewards'
    scale.
    """
    C, G = q_all.shape[-3:-1]
    m = valid.bool()[..., None, None]  # [B, L, 1, 1]
    q_all = torch.where(m.unsqueeze(-1), q_all, q_all.new_zeros(()))  # padding (even NaN) never reaches a gradient
    q_data = (q_all * action.unsqueeze(-3)).sum(-1)  # [B, L, C, G]
    soft_max = torch.logsumexp(q_all / temperature, dim=-1) * temperature  # [B, L, C, G]; exact at τ = 1
    gap = torch.where(m, soft_max - q_data, q_all.new_zeros(()))
    return gap.sum() / (valid.sum().clamp_min(1) * C * G)


# ---------------------------------------------------------------- the classification critic (critic_kind twohot)


def two_hot(values: torch.Tensor, bins: torch.Tensor) -> torch.Tensor:
    """Two-hot labels [..., K] of `values` [...] on the increasing bin centres `bins` [K] (K >= 2).

    A value between bins k and k+1 puts weight (b_{k+1} - v) / (b_{k+1} - b_k) on k and the rest on k+1, so the
    labels' expectation Σ_k p_k b_k is the value itself; a value on a centre is one-hot there. Values outside
    [b_0, b_{K-1}] are clamped to it (all weight on the end bin). Every row sums to 1.
    """
    bins = bins.to(values.dtype)
    v = values.clamp(bins[0], bins[-1])
    idx = (torch.searchsorted(bins, v.contiguous(), right=True) - 1).clamp(0, bins.shape[0] - 2)
    lo, hi = bins[idx], bins[idx + 1]
    w_hi = ((v - lo) / (hi - lo)).clamp(0.0, 1.0).unsqueeze(-1)
    labels = values.new_zeros(*values.shape, bins.shape[0])
    labels.scatter_(-1, idx.unsqueeze(-1), 1.0 - w_hi)
    return labels.scatter_add_(-1, idx.unsqueeze(-1) + 1, w_hi)


def hl_gauss(values: torch.Tensor, bins: torch.Tensor, sigma: float) -> torch.Tensor:
    """HL-Gauss labels [..., K] (Farebrother et al. 2024): the mass of N(v, sigma²) on each bin, renormalised to
    the bins' support. Bin k spans the midpoints to its neighbours (the end bins reach half a gap beyond their
    centre); `sigma` is in the bins' units. Values are clamped to [b_0, b_{K-1}] first, as in `two_hot`."""
    if sigma <= 0:
        raise ValueError(f"hl_gauss needs sigma > 0, got {sigma}; use two_hot for sigma 0")
    bins = bins.to(values.dtype)
    mid = (bins[1:] + bins[:-1]) / 2
    edges = torch.cat([bins[:1] - (mid[:1] - bins[:1]), mid, bins[-1:] + (bins[-1:] - mid[-1:])])  # [K + 1]
    v = values.clamp(bins[0], bins[-1]).unsqueeze(-1)
    cdf = torch.erf((edges - v) / (sigma * math.sqrt(2.0)))  # 2 Φ - 1 at every edge: [..., K + 1]
    return (cdf[..., 1:] - cdf[..., :-1]) / (cdf[..., -1:] - cdf[..., :1])


def bins_to_value(logits: torch.Tensor, bins: torch.Tensor) -> torch.Tensor:
    """The expectation Σ_k softmax(logits)_k b_k: logits [..., K], bins [K] -> [...] (differentiable)."""
    return (logits.softmax(-1) * bins.to(logits.dtype)).sum(-1)


@dataclass(frozen=True)
class ValueBins:
    """The classification critic's support: K bin centres evenly spaced over [low, high] in symlog(value)
    (`symlog`) or in value, and the label and read-out rules. Targets and values are unnormalised.

    `labels(y)` = two_hot(f(y), centres) (HL-Gauss when `sigma` > 0, in f's units); `value(logits)` =
    f⁻¹(Σ_k p_k centre_k), with f = symlog or the identity (Dreamer-V3 / official AMAGO: the expectation is
    taken in the bins' space, then mapped back)."""

    centres: torch.Tensor  # [K], increasing, in f's space
    symlog: bool = True
    sigma: float = 0.0

    @classmethod
    def evenly(cls, num_bins: int, low: float, high: float, *, symlog_spaced: bool = True, sigma_bins: float = 0.0,
               device: torch.device | str | None = None) -> ValueBins:
        """Bins evenly spaced in f-space; `sigma_bins`: the HL-Gauss width in bin widths (0: two-hot)."""
        ends = torch.tensor([low, high], dtype=torch.float64)
        ends = symlog(ends) if symlog_spaced else ends
        centres = torch.linspace(float(ends[0]), float(ends[1]), num_bins, dtype=torch.float64)
        width = float(ends[1] - ends[0]) / (num_bins - 1)
        return cls(centres.to(device=device, dtype=torch.float32), symlog_spaced, sigma_bins * width)

    def labels(self, y: torch.Tensor) -> torch.Tensor:
        """Unnormalised values [...] -> labels [..., K] (rows sum to 1)."""
        x = symlog(y) if self.symlog else y
        return hl_gauss(x, self.centres, self.sigma) if self.sigma > 0 else two_hot(x, self.centres)

    def value(self, logits: torch.Tensor) -> torch.Tensor:
        """Bin logits [..., K] -> unnormalised values [...], differentiable in the logits."""
        x = bins_to_value(logits, self.centres)
        return symexp(x) if self.symlog else x


def classification_critic_loss(
    logits: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor, q_norm: torch.Tensor, y_norm: torch.Tensor
) -> tuple[torch.Tensor, Metrics]:
    """Masked mean cross-entropy of every member's and discount's bin logits against its TD target's labels.

    logits [B, L, C, G, K]: the critic at (s_t, a_t); labels [B, L, G, K]: `ValueBins.labels` of the
    unnormalised targets (detached here); valid [B, L] bool. Averages over real transitions × C × G, as
    `critic_loss`; padding contributes exactly nothing. q_norm [B, L, C, G] (the critic's expected values) and
    y_norm [B, L, G], both in the space `critic_loss` reports (PopArt-normalised), give the same metrics.
    """
    C, G = logits.shape[-3:-1]
    m = valid.bool()[..., None, None]  # [B, L, 1, 1]
    labels = torch.where(m, labels.detach(), labels.new_zeros(()))  # NaN padding never reaches the gradient
    ce = -(labels.unsqueeze(-3) * logits.log_softmax(-1)).sum(-1)  # [B, L, C, G]
    loss = torch.where(m, ce, ce.new_zeros(())).sum() / (valid.sum().clamp_min(1) * C * G)
    err = _td_error(q_norm.detach(), y_norm, m)
    return loss, {"critic_loss": loss.detach(), **_value_metrics(q_norm.detach(), y_norm, err, m)}


def frozen_critic(critic: nn.Module, s: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """`a -> critic(s.detach(), a)` evaluated with *detached* parameters (via `torch.func.functional_call`).

    Gradients flow into the action `a` (and so into the actor) but never into the critic's parameters
    or, through the critic, into the encoder that produced `s` (docs/design.md §4, gradient routing).
    """
    params = {name: p.detach() for name, p in critic.named_parameters()}
    s = s.detach()

    def q_fn(a: torch.Tensor) -> torch.Tensor:
        return functional_call(critic, params, (s, a))

    return q_fn


def advantage_filter(
    adv: torch.Tensor, kind: Literal["binary", "exp"] = "binary", beta: float = 1.0, clip: float = 20.0
) -> torch.Tensor:
    """BC weights f(A): `binary` 1[A > 0] (filtered BC), `exp` min(exp(A / beta), clip) (CRR / AWR)."""
    adv = adv.detach()
    if kind == "binary":
        return (adv > 0).to(adv.dtype)
    if kind == "exp":
        return torch.exp(adv / beta).clamp(max=clip)
    raise ValueError(f"unknown advantage filter {kind!r}; use 'binary' or 'exp'")


def _per_discount(dist: Distribution, action: torch.Tensor) -> torch.Tensor:
    """The batch's actions [B, L, A] (or [B, L, G, A]) as [B, L, G, A] in the distribution's dtype."""
    G = dist.batch_shape[-1]
    if action.dim() == len(dist.batch_shape):  # [B, L, A] -> the same action for every discount
        action = action.unsqueeze(-2).expand(*action.shape[:-1], G, action.shape[-1])
    return action.to(dist.dtype)


def _discrete_terms(dist: Categorical, action: torch.Tensor, q_all: torch.Tensor | None,
                    online_reduce: Literal["mean", "min"] = "mean") -> tuple[torch.Tensor, ...]:
    """(online, v, q_data) [B, L, G] of a discrete actor: exact sums over the actions of the ensemble-mean Q (the
    online term: of each member's Q, then their minimum, with `online_reduce` "min")."""
    if q_all is None:
        raise ValueError("discrete actor_loss needs q_all [B, L, C, G, A]")
    q = q_all.detach().mean(-3)  # [B, L, G, A], ensemble mean
    q_pi = (dist.probs * q).sum(-1)  # [B, L, G]: exact E_{a~π} Q(s, a), differentiable in π
    if online_reduce == "min":  # min_c E_{a~π} Q_c(s, a), the official AMAGO's online term
        online = -(dist.probs.unsqueeze(-3) * q_all.detach()).sum(-1).amin(-2)  # [B, L, G]
        return online, q_pi.detach(), (q * action).sum(-1)
    return -q_pi, q_pi.detach(), (q * action).sum(-1)


def _sampled_terms(
    dist: Distribution,
    action: torch.Tensor,
    q_fn: Callable[[torch.Tensor], torch.Tensor] | None,
    num_value_samples: int,
    need_online: bool,
    need_bc: bool,
    q_data_all: torch.Tensor | None = None,
    q_all: torch.Tensor | None = None,
    online_reduce: Literal["mean", "min"] = "mean",
) -> tuple[torch.Tensor, ...]:
    """(online, v, q_data) [B, L, G] of an actor whose critic takes the action as input. As in AMAGO: K actions
    a_k ~ π give both the online term -mean_k Q(s, a_k) (differentiated through a_k) and, detached, the value V(s)
    of the advantage; Q(s, a_t) is only evaluated when the BC term needs it, and not at all when the caller
    passes it (`q_data_all` [B, L, C, G], the critic loss's own Q(s_t, a_t): the same critic, state and
    action, so the same values). A discrete π samples straight through (`Categorical.straight_through_sample`);
    `q_all` [B, L, C, G, A] (its critic at every one-hot action) makes V(s) the exact Σ_a π(a|s) Q(s, a)."""
    if q_fn is None:
        raise ValueError("continuous / multi-binary actor_loss needs q_fn (see frozen_critic)")
    if q_all is not None and not isinstance(dist, Categorical):
        raise ValueError("q_all (Q of every action) needs a discrete policy")
    sampled = need_online or q_all is None
    if sampled:
        if isinstance(dist, Categorical):  # one-hot in value, the relaxed probabilities' gradient
            a_pi = dist.straight_through_sample((num_value_samples,))  # [K, B, L, G, A]
        else:
            a_pi = dist.rsample((num_value_samples,))  # [K, B, L, G, A]
        if need_online:
            members = q_fn(a_pi)  # [K, B, L, C, G]
            q_pi = members.mean(-2)  # [K, B, L, G], ensemble mean
            online = -(members.amin(-2) if online_reduce == "min" else q_pi).mean(0)
        else:
            with torch.no_grad():
                q_pi = q_fn(a_pi.detach()).mean(-2)
            online = -q_pi.mean(0)
    with torch.no_grad():  # the advantage is a fixed weight: no graph, no activations kept
        if isinstance(dist, Categorical) and q_all is not None:  # exact: Σ_a π(a|s) Q(s, a), ensemble mean
            v = (dist.probs.detach() * q_all.mean(-3)).sum(-1)
        else:
            v = q_pi.detach().mean(0)
        if not need_bc:
            q_data = v
        elif q_data_all is not None:
            q_data = q_data_all.detach().mean(-2)  # [B, L, G]
        else:
            q_data = q_fn(action).mean(-2)  # [B, L, G]
    return online if sampled else -v, v, q_data


def _masked_mean(valid: torch.Tensor, G: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """x [B, L, G] -> the mean over the steps where `valid` [B, L] holds and over the G discounts."""
    m = valid.bool().unsqueeze(-1)  # [B, L, 1]
    denom = valid.sum().clamp_min(1) * G

    def mean(x: torch.Tensor) -> torch.Tensor:
        return torch.where(m, x, x.new_zeros(())).sum() / denom

    return mean


def actor_loss(
    dist: Distribution,
    action: torch.Tensor,
    valid: torch.Tensor,
    *,
    q_all: torch.Tensor | None = None,
    q_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
    q_data: torch.Tensor | None = None,
    online_coeff: float = 1.0,
    offline_coeff: float = 0.1,
    bc_filter: Literal["binary", "exp"] = "binary",
    exp_beta: float = 1.0,
    exp_clip: float = 20.0,
    num_value_samples: int = 1,
    entropy_coeff: float = 0.0,
    online_reduce: Literal["mean", "min"] = "mean",
) -> tuple[torch.Tensor, Metrics]:
    """online · (−Q(s, a~π_g)) + offline · (−f(A) · log π_g(a_t|s_t)), per discount g, masked mean.

    dist: the actor's π(·|s_t), batch shape [B, L, G] (computed from the *non-detached* state, so the
        actor loss reaches the encoder through the actor head only).
    action [B, L, A] (or [B, L, G, A]): the batch's a_t as vectors; valid [B, L] bool: steps with an action.
    Critic values, PopArt-normalised, averaged over the ensemble, and never differentiated w.r.t. the critic:
      * discrete: `q_all` [B, L, C, G, A], Q of every action (the critic-loss forward's output may be
        reused; it is detached here). Both the online term Σ_a π(a) Q(s, a) and V(s) are exact sums.
      * continuous / multi-binary: `q_fn(a [..., B, L, G, A]) -> [..., B, L, C, G]`, normally
        `frozen_critic(critic, s)`. K = `num_value_samples` actions a_k ~ π (reparameterised, or
        straight-through for multi-binary) give the online term -mean_k Q(s, a_k), differentiated through
        the actions, and (detached) V(s) = mean_k Q(s, a_k). Cost: two critic calls, on K and on 1 action;
        one when `q_data` [B, L, C, G] (the critic loss's Q(s_t, a_t), detached here) is passed.
      * discrete with the action as critic input (`LossConfig.discrete_action_input`): `q_fn` and `q_data` as
        above, the K actions drawn straight through (one-hot values, Gumbel-softmax gradients); with `q_all` (the
        critic at every one-hot action, detached here) V(s) is the exact Σ_a π(a) Q(s, a), else mean_k Q(s, a_k).
    A = Q(s, a_t) - V(s) per discount; `advantage_filter(A, bc_filter, exp_beta, exp_clip)` weights the BC term.
    """
    G = dist.batch_shape[-1]
    action = _per_discount(dist, action)  # [B, L, G, A]
    need_bc = offline_coeff != 0
    if isinstance(dist, Categorical) and q_fn is None:  # the critic outputs Q for every action
        online, v, q_data = _discrete_terms(dist, action, q_all, online_reduce)
    else:
        online, v, q_data = _sampled_terms(
            dist, action, q_fn, num_value_samples, online_coeff != 0, need_bc, q_data_all=q_data, q_all=q_all,
            online_reduce=online_reduce,
        )
    adv = q_data - v  # [B, L, G]
    weight = advantage_filter(adv, bc_filter, exp_beta, exp_clip)
    logp = dist.log_prob(action) if need_bc else torch.zeros_like(adv)  # [B, L, G]
    bc = -weight * logp  # the filtered BC term
    per_step = online_coeff * online + offline_coeff * bc  # [B, L, G]
    entropy = dist.entropy()  # [B, L, G]
    if entropy_coeff:
        per_step = per_step - entropy_coeff * entropy

    masked_mean = _masked_mean(valid, G)
    loss = masked_mean(per_step)
    with torch.no_grad():
        terms = {"actor_online": online, "actor_bc": bc, "bc_weight": weight, "advantage": adv, "logp_data": logp,
                 "entropy": entropy}
        metrics = {"actor_loss": loss.detach(), **{k: masked_mean(x.detach()) for k, x in terms.items()}}
    return loss, metrics
