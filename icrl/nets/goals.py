"""Instruction embedding for goal-conditioned tasks (docs/design.md §7, docs/CONTRACTS.md).

The instruction arrives as k goal tokens per timestep, completed sub-goals zeroed in place. Token
embeddings plus a small GRU over the k slots give one vector per timestep that joins the timestep
encoder's input, so the same network can follow any instruction — including the hindsight ones the
relabeler writes. `view="current"` shows only the current sub-goal (the first non-zero token): the
paper's ablation where the agent cannot plan ahead along the instruction.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn


class GoalEmbedder(nn.Module):
    """goal tokens [B, L, k] long (0 = empty or completed slot) -> [B, L, d_out]."""

    def __init__(
        self, vocab: int, slots: int, d_out: int = 32, d_token: int = 32, view: Literal["full", "current"] = "full"
    ):
        super().__init__()
        if vocab < 1 or slots < 1:
            raise ValueError(f"a goal embedder needs vocab >= 1 and slots >= 1, got {vocab} and {slots}")
        if view not in ("full", "current"):
            raise ValueError(f"view must be 'full' or 'current', got {view!r}")
        self.vocab, self.slots, self.d_out, self.view = vocab, slots, d_out, view
        self.token = nn.Embedding(vocab + 1, d_token, padding_idx=0)  # token 0 embeds to zeros
        self.slot = nn.Parameter(torch.randn(slots, d_token) * 0.02)  # which slot a token sits in
        self.rnn = nn.GRU(d_token, d_out, batch_first=True)
        self.norm = nn.LayerNorm(d_out)

    @staticmethod
    def current_goal(goals: torch.Tensor) -> torch.Tensor:
        """[..., k] -> [..., 1]: the first non-zero token (0 when every slot is empty)."""
        first = (goals != 0).long().argmax(-1, keepdim=True)  # [..., 1] index of the first non-zero slot
        return goals.gather(-1, first)

    def forward(self, goals: torch.Tensor) -> torch.Tensor:
        B, L, k = goals.shape
        if k != self.slots:
            raise ValueError(f"expected {self.slots} goal slots, got {k}")
        goals = goals.long().clamp(0, self.vocab)  # out-of-range tokens would index past the table
        if self.view == "current":
            x = self.token(self.current_goal(goals))  # [B, L, 1, d_token]
        else:
            x = self.token(goals) + self.slot * (goals != 0).unsqueeze(-1)  # [B, L, k, d_token]
        _, h = self.rnn(x.reshape(B * L, x.shape[2], -1))  # h [1, B*L, d_out]
        return self.norm(h[-1]).view(B, L, self.d_out)
