"""The learning objective (group `loss`): discounts, TD targets, REDQ, the actor's terms and PopArt."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from icrl.config.bounds import bounded

LONG_CONTEXT = 256
"""Contexts longer than this get PopArt's floor, and n-step returns where exploration leaves the rollout greedy,
unless set (`icrl.config.resolve`)."""
LONG_CONTEXT_MAX_RATIO = 5.0
"""PopArt's floor for long contexts (`popart_max_ratio`)."""
TIMESTEPS_PER_N_STEP = 64
"""Long contexts with greedy windows take n = context // this: a reward crosses the context in ~64 hops."""

TWOHOT_FIELDS = ("critic_bins", "critic_min_value", "critic_max_value", "critic_symlog_bins", "critic_hl_gauss_sigma")
"""The fields that shape a `twohot` critic (`LossConfig.critic_kind`); a regression critic refuses them."""

CATEGORICAL_ENTROPY_COEFF = 0.03
"""The actor's entropy bonus where `entropy_coeff` is unset and the actions are Discrete (docs/results.md, "An
entropy bonus: a flat critic leaves the policy spread")."""

DEFAULT_GAMMAS: tuple[float, ...] = (0.1, 0.9, 0.95, 0.97, 0.99, 0.995, 0.999)
"""The official AMAGO's discounts: short horizons learn fast and shape the encoder, 0.999 is the policy's."""


@dataclass(frozen=True)
class LossConfig:
    gammas: tuple[float, ...] = DEFAULT_GAMMAS
    """Discounts learned in parallel; the last one is the policy's."""
    num_critics: int = bounded(4, ge=1)
    """Critic ensemble size C."""
    redq_subset: int = 2
    """Target critics drawn at random per update and reduced into the target (REDQ)."""
    redq_reduce: Literal["min", "mean"] = "min"
    """How the drawn target critics are reduced: their `min` (REDQ's pessimism against overestimation) or
    their `mean` (less pessimistic; with --redq-subset = --num-critics, the plain ensemble average)."""
    reward_scale: float = bounded(10.0, gt=0.0)
    """Rewards are multiplied by this before the TD target (the official AMAGO's default). With PopArt the
    critics' targets are normalised anyway; the scale sets how far above PopArt's σ floor small returns lie."""
    online_coeff: float = bounded(1.0, ge=0.0)
    """Weight of the -Q(s, a~pi) actor term."""
    online_reduce: Literal["mean", "min"] = "mean"
    """How the online term -Q(s, a~pi) reduces the critic ensemble: its `mean`, or its `min` (the official AMAGO's:
    pessimistic where the members disagree, as they do about actions the replay seldom holds)."""
    offline_coeff: float = bounded(0.1, ge=0.0)
    """Weight of the filtered behaviour-cloning actor term."""
    bc_filter: Literal["binary", "exp"] = "binary"
    """Advantage filter of the BC term: 1[A>0], or clamp(exp(A / beta))."""
    exp_beta: float = bounded(1.0, gt=0.0)
    """`exp` filter: temperature beta of exp(A / beta); smaller beta weights high-advantage actions more."""
    exp_clip: float = bounded(20.0, gt=0.0)
    """`exp` filter: upper bound of the BC weight, so one large advantage cannot dominate the batch."""
    num_value_samples: int = bounded(1, ge=1, le=1024)
    """Continuous / multi-binary actions (and `discrete_action_input`'s online term): actions a_k ~ pi sampled per
    state for the online term -mean_k Q(s, a_k) and the advantage's baseline V(s) = mean_k Q(s, a_k); discrete
    actions sum exactly. 1, the official AMAGO's default: these critic rows are the continuous update's largest
    cost."""
    entropy_coeff: float | None = bounded(None, ge=0.0)
    """Entropy bonus c of the actor, on PopArt-normalised values: the online term then aims at softmax(Q / c), so
    value differences well below c (a critic that has seen no reward yet) leave a categorical policy spread instead
    of letting Adam's normalised steps collapse it onto noise (docs/method.md, "Departures from AMAGO's learning
    rule"). Unset: CATEGORICAL_ENTROPY_COEFF for Discrete actions, 0 for continuous and multi-binary ones, whose
    one-sample bonus kept Pendulum's Gaussian wide (`entropy_for`; a run resolves it from its action space,
    `icrl.config.resolve`). 0 is the paper's loss."""
    conservative_coeff: float = bounded(0.1, ge=0.0)
    """Discrete per-action critics: weight of a conservative term (CQL(H), Kumar et al. 2020) added to every member's
    and discount's critic loss, logsumexp_a Q(s_t, a) - Q(s_t, a_t) on PopArt-normalised values. It lowers the values
    of actions the replay does not hold at a state, which the squared TD error never fits and which are otherwise
    extrapolated from neighbouring states' (a solved T-Maze fell back when they were; docs/method.md, "Departures
    from AMAGO's learning rule"). 0 is AMAGO's critic loss; continuous, multi-binary and `discrete_action_input`
    critics ignore it."""
    conservative_temperature: float = bounded(1.0, gt=0.0)
    """The conservative term's temperature τ: τ · logsumexp_a (Q(s_t, a) / τ) − Q(s_t, a_t). Its gradient lowers
    every action by softmax_a (Q / τ) and raises the stored one, summing to the same α whatever τ. 1 is CQL(H)'s;
    a smaller τ lowers mainly the actions valued above the stored one, so it still pushes an action the replay never
    holds below the stored ones but no longer favours a stored action for being stored more often (docs/method.md,
    "The conservative term's temperature")."""
    critic_weight: float = bounded(10.0, gt=0.0)
    """Weight of the critic loss against the actor loss."""
    critic_kind: Literal["regression", "twohot"] = "regression"
    """How the critics learn. `regression`: squared error to the PopArt-normalised TD target (the AMAGO paper).
    `twohot`: classification, the scale-resistant critic of AMAGO-2 (official `MultiTaskAgent`): K logits per
    member, discount (and action), cross-entropy against two-hot (or HL-Gauss) labels of the unnormalised TD
    target, read as the expectation over the bins. PopArt then only normalises the actor's Q (docs/method.md)."""
    discrete_action_input: bool = False
    """Discrete actions: the critic takes the one-hot action as an input, Q(s, a) -> one value (or K bin logits) per
    member and discount as for continuous actions, instead of one output per action (AMAGO-2's `MultiTaskAgent`): its
    size no longer grows with the number of actions. Off by default: an update costs several times the default's
    (docs/method.md), since the online term -Q(s, a~pi) runs the critic forward and backward on `num_value_samples`
    straight-through Gumbel-softmax samples per discount (a biased gradient) instead of the exact sum over actions;
    the TD target and the advantage's V(s) stay exact sums over the A one-hot actions while A <= len(gammas), and use
    sampled actions beyond. Continuous and multi-binary critics take the action as input anyway and ignore it."""
    critic_bins: int = bounded(128, ge=2, le=65_536)
    """`twohot` critic: value bins K (the official `output_bins`)."""
    critic_min_value: float = -100_000.0
    """`twohot` critic: the lowest bin, in unnormalised value space (returns of reward_scale x rewards); TD
    targets below it are clamped to it. The official default is this extreme value; a task's own bound (its
    lowest return) gives finer bins."""
    critic_max_value: float = 100_000.0
    """`twohot` critic: the highest bin (see --critic-min-value)."""
    critic_symlog_bins: bool = True
    """`twohot` critic: bins evenly spaced in symlog(value) (Dreamer-V3, the official default: fine near 0, coarse
    at large returns), labels and expectation taken in that space; false: evenly spaced in value."""
    critic_hl_gauss_sigma: float = bounded(0.0, ge=0.0)
    """`twohot` critic: HL-Gauss labels (Farebrother et al. 2024) of this width in bin widths (they recommend
    0.75); 0: plain two-hot labels, as the official code."""
    n_step: int | None = bounded(None, ge=1, le=65_536)
    """n-step TD returns. Unset: 1, or one step per 64 timesteps of context (T-Maze 500, context 501: 7) for a
    context longer than 256 whose exploration is a `window` (random actions only at the task's decision steps),
    so a reward's value reaches the start of a long rollout in ~64 bootstrap hops instead of one per timestep;
    under flat ε-greedy an n-step window holds random actions, so 1 (`icrl.config.resolve`; docs/results.md)."""
    tau: float = bounded(0.003, gt=0.0, le=1.0)
    """EMA rate of the target actor and critics."""
    popart: bool = True
    """Normalise value targets with PopArt."""
    popart_beta: float = bounded(5e-4, gt=0.0, le=1.0)
    """PopArt statistics step size (bias-corrected: the first update takes the first batch's moments)."""
    popart_max_ratio: float | None = bounded(None, ge=0.0)
    """A floor on PopArt's scale: at least (largest |target - mean| of a batch, averaged) / this, so rare large
    targets (sparse rewards, long corridors) are at most this many scale units away (icrl.nets.popart). 0: no
    floor (the plain standard deviation, as the official code). Unset: 5 for a context longer than 256 timesteps,
    where long corridors need it, else no floor, which short contexts learn faster with (`icrl.config.resolve`;
    docs/results.md)."""

    @property
    def td_steps(self) -> int:
        """`n_step`, or 1 where it is unset (a run resolves it first, from its context)."""
        return 1 if self.n_step is None else self.n_step

    def entropy_for(self, discrete: bool) -> float:
        """`entropy_coeff`, or where it is unset the default for the policy's kind (a run resolves it first, from
        its action space; a config built by hand gets the same value here)."""
        if self.entropy_coeff is not None:
            return self.entropy_coeff
        return CATEGORICAL_ENTROPY_COEFF if discrete else 0.0

    @property
    def popart_floor(self) -> float | None:
        """`popart_max_ratio` as PopArt takes it: None for no floor (unset or 0)."""
        return self.popart_max_ratio or None
