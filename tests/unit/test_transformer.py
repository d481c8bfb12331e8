"""The stabilised Transformer: σReparam (and its acting snapshot), sliding window, KV cache equivalence, time
embeddings, dropout."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from icrl.nets.positions import Rotary, rotate_qk
from icrl.nets.transformer import (
    SigmaReparamLinear,
    TransformerTrajEncoder,
    banded_causal_mask,
    refresh_acting_weights,
)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def make(**kw) -> TransformerTrajEncoder:
    torch.manual_seed(0)
    cfg = dict(d_model=32, layers=2, heads=4, context_len=8, max_time=100)
    cfg.update(kw)
    return TransformerTrajEncoder(5, **cfg)


def step_through(enc: TransformerTrajEncoder, x: torch.Tensor, time: torch.Tensor,
                 static: bool = False) -> torch.Tensor:
    """Act over the whole sequence one step at a time: [B, L, d_in] -> [B, L, d_out]. `static`: the KV books on
    the device, every step over all W slots (the captured acting step's form)."""
    state = enc.init_state(x.shape[0], x.device, static=static)
    outs = []
    for t in range(x.shape[1]):
        out, state = enc.step(x[:, t], time[:, t], state)
        outs.append(out)
    return torch.stack(outs, dim=1)


@pytest.mark.parametrize("pos_emb", ["learned", "sinusoidal", "none", "rope"])
def test_forward_shape(pos_emb: str) -> None:
    enc = make(pos_emb=pos_emb)
    out = enc(torch.randn(3, 11, 5), torch.arange(11).repeat(3, 1))
    assert out.shape == (3, 11, enc.d_out) and enc.d_out == 32
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pos_emb", ["learned", "sinusoidal", "rope"])
# inside the window (is_causal path); W + 1, a training window (causal head + a maskless last query); W + 3 (a
# banded tail); 3 x W (the banded mask)
@pytest.mark.parametrize("length", [6, 9, 11, 24])
@pytest.mark.parametrize("static", [False, True])
def test_kv_cache_matches_full_forward(pos_emb: str, length: int, device: str, static: bool) -> None:
    enc = make(pos_emb=pos_emb).to(device).eval()
    x = torch.randn(3, length, 5, device=device)
    time = torch.arange(length, device=device).repeat(3, 1) + torch.tensor([[0], [3], [90]], device=device)
    with torch.no_grad():
        full = enc(x, time)
        stepped = step_through(enc, x, time, static)
    torch.testing.assert_close(stepped, full, atol=1e-5, rtol=1e-5)


def test_sliding_window_receptive_field() -> None:
    """One layer with window W: a change at step t reaches outputs t .. t+W-1 and nothing later."""
    enc = make(layers=1, context_len=4, pos_emb="none").eval()
    x, time = torch.randn(1, 16, 5), torch.arange(16)[None]
    x2 = x.clone()
    x2[:, 5] += 1.0
    with torch.no_grad():
        diff = (enc(x, time) - enc(x2, time)).abs().amax(-1)[0]  # [L]
    assert diff[:5].max() == 0
    assert (diff[5:9] > 1e-5).all()
    assert diff[9:].max() == 0


def test_banded_mask() -> None:
    m = banded_causal_mask(5, 2, torch.device("cpu"))
    expected = torch.tensor(
        [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 1, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 1, 1]],
        dtype=torch.bool,
    )
    assert torch.equal(m, expected)
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    assert torch.equal(banded_causal_mask(4, 4, torch.device("cpu")), causal)


def test_reset_state_empties_rows_and_cache_is_reused() -> None:
    enc = make().eval()
    with torch.no_grad():
        state = enc.init_state(2, "cpu")
        kv_ptr = state.kv.data_ptr()
        for t in range(3):
            _, state = enc.step(torch.randn(2, 5), torch.full((2,), t), state)
        state = enc.reset_state(state, torch.tensor([True, False]))
        assert state.count.tolist() == [0, 3]
        state = enc.reset_state(state, torch.tensor([True, True]))
        assert state.count.tolist() == [0, 0]
        x0 = torch.randn(2, 5)
        out, state = enc.step(x0, torch.zeros(2, dtype=torch.long), state)
        assert state.kv.data_ptr() == kv_ptr  # written in place, never re-allocated
        fresh, _ = enc.step(x0, torch.zeros(2, dtype=torch.long), enc.init_state(2, "cpu"))
    torch.testing.assert_close(out, fresh, atol=1e-6, rtol=1e-6)


def test_learned_time_embedding_clamps_past_max_time() -> None:
    enc = make(max_time=10).eval()
    x = torch.randn(1, 1, 5)
    with torch.no_grad():
        a, b = enc(x, torch.tensor([[10]])), enc(x, torch.tensor([[500]]))
        c = enc(x, torch.tensor([[3]]))
    torch.testing.assert_close(a, b)
    assert (a - c).abs().max() > 1e-4


def test_dropout_only_in_training() -> None:
    enc = make(dropout=0.3, attn_dropout=0.3, emb_dropout=0.3)
    x, time = torch.randn(2, 6, 5), torch.arange(6).repeat(2, 1)
    enc.train()
    assert (enc(x, time) - enc(x, time)).abs().max() > 1e-4
    enc.eval()
    torch.testing.assert_close(enc(x, time), enc(x, time), atol=0, rtol=0)


@pytest.mark.parametrize("kw", [{"dropout": 0.3}, {"attn_dropout": 0.3}, {"emb_dropout": 0.3}])
def test_each_dropout_and_the_mlp_width_are_separate_arguments(kw: dict) -> None:
    """Residual, attention and embedding dropout each act alone; d_ff sets the MLP width (default 4 d)."""
    enc = make(**kw).train()
    x, time = torch.randn(2, 6, 5), torch.arange(6).repeat(2, 1)
    assert (enc(x, time) - enc(x, time)).abs().max() > 1e-4
    assert make().blocks[0].mlp.fc.weight.shape == (4 * 32, 32)
    assert make(d_ff=48).blocks[0].mlp.fc.weight.shape == (48, 32)


def _matrix_with_spectrum(d_out: int, d_in: int, top: list[float]) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    U, _ = torch.linalg.qr(torch.randn(d_out, d_out, generator=gen))
    V, _ = torch.linalg.qr(torch.randn(d_in, d_in, generator=gen))
    s = torch.full((min(d_out, d_in),), 0.5)
    s[: len(top)] = torch.tensor(top)
    return U[:, : len(s)] @ torch.diag(s) @ V[:, : len(s)].T


def test_sigma_reparam_power_iteration_converges() -> None:
    layer = SigmaReparamLinear(24, 40)
    with torch.no_grad():
        layer.weight.copy_(_matrix_with_spectrum(40, 24, [3.0, 2.0, 1.5]))
        layer.gamma.fill_(2.5)
        gen = torch.Generator().manual_seed(1)
        layer.u.copy_(torch.nn.functional.normalize(torch.randn(40, generator=gen), dim=0))
        layer.v.copy_(torch.nn.functional.normalize(torch.randn(24, generator=gen), dim=0))
    x = torch.randn(4, 24)
    layer.train()
    first = layer.sigma().item()
    for _ in range(40):  # one power-iteration step per training forward
        layer(x)
    true_sigma = torch.linalg.matrix_norm(layer.weight.detach(), ord=2).item()
    assert abs(first - true_sigma) > 0.1  # it really started off
    assert layer.sigma().item() == pytest.approx(true_sigma, rel=1e-4)
    w_hat = layer.effective_weight().detach()
    assert torch.linalg.matrix_norm(w_hat, ord=2).item() == pytest.approx(2.5, rel=1e-4)
    # eval: u, v frozen, outputs deterministic
    layer.eval()
    u = layer.u.clone()
    y1, y2 = layer(x), layer(x)
    assert torch.equal(layer.u, u) and torch.equal(y1, y2)
    # the output-scaling path (few rows) and the weight-scaling path (many rows) agree
    many = torch.randn(100, 24)
    for inp in (x, many):
        expected = torch.nn.functional.linear(inp, w_hat, layer.bias)
        torch.testing.assert_close(layer(inp), expected, atol=1e-5, rtol=1e-5)


def test_sigma_reparam_init_exact_and_two_forwards_one_backward() -> None:
    layer = SigmaReparamLinear(16, 32)
    true_sigma = torch.linalg.matrix_norm(layer.weight.detach(), ord=2).item()
    assert layer.sigma().item() == pytest.approx(true_sigma, rel=1e-5)
    layer.train()
    x = torch.randn(3, 16)
    loss = layer(x).sum() + layer(x).square().sum()  # the buffers change between the two forwards
    loss.backward()
    assert layer.weight.grad is not None and layer.gamma.grad is not None


def test_gradients_reach_all_parameters() -> None:
    enc = make(pos_emb="learned").train()
    enc(torch.randn(2, 20, 5), torch.arange(20).repeat(2, 1)).square().mean().backward()
    for name, p in enc.named_parameters():
        if name == "time_emb.table.weight":
            assert p.grad[:20].abs().sum(-1).gt(0).all() and p.grad[20:].abs().sum() == 0
            continue
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def _uncached(layer: SigmaReparamLinear, x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.linear(x, layer.effective_weight(), layer.bias)


def test_sigma_reparam_acting_snapshot_is_exact_and_kept_until_refreshed() -> None:
    """Eval + no grad (acting) multiplies by a W_hat snapshot: exact, reused, and replaced only by a refresh
    (or a move to another dtype / device). Without the refresh, acting keeps the old weights."""
    torch.manual_seed(0)
    layer = SigmaReparamLinear(16, 24)
    x = torch.randn(5, 16)
    layer.train()
    layer(x)  # one power-iteration step: u, v move
    layer.eval()

    def act() -> torch.Tensor:
        with torch.no_grad():
            return layer(x)

    def check_fresh() -> torch.Tensor:
        y = act()
        assert torch.equal(y, _uncached(layer, x))
        snapshot = layer._acting_weight
        assert torch.equal(act(), y) and layer._acting_weight is snapshot  # reused, not recomputed
        with torch.enable_grad():  # the differentiable eval path agrees
            torch.testing.assert_close(layer(x), y, atol=1e-6, rtol=1e-5)
        return y

    def change_then_check(change) -> None:
        before = check_fresh()
        w_before = layer.effective_weight().detach().clone()
        change()
        assert not torch.equal(layer.effective_weight(), w_before)
        # not refreshed yet: acting still multiplies by the old W_hat (the bias is read live)
        assert torch.equal(act(), torch.nn.functional.linear(x, w_before, layer.bias))
        layer.refresh_acting_weight()
        assert not torch.equal(check_fresh(), before)

    def edit() -> None:
        with torch.no_grad():
            layer.weight.add_(0.01)

    def power_iteration() -> None:
        layer.train()
        layer(x)
        layer.eval()

    opt = torch.optim.AdamW(layer.parameters(), lr=1e-2, fused=True)

    def optimiser_step() -> None:
        layer(x).square().sum().backward()
        opt.step()

    other = SigmaReparamLinear(16, 24)
    for change in (edit, power_iteration, optimiser_step, lambda: layer.load_state_dict(other.state_dict())):
        change_then_check(change)
    with torch.no_grad():
        assert torch.equal(layer(x), other.eval()(x))

    layer.double()  # replaced tensors: the snapshot goes with them
    x = x.double()
    assert act().dtype == torch.float64
    check_fresh()

    # the module-wide refresh reaches every layer; a snapshot taken under inference_mode is a normal tensor,
    # usable in later no-grad calls outside it
    layer.weight.data.mul_(1.5)
    refresh_acting_weights(torch.nn.Sequential(layer))
    with torch.inference_mode():
        yi = layer(x)
    assert not layer._acting_weight.is_inference()
    with torch.no_grad():
        assert torch.equal(layer(x), yi) and torch.equal(yi, _uncached(layer, x))


@pytest.mark.parametrize("pos_emb", ["learned", "rope"])
def test_step_masks_only_when_rows_differ(pos_emb: str) -> None:
    """Rows at the same fill level attend without a mask; staggered rows mask their empty slots."""
    enc = make(context_len=4, pos_emb=pos_emb).eval()
    x = torch.randn(2, 7, 5)
    time = torch.arange(7).repeat(2, 1)
    with torch.no_grad():
        full = enc(x, time)
        state = enc.init_state(2, "cpu")
        outs = []
        for t in range(7):
            if t == 3:
                state = enc.reset_state(state, np.array([False, True]))
            out, state = enc.step(x[:, t], time[:, t] if t < 3 else torch.tensor([t, t - 3]), state)
            outs.append(out)
            assert min(int(state.count.max()), 4) == min(4, t + 1)  # the slots the next step attends over
    torch.testing.assert_close(torch.stack(outs[:3], 1), full[:, :3], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.stack(outs, 1)[0], full[0], atol=1e-5, rtol=1e-5)  # row 0: never reset
    with torch.no_grad():
        fresh = enc(x[1:, 3:], torch.arange(4)[None])[0]
    torch.testing.assert_close(torch.stack(outs[3:], 1)[1], fresh, atol=1e-5, rtol=1e-5)  # row 1: since reset


# ---------------------------------------------------------------- RoPE


def test_rope_rotation_is_the_half_split_complex_rotation() -> None:
    """Pair i of a head vector, (x[i], x[i + dh/2]), is multiplied by e^{i t w_i}, w_i = 10000^(-2i/dh), for
    queries and keys; values are untouched."""
    B, L, H, dh = 2, 5, 3, 8
    qkv = torch.randn(B, L, 3, H, dh, dtype=torch.float64)
    time = torch.tensor([[0, 1, 2, 7, 300], [4, 5, 6, 7, 8]])
    out = rotate_qk(qkv.float(), Rotary(dh)(time)).double()
    w = 10000.0 ** (-torch.arange(0, dh, 2, dtype=torch.float64) / dh)  # [dh/2]
    phase = torch.polar(torch.ones(B, L, dh // 2, dtype=torch.float64), time[..., None].double() * w)
    for j in (0, 1):  # q, k
        x = qkv[:, :, j]  # [B, L, H, dh]
        z = torch.complex(x[..., : dh // 2], x[..., dh // 2 :]) * phase[:, :, None]
        torch.testing.assert_close(out[:, :, j], torch.cat([z.real, z.imag], -1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[:, :, 2], qkv[:, :, 2], atol=1e-6, rtol=1e-6)


def test_rope_scores_depend_on_time_differences_only() -> None:
    """No position is added to the input: the encoder's output is the same when every time shifts by a
    constant, and changes when the gaps between times change (positions come from `time`, not the window)."""
    enc = make(pos_emb="rope").eval()
    x = torch.randn(2, 10, 5)
    time = torch.arange(10).repeat(2, 1)
    with torch.no_grad():
        base = enc(x, time)
        torch.testing.assert_close(enc(x, time + 57), base, atol=1e-4, rtol=1e-4)
        spread = time * 3
        assert (enc(x, spread) - base)[:, 1:].abs().amax() > 1e-3
        torch.testing.assert_close(enc(x, spread)[:, 0], base[:, 0])  # the first step attends to itself only


def test_rope_adds_no_parameters_and_needs_an_even_head_width() -> None:
    """A "rope" model has the state dict of a "none" model (the frequencies are not saved)."""
    rope, none = make(pos_emb="rope"), make(pos_emb="none")
    assert rope.state_dict().keys() == none.state_dict().keys()
    assert all(rope.state_dict()[k].shape == v.shape for k, v in none.state_dict().items())
    with pytest.raises(ValueError, match="even head width"):
        make(pos_emb="rope", d_model=12, heads=4)


def test_rope_gradients_reach_all_parameters() -> None:
    enc = make(pos_emb="rope").train()
    x = torch.randn(2, 9, 5, requires_grad=True)
    enc(x, torch.arange(9).repeat(2, 1)).square().mean().backward()
    for name, p in enc.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_rope_acting_rotates_by_time_not_by_slot() -> None:
    """Stepping equals the forward pass also when times are not consecutive (so a rotation by the ring slot
    or the step count, which agrees with consecutive times up to a shift, would fail here)."""
    enc = make(pos_emb="rope").eval()
    x = torch.randn(2, 20, 5)
    gaps = torch.randint(1, 5, (2, 20))
    time = gaps.cumsum(1) + torch.tensor([[0], [40]])
    with torch.no_grad():
        full = enc(x, time)
        stepped = step_through(enc, x, time)
        shifted = enc(x, torch.arange(20).repeat(2, 1))
    torch.testing.assert_close(stepped, full, atol=1e-5, rtol=1e-5)
    assert (shifted - full).abs().amax() > 1e-3
