"""Trajectory encoders: the causal sequence model between the timestep encoder and the heads (docs/design.md §3).

Every encoder has the same five members (the `TrajEncoder` protocol below), so the agent can swap a
Transformer for an RNN or for no memory at all (the control that shows a task needs memory):

    d_out                                   width of the output state
    forward(x [B, L, d_in], time [B, L])    -> [B, L, d_out], causal: output t sees inputs <= t only
    init_state(batch_size, device)          -> acting state for `batch_size` parallel rollouts
    reset_state(state, mask [B] bool)       -> state with the masked rows emptied (a hard reset / new task)
    step(x [B, d_in], time [B], state)      -> (out [B, d_out], state), one timestep per row

`step` over a rollout gives the same outputs as `forward` over it. Rows of a batch advance and reset
independently. Inner episode boundaries of a multi-episode rollout are *not* resets: remembering earlier
episodes is the point of meta-RL (docs/design.md §10). `time` is accepted by every encoder and ignored by those
that do not use it. Acting runs under `torch.no_grad()`; states may be updated in place.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn

from icrl.nets.transformer import TransformerTrajEncoder

if TYPE_CHECKING:
    from icrl.config.model import ModelConfig

TrajKind = Literal["transformer", "gru", "lstm", "ff"]


@runtime_checkable
class TrajEncoder(Protocol):
    """What the agent needs from a trajectory encoder (see the module docstring for the contract)."""

    d_out: int

    def forward(self, x: torch.Tensor, time: torch.Tensor) -> torch.Tensor: ...

    def init_state(self, batch_size: int, device: torch.device | str) -> Any: ...

    def reset_state(self, state: Any, mask: torch.Tensor | np.ndarray) -> Any: ...

    def step(self, x: torch.Tensor, time: torch.Tensor, state: Any) -> tuple[torch.Tensor, Any]: ...


def _row_mask(mask: torch.Tensor | np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(mask, dtype=torch.bool, device=device)


class RNNTrajEncoder(nn.Module):
    """nn.GRU / nn.LSTM over the timestep embeddings, with a LayerNorm on the output.

    The stepping state is the RNN hidden state ([layers, B, d] for a GRU, a pair of them for an LSTM);
    resetting a row zeroes it, which is exactly the zero initial state `forward` starts from.
    """

    def __init__(
        self, d_in: int, d_model: int = 128, layers: int = 1, dropout: float = 0.0, cell: str = "gru"
    ):
        super().__init__()
        rnn_cls = {"gru": nn.GRU, "lstm": nn.LSTM}[cell]
        self.rnn = rnn_cls(d_in, d_model, layers, batch_first=True, dropout=dropout if layers > 1 else 0.0)
        self.norm = nn.LayerNorm(d_model)
        self.d_out, self.layers, self.is_lstm = d_model, layers, cell == "lstm"

    def forward(self, x: torch.Tensor, time: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, L, d_in] -> [B, L, d_out]; `time` is unused (an RNN counts steps itself)."""
        out, _ = self.rnn(x)
        return self.norm(out)

    def init_state(self, batch_size: int, device: torch.device | str) -> Any:
        """Zero hidden state: [layers, B, d] (GRU) or a pair of them (LSTM)."""
        w = self.norm.weight
        h = torch.zeros(self.layers, batch_size, self.d_out, device=device, dtype=w.dtype)
        return (h, torch.zeros_like(h)) if self.is_lstm else h

    def reset_state(self, state: Any, mask: torch.Tensor | np.ndarray) -> Any:
        """Zero the hidden state of rows where `mask` [B] is True."""
        tensors = state if self.is_lstm else (state,)
        keep = ~_row_mask(mask, tensors[0].device)[None, :, None]  # [1, B, 1]
        new = tuple(h * keep for h in tensors)
        return new if self.is_lstm else new[0]

    def step(self, x: torch.Tensor, time: torch.Tensor | None, state: Any) -> tuple[torch.Tensor, Any]:
        """x [B, d_in] -> (out [B, d_out], new hidden state)."""
        out, state = self.rnn(x[:, None], state)  # [B, 1, d]
        return self.norm(out[:, 0]), state


class GRUTrajEncoder(RNNTrajEncoder):
    """`RNNTrajEncoder` with a GRU cell."""

    def __init__(self, d_in: int, d_model: int = 128, layers: int = 1, dropout: float = 0.0):
        super().__init__(d_in, d_model, layers, dropout, cell="gru")


class LSTMTrajEncoder(RNNTrajEncoder):
    """`RNNTrajEncoder` with an LSTM cell (state is the pair (h, c))."""

    def __init__(self, d_in: int, d_model: int = 128, layers: int = 1, dropout: float = 0.0):
        super().__init__(d_in, d_model, layers, dropout, cell="lstm")


class FFTrajEncoder(nn.Module):
    """Memoryless control: the same MLP on every timestep. Its state is None.

    Pairing it with a recurrent or attention encoder on a memory task shows whether the agent really
    uses its context.
    """

    def __init__(self, d_in: int, d_model: int = 128, layers: int = 2, dropout: float = 0.0):
        super().__init__()
        dims = [d_in] + [d_model] * layers
        mods: list[nn.Module] = []
        for a, b in zip(dims[:-1], dims[1:]):
            mods += [nn.Linear(a, b), nn.LayerNorm(b), nn.LeakyReLU(), nn.Dropout(dropout)]
        self.net = nn.Sequential(*mods[:-2])  # the output ends on a LayerNorm, like the other encoders
        self.d_out = d_model

    def forward(self, x: torch.Tensor, time: torch.Tensor | None = None) -> torch.Tensor:
        return self.net(x)

    def init_state(self, batch_size: int, device: torch.device | str) -> None:
        return None

    def reset_state(self, state: None, mask: torch.Tensor | np.ndarray) -> None:
        return state

    def step(self, x: torch.Tensor, time: torch.Tensor | None, state: None) -> tuple[torch.Tensor, None]:
        return self.net(x), state


# Every trajectory encoder class: what `make_traj_encoder` returns (each satisfies `TrajEncoder`).
AnyTrajEncoder = TransformerTrajEncoder | RNNTrajEncoder | FFTrajEncoder


def make_traj_encoder(kind: TrajKind, d_in: int, **kwargs: Any) -> AnyTrajEncoder:
    """Build a trajectory encoder by kind; `kwargs` go to its constructor (e.g. d_model, layers)."""
    if kind == "transformer":
        return TransformerTrajEncoder(d_in, **kwargs)
    if kind == "gru":
        return GRUTrajEncoder(d_in, **kwargs)
    if kind == "lstm":
        return LSTMTrajEncoder(d_in, **kwargs)
    if kind == "ff":
        return FFTrajEncoder(d_in, **kwargs)
    raise ValueError(f"unknown trajectory encoder {kind!r}; expected 'transformer', 'gru', 'lstm' or 'ff'")


def traj_encoder_kwargs(model: ModelConfig) -> dict[str, Any]:
    """The constructor kwargs `make_traj_encoder(model.traj_encoder, d_in, **kwargs)` takes from a
    `ModelConfig`: width and depth for every kind, the attention, feed-forward and dropout settings for the
    Transformer (the RNN and FF encoders are built without dropout)."""
    kwargs: dict[str, Any] = {"d_model": model.d_model, "layers": model.layers}
    if model.traj_encoder == "transformer":
        kwargs.update(
            heads=model.heads,
            context_len=model.context,
            max_time=model.max_time,
            pos_emb=model.pos_emb,
            dropout=model.dropout,
            attn_dropout=model.attn_dropout,
            emb_dropout=model.emb_dropout,
            d_ff=model.d_ff,
        )
    return kwargs


__all__ = [
    "TrajEncoder",
    "TrajKind",
    "AnyTrajEncoder",
    "RNNTrajEncoder",
    "GRUTrajEncoder",
    "LSTMTrajEncoder",
    "FFTrajEncoder",
    "TransformerTrajEncoder",
    "make_traj_encoder",
    "traj_encoder_kwargs",
]
