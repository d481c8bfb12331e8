"""Symmetric log squashing (Dreamer-V3): `symlog` keeps values of any scale in a range a network tolerates,
`symexp` inverts it. The timestep encoder squashes the previous reward with it (icrl.nets.tstep), the two-hot
critic spaces its value bins with it (icrl.agent.losses.ValueBins).
"""

from __future__ import annotations

import torch


def symlog(x: torch.Tensor) -> torch.Tensor:
    """sign(x) log(1 + |x|): keeps rewards of any scale in a range an MLP input tolerates."""
    return torch.sign(x) * torch.log1p(x.abs())


def symexp(x: torch.Tensor) -> torch.Tensor:
    """The inverse of `symlog`: sign(x) (exp(|x|) - 1)."""
    return torch.sign(x) * torch.expm1(x.abs())
