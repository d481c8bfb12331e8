"""Where a timestep sits in its rollout, as the Transformer sees it (`ModelConfig.pos_emb`).

Every choice reads the rollout's `time` input (the step index inside the rollout), never the index in the
training window or the slot of the acting KV ring, so a window that starts mid-rollout and the acting ring see
the same positions:
  * `TimeEmbedding` ("learned", "sinusoidal", "none"): a vector added to the timestep embedding once, before
    the first block.
  * `Rotary` ("rope", Su et al. 2021): nothing is added to the input; every layer rotates its queries and keys
    by their time before attending, so q_i . k_j depends on time_i - time_j only. The training forward rotates
    the whole sequence, the acting step rotates the new query and the new key by their time before the key is
    written into the ring, with the same element-wise operations: stepping equals the forward pass.
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import torch
from torch import nn

PosEmb = Literal["learned", "sinusoidal", "none", "rope"]


class TimeEmbedding(nn.Module):
    """Additive position embedding of the rollout time index: learned table (time clamped), sinusoidal, or none.

    "rope" adds nothing here (None, as "none"): its positions enter through `Rotary` inside attention."""

    freqs: torch.Tensor  # buffer, registered in __init__ for kind="sinusoidal"

    def __init__(self, kind: PosEmb, d_model: int, max_time: int):
        super().__init__()
        self.kind, self.max_time = kind, max_time
        if kind == "learned":
            self.table = nn.Embedding(max_time + 1, d_model)
            # N(0, 1) like torch's default (and the official AMAGO's table): at std 0.02 the positions were
            # ~30x smaller than the token embedding they are added to, and attention could barely use them.
            nn.init.normal_(self.table.weight, std=1.0)
        elif kind == "sinusoidal":
            assert d_model % 2 == 0, "sinusoidal time embedding needs an even d_model"
            freqs = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
            self.register_buffer("freqs", freqs, persistent=False)  # [d/2]
        elif kind not in ("none", "rope"):
            raise ValueError(f"pos_emb must be 'learned', 'sinusoidal', 'none' or 'rope', got {kind!r}")

    def forward(self, time: torch.Tensor) -> torch.Tensor | None:
        """time [...] long -> [..., d] (None for 'none' and 'rope')."""
        if self.kind == "learned":
            return self.table(time.clamp(0, self.max_time))
        if self.kind == "sinusoidal":
            angle = time.unsqueeze(-1).float() * self.freqs  # [..., d/2]
            return torch.cat([angle.sin(), angle.cos()], dim=-1)
        return None


class Rotation(NamedTuple):
    """cos and sin of every rotation angle, [B, L, 1, 1, dh/2] each (float32): broadcast over q|k and heads."""

    cos: torch.Tensor
    sin: torch.Tensor


class Rotary(nn.Module):
    """Rotary position embedding (RoPE) of the rollout time, half-split (Llama-style) like the official AMAGO's
    `RotaryPosEmb`: a head vector x = [x1, x2] (halves of dh/2) at time t becomes
    [x1 cos(t w) - x2 sin(t w), x1 sin(t w) + x2 cos(t w)], w_i = base^(-2i / dh).

    No parameters; the frequencies are a non-persistent buffer, so a "rope" model's state dict has the same
    keys as a "none" one. Angles and rotations are computed in float32 and cast back to q / k's dtype."""

    inv_freq: torch.Tensor  # buffer [dh/2]

    def __init__(self, head_dim: int, base: float = 10000.0):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head width (d_model / heads), got {head_dim}")
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2).float() / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, time: torch.Tensor) -> Rotation:
        """time [B, L] long -> the rotation of every position (computed once, shared by every layer)."""
        angle = time.float().unsqueeze(-1) * self.inv_freq  # [B, L, dh/2]
        angle = angle[:, :, None, None, :]  # [B, L, 1, 1, dh/2]
        return Rotation(angle.cos(), angle.sin())


def rotate_qk(qkv: torch.Tensor, rot: Rotation) -> torch.Tensor:
    """Rotate the queries and keys of packed qkv [B, L, 3, H, dh] by their positions; values unchanged."""
    qk = qkv[:, :, :2]  # [B, L, 2, H, dh]
    x1, x2 = qk.chunk(2, dim=-1)
    cos, sin = rot
    rotated = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(qkv.dtype)
    return torch.cat([rotated, qkv[:, :, 2:]], dim=2)
