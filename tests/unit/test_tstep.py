"""TimestepEncoder: vector / image / multi-key observations, running normalisation, goal hook."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from icrl.nets.squash import symlog
from icrl.nets.tstep import ImpalaCNN, NatureCNN, TimestepEncoder
from icrl.types import Timesteps

A = 3  # previous-action width


def vec_box(*shape: int) -> gym.spaces.Box:
    return gym.spaces.Box(-np.inf, np.inf, shape, np.float32)


def img_box(h: int, w: int, c: int = 3) -> gym.spaces.Box:
    return gym.spaces.Box(0, 255, (h, w, c), np.uint8)


def sample_timesteps(space: gym.spaces.Dict, B: int = 2, L: int = 5, seed: int = 0) -> Timesteps:
    gen = torch.Generator().manual_seed(seed)
    obs = {}
    for key, sub in space.spaces.items():
        if sub.dtype == np.uint8:
            obs[key] = torch.randint(0, 256, (B, L, *sub.shape), generator=gen, dtype=torch.uint8)
        elif np.issubdtype(sub.dtype, np.integer):
            obs[key] = torch.randint(0, 10, (B, L, *sub.shape), generator=gen)
        else:
            obs[key] = torch.randn(B, L, *sub.shape, generator=gen)
    return Timesteps(
        obs=obs,
        prev_action=torch.randn(B, L, A, generator=gen),
        prev_reward=torch.randn(B, L, generator=gen) * 100,
        time=torch.arange(L).repeat(B, 1),
        reset=torch.zeros(B, L, dtype=torch.bool).index_fill_(1, torch.tensor([0]), True),
    )


def test_vector_obs_shape() -> None:
    space = gym.spaces.Dict({"obs": vec_box(4)})
    enc = TimestepEncoder(space, A, d_out=16, hidden=32)
    out = enc(sample_timesteps(space))
    assert out.shape == (2, 5, 16) and torch.isfinite(out).all()


@pytest.mark.parametrize(("cnn", "size"), [("impala", 16), ("impala", 7), ("nature", 40)])
def test_multi_key_dict_with_images(cnn: str, size: int) -> None:
    space = gym.spaces.Dict(
        {
            "agent/pos": vec_box(2),
            "agent/vel": vec_box(3, 2),
            "image": img_box(size, size),
            "goal": gym.spaces.Box(0, 10, (4,), np.int64),  # ignored without a goal embedder
        }
    )
    enc = TimestepEncoder(space, A, d_out=16, hidden=32, cnn=cnn)
    assert enc.vector_keys == ["agent/pos", "agent/vel"] and enc.image_keys == ["image"]
    assert isinstance(enc.cnns[0], ImpalaCNN if cnn == "impala" else NatureCNN)
    ts = sample_timesteps(space)
    out = enc(ts)
    assert out.shape == (2, 5, 16) and torch.isfinite(out).all()
    out.square().mean().backward()
    for name, p in enc.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    # the image matters
    ts.obs["image"] = 255 - ts.obs["image"]
    assert (enc(ts) - out).abs().max() > 1e-5


def test_nature_cnn_rejects_small_images() -> None:
    with pytest.raises(ValueError, match="impala"):
        TimestepEncoder(gym.spaces.Dict({"image": img_box(7, 7)}), A, d_out=8, cnn="nature")


def test_acting_shape_from_numpy() -> None:
    space = gym.spaces.Dict({"obs": vec_box(4), "image": img_box(8, 8)})
    enc = TimestepEncoder(space, A, d_out=16, hidden=32)
    step = {
        "obs": {"obs": np.zeros((3, 4), np.float32), "image": np.zeros((3, 8, 8, 3), np.uint8)},
        "prev_action": np.zeros((3, A), np.float32),
        "prev_reward": np.zeros(3, np.float32),
        "time": np.array([0, 5, 2000]),
        "reset": np.array([1, 0, 0], np.int8),
    }
    assert enc(Timesteps.from_numpy(step)).shape == (3, 1, 16)


def test_time_reset_action_and_reward_are_inputs() -> None:
    space = gym.spaces.Dict({"obs": vec_box(4)})
    enc = TimestepEncoder(space, A, d_out=16, hidden=32).eval()
    ts = sample_timesteps(space)
    base = enc(ts)
    for field, new in [
        ("time", ts.time + 7),
        ("reset", ~ts.reset),
        ("prev_action", ts.prev_action + 1),
        ("prev_reward", ts.prev_reward + 1),
    ]:
        changed = Timesteps(**{**vars(ts), field: new})
        assert (enc(changed) - base).abs().max() > 1e-5, field


def test_reward_action_inputs_are_the_previous_action_times_the_symlog_reward() -> None:
    """`reward_action` appends A inputs, last: prev_action x symlog(prev_reward), zero where the reward is."""
    space = gym.spaces.Dict({"obs": vec_box(4)})
    plain = TimestepEncoder(space, A, d_out=16, hidden=32)
    enc = TimestepEncoder(space, A, d_out=16, hidden=32, reward_action=True).eval()
    first = enc.mlp[0]
    assert isinstance(first, nn.Linear) and first.in_features == plain.mlp[0].in_features + A
    seen: list[torch.Tensor] = []
    first.register_forward_hook(lambda _m, args, _out: seen.append(args[0]))
    ts = sample_timesteps(space)
    ts.prev_reward[0, 2] = 0.0
    enc(ts)
    torch.testing.assert_close(seen[0][..., -A:], ts.prev_action * symlog(ts.prev_reward).unsqueeze(-1))
    assert (seen[0][0, 2, -A:] == 0).all() and (seen[0][..., :-A] != 0).any()


@pytest.mark.parametrize("freqs", [0, 4])
def test_time_features_are_the_linear_time_and_the_asked_sinusoids(freqs: int) -> None:
    """`time_freqs` sinusoids beside the linear feature; with none the time still enters (linearly)."""
    space = gym.spaces.Dict({"obs": vec_box(4)})
    enc = TimestepEncoder(space, A, d_out=16, hidden=32, max_time=100, n_time_freqs=freqs).eval()
    ts = sample_timesteps(space)
    feats = enc.time_features(ts.time)
    assert feats.shape == (*ts.shape, 1 + 2 * freqs)
    torch.testing.assert_close(feats[..., 0], ts.time.float() / 100)
    changed = Timesteps(**{**vars(ts), "time": ts.time + 7})
    assert (enc(changed) - enc(ts)).abs().max() > 1e-5


def test_normalization_uses_only_masked_in_steps() -> None:
    space = gym.spaces.Dict({"a": vec_box(2), "b": vec_box(3)})
    enc = TimestepEncoder(space, A, d_out=8)
    ts = sample_timesteps(space, B=4, L=6)
    mask = torch.zeros(4, 6, dtype=torch.bool)
    mask[:, :4] = True
    ts.obs["a"][~mask] = 1e6  # padding with absurd values must not leak into the statistics
    ts.obs["b"][~mask] = -1e6
    stats_before = enc.obs_norm.mean.clone()
    enc(ts)  # forward never updates
    assert torch.equal(enc.obs_norm.mean, stats_before)

    enc.obs_norm.merge(*enc.normalization_moments(ts, mask))
    real = enc.vector_obs(ts)[mask].double()  # [16, 5]
    torch.testing.assert_close(enc.obs_norm.mean.double(), real.mean(0), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(enc.obs_norm.var.double(), real.var(0, unbiased=False), rtol=1e-5, atol=1e-6)
    assert enc.obs_norm.count.item() == 16

    # a second batch merges exactly like one pass over both (Chan's parallel update)
    ts2 = sample_timesteps(space, B=4, L=6, seed=1)
    ts2.obs["a"] = ts2.obs["a"] * 3 + 5
    mask2 = torch.rand(4, 6, generator=torch.Generator().manual_seed(2)) > 0.3
    enc.obs_norm.merge(*enc.normalization_moments(ts2, mask2))
    both = torch.cat([real, enc.vector_obs(ts2)[mask2].double()])
    torch.testing.assert_close(enc.obs_norm.mean.double(), both.mean(0), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(enc.obs_norm.var.double(), both.var(0, unbiased=False), rtol=1e-5, atol=1e-6)
    normed = enc.obs_norm(enc.vector_obs(ts2)[mask2])
    assert normed.abs().max() <= enc.obs_norm.clip
    assert set(dict(enc.named_buffers())) >= {"obs_norm.mean", "obs_norm.var", "obs_norm.count"}


def test_normalization_moves_stats_toward_the_data_and_changes_the_output() -> None:
    space = gym.spaces.Dict({"obs": vec_box(4)})
    enc = TimestepEncoder(space, A, d_out=8).eval()
    ts = sample_timesteps(space, B=4, L=8)
    ts.obs["obs"] = ts.obs["obs"] * 3 + 5  # far from the initial statistics (mean 0, var 1)
    mask = torch.ones(4, 8, dtype=torch.bool)
    before = enc(ts)
    data = enc.vector_obs(ts)[mask]  # [32, 4]
    gap_mean = (enc.obs_norm.mean - data.mean(0)).abs()
    gap_var = (enc.obs_norm.var - data.var(0, unbiased=False)).abs()
    enc.obs_norm.merge(*enc.normalization_moments(ts, mask))
    assert torch.all((enc.obs_norm.mean - data.mean(0)).abs() < 0.01 * gap_mean)
    assert torch.all((enc.obs_norm.var - data.var(0, unbiased=False)).abs() < 0.01 * gap_var)
    normed = enc.obs_norm(data).double()  # what the MLP now sees: standardised
    torch.testing.assert_close(normed.mean(0), torch.zeros(4, dtype=torch.float64), atol=1e-5, rtol=0)
    ones = torch.ones(4, dtype=torch.float64)
    torch.testing.assert_close(normed.var(0, unbiased=False), ones, atol=1e-4, rtol=0)
    assert (enc(ts) - before).abs().max() > 1e-3


def test_normalization_off() -> None:
    """Without normalisation, a batch changes nothing: no statistics, the same output; the
    same call on the same data moves the output of an otherwise identical encoder that normalises."""
    space = gym.spaces.Dict({"obs": vec_box(4)})
    ts = sample_timesteps(space)
    ts.obs["obs"] = ts.obs["obs"] * 2 + 3  # off the initial statistics, inside the clip range
    assert ts.obs["obs"].abs().max() < 10
    mask = torch.ones(2, 5, dtype=torch.bool)
    outputs = {}
    for normalize in (False, True):
        torch.manual_seed(0)
        enc = TimestepEncoder(space, A, d_out=8, normalize_obs=normalize).eval()
        state, before = {k: v.clone() for k, v in enc.state_dict().items()}, enc(ts)
        moments = enc.normalization_moments(ts, mask)  # what the learner folds in: nothing without normalisation
        assert (moments is None) == (not normalize)
        if moments is not None:
            enc.obs_norm.merge(*moments)
        after = enc(ts)
        outputs[normalize] = (before, after)
        if not normalize:
            assert enc.obs_norm is None
            assert not any("obs_norm" in k for k in state)
            assert all(torch.equal(v, state[k]) for k, v in enc.state_dict().items())
            assert torch.equal(after, before)
    assert (outputs[True][1] - outputs[True][0]).abs().max() > 1e-3  # the data would have moved the stats
    torch.testing.assert_close(outputs[True][0], outputs[False][0], atol=1e-5, rtol=0)  # same encoder


class MeanTokenEmbedder(nn.Module):
    """A stand-in goal embedder: mean of token embeddings."""

    def __init__(self, vocab: int, d_out: int):
        super().__init__()
        self.emb, self.d_out = nn.Embedding(vocab, d_out), d_out

    def forward(self, goal: torch.Tensor) -> torch.Tensor:  # [B, L, K] -> [B, L, d_out]
        return self.emb(goal).mean(-2)


def test_goal_embedder_hook() -> None:
    space = gym.spaces.Dict({"obs": vec_box(4), "goal": gym.spaces.Box(0, 10, (3,), np.int64)})
    enc = TimestepEncoder(space, A, d_out=8, goal_embedder=MeanTokenEmbedder(11, 6))
    ts = sample_timesteps(space)
    out = enc(ts)
    ts.obs["goal"] = (ts.obs["goal"] + 1) % 11
    assert (enc(ts) - out).abs().max() > 1e-5
    with pytest.raises(ValueError, match="goal"):
        no_goal = gym.spaces.Dict({"obs": vec_box(4)})
        TimestepEncoder(no_goal, A, d_out=8, goal_embedder=MeanTokenEmbedder(11, 6))


def test_symlog() -> None:
    x = torch.tensor([-100.0, -1.0, 0.0, 1.0, 100.0])
    torch.testing.assert_close(symlog(x), torch.sign(x) * torch.log1p(x.abs()))
    assert symlog(torch.tensor(0.0)) == 0
