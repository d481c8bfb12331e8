"""Contract tests shared by every trajectory encoder: shapes, causality, stepping == forward with resets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from icrl.nets.traj import (
    FFTrajEncoder,
    GRUTrajEncoder,
    LSTMTrajEncoder,
    TrajEncoder,
    TransformerTrajEncoder,
    make_traj_encoder,
)

D_IN = 6
KINDS = ["transformer", "gru", "lstm", "ff"]


def build(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind in ("transformer", "transformer-rope"):
        # a short window, so the rollouts below run past it and exercise the sliding window
        pos_emb = "rope" if kind == "transformer-rope" else "learned"
        return make_traj_encoder(
            "transformer", D_IN, d_model=32, layers=2, heads=4, context_len=5, max_time=64, pos_emb=pos_emb
        )
    return make_traj_encoder(kind, D_IN, d_model=32)


@pytest.mark.parametrize("kind", KINDS)
def test_shapes_and_protocol(kind: str) -> None:
    enc = build(kind)
    assert isinstance(enc, TrajEncoder)
    x, time = torch.randn(3, 7, D_IN), torch.arange(7).repeat(3, 1)
    assert enc(x, time).shape == (3, 7, enc.d_out)
    state = enc.init_state(3, "cpu")
    out, state = enc.step(x[:, 0], time[:, 0], state)
    assert out.shape == (3, enc.d_out)


def test_make_traj_encoder_types() -> None:
    assert isinstance(make_traj_encoder("transformer", 4, d_model=16, heads=2), TransformerTrajEncoder)
    assert isinstance(make_traj_encoder("gru", 4), GRUTrajEncoder)
    assert isinstance(make_traj_encoder("lstm", 4), LSTMTrajEncoder)
    assert isinstance(make_traj_encoder("ff", 4), FFTrajEncoder)
    with pytest.raises(ValueError, match="unknown trajectory encoder"):
        make_traj_encoder("mamba", 4)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", KINDS)
def test_causality(kind: str) -> None:
    """Perturbing the input at step t leaves outputs before t unchanged and changes the output at t
    (and, for encoders with memory, the next ones)."""
    enc = build(kind).eval()
    L, t = 12, 6
    x, time = torch.randn(2, L, D_IN), torch.arange(L).repeat(2, 1)
    x2 = x.clone()
    x2[:, t] += 1.0
    with torch.no_grad():
        y, y2 = enc(x, time), enc(x2, time)
    torch.testing.assert_close(y[:, :t], y2[:, :t], atol=0, rtol=0)
    assert (y[:, t] - y2[:, t]).abs().amax() > 1e-4
    after = (y[:, t + 1 :] - y2[:, t + 1 :]).abs().amax(dim=-1)  # [B, L - t - 1]
    if kind == "ff":
        assert after.max() == 0
    else:
        assert (after[:, :3] > 1e-6).all()


def _staggered_rollouts(
    batch: int, steps: int, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """Inputs, times and hard-reset flags [B, T] for rows that reset at different moments."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, steps, D_IN, generator=gen)
    resets = np.zeros((batch, steps), dtype=bool)
    resets[:, 0] = True
    resets[1, 7] = True
    resets[2, [3, 11]] = True
    resets[3, 15] = True
    time = np.zeros((batch, steps), dtype=np.int64)
    for b in range(batch):
        for t in range(1, steps):
            time[b, t] = 0 if resets[b, t] else time[b, t - 1] + 1
    time[2] += 2  # a rollout chunk that starts mid-way: time need not start at 0
    return x, torch.as_tensor(time), resets


@pytest.mark.parametrize("kind", [*KINDS, "transformer-rope"])
def test_stepping_matches_forward_with_staggered_resets(kind: str) -> None:
    """Rows at different timesteps reset at different moments; each row's stepped outputs equal one
    full forward pass over its own rollout since its last reset (docs/design.md §10)."""
    enc = build(kind).eval()
    B, T = 4, 20
    x, time, resets = _staggered_rollouts(B, T)
    outs = []
    with torch.no_grad():
        state = enc.init_state(B, "cpu")
        for t in range(T):
            state = enc.reset_state(state, resets[:, t])  # numpy masks are accepted
            out, state = enc.step(x[:, t], time[:, t], state)
            outs.append(out)
        stepped = torch.stack(outs, dim=1)  # [B, T, d]
        for b in range(B):
            starts = list(np.flatnonzero(resets[b])) + [T]
            for s, e in zip(starts[:-1], starts[1:]):
                full = enc(x[b : b + 1, s:e], time[b : b + 1, s:e])[0]
                torch.testing.assert_close(stepped[b, s:e], full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_rnn_reset_zeroes_only_masked_rows(kind: str) -> None:
    enc = build(kind).eval()
    with torch.no_grad():
        state = enc.init_state(3, "cpu")
        _, state = enc.step(torch.randn(3, D_IN), torch.zeros(3, dtype=torch.long), state)
        state = enc.reset_state(state, torch.tensor([False, True, False]))
    for h in state if isinstance(state, tuple) else (state,):
        assert h[:, 1].abs().max() == 0
        assert h[:, 0].abs().max() > 0 and h[:, 2].abs().max() > 0


@pytest.mark.parametrize("kind", KINDS)
def test_gradients_reach_all_parameters(kind: str) -> None:
    enc = build(kind).train()
    x, time = torch.randn(2, 9, D_IN, requires_grad=True), torch.arange(9).repeat(2, 1)
    enc(x, time).square().mean().backward()
    for name, p in enc.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert x.grad is not None and x.grad.abs().sum() > 0
