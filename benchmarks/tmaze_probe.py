"""What a Passive T-Maze run has to learn from, and whether its critic uses the cue: counts over its replay and
the critic's Q at the junction for either cue.

    python benchmarks/tmaze_probe.py RUN_DIR              # a run of `icrl train --env tmaze ...` (finished or not)
    python benchmarks/tmaze_probe.py RUN_DIR --gradients  # + where the encoder's gradient comes from

Replay: rollouts, those that reached the junction, those that chose up/down there, and the choices per cue.
Critic: two synthetic rollouts that walk the corridor optimally, one per cue; Q(junction, up / down) of the policy's
discount (ensemble mean, unnormalised, in units of the run's reward scale) and the policy at the junction. A critic
that remembers gives different Q for the two cues; one that does not gives the same numbers. PopArt's scale.
Gradients (`--gradients`): on batches of whole stored rollouts (drawn uniformly, as the learner draws them), the
encoder's gradient norm from the critic's TD loss and from its conservative term, each at the junction step and at
every other step (each as its share of the full loss, weighted as in training), from the actor loss and from the
whole training loss (`compute_loss`), how consistent each is over the batches (norm of the mean gradient / mean
norm: 1 is a fixed direction; the corridor's steps are alike in every rollout, so its parts lean towards 1) and the
cosine between the parts' mean gradients (-1: they pull against each other). The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import icrl
from icrl.agent.critic_kind import CriticReader
from icrl.agent.learner import compute_loss, target_values
from icrl.agent.losses import actor_loss, align_next, conservative_term, critic_loss, redq_members
from icrl.config.experiment import ExperimentConfig
from icrl.data.collate import collate_windows
from icrl.data.storage import list_rollout_files, load_rollout
from icrl.nets.heads import q_at_action
from icrl.types import Timesteps

UP, DOWN = 0, 1


def replay_counts(run: Path, blocks: int = 1) -> dict:
    """The counts over the whole replay, and with `blocks` > 1 per consecutive block of rollouts in the order they
    were written (`list_rollout_files` lists them oldest first): what the replay held from each stage of the run."""
    per_rollout = [junction_choice(load_rollout(f.path)) for f in list_rollout_files(run / "replay" / "fifo")]
    result = _count(per_rollout)
    if blocks > 1:
        size = -(-len(per_rollout) // blocks)
        result["blocks"] = [_count(per_rollout[i:i + size]) for i in range(0, len(per_rollout), size)]
    return result


def junction_choice(r) -> str | None:
    """"cue_X->Y" for a rollout that chose Y at the junction under cue X, "" for one that reached it without
    choosing, None for one that never reached it."""
    obs = r.obs["obs"]  # [T+1, 4]: cue_up, cue_down, in_corridor, at_junction
    at = np.nonzero(obs[:, 3] > 0.5)[0]
    if not len(at):
        return None
    t = int(at[0])
    if t >= len(r.action) or int(r.action[t]) not in (UP, DOWN):
        return ""
    cue_up, a = bool(obs[0, 0] > 0.5), int(r.action[t])
    return f"cue_{'up' if cue_up else 'down'}->{'up' if a == UP else 'down'}"


def _count(choices: list[str | None]) -> dict:
    made = [c for c in choices if c]
    correct = sum(c in ("cue_up->up", "cue_down->down") for c in made)
    per_cue = {k: made.count(k) for k in sorted(set(made))}
    return {"rollouts": len(choices), "reached_junction": sum(c is not None for c in choices), "chose": len(made),
            "correct": correct, "choices": per_cue}


def optimal_walk(length: int, cue_up: bool) -> Timesteps:
    T = length + 1  # timesteps up to and including the junction
    obs = np.zeros((1, T, 4), np.float32)
    obs[0, 0, 0 if cue_up else 1] = 1.0
    obs[0, :length, 2] = 1.0
    obs[0, length, 3] = 1.0
    prev_action = np.zeros((1, T, 4), np.float32)
    prev_action[0, 1:, 3] = 1.0  # walked right
    return Timesteps(obs={"obs": torch.from_numpy(obs)}, prev_action=torch.from_numpy(prev_action),
                     prev_reward=torch.zeros(1, T), time=torch.arange(T)[None],
                     reset=torch.tensor([[True] + [False] * (T - 1)]))


@torch.no_grad()
def critic_at_junction(agent: torch.nn.Module, length: int) -> dict:
    agent.eval()
    out = {}
    for cue_up in (True, False):
        s = agent(optimal_walk(length, cue_up))  # [1, T, d]
        q = agent.critic.every_action(s)  # [1, T, C, G, A] normalised (either discrete critic form)
        q = agent.popart.denormalize_per_action(q)[0, length].mean(0)  # [G, A]
        probs = agent.actor(s).probs[0, length, -1]
        out[f"cue_{'up' if cue_up else 'down'}"] = {
            "q_up": round(float(q[-1, UP]), 4), "q_down": round(float(q[-1, DOWN]), 4),
            "pi": [round(float(p), 3) for p in probs],
        }
    return out


@torch.no_grad()
def greedy_path(agent: torch.nn.Module, length: int) -> dict:
    """Where the greedy policy leaves the optimal walk, per cue: the first step whose most likely action is not
    the optimal one (RIGHT in the corridor, the cued end at the junction), that action, the policy's probabilities
    and Q of the policy's discount for all four actions there. Greedy evaluation follows the optimal walk up to
    exactly this step, so an evaluation at success 0 has its cause here (`None`: the greedy walk is optimal)."""
    agent.eval()
    out = {}
    for cue_up in (True, False):
        s = agent(optimal_walk(length, cue_up))  # [1, T, d]
        probs = agent.actor(s).probs[0, :, -1]  # [T, A] of the policy's discount
        best = probs.argmax(-1)  # [T]
        optimal = torch.full_like(best, 3)
        optimal[length] = UP if cue_up else DOWN
        off = torch.nonzero(best != optimal).flatten()
        key = f"cue_{'up' if cue_up else 'down'}"
        if not len(off):
            out[key] = None
            continue
        t = int(off[0])
        q = agent.popart.denormalize_per_action(agent.critic.every_action(s))[0, t].mean(0)[-1]  # [A]
        out[key] = {"step": t, "deviations": int(len(off)), "action": int(best[t]),
                    "pi": [round(float(x), 3) for x in probs[t]], "q": [round(float(x), 4) for x in q]}
    return out


PARTS = ["critic_junction", "critic_rest", "conservative_junction", "conservative_rest", "actor", "total"]


def _part_loss(part: str, agent: torch.nn.Module, batch, cfg: ExperimentConfig, generator: torch.Generator):
    """One part of the training loss on `batch`, weighted as its share of the whole (`compute_loss`)."""
    members = redq_members(agent.target_critic.num_critics, cfg.loss.redq_subset, generator)
    if part == "total":
        return compute_loss(agent, batch, cfg.loss, members=members)[0]
    s = agent(batch.inputs)  # [B, L, d]
    valid = batch.has_action & align_next(batch.mask)
    G = agent.gammas.numel()
    action = batch.action.unsqueeze(-2).expand(*batch.action.shape[:-1], G, batch.action.shape[-1])
    out_all = agent.critic(s)  # [B, L, C, G, A]: one critic pass serves each part
    q_all = CriticReader.of(agent, cfg.loss, s.device).normalized_per_action(out_all)  # [B, L, C, G, A]
    if part == "actor":
        return actor_loss(agent.actor(s), action, batch.has_action & batch.mask, q_all=q_all,
                          online_coeff=cfg.loss.online_coeff, offline_coeff=cfg.loss.offline_coeff)[0]
    junction = batch.inputs.obs["obs"][..., 3] > 0.5  # [B, L]
    sel = valid & (junction if part.endswith("junction") else ~junction)
    share = cfg.loss.critic_weight * sel.sum() / valid.sum()  # its share of the full critic loss
    if part.startswith("conservative"):
        return share * cfg.loss.conservative_coeff * conservative_term(
            q_all, action, sel, cfg.loss.conservative_temperature)
    y = agent.popart.normalize(target_values(agent, s.detach(), batch, valid, cfg.loss, members))  # [B, L, G]
    return share * critic_loss(q_at_action(out_all, action), y, sel)[0]


def gradient_split(run: Path, agent: torch.nn.Module, batches: int, seed: int = 0) -> dict:
    cfg = ExperimentConfig.from_json((run / "config.json").read_text())
    agent.train()
    # every stored rollout, drawn uniformly as the learner draws them: rollouts that chose only would select the
    # approach steps' targets (those that reach the junction in time are paid there more often) and bias their TD error
    rollouts = [load_rollout(f.path) for f in list_rollout_files(run / "replay" / "fifo")]
    if not any(junction_choice(r) for r in rollouts):
        return {"error": "no stored rollout chose at the junction"}
    encoder = [p for n, p in agent.named_parameters() if n.startswith(("traj_encoder", "tstep_encoder"))]
    rng = np.random.default_rng(seed)
    grads: dict[str, list[torch.Tensor]] = {part: [] for part in PARTS}
    for b in range(batches):
        picks = rng.integers(len(rollouts), size=cfg.optim.batch_size)
        batch = collate_windows([(rollouts[i], 0) for i in picks], cfg.model.training_window, agent.spec)
        for part, out in grads.items():
            agent.zero_grad(set_to_none=True)
            # REDQ's target members: the same draw for every part of one batch, as one update draws them once
            _part_loss(part, agent, batch, cfg, torch.Generator().manual_seed(seed + b)).backward()
            out.append(torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in encoder]))
    stacked = {part: torch.stack(gs) for part, gs in grads.items()}  # [batches, params]
    mean = {part: g.mean(0) for part, g in stacked.items()}  # [params]: each part's mean direction
    result: dict = {}
    for part, g in stacked.items():
        norms = g.norm(dim=1)
        result[part] = {"grad_norm": round(float(norms.mean()), 5),
                        "consistency": round(float(mean[part].norm() / norms.mean().clamp_min(1e-30)), 4)}
    # do the parts pull the encoder the same way or against each other (cosine of their mean gradients)
    result["cosine"] = {f"{a}~{b}": round(float(F.cosine_similarity(mean[a], mean[b], dim=0)), 4)
                        for i, a in enumerate(PARTS) for b in PARTS[i + 1:]}
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", type=Path)
    p.add_argument("--gradients", action="store_true", help="also split the encoder's gradient (slow: CPU minutes)")
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--checkpoint", type=Path,
                   help="probe this checkpoint folder (a copy of RUN_DIR/checkpoints/ckpt-N) "
                   "instead of the run's latest weights")
    p.add_argument("--no-replay", action="store_true", help="skip the replay counts")
    p.add_argument("--blocks", type=int, default=1,
                   help="also count the replay in this many consecutive blocks of rollouts, oldest first")
    args = p.parse_args()
    cfg = json.loads((args.run_dir / "config.json").read_text())
    length = int(json.loads(cfg["env"]["env_kwargs"])["length"])
    # loaded once: the critic probe, PopArt and the gradients read it
    agent = icrl.load(str(args.checkpoint or args.run_dir)).agent
    result = {"run_dir": str(args.run_dir), "checkpoint": str(args.checkpoint) if args.checkpoint else None,
              "length": length, "replay": None if args.no_replay else replay_counts(args.run_dir, args.blocks),
              "critic": critic_at_junction(agent, length), "greedy": greedy_path(agent, length)}
    result["popart_sigma"] = [round(float(x), 4) for x in agent.popart.sigma]
    if args.gradients:
        result["gradients"] = gradient_split(args.run_dir, agent, args.batches)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
