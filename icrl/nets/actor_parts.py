"""The actor head's interchangeable trunk (`icrl.nets.heads.Actor`, `ModelConfig.actor_head`): "mlp",
`heads.mlp` (the default, parameter names `net.0` ... `net.N`), or "residual", `ResidualTrunk`: the official
AMAGO's `ResidualActor` (after BRO, Nauman et al. 2024). Its continuous policy (`ModelConfig.continuous_dist`)
is `icrl.nets.dists.ContinuousOutput`, beside the distributions it builds."""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

LEAKY_SLOPE = 0.01  # every head's Leaky ReLU (actor and critic)

ActorTrunk = Literal["mlp", "residual"]


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
