"""The learning update's math as plain functions (docs/design.md §4): TD targets, REDQ, critic and actor losses.

Everything works on all G discounts at once (last dimension G; the last discount is the policy's) and
on whole padded sequences [B, L]. No function here builds modules or owns state: the agent computes
the network outputs, these functions turn them into losses and return `(loss, metrics)`, where metrics
are detached 0-dim tensors (no host sync until the caller logs them).

Value spaces: critic outputs and the actor's Q are PopArt-normalised; TD targets are computed in
unnormalised space (`icrl.nets.popart.PopArt.denormalize` the target critic first, `normalize` y after).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import torch
from torch import nn
from torch.func import functional_call

from icrl.config.loss import DEFAULT_GAMMAS
from icrl.nets.dists import Categorical, Distribution, TanhGaussian

__all__ = [  # DEFAULT_GAMMAS is re-exported: the loss functions' callers often want the default discounts too
    "DEFAULT_GAMMAS", "Metrics", "actor_loss", "advantage_filter", "align_next", "critic_loss", "frozen_critic",
    "redq_members", "td_targets",
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


def redq_members(num_critics: int, subset: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """REDQ's random subset of `subset` of the `num_critics` target critics, drawn once per update on the
    CPU generator. The learner evaluates only these members and reduces over them (min or mean)."""
    return torch.randperm(num_critics, generator=generator)[:subset]


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
    err = torch.where(m, q_sa - y_norm.detach().unsqueeze(-2), q_sa.new_zeros(()))  # [B, L, C, G]
    n = valid.sum().clamp_min(1)
    loss = err.square().sum() / (n * C * G)
    with torch.no_grad():
        q_mean = torch.where(m, q_sa, q_sa.new_zeros(())).sum() / (n * C * G)
        y_mean = torch.where(m[..., 0, :], y_norm, y_norm.new_zeros(())).sum() / (n * G)
        abs_err = err.abs().sum() / (n * C * G)
    return loss, {"critic_loss": loss.detach(), "q_norm": q_mean, "y_norm": y_mean, "td_abs_err": abs_err}


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
    param = dist.mean if isinstance(dist, TanhGaussian) else dist.logits
    return action.to(param.dtype)


def _discrete_terms(dist: Categorical, action: torch.Tensor, q_all: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """(online, v, q_data) [B, L, G] of a discrete actor: exact sums over the actions of the ensemble-mean Q."""
    if q_all is None:
        raise ValueError("discrete actor_loss needs q_all [B, L, C, G, A]")
    q = q_all.detach().mean(-3)  # [B, L, G, A], ensemble mean
    q_pi = (dist.probs * q).sum(-1)  # [B, L, G]: exact E_{a~π} Q(s, a), differentiable in π
    return -q_pi, q_pi.detach(), (q * action).sum(-1)


def _sampled_terms(
    dist: Distribution,
    action: torch.Tensor,
    q_fn: Callable[[torch.Tensor], torch.Tensor] | None,
    num_value_samples: int,
    need_online: bool,
    need_bc: bool,
    q_data_all: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    """(online, v, q_data) [B, L, G] of a continuous / multi-binary actor. As in AMAGO: K actions a_k ~ π
    give both the online term -mean_k Q(s, a_k) (differentiated through a_k) and, detached, the value V(s)
    of the advantage; Q(s, a_t) is only evaluated when the BC term needs it, and not at all when the caller
    passes it (`q_data_all` [B, L, C, G], the critic loss's own Q(s_t, a_t): the same critic, state and
    action, so the same values)."""
    if q_fn is None:
        raise ValueError("continuous / multi-binary actor_loss needs q_fn (see frozen_critic)")
    a_pi = dist.rsample((num_value_samples,))  # [K, B, L, G, A]
    if need_online:
        q_pi = q_fn(a_pi).mean(-2)  # [K, B, L, G], ensemble mean
    else:
        with torch.no_grad():
            q_pi = q_fn(a_pi.detach()).mean(-2)
    v = q_pi.detach().mean(0)
    with torch.no_grad():  # the advantage is a fixed weight: no graph, no activations kept
        if not need_bc:
            q_data = v
        elif q_data_all is not None:
            q_data = q_data_all.detach().mean(-2)  # [B, L, G]
        else:
            q_data = q_fn(action).mean(-2)  # [B, L, G]
    return -q_pi.mean(0), v, q_data


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
    A = Q(s, a_t) - V(s) per discount; `advantage_filter(A, bc_filter, exp_beta, exp_clip)` weights
    the BC term.
    """
    G = dist.batch_shape[-1]
    action = _per_discount(dist, action)  # [B, L, G, A]
    need_bc = offline_coeff != 0
    if isinstance(dist, Categorical):
        online, v, q_data = _discrete_terms(dist, action, q_all)
    else:
        online, v, q_data = _sampled_terms(
            dist, action, q_fn, num_value_samples, online_coeff != 0, need_bc, q_data_all=q_data
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
