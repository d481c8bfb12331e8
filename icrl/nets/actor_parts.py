"""The actor head's interchangeable parts (`icrl.nets.heads.Actor`): its trunk and its continuous policy.

* Trunk (`ModelConfig.actor_head`): "mlp", `heads.mlp` (the default, parameter names `net.0` ... `net.N`), or
  "residual", `ResidualTrunk`: the official AMAGO's `ResidualActor` (after BRO, Nauman et al. 2024).
* Continuous policy (`ModelConfig.continuous_dist`): `ContinuousOutput` says how many outputs per discount
  the last layer has and turns them into a `TanhGaussian`, `TanhGMM` or `ShiftedBeta` (icrl.nets.dists).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from icrl.nets.dists import ShiftedBeta, TanhGaussian, TanhGMM

LEAKY_SLOPE = 0.01  # every head's Leaky ReLU (actor and critic)

ContinuousDist = Literal["tanh_gaussian", "gmm", "beta"]
ActorTrunk = Literal["mlp", "residual"]

GMM_MIN_STD = 1e-4
"""A GMM component's smallest std (softplus(x) + GMM_MIN_STD, no upper bound), the official `GMM`'s."""
BETA_MIN_CONCENTRATION = 1.0001
"""alpha, beta = softplus(x) + BETA_MIN_CONCENTRATION (> 1: unimodal), the official `Beta`'s."""


class ResidualTrunk(nn.Module):
    """Linear -> Leaky ReLU -> Linear to a `hidden`-wide feature, then `blocks` residual blocks
    x + LN(W2 LeakyReLU(LN(W1 x))) (W1: hidden -> 2 hidden), then the output Linear (`out`).

    The official `ResidualActor` with `feature_dim` = `hidden` and `residual_ff_dim` = 2 x `hidden` (its
    defaults, 256 and 512, keep that ratio) and `residual_blocks` = `blocks`."""

    def __init__(self, d_in: int, d_out: int, hidden: int, blocks: int) -> None:
        super().__init__()
        self.inp = nn.Sequential(nn.Linear(d_in, hidden), nn.LeakyReLU(LEAKY_SLOPE), nn.Linear(hidden, hidden))
        self.blocks = nn.ModuleList(
            nn.Sequential(
                nn.Linear(hidden, 2 * hidden),
                nn.LayerNorm(2 * hidden),
                nn.LeakyReLU(LEAKY_SLOPE),
                nn.Linear(2 * hidden, hidden),
                nn.LayerNorm(hidden),
            )
            for _ in range(blocks)
        )
        self.out = nn.Linear(hidden, d_out)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The input of the output layer: [..., d_in] -> [..., hidden]."""
        x = self.inp(x)
        for block in self.blocks:
            x = x + block(x)
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.features(x))


@dataclass(frozen=True)
class ContinuousOutput:
    """The continuous policy's output layout (per discount) and its distribution.

    tanh_gaussian: [mean A | raw log-std A], log-std squashed smoothly into [min_log_std, max_log_std].
    gmm:           [means M*A | raw stds M*A | mixture logits M] (component-major, the official layout),
                   std = softplus(raw) + GMM_MIN_STD.
    beta:          [raw alpha A | raw beta A], concentration = softplus(raw) + BETA_MIN_CONCENTRATION.
    """

    kind: ContinuousDist = "tanh_gaussian"
    components: int = 5
    min_log_std: float = -5.0
    max_log_std: float = 2.0

    def width(self, action_dim: int) -> int:
        """Outputs per discount for `action_dim` action dims."""
        if self.kind == "gmm":
            return self.components * (2 * action_dim + 1)
        return 2 * action_dim

    def __call__(self, out: torch.Tensor) -> TanhGaussian | TanhGMM | ShiftedBeta:
        """The distribution of output values [..., width]."""
        if self.kind == "gmm":
            return self._gmm(out)
        first, second = out.chunk(2, dim=-1)  # [..., A] each
        if self.kind == "beta":
            return ShiftedBeta(
                F.softplus(first) + BETA_MIN_CONCENTRATION, F.softplus(second) + BETA_MIN_CONCENTRATION
            )
        if self.kind != "tanh_gaussian":
            raise ValueError(f"unknown continuous_dist {self.kind!r}; use 'tanh_gaussian', 'gmm' or 'beta'")
        # Smooth squashing into [min, max] keeps a gradient everywhere (a hard clamp would cut it).
        lo, hi = self.min_log_std, self.max_log_std
        log_std = lo + 0.5 * (hi - lo) * (torch.tanh(second) + 1.0)
        return TanhGaussian(first, log_std, lo, hi)

    def _gmm(self, out: torch.Tensor) -> TanhGMM:
        M = self.components
        A = (out.shape[-1] - M) // (2 * M)
        k = M * A
        means = out[..., :k].unflatten(-1, (M, A))  # [..., M, A]
        stds = F.softplus(out[..., k : 2 * k].unflatten(-1, (M, A))) + GMM_MIN_STD
        return TanhGMM(means, stds, out[..., 2 * k :])
