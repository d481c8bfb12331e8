"""One learning update (docs/design.md §4): a single encoder pass, critic + actor losses, one optimiser step, EMA.

`compute_loss` reads as the method:
    s_t          = encoder(timesteps)                                   # [B, L, d], one pass
    y_{t,g}      = R r_t + γ_g (1 - term_t) · min_{2 of C} Q̄_g(s_{t+1}, a' ~ π̄_g)   (REDQ; or the mean)
    critic loss  = mean (Q_{c,g}(s_t, a_t) - y_{t,g})²   (PopArt-normalised, masked) × critic_weight
                   (or the cross-entropy to y's bin labels, `critic_kind` twohot: icrl.agent.critic_kind)
    actor loss   = online · -Q(sg(s_t), a ~ π_g(s_t)) + offline · -1[A > 0] log π_g(a_t | s_t)
With `discrete_action_input` a discrete critic is Q(s, one-hot a), read as the continuous one (the online term
through straight-through samples), its targets and V(s) exact over the A one-hot actions while A <= G
(`Critic.sums_over_actions`), else from sampled actions as for continuous ones.
Gradient routing: critic parameters see only the critic loss; the actor loss reads the critic as a frozen
function of a detached state, so it reaches the encoder only through the actor head.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from icrl.agent.critic_kind import CriticReader
from icrl.agent.graphs import CapturedStep, graphs_available
from icrl.agent.losses import actor_loss, align_next, conservative_term, redq_members, td_targets
from icrl.agent.model import Agent
from icrl.config import ExperimentConfig, LossConfig
from icrl.config.resolve import resolve
from icrl.device import use_fused_adam, warn_if_bf16_is_emulated
from icrl.guards import UpdateGuard
from icrl.nets.ema import ema_update_
from icrl.parallel import Collectives, OneProcess
from icrl.types import Batch

LossOutput = tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor, torch.Tensor]  # loss, metrics, y, valid


def compute_loss(
    agent: Agent,
    batch: Batch,
    cfg: LossConfig,
    generator: torch.Generator | None = None,
    members: torch.Tensor | None = None,
) -> LossOutput:
    """Returns (loss, metrics, y, valid): the unnormalised targets [B, L, G] and their mask feed PopArt.

    `members` is REDQ's subset of target critics, drawn from `generator` when not given. The learner draws
    it outside `compute_loss`, so a compiled `compute_loss` is one graph (a CPU generator breaks graphs)."""
    discrete = agent.spec.kind == "discrete"
    s = agent(batch.inputs)  # [B, L, d]
    G = agent.gammas.numel()
    valid = batch.has_action & align_next(batch.mask)  # [B, L]: transition t -> t+1 inside the window
    action = batch.action.unsqueeze(-2).expand(*batch.action.shape[:-1], G, batch.action.shape[-1])  # [B, L, G, A]

    if members is None:  # REDQ: only the random subset of target critics reduced into the target is evaluated
        members = redq_members(agent.target_critic.num_critics, cfg.redq_subset, generator,
                               s.device if generator is None else generator.device)
    read = CriticReader.of(agent, cfg, s.device)  # Q values from either kind of critic (icrl.agent.critic_kind)
    y = target_values(agent, s.detach(), batch, valid, cfg, members, read)  # [B, L, G]

    q_all = None
    per_action = agent.critic.discrete  # Q of every action from s alone (not `discrete_action_input`)
    if per_action:
        out_all = agent.critic(s)  # [B, L, C, G, A(, K)]
        out_sa = read.at_action(out_all, action)  # [B, L, C, G(, K)]
        with torch.set_grad_enabled(cfg.conservative_coeff > 0):  # only the conservative term differentiates it
            q_all = read.normalized_per_action(out_all)  # [B, L, C, G, A], read detached by the actor loss
    else:
        # a_t is the same for every discount: [B, L, 1, A] runs the critic's hidden stack once for all G
        out_sa = agent.critic(s, batch.action.unsqueeze(-2))  # [B, L, C, G(, K)]
        if discrete and agent.critic.sums_over_actions and cfg.offline_coeff != 0:  # exact V(s) of the advantage
            with torch.no_grad():
                q_all = read.normalized_per_action(agent.critic.every_action(s.detach()))  # [B, L, C, G, A]
    loss_c, metrics = read.loss(out_sa, y, valid)
    if q_all is not None and per_action and cfg.conservative_coeff:  # CQL(H) on every action's value (method.md)
        gap = conservative_term(q_all, action, valid, cfg.conservative_temperature)
        loss_c, metrics["conservative"] = loss_c + cfg.conservative_coeff * gap, gap.detach()

    dist = agent.actor(s)  # batch [B, L, G]; the actor's gradient reaches the encoder through here
    loss_a, actor_metrics = actor_loss(
        dist,
        action,
        batch.has_action & batch.mask,
        q_all=q_all,
        q_fn=None if per_action else read.frozen(agent.critic, s),
        q_data=None if per_action else read.normalized(out_sa),
        online_coeff=cfg.online_coeff,
        offline_coeff=cfg.offline_coeff,
        bc_filter=cfg.bc_filter,
        exp_beta=cfg.exp_beta,
        exp_clip=cfg.exp_clip,
        num_value_samples=cfg.num_value_samples,
        entropy_coeff=cfg.entropy_for(discrete),
        online_reduce=cfg.online_reduce,
    )
    metrics.update(actor_metrics)
    with torch.no_grad():
        m = valid.unsqueeze(-1)
        metrics["target_mean"] = (y * m).sum() / (m.sum() * G).clamp_min(1)
    return cfg.critic_weight * loss_c + loss_a, metrics, y, valid


@torch.no_grad()
def target_values(
    agent: Agent, s: torch.Tensor, batch: Batch, valid: torch.Tensor, cfg: LossConfig, members: torch.Tensor,
    read: CriticReader | None = None,
) -> torch.Tensor:
    """Unnormalised TD targets y [B, L, G] from the EMA heads on the online encoder's detached states s.
    `read`: how to read the critic's outputs (`CriticReader.of(agent, cfg, ...)` when not given)."""
    read = read if read is not None else CriticReader.of(agent, cfg, s.device)
    target_dist = agent.target_actor(s)  # batch [B, L, G]
    if agent.spec.kind == "discrete" and agent.target_critic.sums_over_actions:  # (`Critic.every_action`)
        q_next = agent.target_critic.every_action(s, members=members)  # [B, L, k, G, A(, K)]: normalised, or logits
        q_next = read.raw_per_action(q_next)  # [B, L, k, G, A] unnormalised
        v_next = (target_dist.probs.unsqueeze(-3) * q_next).sum(-1)  # [B, L, k, G]: exact E_{a'~π̄}
    else:
        q_next = agent.target_critic(s, target_dist.sample(), members=members)  # [B, L, k, G(, K)]
        v_next = read.raw(q_next)
    v_next = v_next.amin(-2) if cfg.redq_reduce == "min" else v_next.mean(-2)  # [B, L, G]
    return td_targets(
        batch.reward, batch.terminated, valid, align_next(v_next), agent.gammas, cfg.reward_scale, cfg.td_steps
    )


def is_weight_matrix(name: str, p: torch.Tensor) -> bool:
    """Decay weight matrices only: norms, biases, embeddings and σReparam scales are left alone."""
    parts = name.split(".")
    if any(part.startswith("w_") for part in parts):  # the critic ensemble's [C, in, out] weights
        return True
    return parts[-1].startswith("weight") and p.ndim >= 2 and "emb" not in name


def param_groups(agent: Agent, weight_decay: float) -> list[dict]:
    keep = {id(p) for p in agent.online_parameters()}
    named = [(n, p) for n, p in agent.named_parameters() if id(p) in keep]
    decay = [p for n, p in named if is_weight_matrix(n, p)]
    no_decay = [p for n, p in named if not is_weight_matrix(n, p)]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


class LossModule(nn.Module):
    """The learner's loss as a module's forward, so DistributedDataParallel can wrap it: DDP averages the
    gradients of the parameters used in its own forward call, and the loss reaches the agent's parts
    (encoder, heads, targets) directly rather than through `Agent.forward`. In one process the wrap is the
    identity and calling the module is calling `compute_loss`.

    It holds no reference to the Learner: a cycle learner -> DDP wrapper -> learner would leave the wrapper, and
    the gloo work its reducer keeps, to the garbage collector, which may first run at interpreter shutdown,
    where freeing that work aborts the process (SIGABRT after a finished data-parallel run)."""

    def __init__(self, agent: Agent, cfg: LossConfig, compiled: bool) -> None:
        super().__init__()
        self.agent, self.cfg = agent, cfg  # `agent` registered: DDP sees its parameters
        self.compute_loss = torch.compile(compute_loss) if compiled else compute_loss

    def forward(self, batch: Batch, members: torch.Tensor) -> LossOutput:
        """`compute_loss`, compiled or not. A compile that fails (an inductor or dynamo error on some torch,
        device or model) warns once and leaves the run eager: the same maths, only slower."""
        try:
            return self.compute_loss(self.agent, batch, self.cfg, members=members)
        except Exception as e:  # noqa: BLE001 - any compiler failure; eager below re-raises a real error
            if self.compute_loss is compute_loss:
                raise
            first = (str(e).strip().splitlines() or [""])[0][:200]
            warnings.warn(f"icrl: torch.compile of the learner failed ({type(e).__name__}: {first}); "
                          "training continues eager (pass --compile False to skip compiling)", stacklevel=2)
            self.compute_loss = compute_loss
            return compute_loss(self.agent, batch, self.cfg, members=members)


class Learner:
    """Owns the optimiser, the warm-up schedule and the REDQ generator of one agent.

    `OptimConfig.dtype == "bf16"` runs the forward pass and the losses under torch.autocast(bfloat16); the
    backward pass follows the forward's dtypes, and parameters, gradients and AdamW stay float32.
    `OptimConfig.compile` wraps `compute_loss` in torch.compile.

    One update is one function, `_step`, that reads nothing back to the host (docs/design.md §4,
    icrl.agent.graphs): the non-finite guard is a device flag that turns AdamW's step, PopArt's and the
    targets' updates into no-ops, REDQ's members are drawn on the device, the observation statistics are
    masked sums, and the metrics accumulate on the device until `read_metrics` (once per epoch). On CUDA, in
    one process, with `OptimConfig.cuda_graphs`, its batches are copied into static buffers of the training
    window's shape and the step is captured as a CUDA graph and replayed (`CapturedStep`); elsewhere the same
    function runs eagerly.

    `replicas` (`Collectives`, e.g. icrl.parallel.Replicas; default `OneProcess`): the processes of a
    data-parallel run. There is one update for any world size: the loss runs inside `replicas.wrap` (DDP,
    which averages gradients over the ranks), the batch statistics (observation RunningNorm, PopArt) are
    updated from every rank's rows, and a step is skipped on every rank when any rank's loss or the
    all-reduced gradient norm is not finite, so all ranks keep identical weights and buffers. In one process
    every collective is the identity and the update is the plain single-process step.
    """

    def __init__(
        self, agent: Agent, cfg: ExperimentConfig, device: torch.device, replicas: Collectives | None = None
    ) -> None:
        self.agent, self.cfg, self.device = agent, cfg, device
        self.replicas: Collectives = replicas if replicas is not None else OneProcess()
        fused = use_fused_adam(cfg.optim.fused_adam, device)
        graphed = graphs_available(device, cfg.optim.cuda_graphs) and self.replicas.world_size == 1 and fused
        self.optimizer = torch.optim.AdamW(param_groups(agent, cfg.optim.weight_decay), lr=cfg.optim.lr, fused=fused,
                                           capturable=graphed)
        resolved = resolve(cfg).optim  # as a run resolved them (a config built by hand: the library's rules)
        warmup = max(resolved.warmup_updates or 1, 1)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda u: min(1.0, (u + 1) / warmup))
        self.generator = torch.Generator().manual_seed(cfg.run.seed)  # REDQ's members on the CPU
        self.updates = 0
        self.guard = UpdateGuard()  # skipped updates: self.guard.skipped
        # The fused AdamW skips its step where `found_inf` is 1 (AMP's mechanism): the guard's decision stays
        # on the device. Without the fused kernel the host reads the decision (one sync per update).
        self._found_inf = torch.zeros((), device=device)
        if fused:
            self.optimizer.found_inf = self._found_inf  # type: ignore[attr-defined]  # read by Adam.step
        self.autocast_enabled = cfg.optim.dtype == "bf16"
        warn_if_bf16_is_emulated(cfg.optim.dtype, device)
        # Rank 0's initial weights and buffers on every rank (in place: the optimiser's parameters stay the
        # same objects), then DDP for the gradients (one process: neither does anything).
        self.replicas.broadcast_(agent)
        self.loss_module = LossModule(agent, cfg.loss, compiled=bool(resolved.compile))
        self.loss = self.replicas.wrap(self.loss_module)
        self._metric_names: list[str] = []
        self._metric_sum: torch.Tensor | None = None  # [M] on the device, summed since the last read
        self._metric_count = 0
        # the captured path: static batch buffers (allocated from the first batch) and the learning rates as
        # device tensors the graph reads (a float would be baked into it)
        self._static: Batch | None = None
        self._lr = [torch.tensor(float(g["lr"]), device=device) for g in self.optimizer.param_groups] if graphed else []
        self._captured = CapturedStep(self._graphed_step, enabled=graphed, what="learner update")

    def release_wrapper(self) -> None:
        """Free the data-parallel wrapper now, before the process group is left: its reducer holds gloo work
        that must not outlive the group, and anything still referring to the learner (a cycle, a traceback)
        would otherwise keep it until interpreter shutdown, where freeing it aborts the process. Updates after
        this run unwrapped, as in one process. No-op in one process."""
        self.loss = self.loss_module

    @property
    def compute_loss(self) -> Callable[..., LossOutput]:
        """The loss function the updates run: `compute_loss`, compiled where `OptimConfig.compile` says (eager
        again once a compile has failed)."""
        return self.loss_module.compute_loss

    @property
    def graphed(self) -> bool:
        """Whether updates are replayed as a CUDA graph (after the warm-up calls), rather than run eagerly."""
        return self._captured.enabled

    def state_dict(self) -> dict:
        """Optimiser and scheduler state dicts (tensors, for a weights-only file), the update counter and
        the REDQ generator state (a list of ints, for JSON)."""
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "updates": self.updates,
            "generator": self.generator.get_state().tolist(),
        }

    def load_state_dict(self, state: dict) -> None:
        """The optimiser's state and the counters; the optimiser's own choices (fused, capturable, foreach) stay
        this learner's, whatever the saved run used (a CPU run resumed on a GPU is captured there)."""
        flags: list[dict[str, Any]] = [{k: g[k] for k in ("fused", "capturable", "foreach") if k in g}
                                       for g in self.optimizer.param_groups]
        self.optimizer.load_state_dict(state["optimizer"])
        for group, kept in zip(self.optimizer.param_groups, flags):
            group.update(kept)
            if group.get("fused") or group.get("capturable"):  # their step counters live on the device
                for p in group["params"]:
                    st = self.optimizer.state.get(p, {})
                    if "step" in st:
                        st["step"] = st["step"].to(p.device, torch.float32)
        self.scheduler.load_state_dict(state["scheduler"])
        self.updates = int(state["updates"])
        self.generator.set_state(torch.tensor(state["generator"], dtype=torch.uint8))
        if self._captured.captured:  # load_state_dict replaced the optimiser's state tensors: capture again
            self._captured = CapturedStep(self._graphed_step, enabled=True, what="learner update")

    def update(self, batch: Batch) -> dict[str, torch.Tensor]:
        """One gradient step. Metrics stay tensors (no host sync); on the captured path they are the graph's
        outputs, overwritten by the next update (clone what you keep). `read_metrics` gives their means."""
        if self._captured.enabled:
            self._stage(batch)
            for lr, group in zip(self._lr, self.optimizer.param_groups):
                lr.fill_(float(group["lr"]))  # the scheduler's value, read by the captured AdamW step
            values = self._captured()
        else:
            values = self._step(batch.to(self.device, non_blocking=True, learner_only=True))
        self.scheduler.step()  # the warm-up counts updates, applied or skipped
        self.agent.refresh_acting_weights()  # the step moved the weights; the forward's power iteration u and v
        self.updates += 1
        self._metric_count += 1
        metrics = dict(zip(self._metric_names, values.unbind()))
        metrics["lr"] = torch.tensor(self.scheduler.get_last_lr()[0])
        return metrics

    def read_metrics(self) -> dict[str, float]:
        """The mean of every metric over the updates since the last read (one host sync), and the guard's
        verdict on them: a warning for skipped updates, NonFiniteError after too many in a row. Empty when no
        update ran since."""
        if self._metric_sum is None or self._metric_count == 0:
            return {}
        sums = (self._metric_sum / self._metric_count).tolist()
        self._metric_sum.zero_()
        self._metric_count = 0
        self.guard.check()
        out = dict(zip(self._metric_names, sums))
        out["lr"] = float(self.scheduler.get_last_lr()[0])
        return out

    def _graphed_step(self) -> torch.Tensor:
        assert self._static is not None
        groups = self.optimizer.param_groups
        floats = [g["lr"] for g in groups]
        for g, lr in zip(groups, self._lr):  # the captured step reads the learning rate from device memory
            g["lr"] = lr
        try:
            return self._step(self._static)
        finally:
            for g, lr_float in zip(groups, floats):
                g["lr"] = lr_float

    def _step(self, batch: Batch) -> torch.Tensor:
        """The update itself, on a batch on the device: returns this update's metrics [M] and adds them to the
        running sums. Reads nothing back to the host (on the fused-AdamW path)."""
        agent, cfg = self.agent, self.cfg
        agent.train()  # acting (AgentPolicy) leaves the agent in eval mode
        members = self._redq_members()
        length = self._update_normalization(batch)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast_enabled,
                            cache_enabled=not self._captured.enabled):  # a graph must not keep autocast's cache
            loss, metrics, y, valid = self.loss(batch, members)
        y, valid = self.replicas.gather_padded(y.float(), valid, length)  # [N*B, L, G]: every rank's targets
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(agent.online_parameters(), cfg.optim.grad_clip, foreach=True)
        # A non-finite loss or gradient applies nothing (icrl.guards). The gradient norm is all-reduced and the
        # losses are summed over the ranks, so every rank decides alike and skips the same updates.
        ok = self.guard.observe(self.replicas.reduce_sum(loss), grad_norm)
        self._found_inf.copy_(~ok)
        if hasattr(self.optimizer, "found_inf") or bool(ok):  # fused: AdamW skips on the device
            self.optimizer.step()
        with torch.no_grad():
            # a classification critic's values are unnormalised: PopArt only tracks the targets then
            rescaled = [agent.critic, agent.target_critic] if agent.critic.num_bins is None else None
            agent.popart.update_(y, valid, rescaled, apply=ok)
            ema_update_(agent.target_actor, agent.actor, cfg.loss.tau, apply=ok)
            ema_update_(agent.target_critic, agent.critic, cfg.loss.tau, apply=ok)
            metrics.update(loss=loss.detach(), grad_norm=grad_norm, popart_mu=agent.popart.mu[-1],
                           popart_sigma=agent.popart.sigma[-1])
            if not self._metric_names:
                self._metric_names = list(metrics)
            values = torch.stack([metrics[k].detach().float().reshape(()) for k in self._metric_names])  # [M]
            if self._metric_sum is None:
                self._metric_sum = torch.zeros_like(values)
            self._metric_sum.add_(values)
        return values

    def _redq_members(self) -> torch.Tensor:
        """REDQ's subset of target critics for this update, on the device: from the learner's generator on the
        CPU (saved in checkpoints); on CUDA from the device's default generator (seeded with the run), which a
        captured step draws from at every replay."""
        C, k = self.agent.target_critic.num_critics, self.cfg.loss.redq_subset
        return redq_members(C, k, self.generator if self.device.type == "cpu" else None, self.device)

    def _stage(self, batch: Batch) -> None:
        """Copy `batch` into the static buffers the captured step reads ([B, training window]; allocated from
        the first batch), padding a shorter batch. A batch of another layout (batch size, keys, longer windows)
        is refused: the captured step has one shape."""
        src = batch.to_learner_fields()
        if self._static is None:
            window = max(self.cfg.model.training_window, batch.shape[1])
            self._static = Batch.zeros_like_fields(src, window, self.device)
        static = self._static
        dst = static.to_learner_fields()
        if src.keys() != dst.keys() or batch.shape[0] != static.shape[0] or batch.shape[1] > static.shape[1]:
            raise ValueError(f"a batch of shape {batch.shape} and fields {sorted(src)} does not fit the learner's "
                             f"captured update ({static.shape}, {sorted(dst)}); every batch of a run must "
                             "have the same batch size and keys and at most the training window's length")
        L = batch.shape[1]
        for name, x in src.items():
            d = dst[name]
            if L < d.shape[1]:
                d[:, L:].zero_()  # padding: mask and has_action False
            if self.device.type == "cuda" and x.device.type == "cpu" and not x.is_pinned():
                x = x.pin_memory()  # a copy from pageable memory would wait for the device (the loader pins on CUDA)
            d[:, :L].copy_(x, non_blocking=True)

    @torch.no_grad()
    def _update_normalization(self, batch: Batch) -> int:
        """The running obs statistics (`TimestepEncoder.obs_norm`) fed with the real timesteps of every rank's batch;
        returns
        the longest batch length over the ranks (for gathering PopArt's targets after the step). One summary
        row per rank (count, mean, squared deviations): fixed shapes, no host read in one process."""
        enc = self.agent.tstep_encoder
        moments = enc.normalization_moments(batch.inputs, batch.mask)  # ([1], [1, D], [1, D]) | None
        (length,) = self.replicas.max([batch.mask.shape[1]])
        if moments is not None and enc.obs_norm is not None:
            if self.replicas.world_size > 1:
                row = torch.cat([moments[0][:, None], moments[1], moments[2]], dim=1)  # [1, 1 + 2D]
                rows = self.replicas.gather_rows(row, 1)  # [N, 1 + 2D]
                D = moments[1].shape[1]
                moments = (rows[:, 0], rows[:, 1 : 1 + D], rows[:, 1 + D :])
            enc.obs_norm.merge(*moments)
        return length
