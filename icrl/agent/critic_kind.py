"""The critic's kind (`LossConfig.critic_kind`): the one place the learner turns critic outputs into Q values.

A `regression` critic outputs PopArt-normalised values: the actor reads them as they are, the TD target
denormalises them, and the loss is the squared error to the normalised target (`critic_loss`). A `twohot`
critic outputs K logits over fixed value bins (`ValueBins`): every reader takes the expectation over the bins
(unnormalised), the actor then normalises it with PopArt's statistics (which track the targets but rescale
nothing), and the loss is the cross-entropy against the bin labels of the unnormalised target
(`classification_critic_loss`). `CriticReader` hides the difference, so `icrl.agent.learner.compute_loss` reads
the same for both kinds and a regression critic computes exactly what it did before the option existed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from icrl.agent.losses import Metrics, ValueBins, classification_critic_loss, critic_loss, frozen_critic
from icrl.agent.model import Agent
from icrl.config import LossConfig
from icrl.config.errors import flag
from icrl.nets.heads import Critic, logits_at_action, q_at_action
from icrl.nets.popart import PopArt


@functools.lru_cache(maxsize=16)
def value_bins(cfg: LossConfig, device: torch.device | str | None = None) -> ValueBins | None:
    """The `twohot` critic's bins from the config; None for a regression critic. Built once per config and
    device (the update reads them every step, and a captured one cannot copy them to the device)."""
    if cfg.critic_kind != "twohot":
        return None
    return ValueBins.evenly(cfg.critic_bins, cfg.critic_min_value, cfg.critic_max_value,
                            symlog_spaced=cfg.critic_symlog_bins, sigma_bins=cfg.critic_hl_gauss_sigma, device=device)


class CriticReader:
    """Q values from the outputs of a critic of either kind (see the module docstring).

    `raw*`: unnormalised values (the TD target's); `normalized*`: PopArt-normalised ones (the actor's).
    `*_per_action`: a discrete critic's outputs for every action, [..., C, G, A(, K)] -> [..., C, G, A]."""

    def __init__(self, popart: PopArt, bins: ValueBins | None) -> None:
        self.popart, self.bins = popart, bins

    @classmethod
    def of(cls, agent: Agent, cfg: LossConfig, device: torch.device) -> CriticReader:
        """The reader of `agent`'s critics; refuses an agent whose critic is not of `cfg.critic_kind`."""
        bins = value_bins(cfg, device) if cfg.critic_kind == "twohot" else None  # (a compiled loss traces no cache)
        want = None if bins is None else cfg.critic_bins
        if agent.critic.num_bins != want:
            raise ValueError(f"{flag('critic_kind')} {cfg.critic_kind} (bins {want}) but the agent's critic has bins "
                             f"{agent.critic.num_bins}: build the agent from the same LossConfig")
        per_action = agent.spec.kind == "discrete" and not cfg.discrete_action_input
        if agent.critic.discrete != per_action:
            raise ValueError(f"{flag('discrete_action_input')} {str(cfg.discrete_action_input).lower()} "
                             "but the agent's critic was built with the other form: "
                             "build the agent from the same LossConfig")
        return cls(agent.popart, bins)

    def raw(self, out: torch.Tensor) -> torch.Tensor:
        return self.popart.denormalize(out) if self.bins is None else self.bins.value(out)

    def raw_per_action(self, out: torch.Tensor) -> torch.Tensor:
        return self.popart.denormalize_per_action(out) if self.bins is None else self.bins.value(out)

    def normalized(self, out: torch.Tensor) -> torch.Tensor:
        return out if self.bins is None else self.popart.normalize(self.bins.value(out))

    def normalized_per_action(self, out: torch.Tensor) -> torch.Tensor:
        if self.bins is None:
            return out
        return self.popart.normalize(self.bins.value(out).transpose(-1, -2)).transpose(-1, -2)

    def at_action(self, out_all: torch.Tensor, a_vec: torch.Tensor) -> torch.Tensor:
        """A discrete critic's outputs at the one-hot actions a_vec [..., G, A]: [..., C, G(, K)]."""
        return q_at_action(out_all, a_vec) if self.bins is None else logits_at_action(out_all, a_vec)

    def frozen(self, critic: Critic, s: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        """`frozen_critic(critic, s)` reading normalised values: differentiable in the action only."""
        q_fn = frozen_critic(critic, s)
        return q_fn if self.bins is None else (lambda a: self.normalized(q_fn(a)))

    def loss(self, out_sa: torch.Tensor, y: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, Metrics]:
        """The critic loss of the outputs at (s_t, a_t) [B, L, C, G(, K)] against unnormalised targets y [B, L, G]."""
        y_norm = self.popart.normalize(y)
        if self.bins is None:
            return critic_loss(out_sa, y_norm, valid)
        with torch.no_grad():
            q_norm = self.normalized(out_sa)
        return classification_critic_loss(out_sa, self.bins.labels(y), valid, q_norm, y_norm)
