"""Actor and critic-ensemble heads on top of the trajectory encoder's states (docs/design.md §3).

Both heads produce one output per discount g (G in all): the actor one policy π_g per discount, the
critic C ensemble members × G discounts. The ensemble is evaluated as one batched matmul per layer
(weights [C, in, out]), never a Python loop over members or discounts.

Critic outputs live in PopArt-normalised space; `Critic.rescale_output_` lets `icrl.nets.popart.PopArt`
change its statistics without changing the unnormalised values (the output layer is affine in its
weights, so rescaling it per discount is exact). A classification critic (`num_bins=K`) emits K logits over
value bins per output instead (the learner reads them through `icrl.agent.losses.ValueBins`).
"""

from __future__ import annotations

import math
from typing import TypedDict

import torch
import torch.nn.functional as F
from torch import nn

from icrl.nets.actor_parts import LEAKY_SLOPE, ActorTrunk, ResidualTrunk
from icrl.nets.dists import Bernoulli, Categorical, ContinuousDist, ContinuousOutput, Distribution
from icrl.types import ActionSpec


def mlp(d_in: int, d_out: int, hidden: int, layers: int) -> nn.Sequential:
    """`layers` × (Linear -> LayerNorm -> LeakyReLU), then a Linear to d_out."""
    mods: list[nn.Module] = []
    d = d_in
    for _ in range(layers):
        mods += [nn.Linear(d, hidden), nn.LayerNorm(hidden), nn.LeakyReLU(LEAKY_SLOPE)]
        d = hidden
    mods.append(nn.Linear(d, d_out))
    return nn.Sequential(*mods)


class Actor(nn.Module):
    """π_g(a | s) for every discount g from one network whose last layer has G output groups.

    `forward(s [..., d]) -> dist` with batch shape [..., G] (usually [B, L, G]); samples are action
    vectors [..., G, A]. The policy that acts is the last discount's (index -1).
    `trunk`: "mlp" (`mlp`, `layers` hidden layers) or "residual" (`ResidualTrunk`, `layers` residual blocks);
    `continuous_dist` / `gmm_components`: the policy of continuous actions (`ContinuousOutput`), which sets
    the output width. Discrete and multi-binary actions ignore them. `prob_clip` (low, high): a discrete policy's
    probabilities clamped to it and renormalised (`Categorical`); None: the plain softmax.
    """

    def __init__(
        self,
        d_in: int,
        spec: ActionSpec,
        num_gammas: int,
        hidden: int = 256,
        layers: int = 2,
        min_log_std: float = -5.0,
        max_log_std: float = 2.0,
        continuous_dist: ContinuousDist = "tanh_gaussian",
        gmm_components: int = 5,
        trunk: ActorTrunk = "mlp",
        prob_clip: tuple[float, float] | None = None,
    ) -> None:
        super().__init__()
        self.spec, self.num_gammas, self.prob_clip = spec, num_gammas, prob_clip
        self.min_log_std, self.max_log_std = min_log_std, max_log_std
        self.continuous = ContinuousOutput(continuous_dist, gmm_components, min_log_std, max_log_std)
        per_gamma = self.continuous.width(spec.dim) if spec.kind == "continuous" else spec.dim
        self.net: nn.Sequential | ResidualTrunk
        if trunk == "residual":
            self.net = ResidualTrunk(d_in, num_gammas * per_gamma, hidden, layers)
            self._hidden_layers: tuple[nn.Module, ...] = ()
        elif trunk == "mlp":
            self.net = mlp(d_in, num_gammas * per_gamma, hidden, layers)
            # the hidden layers for the acting step, gathered once (not per step); deepcopy maps them to the copy's
            self._hidden_layers = tuple(self.net)[:-1]
        else:
            raise ValueError(f"unknown actor trunk {trunk!r}; use 'mlp' or 'residual'")
        # A small last layer starts every head near a uniform / centred policy.
        with torch.no_grad():
            self._out_layer().weight.mul_(0.1)
            self._out_layer().bias.zero_()

    def _out_layer(self) -> nn.Linear:
        """The output Linear (`mlp` ends on one, `ResidualTrunk` names it `out`)."""
        last = self.net.out if isinstance(self.net, ResidualTrunk) else self.net[-1]
        if not isinstance(last, nn.Linear):
            raise TypeError(f"Actor.net must end on an nn.Linear, got {type(last).__name__}")
        return last

    def _features(self, s: torch.Tensor) -> torch.Tensor:
        """The output layer's input, submodules called without nn.Module overhead where it is an MLP."""
        if isinstance(self.net, ResidualTrunk):
            return self.net.features(s)
        h = s
        for layer in self._hidden_layers:
            h = layer.forward(h)
        return h

    def forward(self, s: torch.Tensor) -> Distribution:
        return self._dist(self.net(s).unflatten(-1, (self.num_gammas, -1)))  # [..., G, per-discount width]

    def policy(self, s: torch.Tensor) -> Distribution:
        """The acting policy π_{G-1}(a | s) alone: batch shape [...] (no discount dim), samples [..., A].

        Equal to `forward(s)` at discount index -1, but the output layer computes only that discount's
        rows, and submodules are called without nn.Module overhead (the per-step acting path).
        """
        h = self._features(s)
        last = self._out_layer()
        k = last.out_features // self.num_gammas
        return self._dist(F.linear(h, last.weight[-k:], last.bias[-k:]))

    def _dist(self, out: torch.Tensor) -> Distribution:
        """Distribution from the output layer's values [..., width] (float32 even under autocast)."""
        out = _upcast(out)
        if self.spec.kind == "discrete":
            return Categorical(out, self.prob_clip)
        if self.spec.kind == "multibinary":
            return Bernoulli(out)
        return self.continuous(out)


class _Weights(TypedDict):
    """`Critic._weights`: the member-indexed parameters, [C, ...] each."""

    w_state: torch.Tensor
    w_action: torch.Tensor | None  # None for the discrete critic
    b_in: torch.Tensor
    ln_w: list[torch.Tensor]
    ln_b: list[torch.Tensor]
    w_hidden: list[torch.Tensor]
    b_hidden: list[torch.Tensor]
    w_out: torch.Tensor
    b_out: torch.Tensor


class Critic(nn.Module):
    """An ensemble of C MLP critics Q_{c,g}, all members and discounts in batched ops.

    Discrete:   `forward(s [..., d]) -> q [..., C, G, A]` (a value for every action).
    Otherwise:  `forward(s [..., d], a [..., G, A]) -> q [..., C, G]`, where discount g's output is read at
                discount g's action. `a` may carry extra leading dims that broadcast against `s`
                (e.g. K sampled actions [K, B, L, G, A] with s [B, L, d]), so value estimates from several
                actions cost one call. `a [..., 1, A]` is one action for every discount (the replay's a_t):
                the hidden stack then runs once for all G discounts, a G-th of the cost, with the same result
                as that action repeated G times.
    `members` (optional [C'] long indices) evaluates only those ensemble members, in that order: the output
    equals the full output indexed at `members` along the C dim, for a C'/C share of the cost (REDQ's
    target needs only its random subset of the target critics).

    Member c's layer i is `weights[i][c]` ([in, out]); members share no parameters. The first layer of the
    (s, a) critic is split into a state part and an action part — equal to a Linear on concat(s, a_g) —
    so the state's product is computed once, not once per discount.

    `num_bins=K` (`LossConfig.critic_kind = "twohot"`) makes it a classification critic: every output above
    gains a last dim of K bin logits ([..., C, G, A, K] or [..., C, G, K]), the output layer K times wider; the
    hidden layers and every other parameter keep their names and shapes. None (the default): one value each.

    `action_input=True` (`LossConfig.discrete_action_input`) builds a discrete critic as the (s, a) critic over
    one-hot action vectors (AMAGO-2's form: its size does not grow with the number of actions); `every_action`
    then evaluates the A one-hot actions. Other action kinds take actions as input anyway and ignore it.
    """

    def __init__(
        self,
        d_in: int,
        spec: ActionSpec,
        num_gammas: int,
        num_critics: int = 4,
        hidden: int = 256,
        layers: int = 2,
        num_bins: int | None = None,
        action_input: bool = False,
    ) -> None:
        super().__init__()
        if layers < 1:
            raise ValueError("Critic needs at least one hidden layer")
        if num_bins is not None and num_bins < 2:
            raise ValueError(f"a classification critic needs at least 2 bins, got {num_bins}")
        self.spec, self.num_gammas, self.num_critics, self.num_bins = spec, num_gammas, num_critics, num_bins
        self.discrete = spec.kind == "discrete" and not action_input  # Q for every action from s alone
        C, G, A, H = num_critics, num_gammas, spec.dim, hidden
        fan_in = d_in if self.discrete else d_in + A
        self.w_state = nn.Parameter(_uniform((C, d_in, H), fan_in))  # [C, d, H]
        self.w_action = None if self.discrete else nn.Parameter(_uniform((C, A, H), fan_in))  # [C, A, H]
        self.b_in = nn.Parameter(_uniform((C, H), fan_in))  # [C, H]
        self.ln_w = nn.ParameterList([nn.Parameter(torch.ones(C, H)) for _ in range(layers)])
        self.ln_b = nn.ParameterList([nn.Parameter(torch.zeros(C, H)) for _ in range(layers)])
        self.w_hidden = nn.ParameterList([nn.Parameter(_uniform((C, H, H), H)) for _ in range(layers - 1)])
        self.b_hidden = nn.ParameterList([nn.Parameter(_uniform((C, H), H)) for _ in range(layers - 1)])
        out_shape = ((G, A) if self.discrete else (G,)) + (() if num_bins is None else (num_bins,))
        self.w_out = nn.Parameter(_uniform((C, H, *out_shape), H))  # [C, H, G, A] | [C, H, G] (, K)
        self.b_out = nn.Parameter(_uniform((C, *out_shape), H))  # [C, G, A] | [C, G] (, K)

    def _weights(self, members: torch.Tensor | None) -> _Weights:
        """Every member-indexed parameter ([C, ...]), restricted to `members` when given."""
        if members is None:
            def pick(p):
                return p
        else:
            members = members.to(self.w_state.device)

            def pick(p):
                return p.index_select(0, members)

        return {
            "w_state": pick(self.w_state),
            "w_action": None if self.w_action is None else pick(self.w_action),
            "b_in": pick(self.b_in),
            "ln_w": [pick(p) for p in self.ln_w],
            "ln_b": [pick(p) for p in self.ln_b],
            "w_hidden": [pick(p) for p in self.w_hidden],
            "b_hidden": [pick(p) for p in self.b_hidden],
            "w_out": pick(self.w_out),
            "b_out": pick(self.b_out),
        }

    @staticmethod
    def _hidden(x: torch.Tensor, w: _Weights, fused: bool = False) -> torch.Tensor:
        """Shared hidden stack on pre-activations x [C, N, H] of the first layer -> features [C, N, H].

        `fused` (the (s, a) critic): the LayerNorm's per-member affine is one addcmul and the activation
        overwrites its input (addcmul's backward does not read its output), so a layer makes 2 [C, N, H]
        tensors, not 4. The same values up to rounding (a fused multiply-add: ~1 ulp); the discrete critic
        keeps the unfused ops, so its results stay bit-identical to the earlier code."""
        for i in range(len(w["ln_w"])):
            if i > 0:
                x = torch.baddbmm(w["b_hidden"][i - 1].unsqueeze(1), x, w["w_hidden"][i - 1])
            if fused:
                x = torch.addcmul(w["ln_b"][i].unsqueeze(1), F.layer_norm(x, x.shape[-1:]), w["ln_w"][i].unsqueeze(1))
                x = F.leaky_relu(x, LEAKY_SLOPE, inplace=True)
            else:
                x = F.layer_norm(x, x.shape[-1:]) * w["ln_w"][i].unsqueeze(1) + w["ln_b"][i].unsqueeze(1)
                x = F.leaky_relu(x, LEAKY_SLOPE)
        return x

    @staticmethod
    def _state_in(s: torch.Tensor, w_state: torch.Tensor) -> torch.Tensor:
        """First-layer state product for every member in one GEMM: s [N, d] -> [N, C, H]."""
        C, d, H = w_state.shape
        return (s @ w_state.permute(1, 0, 2).reshape(d, C * H)).view(-1, C, H)

    def forward(
        self, s: torch.Tensor, a: torch.Tensor | None = None, members: torch.Tensor | None = None
    ) -> torch.Tensor:
        w = self._weights(members)
        C, H, G = w["w_state"].shape[0], w["w_state"].shape[-1], self.num_gammas
        if self.discrete:
            if a is not None:
                raise ValueError("the discrete critic returns Q for every action; select with q_at_action")
            batch = s.shape[:-1]
            x = self._state_in(s.reshape(-1, s.shape[-1]), w["w_state"]) + w["b_in"]  # [N, C, H]
            x = x.transpose(0, 1)  # [C, N, H]
            x = self._hidden(x, w)
            q = torch.baddbmm(w["b_out"].flatten(1).unsqueeze(1), x, w["w_out"].flatten(2))  # [C, N, G*A(*K)]
            if self.num_bins is not None:
                return _upcast(q.view(C, *batch, G, -1, self.num_bins).movedim(0, -4))  # [..., C, G, A, K]
            q = q.view(C, *batch, G, -1)  # [C, ..., G, A]
            return _upcast(q.movedim(0, -3))  # [..., C, G, A]

        if a is None:
            raise ValueError("this critic needs actions a [..., G, A] (or [..., 1, A])")
        w_action = w["w_action"]
        if w_action is None:
            raise RuntimeError("a continuous or multi-binary critic must have action weights (w_action)")
        return self._forward_sa(s, a, w, w_action, C, H, G)

    @property
    def sums_over_actions(self) -> bool:
        """Whether the learner takes V(s) = Σ_a π(a|s) Q(s, a) exactly, from `every_action`, rather than from
        sampled actions: always for the per-action critic; for `action_input` while A <= G, where the A one-hot
        rows per state are no more than the sampled target's one action per discount (the measured cost:
        docs/method.md, benchmarks/discrete_action_input_cost.py)."""
        return self.discrete or (self.spec.kind == "discrete" and self.spec.dim <= self.num_gammas)

    def every_action(self, s: torch.Tensor, members: torch.Tensor | None = None) -> torch.Tensor:
        """Outputs for every discrete action, [..., C, G, A(, K)]: `forward(s)` of the per-action critic, or the
        (s, a) critic (`action_input`) at the A one-hot actions, as A leading sample dims of one call
        (one action for every discount, so A x the rows of one action)."""
        if self.discrete:
            return self(s, members=members)
        if self.spec.kind != "discrete":
            raise ValueError(f"every_action needs discrete actions, not {self.spec.kind} ones")
        A = self.spec.dim
        eye = torch.eye(A, device=s.device).view(A, *([1] * (s.dim() - 1)), 1, A)  # [A, 1, .., 1, 1, A]
        out = self(s, eye, members=members)  # [A, ..., C, G(, K)]
        return out.movedim(0, -1 if self.num_bins is None else -2)

    def _forward_sa(
        self, s: torch.Tensor, a: torch.Tensor, w: _Weights, w_action: torch.Tensor, C: int, H: int, G: int
    ) -> torch.Tensor:
        """The (s, a) critic. Rows are laid out [C, Ga, K, Ns, H] (Ga: 1 or G action groups, K: a's extra
        leading dims, Ns: s's rows), so the state's first-layer product [C, Ns, H] broadcasts into them without
        being copied per discount or per sample, and no [.., C, H] tensor is ever permuted.

        With one action for every discount (a [..., 1, A]) the hidden stack runs once per member and state for
        all G discounts: exactly the per-discount result, since only the output layer is per discount."""
        Ga, A = a.shape[-2:]
        if Ga not in (1, G):
            raise ValueError(f"actions must be [..., {G}, A] (one per discount) or [..., 1, A], got {tuple(a.shape)}")
        batch = torch.broadcast_shapes(s.shape[:-1], a.shape[:-2])
        s_batch = batch[len(batch) - (s.dim() - 1):] if s.dim() > 1 else torch.Size()
        lead = batch[: len(batch) - len(s_batch)]  # a's extra leading dims (K samples)
        if s.shape[:-1] != s_batch:
            s = s.expand(*s_batch, s.shape[-1])
        K, Ns = math.prod(lead), math.prod(s_batch)
        s_rows = s.reshape(1, Ns, s.shape[-1]).expand(C, Ns, s.shape[-1])
        hs = torch.baddbmm(w["b_in"].unsqueeze(1), s_rows, w["w_state"])  # [C, Ns, H]
        a = a.expand(*batch, Ga, A).reshape(K, Ns, Ga, A).permute(2, 0, 1, 3).contiguous()  # [Ga, K, Ns, A] (small)
        a = a.to(hs.dtype)
        hs5 = hs.view(C, 1, 1, Ns, H)
        if A <= 2:  # a few rank-1 updates: one pass over [C, M, H] each, no thin GEMM, no separate add
            w_a = w_action.view(C, 1, 1, 1, A, H)
            x = torch.addcmul(hs5, a[..., 0:1].unsqueeze(0), w_a[..., 0, :])
            for j in range(1, A):
                x = x.addcmul_(a[..., j : j + 1].unsqueeze(0), w_a[..., j, :])
        else:
            a_rows = a.reshape(1, -1, A)
            ha = torch.bmm(a_rows.expand(C, *a_rows.shape[1:]), w_action)  # [C, Ga*K*Ns, H]
            x = ha.view(C, Ga, K, Ns, H).add_(hs5)  # bmm's backward does not read its output
        x = x.view(C, -1, H)  # [C, M, H], M = Ga*K*Ns
        x = self._hidden(x, w, fused=True)
        if self.num_bins is not None:
            return self._bins_out(x, w, batch, Ga, K, Ns)
        if Ga == 1:  # every discount's output from the same features: one [C, M, H] x [C, H, G] GEMM
            q = torch.baddbmm(w["b_out"].unsqueeze(1), x, w["w_out"])  # [C, K*Ns, G]
            q = q.view(C, K, Ns, G).permute(1, 2, 0, 3)  # [K, Ns, C, G]
        else:  # discount g's output read at discount g's features: a [K*Ns, H] x [H] product per (c, g)
            w_out = w["w_out"].transpose(1, 2).reshape(C * G, H, 1)  # [C*G, H, 1] (small)
            q = torch.bmm(x.view(C * G, K * Ns, H), w_out).view(C, G, K * Ns)  # [C, G, K*Ns]
            q = (q + w["b_out"].unsqueeze(-1)).view(C, G, K, Ns).permute(2, 3, 0, 1)  # [K, Ns, C, G]
        return _upcast(q.reshape(*batch, C, G))  # [..., C, G]

    def _bins_out(self, x: torch.Tensor, w: _Weights, batch: torch.Size, Ga: int, K: int, Ns: int) -> torch.Tensor:
        """The classification critic's output layer on the (s, a) features x [C, Ga*K*Ns, H]: [..., C, G, Kb]
        bin logits, discount g's read at discount g's features (as `_forward_sa`'s value outputs)."""
        C, H, G, Kb = x.shape[0], x.shape[-1], self.num_gammas, w["w_out"].shape[-1]
        if Ga == 1:  # every discount's logits from the same features: one [C, M, H] x [C, H, G*Kb] GEMM
            q = torch.baddbmm(w["b_out"].flatten(1).unsqueeze(1), x, w["w_out"].flatten(2))  # [C, K*Ns, G*Kb]
            q = q.view(C, K, Ns, G, -1).permute(1, 2, 0, 3, 4)  # [K, Ns, C, G, Kb]
        else:  # a [K*Ns, H] x [H, Kb] product per (c, g)
            w_out = w["w_out"].permute(0, 2, 1, 3).reshape(C * G, H, -1)  # [C*G, H, Kb]
            q = torch.bmm(x.view(C * G, K * Ns, H), w_out).view(C, G, K * Ns, -1)  # [C, G, K*Ns, Kb]
            q = (q + w["b_out"].unsqueeze(2)).view(C, G, K, Ns, -1).permute(2, 3, 0, 1, 4)  # [K, Ns, C, G, Kb]
        return _upcast(q.reshape(*batch, C, G, Kb))

    @torch.no_grad()
    def rescale_output_(self, scale: torch.Tensor, shift: torch.Tensor) -> None:
        """Make every output q_{c,g} become q_{c,g} * scale[g] + shift[g], exactly, for all inputs.

        Used by PopArt (scale = σ_old / σ_new, shift = (μ_old - μ_new) / σ_new) so that σ q + μ is unchanged.
        A classification critic's values are not PopArt-normalised (its bins are fixed): it refuses.
        """
        if self.num_bins is not None:
            raise RuntimeError("a classification critic (num_bins) is not rescaled by PopArt: its values are "
                               "unnormalised expectations over fixed bins")
        scale = scale.to(self.w_out)
        shift = shift.to(self.b_out)
        if self.discrete:
            self.w_out.mul_(scale[:, None])  # [C, H, G, A] * [G, 1]
            self.b_out.mul_(scale[:, None]).add_(shift[:, None])
        else:
            self.w_out.mul_(scale)  # [C, H, G] * [G]
            self.b_out.mul_(scale).add_(shift)


def q_at_action(q_all: torch.Tensor, a_vec: torch.Tensor) -> torch.Tensor:
    """Discrete Q for given one-hot actions: q_all [..., C, G, A], a_vec [..., G, A] -> [..., C, G]."""
    return (q_all * a_vec.unsqueeze(-3)).sum(-1)


def logits_at_action(logits: torch.Tensor, a_vec: torch.Tensor) -> torch.Tensor:
    """A discrete classification critic's bin logits at given one-hot actions: logits [..., C, G, A, K],
    a_vec [..., G, A] -> [..., C, G, K] (exactly the chosen action's row)."""
    return (logits * a_vec.unsqueeze(-3).unsqueeze(-1)).sum(-2)


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """Half-precision outputs (autocast) -> float32, so distributions, losses and PopArt run in float32."""
    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


def _uniform(shape: tuple[int, ...], fan_in: int) -> torch.Tensor:
    """nn.Linear's default init, drawn independently for every ensemble member."""
    bound = 1.0 / math.sqrt(fan_in)
    return torch.empty(shape).uniform_(-bound, bound)
