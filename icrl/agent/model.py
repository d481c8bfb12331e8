"""The agent: one timestep encoder and one trajectory encoder shared by an actor and a critic ensemble.

This file only builds and connects networks; the loss math lives in `icrl.agent.losses` and is assembled in
`icrl.agent.learner`. Target networks are EMA copies of the heads alone: the targets read the online
encoder's (detached) states, so one forward pass over the sequence serves every term (docs/design.md §3, §4).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from icrl.config import LossConfig, ModelConfig
from icrl.nets.goals import GoalEmbedder
from icrl.nets.heads import Actor, Critic
from icrl.nets.popart import PopArt
from icrl.nets.traj import make_traj_encoder, traj_encoder_kwargs
from icrl.nets.transformer import refresh_acting_weights
from icrl.nets.tstep import GOAL_KEY, TimestepEncoder
from icrl.types import ActionSpec, Timesteps

if TYPE_CHECKING:
    from icrl.agent.exploration import Exploration


def goal_embedder(obs_space: gym.spaces.Dict, model: ModelConfig) -> GoalEmbedder | None:
    """An instruction embedder when the task shows one (obs key "goal": int tokens 0..V, docs/CONTRACTS.md)."""
    space = obs_space.spaces.get(GOAL_KEY)
    if space is None:
        return None
    if not (isinstance(space, gym.spaces.Box) and np.issubdtype(space.dtype, np.integer) and len(space.shape) == 1):
        raise ValueError(
            f"obs['goal'] is {space!r}; goal-conditioned tasks give a 1-D integer Box of goal tokens "
            "(docs/CONTRACTS.md). Rename the key if it is an ordinary observation."
        )
    vocab = int(np.max(space.high))
    return GoalEmbedder(vocab, space.shape[0], d_out=model.goal_dim, d_token=model.goal_dim, view=model.goal_view)


class Agent(nn.Module):
    gammas: torch.Tensor  # buffer [G], registered in __init__

    def __init__(self, obs_space: gym.spaces.Dict, spec: ActionSpec, model: ModelConfig, loss: LossConfig) -> None:
        super().__init__()
        self.spec = spec
        d = model.d_model
        self.tstep_encoder = TimestepEncoder(
            obs_space, spec.dim, d_out=d, hidden=model.tstep_hidden, max_time=model.max_time, cnn=model.cnn,
            normalize_obs=model.normalize_obs, clip_obs=model.clip_obs, goal_embedder=goal_embedder(obs_space, model),
        )
        self.traj_encoder = make_traj_encoder(model.traj_encoder, d, **traj_encoder_kwargs(model))
        num_gammas = len(loss.gammas)
        s_dim = self.traj_encoder.d_out
        self.actor = Actor(
            s_dim, spec, num_gammas, hidden=model.head_hidden, layers=model.head_layers,
            continuous_dist=model.continuous_dist, gmm_components=model.gmm_components, trunk=model.actor_head,
        )
        self.critic = Critic(
            s_dim, spec, num_gammas, num_critics=loss.num_critics, hidden=model.head_hidden, layers=model.head_layers,
            num_bins=loss.critic_bins if loss.critic_kind == "twohot" else None,  # the critic's kind (docs/method.md)
            action_input=loss.discrete_action_input,  # discrete actions as inputs (AMAGO-2), docs/method.md
        )
        # Targets never receive gradients; they move only by EMA (icrl.nets.popart.ema_update_).
        self.target_actor = copy.deepcopy(self.actor).requires_grad_(False)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.popart = PopArt(num_gammas, beta=loss.popart_beta, enabled=loss.popart, max_ratio=loss.popart_floor)
        self.register_buffer("gammas", torch.tensor(loss.gammas, dtype=torch.float32))

    def forward(self, ts: Timesteps) -> torch.Tensor:
        """Every timestep's state in one pass: [B, L, d]."""
        return self.traj_encoder(self.tstep_encoder(ts), ts.time)

    def refresh_acting_weights(self) -> None:
        """Make acting see the current weights. Acting multiplies by σReparam snapshots (see
        `SigmaReparamLinear`), so call this after every change of weights or σReparam buffers outside acting:
        a learner update, loading weights or a checkpoint, a manual edit."""
        refresh_acting_weights(self)

    def online_parameters(self) -> list[nn.Parameter]:
        """What the optimiser trains: everything but the EMA targets."""
        skip = {id(p) for p in [*self.target_actor.parameters(), *self.target_critic.parameters()]}
        return [p for p in self.parameters() if id(p) not in skip]


class AgentPolicy:
    """Acts in N parallel envs, one timestep at a time, keeping the encoder's KV cache / hidden state.

    Implements the collector's policy protocol. Greedy policies take the mode of the policy-discount
    head; exploratory ones sample it (or take its mode, `sample=False`: `ExploreConfig.train_actions`)
    and then apply `exploration`.

    Mode contract: acting needs the agent in eval mode (frozen σReparam power iteration, no dropout,
    cached effective weights). `act` switches the agent to eval mode when it finds it training and
    leaves it there, so a collection phase pays for the switch once, not once per step; the learner
    switches back (`Learner.update` starts with `agent.train()`). `act` runs under
    `torch.inference_mode`. `seconds` accumulates the wall time spent inside `act`.
    """

    def __init__(
        self,
        agent: Agent,
        num_envs: int,
        *,
        greedy: bool,
        exploration: Exploration | None = None,
        env_steps: Callable[[], int] = lambda: 0,
        device: torch.device | str = "cpu",
        sample: bool = True,
    ) -> None:
        self.agent, self.greedy, self.exploration, self.sample = agent, greedy, exploration, sample
        self.env_steps, self.device = env_steps, torch.device(device)
        # the encoder's acting state: a KV cache, an RNN hidden state or None (`TrajEncoder` types it Any)
        self.state: Any = agent.traj_encoder.init_state(num_envs, self.device)
        self.seconds = 0.0

    @torch.inference_mode()
    def act(self, ts: Timesteps, new_rollout: np.ndarray) -> np.ndarray:
        start = time.perf_counter()
        agent = self.agent
        if agent.training:
            agent.eval()
        if new_rollout.any():
            self.state = agent.traj_encoder.reset_state(self.state, new_rollout)
            if self.exploration is not None:
                self.exploration.new_rollouts(new_rollout)
        host_time = ts.time[:, 0]
        if host_time.device != self.device:
            ts = ts.to(self.device)
        x = agent.tstep_encoder(ts)[:, 0]  # [N, d]
        s, self.state = agent.traj_encoder.step(x, ts.time[:, 0], self.state)  # [N, d]
        dist = agent.actor.policy(s)  # the policy's discount (the last one): batch [N]
        a_vec = dist.sample() if self.sample and not self.greedy else dist.mode()  # [N, A]
        actions = agent.spec.from_vector(a_vec.float().cpu().numpy())
        if self.exploration is not None and not self.greedy:
            actions = self.exploration(actions, self.env_steps(), host_time.cpu().numpy())
        self.seconds += time.perf_counter() - start
        return actions
