"""The stabilised causal Transformer trajectory encoder of AMAGO (DESIGN §3), nanoGPT-style.

Read top to bottom: `SigmaReparamLinear` -> `CausalSelfAttention` -> `MLP` -> `Block` ->
`TimeEmbedding` -> `KVCache` -> `TransformerTrajEncoder`.

Why these pieces: off-policy actor-critic RL drives attention towards low-entropy "recall one exact
step" patterns, which makes plain Transformers collapse (attention logits and activations blow up).
AMAGO keeps them stable with
  * pre-norm blocks plus the two extra NormFormer LayerNorms (after the attention output, before the
    residual add; after the MLP's first activation),
  * σReparam linear layers, W_hat = gamma / sigma(W) * W, which bound every layer's spectral norm by a
    learnable scalar (so attention entropy cannot collapse through large logits),
  * Leaky ReLU MLPs (no dead units when values are sparse and rewards rare).

Position information comes only from the rollout's `time` input (not from the index in the window),
so a window that starts mid-rollout and the acting-time KV ring buffer see the same positions.
Attention is causal and limited to the last `context_len` (W) positions. The full forward pass over a
sequence longer than W uses a banded mask, so it computes exactly what step-by-step acting computes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

PosEmb = Literal["learned", "sinusoidal", "none"]


class SigmaReparamLinear(nn.Module):
    """Linear layer with spectral reparameterisation (Zhai et al. 2023): W_hat = gamma / sigma(W) * W.

    sigma(W) = u^T W v is the power-iteration estimate of W's largest singular value; u and v are
    buffers refined by one power-iteration step per training forward (cheap, and W changes slowly
    between steps). In eval mode u, v are frozen, so outputs are deterministic. Initialisation follows
    the official release: small truncated-normal weights and exact singular vectors from an SVD, so
    sigma is exact at step 0 and every layer starts with spectral norm gamma = 1.
    """

    def __init__(self, d_in: int, d_out: int, bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_out, d_in))
        nn.init.trunc_normal_(self.weight, std=0.02)
        self.bias = nn.Parameter(torch.zeros(d_out)) if bias else None
        self.gamma = nn.Parameter(torch.ones(1))
        U, _, Vh = torch.linalg.svd(self.weight.detach(), full_matrices=False)
        self.register_buffer("u", U[:, 0].clone())  # [d_out] left singular vector estimate
        self.register_buffer("v", Vh[0].clone())  # [d_in] right singular vector estimate

    @torch.no_grad()
    def power_iteration(self) -> None:
        """One step of u <- normalise(W v), v <- normalise(W^T u), in place (DDP keeps syncing them)."""
        w = self.weight.float()
        self.u.copy_(F.normalize(w @ self.v.float(), dim=0))
        self.v.copy_(F.normalize(w.T @ self.u.float(), dim=0))

    def sigma(self) -> torch.Tensor:
        """Spectral-norm estimate u^T W v; differentiable in W (d sigma / dW = u v^T)."""
        u, v = self.u, self.v
        if torch.is_grad_enabled():
            # the buffers are updated in place by later training forwards, and autograd must keep the
            # values this forward used (several forwards may share one backward)
            u, v = u.clone(), v.clone()
        return u @ (self.weight @ v)

    def effective_weight(self) -> torch.Tensor:
        return self.weight * (self.gamma / self.sigma())  # [d_out, d_in]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.power_iteration()
        if x.numel() <= self.weight.shape[1] ** 2:
            # few rows (acting): rescaling the [rows, d_out] output is cheaper than the [d_out, d_in] weight
            y = F.linear(x, self.weight) * (self.gamma / self.sigma())
            return y if self.bias is None else y + self.bias
        return F.linear(x, self.effective_weight(), self.bias)

    def extra_repr(self) -> str:
        return f"d_in={self.weight.shape[1]}, d_out={self.weight.shape[0]}, bias={self.bias is not None}"


def make_linear(d_in: int, d_out: int, sigma_reparam: bool, bias: bool = True) -> nn.Module:
    return SigmaReparamLinear(d_in, d_out, bias) if sigma_reparam else nn.Linear(d_in, d_out, bias)


def banded_causal_mask(length: int, window: int, device: torch.device) -> torch.Tensor:
    """[L, L] bool, True where query i may attend to key j: i - window < j <= i."""
    i = torch.arange(length, device=device)[:, None]
    j = torch.arange(length, device=device)[None, :]
    return (j <= i) & (j > i - window)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention over the last `window` positions, all heads batched in SDPA."""

    def __init__(self, d_model: int, heads: int, window: int, attn_dropout: float, sigma_reparam: bool):
        super().__init__()
        assert d_model % heads == 0, "d_model must be divisible by heads"
        self.heads, self.head_dim, self.window = heads, d_model // heads, window
        self.qkv = make_linear(d_model, 3 * d_model, sigma_reparam, bias=False)
        self.proj = make_linear(d_model, d_model, sigma_reparam)
        self.attn_dropout = attn_dropout

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """x [B, L, d]; mask None (plain causal, L <= window) or the [L, L] banded mask."""
        B, L, d = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)  # [B, H, L, dh]
        p = self.attn_dropout if self.training else 0.0
        if mask is None:  # is_causal lets SDPA pick its fast (flash / memory-efficient) kernels
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        return self.proj(y.transpose(1, 2).reshape(B, L, d))  # [B, L, d]

    def step(
        self,
        x: torch.Tensor,  # [B, d]
        k_cache: torch.Tensor,  # [B, H, W, dh], written in place
        v_cache: torch.Tensor,  # [B, H, W, dh], written in place
        rows: torch.Tensor,  # [B] arange
        slot: torch.Tensor,  # [B] ring slot of this step
        valid: torch.Tensor,  # [B, n] bool: occupied slots among the first n
    ) -> torch.Tensor:
        """One new position per row: write its k, v into the ring, attend over the occupied slots.

        The order of keys in the ring does not matter (attention is permutation invariant over keys and
        positions enter through the time embedding), so slot = count % W is all the bookkeeping needed.
        """
        B, d = x.shape
        q, k, v = self.qkv(x).view(B, 3, self.heads, self.head_dim).unbind(1)  # [B, H, dh]
        k_cache[rows, :, slot] = k.to(k_cache.dtype)  # a no-op unless autocast runs the projection in bf16
        v_cache[rows, :, slot] = v.to(v_cache.dtype)
        n = valid.shape[1]
        p = self.attn_dropout if self.training else 0.0
        keys, values = k_cache[:, :, :n], v_cache[:, :, :n]  # [B, H, n, dh] views, no copy
        y = F.scaled_dot_product_attention(
            q[:, :, None], keys, values, attn_mask=valid[:, None, None, :], dropout_p=p
        )  # [B, H, 1, dh]
        return self.proj(y.reshape(B, d))


class MLP(nn.Module):
    """fc -> Leaky ReLU -> (NormFormer LayerNorm) -> fc."""

    def __init__(self, d_model: int, d_ff: int, sigma_reparam: bool, normformer: bool):
        super().__init__()
        self.fc = make_linear(d_model, d_ff, sigma_reparam)
        self.norm = nn.LayerNorm(d_ff) if normformer else nn.Identity()
        self.proj = make_linear(d_ff, d_model, sigma_reparam)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(F.leaky_relu(self.fc(x))))


class Block(nn.Module):
    """Pre-norm Transformer block with NormFormer's extra norm after attention (before the residual add)."""

    def __init__(
        self,
        d_model: int,
        heads: int,
        d_ff: int,
        window: int,
        attn_dropout: float,
        resid_dropout: float,
        sigma_reparam: bool,
        normformer: bool,
    ):
        super().__init__()
        self.ln_attn = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, heads, window, attn_dropout, sigma_reparam)
        self.ln_attn_out = nn.LayerNorm(d_model) if normformer else nn.Identity()
        self.ln_mlp = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, d_ff, sigma_reparam, normformer)
        self.drop = nn.Dropout(resid_dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:  # [B, L, d]
        x = x + self.drop(self.ln_attn_out(self.attn(self.ln_attn(x), mask)))
        return x + self.drop(self.mlp(self.ln_mlp(x)))

    def step(self, x: torch.Tensor, *cache_args: torch.Tensor) -> torch.Tensor:  # [B, d]
        x = x + self.drop(self.ln_attn_out(self.attn.step(self.ln_attn(x), *cache_args)))
        return x + self.drop(self.mlp(self.ln_mlp(x)))


class TimeEmbedding(nn.Module):
    """Position embedding of the rollout time index: learned table (time clamped), sinusoidal, or none."""

    def __init__(self, kind: PosEmb, d_model: int, max_time: int):
        super().__init__()
        self.kind, self.max_time = kind, max_time
        if kind == "learned":
            self.table = nn.Embedding(max_time + 1, d_model)
            nn.init.normal_(self.table.weight, std=0.02)
        elif kind == "sinusoidal":
            assert d_model % 2 == 0, "sinusoidal time embedding needs an even d_model"
            freqs = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
            self.register_buffer("freqs", freqs, persistent=False)  # [d/2]
        elif kind != "none":
            raise ValueError(f"pos_emb must be 'learned', 'sinusoidal' or 'none', got {kind!r}")

    def forward(self, time: torch.Tensor) -> torch.Tensor | None:
        """time [...] long -> [..., d] (None for 'none')."""
        if self.kind == "learned":
            return self.table(time.clamp(0, self.max_time))
        if self.kind == "sinusoidal":
            angle = time.unsqueeze(-1).float() * self.freqs  # [..., d/2]
            return torch.cat([angle.sin(), angle.cos()], dim=-1)
        return None


@dataclass
class KVCache:
    """Acting-time memory of `TransformerTrajEncoder`: per-layer K/V ring buffers over the last W steps.

    Row b of the batch has written `count[b]` timesteps since its last reset; its occupied slots are
    0 .. min(count[b], W) - 1 and the next step goes to slot count[b] % W. Rows advance and reset
    independently. `filled` is a host-side upper bound on occupied slots over all rows, so early steps
    attend over `filled` slots instead of W without a device sync.
    """

    k: torch.Tensor  # [layers, B, H, W, dh]
    v: torch.Tensor  # [layers, B, H, W, dh]
    count: torch.Tensor  # [B] long
    filled: int
    rows: torch.Tensor  # [B] arange, reused every step
    slots: torch.Tensor  # [W] arange, reused every step


class TransformerTrajEncoder(nn.Module):
    """Causal sliding-window Transformer over a rollout's timestep embeddings (DESIGN §3).

    `forward(x [B, L, d_in], time [B, L]) -> [B, L, d_out]` trains every timestep in parallel.
    `init_state` / `reset_state` / `step` act one timestep at a time with a KV cache, O(W) per step.
    Dropouts: `dropout` on the residual branches, `attn_dropout` on attention weights, `emb_dropout`
    on the input embedding.
    """

    def __init__(
        self,
        d_in: int,
        d_model: int = 128,
        layers: int = 2,
        heads: int = 4,
        context_len: int = 256,
        max_time: int = 1000,
        pos_emb: PosEmb = "learned",
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        emb_dropout: float = 0.0,
        d_ff: int | None = None,
        sigma_reparam: bool = True,
        normformer: bool = True,
    ):
        super().__init__()
        self.d_model, self.d_out, self.context_len = d_model, d_model, context_len
        self.heads, self.n_layers = heads, layers
        self.inp = nn.Linear(d_in, d_model)
        self.time_emb = TimeEmbedding(pos_emb, d_model, max_time)
        self.emb_drop = nn.Dropout(emb_dropout)
        d_ff = d_ff or 4 * d_model
        self.blocks = nn.ModuleList(
            Block(d_model, heads, d_ff, context_len, attn_dropout, dropout, sigma_reparam, normformer)
            for _ in range(layers)
        )
        self.ln_f = nn.LayerNorm(d_model)

    def _embed(self, x: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        t = self.time_emb(time)
        return self.emb_drop(h if t is None else h + t)

    def forward(self, x: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        """x [B, L, d_in], time [B, L] long -> [B, L, d_out]."""
        L = x.shape[1]
        # Within the window plain causal attention is exact; past it the banded mask reproduces the
        # sliding window that acting sees.
        mask = None if L <= self.context_len else banded_causal_mask(L, self.context_len, x.device)
        h = self._embed(x, time)  # [B, L, d]
        for block in self.blocks:
            h = block(h, mask)
        return self.ln_f(h)

    def init_state(self, batch_size: int, device: torch.device | str) -> KVCache:
        """An empty cache for `batch_size` parallel rollouts, allocated once and written in place."""
        p = self.inp.weight
        shape = (self.n_layers, batch_size, self.heads, self.context_len, self.d_model // self.heads)
        return KVCache(
            k=torch.zeros(shape, device=device, dtype=p.dtype),
            v=torch.zeros(shape, device=device, dtype=p.dtype),
            count=torch.zeros(batch_size, device=device, dtype=torch.long),
            filled=0,
            rows=torch.arange(batch_size, device=device),
            slots=torch.arange(self.context_len, device=device),
        )

    def reset_state(self, state: KVCache, mask: torch.Tensor | np.ndarray) -> KVCache:
        """Empty the rows where `mask` [B] is True (their envs start a new rollout). Stale K/V stay but
        are never attended to again."""
        mask = torch.as_tensor(mask, dtype=torch.bool, device=state.count.device)
        state.count.masked_fill_(mask, 0)
        if bool(mask.all()):
            state.filled = 0
        return state

    def step(self, x: torch.Tensor, time: torch.Tensor, state: KVCache) -> tuple[torch.Tensor, KVCache]:
        """x [B, d_in], time [B] -> (out [B, d_out], state). Mutates `state` in place; run under no_grad."""
        W = self.context_len
        slot = state.count % W  # [B]
        state.filled = min(state.filled + 1, W)
        n_valid = (state.count + 1).clamp_(max=W)  # [B] occupied slots after this write
        valid = state.slots[: state.filled] < n_valid[:, None]  # [B, filled]
        h = self._embed(x, time)  # [B, d]
        for layer, block in enumerate(self.blocks):
            h = block.step(h, state.k[layer], state.v[layer], state.rows, slot, valid)
        state.count += 1
        return self.ln_f(h), state
