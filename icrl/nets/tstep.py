"""Timestep encoder: one timestep's observation, previous action and reward, time and reset flag -> x_t.

It sees each timestep on its own (no memory; that is the trajectory encoder's job), so the whole
[B, L] batch is flattened into B*L independent rows. Vector observation keys are concatenated and
normalised with running statistics; image keys (uint8 HxWxC Boxes) go through a CNN each. The time
index enters as features because a fixed-horizon task needs it for well-defined values (docs/design.md §10).
"""

from __future__ import annotations

import math
from typing import Literal

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from icrl.nets.squash import symlog
from icrl.seeding import derive_seed
from icrl.types import Timesteps

GOAL_KEY = "goal"  # int instruction tokens; embedded only by an optional `goal_embedder` (docs/design.md §7)


def is_image_space(space: gym.Space) -> bool:
    return isinstance(space, gym.spaces.Box) and space.dtype == np.uint8 and len(space.shape) == 3


def _image_shape(space: gym.spaces.Box) -> tuple[int, int, int]:
    """(H, W, C) of an image Box (`is_image_space`: three dims)."""
    h, w, c = space.shape
    return h, w, c


class NatureCNN(nn.Module):
    """The DQN Nature CNN (Mnih et al. 2015) for [N, C, H, W] float images in [0, 1]; needs H, W >= 36."""

    def __init__(self, image_shape: tuple[int, int, int], d_out: int):
        super().__init__()
        h, w, c = image_shape
        self.convs = nn.Sequential(
            nn.Conv2d(c, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
            nn.Flatten(),
        )  # fmt: skip
        if min(h, w) < 36:
            raise ValueError(f"NatureCNN needs images of at least 36x36, got {h}x{w}; use cnn='impala'")
        with torch.no_grad():
            flat = self.convs(torch.zeros(1, c, h, w)).shape[1]
        self.out = nn.Sequential(nn.Linear(flat, d_out), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [N, C, H, W] -> [N, d_out]
        return self.out(self.convs(x))


class ImpalaResidual(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(F.relu(self.conv0(F.relu(x))))


class ImpalaCNN(nn.Module):
    """The IMPALA ResNet (Espeholt et al. 2018): per stage conv, 3x3/2 max-pool, two residual blocks.

    Works for any image size (each stage halves H and W, rounding up), including 7x7 grid-worlds.
    """

    def __init__(
        self, image_shape: tuple[int, int, int], d_out: int, channels: tuple[int, ...] = (16, 32, 32)
    ):
        super().__init__()
        h, w, c = image_shape
        stages: list[nn.Module] = []
        for ch in channels:
            stages += [
                nn.Conv2d(c, ch, 3, padding=1),
                nn.MaxPool2d(3, stride=2, padding=1),
                ImpalaResidual(ch),
                ImpalaResidual(ch),
            ]
            c, h, w = ch, (h + 1) // 2, (w + 1) // 2
        self.stages = nn.Sequential(*stages, nn.ReLU(), nn.Flatten())
        self.out = nn.Sequential(nn.Linear(c * h * w, d_out), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [N, C, H, W] -> [N, d_out]
        return self.out(self.stages(x))


class RunningNorm(nn.Module):
    """Running mean / variance of a feature vector, kept in buffers so it is saved and synced with the model.

    `update` merges a batch with Chan et al.'s parallel formula; `forward` only normalises and clips,
    so acting and the training forward never move the statistics.
    """

    mean: torch.Tensor  # buffers, registered in __init__
    var: torch.Tensor
    count: torch.Tensor

    def __init__(self, dim: int, clip: float = 10.0, eps: float = 1e-8):
        super().__init__()
        self.clip, self.eps = clip, eps
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("var", torch.ones(dim))
        self.register_buffer("count", torch.zeros(()))

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """x [N, dim]: N new samples."""
        self.merge(*masked_moments(x.unsqueeze(0), x.new_ones(x.shape[:1], dtype=torch.bool).unsqueeze(0)))

    @torch.no_grad()
    def merge(self, n: torch.Tensor, mean: torch.Tensor, m2: torch.Tensor) -> None:
        """Fold in K batch summaries: counts n [K], means [K, dim] and sums of squared deviations m2 [K, dim]
        (float64; `masked_moments`), with Chan et al.'s parallel formula. Tensor arithmetic only (no host
        read, fixed shapes): an empty batch (n = 0) leaves the statistics exactly as they were."""
        n = n.double()
        n_b = n.sum()  # the summaries combined into one batch
        mean_b = (n[:, None] * mean).sum(0) / n_b.clamp_min(1)
        m2_b = (m2 + n[:, None] * (mean - mean_b).square()).sum(0)
        count, mu, var = self.count.double(), self.mean.double(), self.var.double()
        total = count + n_b
        delta = mean_b - mu
        new_mean = mu + delta * (n_b / total.clamp_min(1))
        new_var = (var * count + m2_b + delta.square() * (count * n_b / total.clamp_min(1))) / total.clamp_min(1)
        some = n_b > 0
        self.mean.copy_(torch.where(some, new_mean, mu))
        self.var.copy_(torch.where(some, new_var, var))
        self.count.copy_(total)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ((x - self.mean) / torch.sqrt(self.var + self.eps)).clamp(-self.clip, self.clip)


class TimestepEncoder(nn.Module):
    """Encode each timestep of `Timesteps` [B, L, ...] into x_t [B, L, d_out].

    Inputs concatenated per timestep: normalised vector observations, one CNN feature vector per image
    key (pixels / 255), an optional goal embedding, the previous action, symlog(previous reward), time
    features (time / max_time and sinusoids of `n_time_freqs` periods), the reset flag and, with
    `reward_action`, the previous action times symlog(previous reward). An MLP
    (Linear -> LayerNorm -> Leaky ReLU -> Linear -> LayerNorm) maps them to `d_out`.

    Args:
        obs_space: the inner observation Dict of `TimestepWrapper` (key -> Box).
        action_dim: width A of the previous-action vector.
        d_out: output width (the trajectory encoder's d_in).
        hidden: MLP width, also the feature width of each image CNN.
        max_time: time scale of the time features; later times read as max_time in the linear feature.
        cnn: "impala" (any image size) or "nature" (>= 36x36).
        normalize_obs: running mean/std normalisation of vector keys (the learner folds in each batch's real
            timesteps: `normalization_moments`).
        goal_embedder: optional module mapping obs["goal"] [B, L, K] long -> [B, L, goal_embedder.d_out].
            Without it, a "goal" key is ignored.
        n_time_freqs: sinusoids of the time, periods spaced geometrically from 4 steps to max_time; 0 leaves the
            linear feature alone (what they cost and give: `ModelConfig.time_freqs`).
        reward_action: also the previous action times symlog(previous reward), A more inputs: which action paid
            (why: `ModelConfig.reward_action_input`).
    """

    time_freqs: torch.Tensor  # buffer, registered in __init__

    def __init__(
        self,
        obs_space: gym.spaces.Dict,
        action_dim: int,
        d_out: int,
        hidden: int = 128,
        max_time: int = 1000,
        cnn: Literal["impala", "nature"] = "impala",
        normalize_obs: bool = True,
        goal_embedder: nn.Module | None = None,
        n_time_freqs: int = 4,
        clip_obs: float = 10.0,
        reward_action: bool = False,
    ):
        super().__init__()
        self.d_out, self.max_time, self.reward_action = d_out, max_time, reward_action
        self.vector_keys: list[str] = []
        self.image_keys: list[str] = []
        boxes: dict[str, gym.spaces.Box] = {}
        for key, space in obs_space.spaces.items():
            if key == GOAL_KEY:
                continue
            if not isinstance(space, gym.spaces.Box):
                raise ValueError(
                    f"obs[{key!r}] is {space!r}; TimestepEncoder expects Box spaces (see TimestepWrapper)"
                )
            boxes[key] = space
            (self.image_keys if is_image_space(space) else self.vector_keys).append(key)
        self.vector_dim = sum(int(np.prod(boxes[k].shape)) for k in self.vector_keys)
        self.obs_norm = RunningNorm(self.vector_dim, clip_obs) if normalize_obs and self.vector_dim else None

        if cnn not in ("impala", "nature"):
            raise ValueError(f"cnn must be 'impala' or 'nature', got {cnn!r}")
        cnn_cls = ImpalaCNN if cnn == "impala" else NatureCNN
        self.cnns = nn.ModuleList(cnn_cls(_image_shape(boxes[k]), hidden) for k in self.image_keys)

        if goal_embedder is not None and GOAL_KEY not in obs_space.spaces:
            raise ValueError("goal_embedder given but the observation space has no 'goal' key")
        self.goal_embedder = goal_embedder
        # d_out is a plain attribute of the embedder, which nn.Module.__getattr__ types as Tensor | Module
        goal_dim = int(goal_embedder.d_out) if goal_embedder is not None else 0  # type: ignore[arg-type]

        # periods spaced geometrically from 4 steps to max_time: both fine and coarse phase information
        periods = torch.logspace(math.log10(4.0), math.log10(max(max_time, 5)), n_time_freqs)
        self.register_buffer("time_freqs", 2 * math.pi / periods, persistent=False)  # [n_freq]

        d_time = 1 + 2 * n_time_freqs
        d_in = self.vector_dim + hidden * len(self.image_keys) + goal_dim + action_dim + 1 + d_time + 1
        first = nn.Linear(d_in, hidden)
        if reward_action:  # the product's A columns come last; the other weights keep the draw made without them
            first = _with_own_columns(first, action_dim)
        self.mlp = nn.Sequential(
            first, nn.LayerNorm(hidden), nn.LeakyReLU(),
            nn.Linear(hidden, d_out), nn.LayerNorm(d_out),
        )  # fmt: skip

    def vector_obs(self, ts: Timesteps) -> torch.Tensor:
        """The vector keys flattened and concatenated, unnormalised: [B, L, vector_dim]."""
        B, L = ts.shape
        return torch.cat([ts.obs[k].reshape(B, L, -1).float() for k in self.vector_keys], dim=-1)

    def time_features(self, time: torch.Tensor) -> torch.Tensor:
        """time [B, L] long -> [B, L, 1 + 2 n_freq]."""
        t = time.float().unsqueeze(-1)  # [B, L, 1]
        angle = t * self.time_freqs  # [B, L, n_freq]
        return torch.cat([t.clamp(0, self.max_time) / self.max_time, angle.sin(), angle.cos()], dim=-1)

    def forward(self, ts: Timesteps) -> torch.Tensor:
        """ts [B, L, ...] -> [B, L, d_out]."""
        B, L = ts.shape
        parts: list[torch.Tensor] = []
        if self.vector_keys:
            vec = self.vector_obs(ts)
            parts.append(self.obs_norm(vec) if self.obs_norm is not None else vec)
        for key, cnn in zip(self.image_keys, self.cnns):
            img = ts.obs[key].reshape(B * L, *ts.obs[key].shape[2:])  # [B*L, H, W, C] uint8
            img = img.permute(0, 3, 1, 2).float() / 255.0  # [B*L, C, H, W] (channels-last memory)
            parts.append(cnn(img).view(B, L, -1))
        if self.goal_embedder is not None:
            parts.append(self.goal_embedder(ts.obs[GOAL_KEY]))
        prev_action, prev_reward = ts.prev_action.float(), symlog(ts.prev_reward.float()).unsqueeze(-1)
        parts += [prev_action, prev_reward, self.time_features(ts.time), ts.reset.float().unsqueeze(-1)]
        if self.reward_action:
            parts.append(prev_action * prev_reward)  # [B, L, A], last (as the records in docs/results.md ran it)
        return self.mlp(torch.cat(parts, dim=-1))

    def normalization_moments(
        self, ts: Timesteps, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """What the running statistics take from a batch: its real timesteps' count [1], mean [1, vector_dim]
        and sum of squared deviations [1, vector_dim] (`masked_moments`), or None without normalisation.
        Fixed shapes whatever the mask holds; the data-parallel learner gathers one such row per rank."""
        return masked_moments(self.vector_obs(ts), mask) if self.obs_norm is not None else None


def _with_own_columns(linear: nn.Linear, extra: int) -> nn.Linear:
    """`linear` widened by `extra` input columns drawn from their own generator (seeded from torch's global seed,
    the run's), at `nn.Linear`'s scale for `linear`'s fan-in, without drawing from the global generator.

    Why: an input that a task leaves at 0 then changes nothing of the model's initial draw, so a run with it equals
    the run without it there, and its effect elsewhere is the input's, not a new draw of every weight (the
    `--reward-action-input` records of T-Maze 500 in docs/results.md were decided by that draw)."""
    wide = torch.nn.utils.skip_init(nn.Linear, linear.in_features + extra, linear.out_features)  # no draw
    generator = torch.Generator().manual_seed(derive_seed(torch.initial_seed(), "timestep-extra-columns"))
    bound = 1.0 / math.sqrt(linear.in_features)  # nn.Linear's own init bound (kaiming_uniform, a = sqrt(5))
    with torch.no_grad():
        wide.weight[:, : linear.in_features] = linear.weight
        wide.weight[:, linear.in_features :] = torch.empty(linear.out_features, extra).uniform_(
            -bound, bound, generator=generator
        )
        wide.bias.copy_(linear.bias)
    return wide


def masked_moments(x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Count [1], mean [1, D] and sum of squared deviations from it [1, D] of the rows of x [B, L, D] where
    `mask` [B, L] holds, in float64. Masked sums rather than `x[mask]`: the shapes never depend on the data,
    so the learner's update reads nothing back to the host (icrl.agent.graphs)."""
    w = mask.reshape(-1, 1).double()  # [N, 1]
    rows = x.reshape(w.shape[0], -1).double()  # [N, D]
    rows = torch.where(w > 0, rows, torch.zeros_like(rows))  # padding may hold anything
    n = w.sum()
    mean = (rows * w).sum(0) / n.clamp_min(1)  # [D]
    m2 = ((rows - mean).square() * w).sum(0)  # [D]
    return n.reshape(1), mean.unsqueeze(0), m2.unsqueeze(0)
