"""The networks (group `model`): timestep encoder, trajectory encoder and the actor / critic heads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from icrl.config.bounds import bounded

DEFAULT_CONTEXT = 256  # the context of a task that recommends none


@dataclass(frozen=True)
class ModelConfig:
    traj_encoder: Literal["transformer", "gru", "lstm", "ff"] = "transformer"
    """Sequence model over the rollout; `ff` is the memoryless baseline."""
    d_model: int = bounded(64, ge=1)
    """Width of the timestep embedding and of the trajectory encoder (the paper's larger runs use 128-512)."""
    layers: int = bounded(2, ge=1, le=1024)
    """Transformer layers (or RNN layers)."""
    heads: int = bounded(4, ge=1)
    """Attention heads."""
    d_ff: int | None = bounded(None, ge=1)
    """Hidden width of the Transformer's feed-forward blocks (unset: 4 x --d-model, the usual ratio)."""
    max_seq_len: int | None = None
    """The Transformer's context while acting (a sliding window beyond it) and the training window's length.
    Unset: what the task recommends for itself (T-Maze N: its whole rollout, N + 1; `recommended_context` in
    docs/tasks.md), else 256. A run whose rollouts are longer than the context says so once."""
    max_time: int = bounded(4096, ge=1)
    """Largest time index with its own learned embedding (later steps share the last one)."""
    pos_emb: Literal["learned", "sinusoidal", "none", "rope"] = "sinusoidal"
    """Time-position embedding of the Transformer (as the official AMAGO's default "fixed"); `learned` is a
    table initialised N(0, 1), at the scale of the token embedding it is added to; `rope` rotates every layer's
    queries and keys by the rollout time instead of adding anything (needs an even --d-model / --heads)."""
    dropout: float = bounded(0.0, ge=0.0, lt=1.0)
    """Dropout on the Transformer's residual branches."""
    attn_dropout: float = bounded(0.0, ge=0.0, lt=1.0)
    """Dropout on the Transformer's attention weights."""
    emb_dropout: float = bounded(0.0, ge=0.0, lt=1.0)
    """Dropout on the Transformer's input embedding (timestep embedding + time-position embedding)."""
    tstep_hidden: int = bounded(128, ge=1)
    """Hidden width of the timestep encoder's MLP, and the feature width of each image key's CNN."""
    time_freqs: int = bounded(4, ge=0, le=64)
    """Sinusoids of the rollout time (periods from 4 steps to `max_time`) among the timestep encoder's inputs,
    beside the linear time feature. They slow a critic that must learn a statistic of the history's contents (the
    bandit's: ~200 updates later than without) and hand a task whose lag is one of the periods its answer
    (RepeatPreviousEasy, lag 4); with 0, `--pos-emb rope` gives attention relative positions at every lag
    (docs/results.md, "The bandit: where the late start is")."""
    reward_action_input: bool = True
    """Also give the timestep encoder the previous action times symlog(previous reward), one input per action
    dimension: which action paid, the statistic a meta-RL history is read for. From the two inputs alone the
    encoder learns that product late, under the time sinusoids (the bandit's critic reads the history 0.70 at 300
    updates with it, 0.10 without; with the same initial weights and the inputs zeroed, 0.28). Its weights are drawn
    apart from the others', so every other weight starts as without it and a task whose rewards are 0 runs nearly
    as without it. A departure from AMAGO's timestep (which carries the two apart); `--no-reward-action-input`
    restores it (docs/method.md, "The previous action times the reward, as an input")."""
    normalize_obs: bool = True
    """Normalise vector observations with running mean / variance (updated from every training batch), so
    tasks whose observations differ in scale by orders of magnitude need no hand-made scaling."""
    clip_obs: float = bounded(10.0, gt=0.0)
    """Normalised vector observations are clipped to [-clip_obs, clip_obs], so an outlier cannot saturate
    the timestep encoder."""
    head_hidden: int = bounded(128, ge=1)
    """Hidden width of the actor and critic MLP heads."""
    head_layers: int = bounded(2, ge=0, le=1024)
    """Hidden layers of the actor and critic MLP heads (the residual actor's residual blocks)."""
    actor_head: Literal["mlp", "residual"] = "mlp"
    """The actor's trunk: an MLP, or `residual` (the official AMAGO's ResidualActor: a --head-hidden wide feature
    through --head-layers residual blocks of width 2 x --head-hidden)."""
    continuous_dist: Literal["tanh_gaussian", "gmm", "beta"] = "tanh_gaussian"
    """The policy of continuous actions: a tanh-squashed Gaussian, a tanh-squashed Gaussian mixture (`gmm`,
    --gmm-components), or a Beta rescaled to [-1, 1]. Discrete and multi-binary actions ignore it."""
    discrete_prob_clip: tuple[float, float] = (0.0, 1.0)
    """A discrete policy's probabilities are clamped to [low, high] and renormalised by a detached sum, as the
    official AMAGO's `Discrete` policy does (its default: 0.001 0.99). A probability at a bound then gets no
    gradient from either actor term, so the policy stops sharpening there and keeps sampling the other actions.
    0 1: the plain softmax (docs/method.md)."""
    gmm_components: int = bounded(5, ge=1, le=1024)
    """Components of the `gmm` policy (--continuous-dist gmm)."""
    cnn: Literal["impala", "nature"] = "impala"
    """CNN for image observations."""
    goal_dim: int = bounded(32, ge=1, le=65_536)
    """Width of the instruction embedding (tasks with a "goal" observation, docs/CONTRACTS.md)."""
    goal_view: Literal["full", "current"] = "full"
    """Instruction the agent sees: every remaining sub-goal, or only the current one (the paper's ablation)."""

    @property
    def context(self) -> int:
        """`max_seq_len`, or the library's default context where it is unset (a run resolves it first)."""
        return DEFAULT_CONTEXT if self.max_seq_len is None else self.max_seq_len

    @property
    def training_window(self) -> int:
        """Timesteps per training window: the acting context plus one.

        The critic learns Q(s_t) from the TD target at s_{t+1}, so the window must hold a full context *and* the
        step after it. With windows of only `max_seq_len` timesteps, a rollout of exactly context + 1 timesteps
        (T-Maze's corridor + junction + final observation) is cut one way or the other: either the cue at t = 0 or
        the junction's transition to the final state falls outside every window, and the junction's value can
        never be learned from memory. The Transformer's banded mask keeps each position's receptive field at
        `max_seq_len`, exactly what acting sees."""
        return self.context + 1
