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

from icrl.agent.graphs import CapturedStep, graphs_available
from icrl.config import ConfigError, ExperimentConfig, LossConfig, ModelConfig
from icrl.config.validation import memory_error
from icrl.nets.goals import GoalEmbedder
from icrl.nets.heads import Actor, Critic
from icrl.nets.popart import PopArt
from icrl.nets.traj import FFTrajEncoder, make_traj_encoder, traj_encoder_kwargs
from icrl.nets.transformer import SigmaReparamLinear, TransformerTrajEncoder
from icrl.nets.tstep import GOAL_KEY, TimestepEncoder, is_image_space
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
            n_time_freqs=model.time_freqs, reward_action=model.reward_action_input,
        )
        self.traj_encoder = make_traj_encoder(model.traj_encoder, d, **traj_encoder_kwargs(model))
        num_gammas = len(loss.gammas)
        s_dim = self.traj_encoder.d_out
        self.actor = Actor(
            s_dim, spec, num_gammas, hidden=model.head_hidden, layers=model.head_layers,
            continuous_dist=model.continuous_dist, gmm_components=model.gmm_components, trunk=model.actor_head,
            prob_clip=None if tuple(model.discrete_prob_clip) == (0.0, 1.0) else model.discrete_prob_clip,
        )
        self.critic = Critic(
            s_dim, spec, num_gammas, num_critics=loss.num_critics, hidden=model.head_hidden, layers=model.head_layers,
            num_bins=loss.critic_bins if loss.critic_kind == "twohot" else None,  # the critic's kind (docs/method.md)
            action_input=loss.discrete_action_input,  # discrete actions as inputs (AMAGO-2), docs/method.md
        )
        # Targets never receive gradients; they move only by EMA (icrl.nets.ema.ema_update_).
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
        a learner update, loading weights or a checkpoint, a manual edit. Only marks them stale (cheap: once
        per update); `update_acting_weights` recomputes the stale ones."""
        for m in self._sigma_layers():
            m.refresh_acting_weight()

    def update_acting_weights(self) -> None:
        """Recompute every stale σReparam acting snapshot now, in place: what a captured acting step must do
        before each replay, as the replay runs no Python that would notice a stale one."""
        stale = [m for m in self._sigma_layers() if m._acting_stale or m._acting_weight is None]
        if stale:
            with torch.inference_mode(False):
                for m in stale:
                    m.acting_weight()

    def _sigma_layers(self) -> list[SigmaReparamLinear]:
        layers = self.__dict__.get("_sigma_list")  # found once: the module tree does not change
        if layers is None:
            layers = [m for m in self.modules() if isinstance(m, SigmaReparamLinear)]
            self.__dict__["_sigma_list"] = layers
        return layers

    def online_parameters(self) -> list[nn.Parameter]:
        """What the optimiser trains: everything but the EMA targets."""
        skip = {id(p) for p in [*self.target_actor.parameters(), *self.target_critic.parameters()]}
        return [p for p in self.parameters() if id(p) not in skip]


def build_agent(cfg: ExperimentConfig, obs_space: gym.spaces.Dict, spec: ActionSpec,
                device: str | torch.device) -> Agent:
    """A fresh agent (random weights) for observations `obs_space` (the env's "obs" entry) and actions `spec`: the one
    place an agent is constructed (`icrl train`, the asynchronous learner and collectors, `icrl eval`, `icrl.load`),
    so a run's weights fit whatever any of them builds. ConfigError (one line) when the weights and batches cannot
    fit in memory for observations of this size: the config's check at parse time does not know the env's spaces (a
    Box of 10^8 numbers, or spaces.json's)."""
    parts = obs_space.spaces.values() if isinstance(obs_space, gym.spaces.Dict) else [obs_space]
    sizes = [(int(np.prod(p.shape)), is_image_space(p)) for p in parts if p.shape is not None]
    numbers = (sum(n for n, image in sizes if not image), sum(n for n, _ in sizes))
    if problem := memory_error(cfg, obs_numbers=numbers):
        raise ConfigError(f"observations of {numbers[1]:,} numbers: {problem}")
    return Agent(obs_space, spec, cfg.model, cfg.loss).to(device)


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

    One acting step, `step`, whichever way it runs. Eager (the default on a CPU): on the caller's timesteps,
    with the KV ring's books on the host. `static` (default: on CUDA, with a Transformer or memoryless encoder,
    unless `cuda_graphs` is False): on static input buffers (one host-to-device copy per step), with the books on
    the device (`KVCache` static: the books are the cache's strategy, the step is the same), captured as a CUDA
    graph (`icrl.agent.graphs`), one per choice of greedy / sampled actions; a static step also runs eagerly on a
    CPU when asked for (the tests do).
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
        static: bool | None = None,
        cuda_graphs: bool = True,
    ) -> None:
        self.agent, self.greedy, self.exploration, self.sample = agent, greedy, exploration, sample
        self.env_steps, self.device = env_steps, torch.device(device)
        enc = agent.traj_encoder
        capturable = isinstance(enc, (TransformerTrajEncoder, FFTrajEncoder))  # RNN states are replaced per step
        if static is None:
            static = capturable and graphs_available(self.device, cuda_graphs)
        if static and not capturable:
            raise ValueError(f"a static acting step needs a Transformer or memoryless encoder, "
                             f"not {type(enc).__name__}")
        self.static, self.num_envs = static, num_envs
        self.graphs = static and graphs_available(self.device, cuda_graphs)
        # the encoder's acting state: a KV cache, an RNN hidden state or None (`TrajEncoder` types it Any)
        if isinstance(enc, TransformerTrajEncoder):
            self.state: Any = enc.init_state(num_envs, self.device, static=static)
        else:
            self.state = enc.init_state(num_envs, self.device)
        self._inputs: StagedInputs | None = None  # the static step's input buffers, from the first timesteps
        self._steps: dict[bool, CapturedStep] = {}  # sampled (True) / mode (False) -> its captured step
        self.seconds = 0.0

    @torch.inference_mode()
    def act(self, ts: Timesteps, new_rollout: np.ndarray) -> np.ndarray:
        start = time.perf_counter()
        agent = self.agent
        if agent.training:
            agent.eval()
        if new_rollout.any() and self.exploration is not None:
            self.exploration.new_rollouts(new_rollout)
        sampled = self.sample and not self.greedy
        host_time = ts.time[:, 0]
        step = self._act_static if self.static else self._act_eager
        if torch.is_autocast_enabled(self.device.type):  # acting is float32 (docs/design.md §5)
            with torch.autocast(self.device.type, enabled=False):
                a_vec = step(ts, new_rollout, sampled)
        else:
            a_vec = step(ts, new_rollout, sampled)
        actions = agent.spec.from_vector(a_vec)
        if self.exploration is not None and not self.greedy:
            actions = self.exploration(actions, self.env_steps(), host_time.cpu().numpy())
        self.seconds += time.perf_counter() - start
        return actions

    def _act_eager(self, ts: Timesteps, new_rollout: np.ndarray, sampled: bool) -> np.ndarray:
        """`step` on the caller's timesteps, with the encoder's own books (host-side KV bookkeeping, attention over
        the occupied slots)."""
        if ts.time.device != self.device:
            ts = ts.to(self.device)
        resets = new_rollout if new_rollout.any() else None  # most steps start no rollout: nothing to empty
        return self.step(ts, resets, sampled).cpu().numpy()

    def _act_static(self, ts: Timesteps, new_rollout: np.ndarray, sampled: bool) -> np.ndarray:
        """One step of fixed shapes from static buffers: one copy in, the (captured) step, one copy out."""
        if self._inputs is None:
            self._inputs = StagedInputs(ts, self.num_envs, self.device)
        self._inputs.load(ts, new_rollout)
        self.agent.update_acting_weights()  # a replay does not see a stale σReparam snapshot by itself
        step = self._steps.get(sampled)
        if step is None:
            step = self._steps[sampled] = CapturedStep(self._static_step, enabled=self.graphs, what="acting step",
                                                       args=(sampled,))
        return self._inputs.read(step())

    def _static_step(self, sampled: bool) -> torch.Tensor:
        """`step` on the static inputs (what a CUDA graph captures and replays)."""
        inputs = self._inputs
        assert inputs is not None
        return self.step(inputs.timesteps, inputs.new_rollout, sampled)

    def step(self, ts: Timesteps, new_rollout: torch.Tensor | np.ndarray | None, sampled: bool) -> torch.Tensor:
        """The one acting step, eager or captured: rows that start a new rollout (`new_rollout` [N]; None: none
        does) forget their context, then one timestep ([N, 1, ...]) through the encoders and the policy head ->
        action vectors [N, A] (float32). The encoder's state changes in place (a static KV cache) or is replaced
        (an RNN's)."""
        agent = self.agent
        if new_rollout is not None:
            self.state = agent.traj_encoder.reset_state(self.state, new_rollout)
        x = agent.tstep_encoder(ts)[:, 0]  # [N, d]
        s, self.state = agent.traj_encoder.step(x, ts.time[:, 0], self.state)  # [N, d]
        dist = agent.actor.policy(s)  # the policy's discount (the last one): batch [N]
        return (dist.sample() if sampled else dist.mode()).float()  # [N, A]


class StagedInputs:
    """The static acting step's inputs on the device ([N, 1, ...] timesteps and the [N] new-rollout flags),
    filled from the host through one pinned buffer and one copy per step; and its action output, read back
    through one pinned buffer. On a CPU device the buffers are plain tensors."""

    def __init__(self, ts: Timesteps, num_envs: int, device: torch.device) -> None:
        leaves = ts.named()
        self.names = list(leaves)
        specs = [(name, x.shape, x.dtype) for name, x in leaves.items()] + [("new_rollout", (num_envs,), torch.bool)]
        pin = device.type != "cpu"
        with torch.inference_mode(False):  # normal tensors, written in place by every step, inside or outside
            self.host, self.host_views = _carve(specs, "cpu", pin)  # [bytes], name -> view
            self.dev, views = _carve(specs, device, False) if pin else (self.host, self.host_views)
        self.timesteps = Timesteps(obs={k[4:]: v for k, v in views.items() if k.startswith("obs/")},
                                   prev_action=views["prev_action"], prev_reward=views["prev_reward"],
                                   time=views["time"], reset=views["reset"])
        self.new_rollout = views["new_rollout"]
        self._out: torch.Tensor | None = None

    def load(self, ts: Timesteps, new_rollout: np.ndarray) -> None:
        leaves = ts.named()
        if list(leaves) != self.names:
            raise ValueError(f"the timesteps' keys changed between acting steps: {list(leaves)} vs {self.names}")
        for name, x in leaves.items():
            self.host_views[name].copy_(x)
        self.host_views["new_rollout"].copy_(torch.from_numpy(np.asarray(new_rollout, dtype=bool)))
        if self.dev is not self.host:
            self.dev.copy_(self.host, non_blocking=True)

    def read(self, out: torch.Tensor) -> np.ndarray:
        """The step's output [N, A] on the host (waits for the device)."""
        if out.device.type == "cpu":
            return out.numpy().copy()
        if self._out is None or self._out.shape != out.shape:
            self._out = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
        self._out.copy_(out, non_blocking=True)
        torch.cuda.current_stream(out.device).synchronize()
        return self._out.numpy().copy()


def _carve(specs: list[tuple[str, Any, torch.dtype]], device: torch.device | str,
           pin: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One byte buffer on `device` (pinned on the host when `pin`) and a view of it per (name, shape, dtype),
    each 64-byte aligned."""
    offsets, total = [], 0
    for _, shape, dtype in specs:
        offsets.append(total)
        nbytes = int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
        total += -(-nbytes // 64) * 64
    buf = torch.zeros(total, dtype=torch.uint8, device=device, pin_memory=pin)
    views = {}
    for (name, shape, dtype), off in zip(specs, offsets):
        nbytes = int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
        views[name] = buf[off : off + nbytes].view(dtype).view(tuple(shape))
    return buf, views
