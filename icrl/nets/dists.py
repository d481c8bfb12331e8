"""Action distributions over action *vectors*, as the networks see them (docs/design.md §4).

Every distribution has batch shape [..., G] (one policy per discount) and event shape [A]:
a sample is a float vector [..., G, A] — one-hot for discrete actions, a point of [-1, 1]^A for
continuous ones, 0/1 entries for multi-binary ones. Working on vectors (not ids) lets one critic
signature Q(s, a_vec) and one actor loss serve all three kinds.

`ActionDistribution` (also named `Distribution`) is that common interface: `sample(shape=())`,
`rsample(shape=())` (reparameterised or straight-through; `Categorical` refuses it, its actor loss uses the
exact expectation instead; with `LossConfig.discrete_action_input` it samples through
`Categorical.straight_through_sample`), `log_prob(a_vec [..., G, A]) -> [..., G]`, `mode() -> a_vec`,
`entropy() -> [..., G]`, `batch_shape`, `dtype`.
Continuous actions (`ModelConfig.continuous_dist`): `ContinuousOutput` turns the actor's outputs into a
`TanhGaussian` (default), `TanhGMM` (a mixture of squashed Gaussians) or `ShiftedBeta` (a Beta rescaled to
[-1, 1]); docs/method.md compares them with the official code.
`ActionSpec.from_vector` / `to_vector` (icrl.types) convert between vectors and the replay's storage format.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

_LOG_2 = math.log(2.0)
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
GUMBEL_TEMPERATURE = 0.5
"""Temperature of `Categorical.straight_through_sample`'s relaxed probabilities (the official AMAGO's
`DiscreteLikeContinuous` default)."""

SampleShape = torch.Size | tuple[int, ...] | int
"""The leading sample dims of `sample` / `rsample` (an int n means (n,))."""


def _shape(shape: SampleShape) -> tuple[int, ...]:
    return (shape,) if isinstance(shape, int) else tuple(shape)


def _gumbel(shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel noise of `shape`, on `like`'s device and dtype (argmax(logits + noise) ~ softmax)."""
    u = torch.rand(shape, device=like.device, dtype=like.dtype)
    return -torch.log(-torch.log(u.clamp_min(torch.finfo(u.dtype).tiny)))


def _clip_bounds(a_vec: torch.Tensor, clip: float) -> torch.Tensor:
    """Actions clamped to [-clip, clip] (at least one float eps inside ±1), where densities stay finite."""
    eps = max(1.0 - clip, torch.finfo(a_vec.dtype).eps)
    return a_vec.clamp(-1.0 + eps, 1.0 - eps)


def _tanh_log_det(u: torch.Tensor) -> torch.Tensor:
    """log|d tanh(u)/du| per entry, as 2 (log 2 - u - softplus(-2u)): exact and finite for any u, where the
    textbook log(1 - tanh(u)^2) underflows to log 0 once |u| > ~9 in float32."""
    return 2.0 * (_LOG_2 - u - F.softplus(-2.0 * u))


class ActionDistribution(abc.ABC):
    """The one interface the actor head returns and the losses read, whatever the kind of action.

    Batch shape [..., G], event shape [A] (module docstring). `sample` is `rsample` without a graph unless a
    class has a cheaper exact draw (`_sample`); subclasses pass their batch shape and dtype to `__init__`.
    """

    def __init__(self, batch_shape: torch.Size, dtype: torch.dtype) -> None:
        self._batch_shape, self._dtype = batch_shape, dtype

    @property
    def batch_shape(self) -> torch.Size:
        return self._batch_shape

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    def sample(self, shape: SampleShape = ()) -> torch.Tensor:
        """An action a ~ π [*shape, ..., G, A] that records no graph (acting, bootstrap targets)."""
        with torch.no_grad():
            return self._sample(_shape(shape))

    def _sample(self, shape: tuple[int, ...]) -> torch.Tensor:
        return self.rsample(shape)

    @abc.abstractmethod
    def rsample(self, shape: SampleShape = ()) -> torch.Tensor:
        """a ~ π [*shape, ..., G, A] with a gradient into the parameters: the online term -Q(s, a~π)."""

    @abc.abstractmethod
    def log_prob(self, a_vec: torch.Tensor) -> torch.Tensor:
        """log π(a) of action vectors [..., G, A] -> [..., G]: the offline (filtered BC) term."""

    @abc.abstractmethod
    def mode(self) -> torch.Tensor:
        """The greedy action [..., G, A] (deterministic acting and evaluation)."""

    @abc.abstractmethod
    def entropy(self) -> torch.Tensor:
        """H(π) [..., G], or a differentiable estimate where there is no closed form."""


Distribution = ActionDistribution
"""The name the heads and losses annotate with."""


class Categorical(ActionDistribution):
    """Softmax policy over A actions; samples and modes are one-hot float vectors [..., G, A]."""

    def __init__(self, logits: torch.Tensor, prob_clip: tuple[float, float] | None = None) -> None:
        self.logits = torch.log_softmax(logits, dim=-1)  # [..., G, A], normalised log-probabilities
        if prob_clip is not None:  # the official AMAGO's `Discrete`: clamp, renormalise by a detached sum
            clipped = self.logits.exp().clamp(*prob_clip)
            self.logits = (clipped / clipped.sum(-1, keepdim=True).detach()).log()
        super().__init__(self.logits.shape[:-1], self.logits.dtype)

    @property
    def probs(self) -> torch.Tensor:
        return self.logits.exp()  # [..., G, A]

    def _one_hot(self, idx: torch.Tensor) -> torch.Tensor:
        return F.one_hot(idx, self.logits.shape[-1]).to(self.logits.dtype)

    def _sample(self, shape: tuple[int, ...]) -> torch.Tensor:
        """Gumbel-max sampling: one batched op, no multinomial reshaping."""
        return self._one_hot((self.logits + _gumbel(shape + self.logits.shape, self.logits)).argmax(-1))

    def rsample(self, shape: SampleShape = ()) -> torch.Tensor:
        raise TypeError(
            "Categorical has no reparameterised sample; "
            "the actor loss uses the exact expectation over actions."
        )

    def straight_through_sample(
        self, shape: SampleShape = (), temperature: float = GUMBEL_TEMPERATURE
    ) -> torch.Tensor:
        """A one-hot sample a ~ π [*shape, ..., G, A] that carries the gradient of its relaxation: the
        straight-through Gumbel-softmax (Jang et al. 2017), used only by the online term of a critic that takes
        discrete actions as input (`LossConfig.discrete_action_input`). See `straight_through_gumbel`."""
        shape = _shape(shape)
        noise = _gumbel(shape + self.logits.shape, self.logits.detach())
        return straight_through_gumbel(self.logits, noise, temperature)

    def log_prob(self, a_vec: torch.Tensor) -> torch.Tensor:
        """log π(a) for one-hot vectors [..., G, A] -> [..., G] (a zero vector gives 0)."""
        return (a_vec * self.logits).sum(-1)

    def mode(self) -> torch.Tensor:
        return self._one_hot(self.logits.argmax(-1))

    def entropy(self) -> torch.Tensor:
        return -(self.probs * self.logits).sum(-1)  # [..., G]


def straight_through_gumbel(logits: torch.Tensor, noise: torch.Tensor, temperature: float) -> torch.Tensor:
    """one_hot(argmax(logits + noise)) in value, d softmax((logits + noise) / temperature) in gradient.

    With standard Gumbel `noise` the value is an exact sample of softmax(logits) (Gumbel-max); the gradient is
    that of the relaxed probabilities y = softmax((logits + noise) / τ), ∂y_i/∂logits_j = y_i (δ_ij - y_j) / τ:
    biased (it differentiates the relaxation, not the sample), as the official `F.gumbel_softmax(hard=True)`.
    `noise` broadcasts against `logits` (extra leading sample dims)."""
    soft = torch.softmax((logits + noise) / temperature, dim=-1)
    hard = F.one_hot(soft.argmax(-1), soft.shape[-1]).to(soft.dtype)
    return hard + (soft - soft.detach())  # exactly `hard` in value


class _TanhSquashed(ActionDistribution):
    """a = tanh(u): a subclass draws the pre-squash u [..., G, A] and gives its log-density; the squashing,
    the density of a drawn sample (from its own u, no atanh round trip) and of a stored action (through atanh,
    clipped) are the same for every squashed policy."""

    LOG_PROB_CLIP: float = 1.0 - 1e-6
    """`log_prob` clips actions to [-LOG_PROB_CLIP, LOG_PROB_CLIP] first (see there). The official code clips
    to ±0.99; on Pendulum-v1 (ff, 900 updates, docs/results.md) ±0.99 measured no different (-1,445 vs
    -1,358 at 10,000 env steps, both unlearned at τ 0.003), so the tighter library clip stays."""

    @abc.abstractmethod
    def _rsample_u(self, shape: tuple[int, ...]) -> torch.Tensor:
        """Reparameterised pre-squash points [*shape, ..., G, A]."""

    @abc.abstractmethod
    def _log_prob_u(self, u: torch.Tensor) -> torch.Tensor:
        """log π(tanh(u)) at pre-squash points u [..., G, A] -> [..., G] (the log-det of tanh included)."""

    def rsample_with_log_prob(self, shape: SampleShape = ()) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterised sample [*shape, ..., G, A] and its log-density [*shape, ..., G] (same u)."""
        u = self._rsample_u(_shape(shape))
        return torch.tanh(u), self._log_prob_u(u)

    def rsample(self, shape: SampleShape = ()) -> torch.Tensor:
        return torch.tanh(self._rsample_u(_shape(shape)))  # rsample_with_log_prob's draw, its density unused

    def log_prob(self, a_vec: torch.Tensor) -> torch.Tensor:
        """log π(a) for given actions in [-1, 1] -> [..., G].

        Actions are clipped to [-LOG_PROB_CLIP, LOG_PROB_CLIP] first: stored actions can sit exactly on the
        bounds (noise, clipping, offline data), where atanh is infinite.
        """
        return self._log_prob_u(torch.atanh(_clip_bounds(a_vec, self.LOG_PROB_CLIP)))

    def entropy(self) -> torch.Tensor:
        """One-sample differentiable estimate -log π(a), a ~ π (no closed form after the squashing)."""
        return -self.rsample_with_log_prob()[1]


class TanhGaussian(_TanhSquashed):
    """a = tanh(u), u ~ N(mean, exp(log_std)); a diagonal Gaussian squashed into [-1, 1]^A."""

    def __init__(
        self, mean: torch.Tensor, log_std: torch.Tensor, min_log_std: float = -5.0, max_log_std: float = 2.0
    ) -> None:
        self.mean = mean  # [..., G, A]
        self.log_std = log_std.clamp(min_log_std, max_log_std)  # [..., G, A]
        self.std = self.log_std.exp()
        super().__init__(mean.shape[:-1], mean.dtype)

    def _log_prob_u(self, u: torch.Tensor) -> torch.Tensor:
        z = (u - self.mean) / self.std
        log_normal = -0.5 * z.square() - self.log_std - _LOG_SQRT_2PI
        return (log_normal - _tanh_log_det(u)).sum(-1)

    def _rsample_u(self, shape: tuple[int, ...]) -> torch.Tensor:
        eps = torch.randn(shape + self.mean.shape, device=self.mean.device, dtype=self.mean.dtype)
        return self.mean + self.std * eps

    def mode(self) -> torch.Tensor:
        return torch.tanh(self.mean)


class Bernoulli(ActionDistribution):
    """Independent Bernoulli per action dim (MultiBinary); log_prob sums over the dims."""

    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = logits  # [..., G, A]
        super().__init__(logits.shape[:-1], logits.dtype)

    @property
    def probs(self) -> torch.Tensor:
        return torch.sigmoid(self.logits)

    def rsample(self, shape: SampleShape = ()) -> torch.Tensor:
        """Straight-through sample: the value is a hard 0/1 sample, the gradient is that of the probabilities.

        This gives the online -Q(s, a~π) term a (biased but useful) gradient into the policy logits.
        """
        p = self.probs.expand(_shape(shape) + self.logits.shape)
        hard = torch.bernoulli(p.detach())
        return hard + (p - p.detach())  # exactly `hard` in value

    def log_prob(self, a_vec: torch.Tensor) -> torch.Tensor:
        # a log σ(l) + (1 - a) log σ(-l) = -BCE(l, a), computed stably from the logits.
        logits = self.logits.expand(a_vec.shape[:-1] + self.logits.shape[-1:])
        return -F.binary_cross_entropy_with_logits(logits, a_vec.to(logits.dtype), reduction="none").sum(-1)

    def mode(self) -> torch.Tensor:
        return (self.logits > 0).to(self.logits.dtype)

    def entropy(self) -> torch.Tensor:
        p = self.probs
        return F.binary_cross_entropy_with_logits(self.logits, p, reduction="none").sum(-1)


class TanhGMM(_TanhSquashed):
    """a = tanh(u), u ~ Σ_m w_m N(mean_m, diag(std_m²)): a mixture of M diagonal Gaussians squashed into [-1, 1]^A.

    Parameters: means, stds [..., G, M, A], mixture logits [..., G, M]. `rsample` draws the component m ~ w
    (no gradient) and then u = mean_m + std_m ε: reparameterised *within* the drawn component, so -Q(s, a~π)
    reaches every component's mean and std (an unbiased gradient for them) but not the mixture weights, which
    learn from the log-likelihood terms (filtered BC, entropy). The official AMAGO's GMM has no rsample at
    all (`actions_differentiable = False`: its online term asserts, GMM runs with online_coeff 0).
    `mode()` is the most probable component's squashed mean; `entropy()` a one-sample estimate -log π(a).
    """

    def __init__(self, means: torch.Tensor, stds: torch.Tensor, logits: torch.Tensor) -> None:
        self.means, self.stds = means, stds  # [..., G, M, A]
        self.log_w = torch.log_softmax(logits, dim=-1)  # [..., G, M]
        super().__init__(self.log_w.shape[:-1], means.dtype)

    def _log_prob_u(self, u: torch.Tensor) -> torch.Tensor:
        z = (u.unsqueeze(-2) - self.means) / self.stds  # [..., G, M, A]
        log_normal = (-0.5 * z.square() - self.stds.log() - _LOG_SQRT_2PI).sum(-1)  # [..., G, M]
        log_mix = torch.logsumexp(self.log_w + log_normal, dim=-1)  # [..., G]
        return log_mix - _tanh_log_det(u).sum(-1)

    def _rsample_u(self, shape: tuple[int, ...]) -> torch.Tensor:
        with torch.no_grad():
            comp = (self.log_w + _gumbel(shape + self.log_w.shape, self.log_w)).argmax(-1)  # [*shape, ..., G]
        A = self.means.shape[-1]
        idx = comp[..., None, None].expand(*comp.shape, 1, A)  # [*shape, ..., G, 1, A]
        full = shape + self.means.shape
        mean = self.means.expand(full).gather(-2, idx).squeeze(-2)  # [*shape, ..., G, A]
        std = self.stds.expand(full).gather(-2, idx).squeeze(-2)
        return mean + std * torch.randn_like(mean)

    def mode(self) -> torch.Tensor:
        """tanh of the most probable component's mean [..., G, A] (the official code: tanh of the mixture's
        mean Σ w_m mean_m, which can fall between two modes)."""
        best = self.log_w.argmax(-1)[..., None, None].expand(*self.batch_shape, 1, self.means.shape[-1])
        return torch.tanh(self.means.gather(-2, best).squeeze(-2))


class ShiftedBeta(ActionDistribution):
    """a = 2x - 1, x ~ Beta(alpha, beta) per action dim: a bounded policy on [-1, 1]^A without squashing
    (Chou et al. 2017). alpha, beta [..., G, A] > 1 keep every marginal unimodal.

    `rsample` is reparameterised (torch's implicit Beta/Dirichlet gradient). `mode()` is the mean,
    (alpha - beta) / (alpha + beta), the official AMAGO's deterministic action (the density's argmax is
    ill-conditioned where alpha and beta are both near 1, the flat start). `entropy()` is exact:
    H(Beta) + log 2 per dim.
    """

    LOG_PROB_CLIP: float = _TanhSquashed.LOG_PROB_CLIP

    def __init__(self, alpha: torch.Tensor, beta: torch.Tensor) -> None:
        self.alpha, self.beta = alpha, beta  # [..., G, A]
        self._beta_dist = torch.distributions.Beta(alpha, beta, validate_args=False)
        super().__init__(alpha.shape[:-1], alpha.dtype)

    def rsample(self, shape: SampleShape = ()) -> torch.Tensor:
        x = self._beta_dist.rsample(torch.Size(_shape(shape)))  # (0, 1), clamped away from 0 and 1 by torch
        return 2.0 * x - 1.0

    def log_prob(self, a_vec: torch.Tensor) -> torch.Tensor:
        """log π(a) for actions in [-1, 1] [..., G, A] -> [..., G]. Actions are clipped to ±LOG_PROB_CLIP
        (the density is 0 on the bounds); log x and log(1 - x) are taken from 1 ± a, not from x = (1 + a) / 2,
        so 1 - x keeps its digits near the upper bound."""
        a = _clip_bounds(a_vec, self.LOG_PROB_CLIP)
        log_x, log_1mx = torch.log1p(a) - _LOG_2, torch.log1p(-a) - _LOG_2
        al, be = self.alpha, self.beta
        log_norm = torch.lgamma(al + be) - torch.lgamma(al) - torch.lgamma(be)
        return ((al - 1.0) * log_x + (be - 1.0) * log_1mx + log_norm - _LOG_2).sum(-1)

    def mode(self) -> torch.Tensor:
        return (self.alpha - self.beta) / (self.alpha + self.beta)

    def entropy(self) -> torch.Tensor:
        return (self._beta_dist.entropy() + _LOG_2).sum(-1)


ContinuousDist = Literal["tanh_gaussian", "gmm", "beta"]

GMM_MIN_STD = 1e-4
"""A GMM component's smallest std (softplus(x) + GMM_MIN_STD, no upper bound), the official `GMM`'s."""
BETA_MIN_CONCENTRATION = 1.0001
"""alpha, beta = softplus(x) + BETA_MIN_CONCENTRATION (> 1: unimodal), the official `Beta`'s."""


@dataclass(frozen=True)
class ContinuousOutput:
    """The continuous policy's output layout (per discount) and its distribution.

    tanh_gaussian: [mean A | raw log-std A], log-std squashed smoothly into [min_log_std, max_log_std].
    gmm:           [means M*A | raw stds M*A | mixture logits M] (component-major, the official layout),
                   std = softplus(raw) + GMM_MIN_STD.
    beta:          [raw alpha A | raw beta A], concentration = softplus(raw) + BETA_MIN_CONCENTRATION.
    """

    kind: ContinuousDist = "tanh_gaussian"
    components: int = 5
    min_log_std: float = -5.0
    max_log_std: float = 2.0

    def width(self, action_dim: int) -> int:
        """Outputs per discount for `action_dim` action dims."""
        if self.kind == "gmm":
            return self.components * (2 * action_dim + 1)
        return 2 * action_dim

    def __call__(self, out: torch.Tensor) -> TanhGaussian | TanhGMM | ShiftedBeta:
        """The distribution of output values [..., width]."""
        if self.kind == "gmm":
            return self._gmm(out)
        first, second = out.chunk(2, dim=-1)  # [..., A] each
        if self.kind == "beta":
            return ShiftedBeta(
                F.softplus(first) + BETA_MIN_CONCENTRATION, F.softplus(second) + BETA_MIN_CONCENTRATION
            )
        if self.kind != "tanh_gaussian":
            raise ValueError(f"unknown continuous_dist {self.kind!r}; use 'tanh_gaussian', 'gmm' or 'beta'")
        # Smooth squashing into [min, max] keeps a gradient everywhere (a hard clamp would cut it).
        lo, hi = self.min_log_std, self.max_log_std
        log_std = lo + 0.5 * (hi - lo) * (torch.tanh(second) + 1.0)
        return TanhGaussian(first, log_std, lo, hi)

    def _gmm(self, out: torch.Tensor) -> TanhGMM:
        M = self.components
        A = (out.shape[-1] - M) // (2 * M)
        k = M * A
        means = out[..., :k].unflatten(-1, (M, A))  # [..., M, A]
        stds = F.softplus(out[..., k : 2 * k].unflatten(-1, (M, A))) + GMM_MIN_STD
        return TanhGMM(means, stds, out[..., 2 * k :])
