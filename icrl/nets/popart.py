"""PopArt value normalisation (docs/design.md §4).

PopArt (van Hasselt et al. 2016; Hessel et al. 2019) keeps running first and second moments μ_g, ν_g of
the TD targets of every discount and trains the critics on normalised targets (y - μ) / σ. Discounts
from 0.1 to 0.999 give returns on scales that differ by orders of magnitude; normalising them lets one
learning rate and one loss weight serve all G outputs. Whenever the statistics move, the critic's output
layer is rescaled so that its *unnormalised* predictions σ q + μ stay exactly what they were
("Preserving Outputs Precisely").

The moments are bias-corrected EMAs (the PopArt paper's adaptive step β_t = β / (1 - (1 - β)^t), as in
the official AMAGO code): the first update sets them to the first batch's moments, and until ~1/β
updates they are the plain average of every batch so far. An uncorrected EMA started at ν = 1 keeps
σ near 1 for thousands of updates, so that a short discount's targets (returns of size ~r) reach the
critic shrunk by 1/σ_true — 30-45x on T-Maze and POPGym, where that alone kept RepeatPrevious at chance.

Optionally (`max_ratio`, off by default) the scale has a floor, σ ≥ D / `max_ratio`, where D is a bias-corrected
EMA (same β) of each batch's largest |y - μ|: no target sits more than `max_ratio` scale units from the mean.
The standard deviation alone is set by the common targets; when the informative ones are rare (a sparse
reward, a long corridor), it puts them tens of units away, and the critic's output layer needs thousands of
Adam steps just to reach them. Measured on Passive T-Maze 500 at 700 updates: σ = 0.08 against junction
targets of 0 or 10 (reward scale 10), normalised targets of ~60-125, and Q(junction) still at 0.2
(unnormalised) where the targets averaged 5; with the floor at 5 it was fitted by 1,434 updates. Dense
targets, whose batch maximum lies a few σ from the mean, never reach the floor; but it slowed T-Maze 100
(80,800 env steps to solve instead of 68,680, two seeds), so it is not the default (docs/results.md, "What
bounds T-Maze 500").
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from icrl.nets.heads import Critic


class PopArt(nn.Module):
    """Running per-discount statistics of the TD targets, and output-preserving critic rescaling.

    Buffers `mu` and `nu` ([G], first and second moment) are part of the state dict. With
    `enabled=False` every method is the identity (plain, unnormalised critics).

    Use, once per update:
        y = td_targets(..., next_value=popart.denormalize(q_next_norm), ...)   # unnormalised
        loss on (q_norm, popart.normalize(y))    ... backward, optimiser step ...
        popart.update_(y, valid, [critic, target_critic])                     # after the step
    Updating after the optimiser step keeps the forward pass, the loss and the stats consistent;
    the new statistics take effect from the next batch.
    """

    mu: torch.Tensor  # buffers, registered in __init__
    nu: torch.Tensor
    max_dev: torch.Tensor | None  # a buffer only with the floor, so default state dicts are as before it
    count: torch.Tensor

    def __init__(
        self,
        num_gammas: int,
        beta: float = 5e-4,
        min_std: float = 1e-2,
        max_std: float = 1e6,
        enabled: bool = True,
        max_ratio: float | None = None,
    ) -> None:
        super().__init__()
        self.beta, self.min_std, self.max_std, self.enabled = beta, min_std, max_std, enabled
        self.max_ratio = max_ratio  # None: no floor (the plain standard deviation)
        self.register_buffer("mu", torch.zeros(num_gammas))
        self.register_buffer("nu", torch.ones(num_gammas))
        if max_ratio is not None:
            self.register_buffer("max_dev", torch.zeros(num_gammas))  # EMA of the batch's largest |y - μ|
        else:
            self.max_dev = None
        self.register_buffer("count", torch.zeros((), dtype=torch.long))  # updates folded in so far

    @property
    def sigma(self) -> torch.Tensor:
        std = (self.nu - self.mu.square()).clamp_min(0.0).sqrt()
        if self.max_ratio is not None and self.max_dev is not None:
            std = torch.maximum(std, self.max_dev / self.max_ratio)
        return std.clamp(self.min_std, self.max_std)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        # Weights saved without the floor have no max_dev: zero, i.e. no floor until the next update.
        if self.max_dev is not None:
            state_dict.setdefault(prefix + "max_dev", torch.zeros_like(self.max_dev))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def normalize(self, y: torch.Tensor) -> torch.Tensor:
        """Unnormalised values [..., G] -> normalised (y - μ) / σ."""
        if not self.enabled:
            return y
        return (y - self.mu) / self.sigma

    def denormalize(self, q: torch.Tensor) -> torch.Tensor:
        """Normalised critic outputs [..., G] -> unnormalised σ q + μ."""
        if not self.enabled:
            return q
        return q * self.sigma + self.mu

    def denormalize_per_action(self, q: torch.Tensor) -> torch.Tensor:
        """A discrete critic's normalised outputs [..., G, A] (one per action) -> unnormalised, per discount."""
        return self.denormalize(q.transpose(-1, -2)).transpose(-1, -2)

    @torch.no_grad()
    def update_(
        self,
        targets: torch.Tensor,
        mask: torch.Tensor,
        critics: Critic | Iterable[Critic] | None = None,
        apply: torch.Tensor | None = None,
    ) -> None:
        """Move μ, ν toward the masked batch moments of `targets` [B, L, G]; rescale `critics` to match.

        `mask` [B, L] selects the real TD transitions. Pass every critic whose outputs are read through
        these statistics — the online critic and its EMA target — so all keep their unnormalised outputs.
        Each critic must provide `rescale_output_(scale [G], shift [G])` (see `icrl.nets.heads.Critic`).
        `apply` (a 0-dim bool tensor): where False, nothing changes, decided on the device (a skipped update,
        whose targets may not even be finite).
        """
        if not self.enabled:
            return
        w = mask.reshape(-1, 1).float()  # [B*L, 1]
        y = targets.reshape(w.shape[0], -1).float()  # [B*L, G]
        y = torch.where(w > 0, y, torch.zeros_like(y))  # padding may hold anything, even NaN
        count = w.sum()
        if apply is not None:  # a skipped update counts as an empty batch, and its targets are never read
            count = torch.where(apply, count, torch.zeros_like(count))
            y = torch.where(apply, y, torch.zeros_like(y))
        batch_mean = (y * w).sum(0) / count.clamp_min(1)  # [G]
        batch_sq = (y.square() * w).sum(0) / count.clamp_min(1)  # [G]
        # An empty batch leaves the statistics alone; tensor arithmetic avoids host syncs on `count`.
        nonempty = (count > 0).to(self.count)
        self.count.add_(nonempty)
        t = self.count.double().clamp_min(1.0)  # float64: β_1 must be exactly 1
        beta = (nonempty.double() * self.beta / (1.0 - (1.0 - self.beta) ** t)).to(self.mu)  # bias-corrected β_t
        first = (self.count == 1) & (nonempty > 0)  # this update initialises the moments
        mu_old, sigma_old = self.mu.clone(), self.sigma
        self.mu.lerp_(batch_mean.to(self.mu), beta)
        self.nu.lerp_(batch_sq.to(self.nu), beta)
        if self.max_dev is not None:
            dev = torch.where(w > 0, (y - self.mu).abs(), torch.zeros_like(y)).amax(0)  # [G]
            self.max_dev.lerp_(dev.to(self.max_dev), beta)
        sigma_new = self.sigma
        if critics is None:
            return
        # The first update replaces the arbitrary initial (μ, σ) = (0, 1) by the data's moments. There is
        # nothing to preserve then (the critics are still random): rescaling their output layers by
        # 1 / σ_1 would blow a short discount's random outputs up by orders of magnitude. Keeping the
        # normalised outputs instead starts every critic at the scale of its own targets.
        sigma_old = torch.where(first, sigma_new, sigma_old)
        mu_old = torch.where(first, self.mu, mu_old)
        if isinstance(critics, nn.Module):
            critics = [critics]
        scale = sigma_old / sigma_new  # [G]
        shift = (mu_old - self.mu) / sigma_new  # [G]
        for critic in critics:
            critic.rescale_output_(scale, shift)
