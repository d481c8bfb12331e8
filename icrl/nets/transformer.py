"""The stabilised causal Transformer trajectory encoder of AMAGO (docs/design.md §3), nanoGPT-style.

Read top to bottom: `SigmaReparamLinear` -> `CausalSelfAttention` -> `MLP` -> `Block` -> `KVCache` ->
`TransformerTrajEncoder` (the positions, `TimeEmbedding` and `Rotary`, live in `icrl.nets.positions`).
Training and acting run the same layers: each has one `forward`, and attention takes an optional
`LayerCache` (the layer's K/V ring while acting) and, with RoPE, the positions' `Rotation`.

Why these pieces: off-policy actor-critic RL drives attention towards low-entropy "recall one exact
step" patterns, which makes plain Transformers collapse (attention logits and activations blow up).
AMAGO keeps them stable with
  * pre-norm blocks plus the two extra NormFormer LayerNorms (after the attention output, before the
    residual add; after the MLP's first activation),
  * σReparam linear layers, W_hat = gamma / sigma(W) * W, which bound every layer's spectral norm by a
    learnable scalar (so attention entropy cannot collapse through large logits),
  * Leaky ReLU MLPs (no dead units when values are sparse and rewards rare).

Position information comes only from the rollout's `time` input (not from the index in the window),
so a window that starts mid-rollout and the acting-time KV ring buffer see the same positions: added to
the input once (learned / sinusoidal), or rotating every layer's queries and keys (RoPE; the acting step
rotates a key by its time before writing it into the ring).
Attention is causal and limited to the last `context_len` (W) positions. The full forward pass over a
sequence longer than W uses a banded mask, so it computes exactly what step-by-step acting computes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from icrl.nets.positions import PosEmb, Rotary, Rotation, TimeEmbedding, rotate_qk


class SigmaReparamLinear(nn.Module):
    """Linear layer with spectral reparameterisation (Zhai et al. 2023): W_hat = gamma / sigma(W) * W.

    sigma(W) = u^T W v is the power-iteration estimate of W's largest singular value; u and v are
    buffers refined by one power-iteration step per training forward (cheap, and W changes slowly
    between steps). In eval mode u, v are frozen, so outputs are deterministic. Initialisation follows
    the official release: small truncated-normal weights and exact singular vectors from an SVD, so
    sigma is exact at step 0 and every layer starts with spectral norm gamma = 1.

    Acting (eval mode with gradients off) multiplies by a snapshot of W_hat, taken at its first call and
    kept until `refresh_acting_weight()` (recomputing it costs about a tenth of an acting step). Whoever
    changes weight, gamma, u or v (a learner update: power iteration and optimiser step; loading weights;
    manual edits) refreshes: `Agent.refresh_acting_weights()`, or `refresh_acting_weights(module)`.
    A refresh only marks the snapshot stale; the next acting call recomputes it *in place*, so the snapshot
    keeps its memory and a captured acting step (a CUDA graph, `icrl.agent.graphs`) reads the new weights.
    Moving the layer (`.to()`, `.double()`) drops the snapshot, as it replaces the tensors behind it.
    """

    u: torch.Tensor  # buffers, registered in __init__
    v: torch.Tensor

    def __init__(self, d_in: int, d_out: int, bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_out, d_in))
        nn.init.trunc_normal_(self.weight, std=0.02)
        self.bias = nn.Parameter(torch.zeros(d_out)) if bias else None
        self.gamma = nn.Parameter(torch.ones(1))
        U, _, Vh = torch.linalg.svd(self.weight.detach(), full_matrices=False)
        self.register_buffer("u", U[:, 0].clone())  # [d_out] left singular vector estimate
        self.register_buffer("v", Vh[0].clone())  # [d_in] right singular vector estimate
        self._acting_weight: torch.Tensor | None = None  # [d_out, d_in] W_hat snapshot; not in the state dict
        self._acting_stale = True  # the snapshot no longer holds the current W_hat

    @torch.no_grad()
    def power_iteration(self) -> None:
        """One step of u <- normalise(W v), v <- normalise(W^T u), in place (DDP keeps syncing them)."""
        w = self.weight.float()
        self.u.copy_(F.normalize(w @ self.v.float(), dim=0))
        self.v.copy_(F.normalize(w.T @ self.u.float(), dim=0))

    def sigma(self) -> torch.Tensor:
        """Spectral-norm estimate u^T W v; differentiable in W (d sigma / dW = u v^T).

        mv / dot (not `@`) keep it in float32 under autocast, which would run matmul in bf16."""
        u, v = self.u, self.v
        if torch.is_grad_enabled():
            # the buffers are updated in place by later training forwards, and autograd must keep the
            # values this forward used (several forwards may share one backward)
            u, v = u.clone(), v.clone()
        return torch.dot(u, torch.mv(self.weight, v))

    def effective_weight(self) -> torch.Tensor:
        return self.weight * (self.gamma / self.sigma())  # [d_out, d_in]

    def refresh_acting_weight(self) -> None:
        """Mark the acting snapshot of W_hat stale; the next acting call recomputes it from the current weights."""
        self._acting_stale = True

    def acting_weight(self) -> torch.Tensor:
        """W_hat for gradient-free use: the snapshot, brought up to date (in place) if it is stale."""
        if self._acting_stale or self._acting_weight is None:
            # a normal tensor even under inference_mode, so later no_grad uses outside it stay legal
            with torch.inference_mode(False), torch.no_grad():
                w = self.effective_weight()
                if self._acting_weight is None:
                    self._acting_weight = w
                else:
                    self._acting_weight.copy_(w)
            self._acting_stale = False
        return self._acting_weight

    def _apply(self, fn, recurse: bool = True):  # noqa: ANN001, ANN202 - nn.Module's signature
        self._acting_weight = None  # `.to()` / `.double()` replace the tensors behind it
        return super()._apply(fn, recurse)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.power_iteration()
        elif not torch.is_grad_enabled():  # acting: u, v frozen, the W_hat snapshot
            return F.linear(x, self.acting_weight(), self.bias)
        if x.numel() <= self.weight.shape[1] ** 2:
            # few rows: rescaling the [rows, d_out] output is cheaper than the [d_out, d_in] weight
            y = F.linear(x, self.weight) * (self.gamma / self.sigma())
            return y if self.bias is None else y + self.bias
        return F.linear(x, self.effective_weight(), self.bias)

    def extra_repr(self) -> str:
        return f"d_in={self.weight.shape[1]}, d_out={self.weight.shape[0]}, bias={self.bias is not None}"


def refresh_acting_weights(module: nn.Module) -> None:
    """Refresh every σReparam acting snapshot in `module` (see `SigmaReparamLinear`): acting then sees the
    current weights."""
    for m in module.modules():
        if isinstance(m, SigmaReparamLinear):
            m.refresh_acting_weight()


def make_linear(d_in: int, d_out: int, sigma_reparam: bool, bias: bool = True) -> nn.Module:
    return SigmaReparamLinear(d_in, d_out, bias) if sigma_reparam else nn.Linear(d_in, d_out, bias)


def banded_causal_mask(length: int, window: int, device: torch.device) -> torch.Tensor:
    """[L, L] bool, True where query i may attend to key j: i - window < j <= i."""
    i = torch.arange(length, device=device)[:, None]
    j = torch.arange(length, device=device)[None, :]
    return (j <= i) & (j > i - window)


def _dropout(drop: nn.Dropout, x: torch.Tensor) -> torch.Tensor:
    """`drop(x)`, skipped in eval mode, where it is the identity: acting calls it once per layer and step."""
    return drop(x) if drop.training else x


class LayerCache(NamedTuple):
    """One layer's share of an acting step: its K/V ring and where this step's keys and values go."""

    kv: torch.Tensor  # [2, B, H, W, dh] this layer's keys (0) and values (1), written in place
    write_idx: torch.Tensor  # [B, 2, H] long: rows of kv.view(-1, dh) at this step's slot
    bias: torch.Tensor  # [B*H, 1, n] additive mask (0 or -inf) over the first n slots


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention over the last `window` positions.

    One projection and one output path for training and acting; only the attention kernel differs:
    SDPA over the whole sequence (flash / memory-efficient kernels), or one query against the layer's
    K/V ring while acting.
    """

    def __init__(self, d_model: int, heads: int, window: int, attn_dropout: float, sigma_reparam: bool):
        super().__init__()
        assert d_model % heads == 0, "d_model must be divisible by heads"
        self.heads, self.head_dim, self.window = heads, d_model // heads, window
        self.qkv = make_linear(d_model, 3 * d_model, sigma_reparam, bias=False)
        self.proj = make_linear(d_model, d_model, sigma_reparam)
        self.attn_dropout = attn_dropout

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        cache: LayerCache | None = None,
        rot: Rotation | None = None,
    ) -> torch.Tensor:
        """x [B, L, d] -> [B, L, d].

        Training (`cache` None): attend within x; `mask` is None (plain causal, L <= window) or the [L, L]
        banded mask. Acting (`cache` given, L == 1): attend over the ring's slots, this step's included.
        `rot` (RoPE): x's positions; queries and keys are rotated by them first (so acting writes rotated keys).
        """
        B, L, d = x.shape
        qkv = self.qkv(x).view(B, L, 3, self.heads, self.head_dim)  # [B, L, 3, H, dh]
        if rot is not None:
            qkv = rotate_qk(qkv, rot)
        y = self._attend_sequence(qkv, mask) if cache is None else self._attend_ring(qkv[:, 0], cache)
        return self.proj(y.reshape(B, L, d))  # [B, L, d]

    def _attend_sequence(self, qkv: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """qkv [B, L, 3, H, dh] -> [B, L, H, dh]."""
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each [B, H, L, dh]
        p = self.attn_dropout if self.training else 0.0
        if q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16):
            # torch's CPU flash kernel is slower in bf16 than in fp32 at RL head widths (fwd + bwd, B24 x H4,
            # torch 2.13, AMX CPU: dh 16 x L 501 126 vs 74 ms, dh 32 x L 256 68 vs 51 ms): attend in fp32
            with torch.autocast("cpu", enabled=False):
                return self._sdpa(q.float(), k.float(), v.float(), mask, p).to(q.dtype).transpose(1, 2)
        return self._sdpa(q, k, v, mask, p).transpose(1, 2)  # [B, L, H, dh]

    def _sdpa(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
              p: float) -> torch.Tensor:
        """Attention of q, k, v [B, H, L, dh]: causal, or within the window where `mask` (banded) is given.

        A training window is the context plus one step (`ModelConfig.training_window`), so L = W + 1 is the
        common banded case: its first W queries are plainly causal, and only the rest need the band. Split so,
        every query block runs a maskless kernel (flash on a GPU) where a mask would force a slower one, and
        the last query (L = W + 1) attends over the last W keys, all of them; the same values up to rounding.
        """
        W, L = self.window, q.shape[-2]
        if mask is None:  # is_causal lets SDPA pick its fast (flash / memory-efficient) kernels
            return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        if L > 2 * W:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        head = F.scaled_dot_product_attention(q[:, :, :W], k[:, :, :W], v[:, :, :W], dropout_p=p, is_causal=True)
        tail_mask = None if L == W + 1 else mask[W:, 1:]  # query W + r: keys r + 1 .. W + r
        tail = F.scaled_dot_product_attention(q[:, :, W:], k[:, :, 1:], v[:, :, 1:], attn_mask=tail_mask, dropout_p=p)
        return torch.cat([head, tail], dim=2)

    def _attend_ring(self, qkv: torch.Tensor, cache: LayerCache) -> torch.Tensor:
        """qkv [B, 3, H, dh] of one new position per row: write its k, v into the ring, attend over the
        first n slots -> [B*H, 1, dh]. The order of keys in the ring does not matter (attention is
        permutation invariant over keys; positions enter through the time embedding, or are already rotated
        into the keys), so slot = count % W.
        A query of length 1 makes attention two batched mat-vecs; written out (one write, baddbmm,
        softmax, bmm) it is much faster than SDPA's CPU kernels, which are tuned for long queries.
        """
        kv, B, H, dh = cache.kv, qkv.shape[0], self.heads, self.head_dim
        W, n = kv.shape[3], cache.bias.shape[-1]
        new = qkv[:, 1:]  # [B, 2, H, dh]
        if new.dtype != kv.dtype:  # autocast ran the projection in bf16
            new = new.to(kv.dtype)
        kv.view(-1, dh).index_put_((cache.write_idx,), new)
        q = qkv[:, 0].reshape(B * H, 1, dh)
        keys = kv[0].view(B * H, W, dh)[:, :n]  # views, no copy
        values = kv[1].view(B * H, W, dh)[:, :n]
        scores = torch.baddbmm(cache.bias, q, keys.transpose(1, 2), alpha=dh**-0.5)  # [B*H, 1, n]
        probs = scores.softmax(-1)
        if self.training and self.attn_dropout > 0:
            probs = F.dropout(probs, self.attn_dropout)
        return torch.bmm(probs, values)  # [B*H, 1, dh]


class MLP(nn.Module):
    """fc -> Leaky ReLU -> (NormFormer LayerNorm) -> fc."""

    def __init__(self, d_model: int, d_ff: int, sigma_reparam: bool, normformer: bool):
        super().__init__()
        self.fc = make_linear(d_model, d_ff, sigma_reparam)
        self.norm = nn.LayerNorm(d_ff) if normformer else nn.Identity()
        self.proj = make_linear(d_ff, d_model, sigma_reparam)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, L, d] -> [B, L, d]
        return self.proj(self.norm(F.leaky_relu(self.fc(x))))


class Block(nn.Module):
    """Pre-norm Transformer block with NormFormer's extra norm after attention (before the residual add)."""

    def __init__(self, d_model: int, heads: int, d_ff: int, window: int, attn_dropout: float,
                 resid_dropout: float, sigma_reparam: bool, normformer: bool):  # fmt: skip
        super().__init__()
        self.ln_attn = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, heads, window, attn_dropout, sigma_reparam)
        self.ln_attn_out = nn.LayerNorm(d_model) if normformer else nn.Identity()
        self.ln_mlp = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, d_ff, sigma_reparam, normformer)
        self.drop = nn.Dropout(resid_dropout)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        cache: LayerCache | None = None,
        rot: Rotation | None = None,
    ) -> torch.Tensor:
        """x [B, L, d] -> [B, L, d]; `mask`, `cache` and `rot` as in `CausalSelfAttention.forward`."""
        x = x + _dropout(self.drop, self.ln_attn_out(self.attn(self.ln_attn(x), mask, cache, rot)))
        return x + _dropout(self.drop, self.mlp(self.ln_mlp(x)))


@dataclass
class KVCache:
    """Acting-time memory of `TransformerTrajEncoder`: per-layer K/V ring buffers over the last W steps.

    Row b of the batch has written `count[b]` timesteps since its last reset; its occupied slots are
    0 .. min(count[b], W) - 1 and the next step goes to slot count[b] % W. Rows advance and reset
    independently. Two ways to keep the books, with the same results:
      * host (default): `count` is a CPU tensor whatever the cache's device, so no step waits on the device, and
        a step attends over min(max(count) + 1, W) slots (early in a rollout fewer than W: cheaper on a CPU);
      * `static`: `count` lives on the cache's device and every step attends over all W slots (empty ones
        masked), so a step has fixed shapes and reads nothing back to the host: it can be captured as a CUDA
        graph (`icrl.agent.graphs`), where W slots cost no more than fewer.
    """

    kv: torch.Tensor  # [layers, 2, B, H, W, dh]: keys (index 0) and values (1), one tensor per layer
    count: torch.Tensor  # [B] long, on the CPU (host books) or on kv's device (static)
    write_base: np.ndarray  # [B, 2, H] int64: row of (b, k|v, h, slot 0) in one layer's kv.view(-1, dh)
    zero_bias: torch.Tensor  # [B*H, 1, W] zeros: the attention mask when no slot needs masking
    static: bool = False
    write_base_t: torch.Tensor | None = None  # [B, 2, H] long on kv's device (static books)

    def reset(self, mask: torch.Tensor | np.ndarray) -> None:
        """Empty the rows where `mask` [B] is True. Stale K/V stay but are never attended to again."""
        if self.static:
            self.count.masked_fill_(torch.as_tensor(mask, device=self.count.device).bool(), 0)
            return
        if isinstance(mask, torch.Tensor):
            mask = mask.detach().cpu().numpy()
        count = self.count.numpy()  # shares memory with self.count
        count[np.asarray(mask, dtype=bool)] = 0

    def take_step(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Count one more timestep per row and return where it goes: (write_idx [B, 2, H], bias [B*H, 1, n]).

        Host books: no mask at all (zeros) when every row attends over the same number of slots (all windows
        full, or rows in step); otherwise each row's empty (or stale) slots get -inf. Static books: n = W, the
        mask built on the device.
        """
        if self.static:
            return self._take_step_static()
        H, W, kv = self.kv.shape[3], self.kv.shape[4], self.kv
        count = self.count.numpy()  # shares memory with self.count
        n_valid = np.minimum(count + 1, W)  # [B] occupied slots after this write
        n = int(n_valid.max())
        idx = torch.from_numpy(self.write_base + (count % W)[:, None, None])  # [B, 2, H]
        if n_valid.min() == n:
            bias = self.zero_bias[:, :, :n]
        else:
            mask = np.where(np.arange(n) < n_valid[:, None], 0.0, -np.inf).astype(np.float32)  # [B, n]
            bias = torch.from_numpy(np.repeat(mask, H, axis=0)[:, None, :])  # [B*H, 1, n]
            bias = bias.to(kv.device, kv.dtype, non_blocking=True)
        if kv.device.type != "cpu":
            idx = idx.to(kv.device, non_blocking=True)
        count += 1
        return idx, bias

    def _take_step_static(self) -> tuple[torch.Tensor, torch.Tensor]:
        """`take_step` with the books on the device: fixed shapes, no host read."""
        B, H, W = self.kv.shape[2], self.kv.shape[3], self.kv.shape[4]
        assert self.write_base_t is not None
        idx = self.write_base_t + (self.count % W)[:, None, None]  # [B, 2, H]
        occupied = torch.arange(W, device=self.count.device) < (self.count + 1).clamp(max=W)[:, None]  # [B, W]
        bias = torch.where(occupied, self.zero_bias.new_zeros(()), self.zero_bias.new_full((), -torch.inf))
        self.count.add_(1)
        return idx, bias[:, None, None, :].expand(B, H, 1, W).reshape(B * H, 1, W)


class TransformerTrajEncoder(nn.Module):
    """Causal sliding-window Transformer over a rollout's timestep embeddings (docs/design.md §3).

    `forward(x [B, L, d_in], time [B, L]) -> [B, L, d_out]` trains every timestep in parallel.
    `init_state` / `reset_state` / `step` act one timestep at a time through the same layers, with a
    KV cache: O(W) per step.
    Widths and dropouts: `d_ff` is the MLP's hidden width (None: 4 * d_model); `dropout` acts on the
    residual branches, `attn_dropout` on the attention weights, `emb_dropout` on the input embedding.
    `pos_emb`: see `icrl.nets.positions` ("rope" rotates every layer's queries and keys by their time).
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
        self.rotary = Rotary(d_model // heads) if pos_emb == "rope" else None
        self.emb_drop = nn.Dropout(emb_dropout)
        d_ff = d_ff or 4 * d_model
        self.blocks = nn.ModuleList(
            Block(d_model, heads, d_ff, context_len, attn_dropout, dropout, sigma_reparam, normformer)
            for _ in range(layers)
        )
        self.ln_f = nn.LayerNorm(d_model)

    def _embed(self, x: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        """x [B, L, d_in], time [B, L] -> [B, L, d]."""
        h = self.inp(x)
        t = self.time_emb(time)
        return _dropout(self.emb_drop, h if t is None else h + t)

    def forward(self, x: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        """x [B, L, d_in], time [B, L] long -> [B, L, d_out]."""
        L = x.shape[1]
        # Within the window plain causal attention is exact; past it the banded mask reproduces the
        # sliding window that acting sees.
        mask = None if L <= self.context_len else banded_causal_mask(L, self.context_len, x.device)
        h = self._embed(x, time)  # [B, L, d]
        rot = self._rotation(time)
        for block in self.blocks:
            h = block(h, mask, rot=rot)
        return self.ln_f(h)

    def _rotation(self, time: torch.Tensor) -> Rotation | None:
        """RoPE's rotation of time [B, L], computed once for every layer (None without RoPE)."""
        return None if self.rotary is None else self.rotary(time)

    def init_state(self, batch_size: int, device: torch.device | str, static: bool = False) -> KVCache:
        """An empty cache for `batch_size` parallel rollouts, allocated once and written in place. `static`:
        the books on the device and fixed shapes (`KVCache`), for a captured acting step."""
        p = self.inp.weight
        B, H, W, L = batch_size, self.heads, self.context_len, self.n_layers
        b, j, h = np.ogrid[:B, :2, :H]
        write_base = ((j * B + b) * H + h).astype(np.int64) * W
        return KVCache(
            kv=torch.zeros((L, 2, B, H, W, self.d_model // H), device=device, dtype=p.dtype),
            count=torch.zeros(B, dtype=torch.long, device=device if static else "cpu"),
            write_base=write_base,
            zero_bias=torch.zeros((B * H, 1, W), device=device, dtype=p.dtype),
            static=static,
            write_base_t=torch.as_tensor(write_base, device=device) if static else None,
        )

    def reset_state(self, state: KVCache, mask: torch.Tensor | np.ndarray) -> KVCache:
        """Empty the rows where `mask` [B] is True (their envs start a new rollout)."""
        state.reset(mask)
        return state

    def step(self, x: torch.Tensor, time: torch.Tensor, state: KVCache) -> tuple[torch.Tensor, KVCache]:
        """`forward` for one new timestep per row: x [B, d_in], time [B] -> (out [B, d_out], state).

        Each layer attends over its ring of the last W keys and values instead of the sequence. Mutates
        `state` in place; run without grad.
        """
        write_idx, bias = state.take_step()
        h = self._embed(x[:, None], time[:, None])  # [B, 1, d]
        rot = self._rotation(time[:, None])
        for layer, block in enumerate(self.blocks):
            h = block(h, cache=LayerCache(state.kv[layer], write_idx, bias), rot=rot)
        return self.ln_f(h)[:, 0], state
