"""What a bandit run's critic and policy have learned from the history, checkpoint by checkpoint.

    python benchmarks/bandit_probe.py RUN_DIR     # a run of `icrl train --env bandit ...` with checkpoints

The Bernoulli bandit's in-context statistic is known exactly: after pulls with s_i successes and f_i failures of
arm i, the posterior mean of p_i is (1 + s_i) / (2 + s_i + f_i) (uniform prior). The probe plays `--histories`
rollouts with uniformly random pulls (the data of the first epochs, where ε is near 1) and, at every step but the
first, compares with that posterior: for each discount, the Pearson correlation of the critic's Q(h, a) (ensemble
mean, centred over the arms) with the posterior means (centred the same way), and the same for the acting
policy's logits. A critic that reads its history tracks the posterior (r near 1; the reachable value is below
1, since Q also carries what later pulls will add); one that does not gives r near 0. So the probe says whether a
slow start is the critic's representation of the history or the policy's reading of the critic. The acting
discount's Q is also split into a preference between the arms that no history moves and the spread of what the
history moves (`arm_offset`): a policy that plays one arm everywhere follows the first while the second is
small. One JSON line per
checkpoint (`RUN_DIR/checkpoints/ckpt-N`, written with `--checkpoint-every`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

if TYPE_CHECKING:  # icrl is imported where it is used: the official side (amago_bandit_probe.py) has no icrl
    from icrl.types import Timesteps


class RandomPulls(NamedTuple):
    """n rollouts of uniformly random pulls on tasks p ~ U(0, 1)^arms, as an agent sees them (step t carries pull
    t-1 and its reward), and the posterior mean of every arm before each step. numpy only, so both libraries'
    probes read the same draws."""

    prev_action: np.ndarray  # [n, H, arms] float32 one-hot, zeros at t = 0
    prev_reward: np.ndarray  # [n, H] float32
    pulls_left: np.ndarray  # [n, H] float32: the bandit's observation, (H - t) / H
    posterior: np.ndarray  # [n, H, arms] float64: (1 + wins) / (2 + tries) over the pulls before t


def random_pulls(n: int, arms: int, horizon: int, seed: int = 0) -> RandomPulls:
    rng = np.random.default_rng(seed)
    p = rng.uniform(size=(n, arms))
    pulls = rng.integers(0, arms, size=(n, horizon))
    reward = (rng.uniform(size=(n, horizon)) < np.take_along_axis(p, pulls, 1)).astype(np.float32)
    onehot = np.eye(arms, dtype=np.float32)[pulls]  # [n, H, arms]
    prev_action = np.zeros((n, horizon, arms), np.float32)
    prev_action[:, 1:] = onehot[:, :-1]
    prev_reward = np.zeros((n, horizon), np.float32)
    prev_reward[:, 1:] = reward[:, :-1]
    wins = np.cumsum(onehot * reward[..., None], 1) - onehot * reward[..., None]  # before step t: steps < t
    tries = np.cumsum(onehot, 1) - onehot
    pulls_left = np.broadcast_to(((horizon - np.arange(horizon)) / horizon).astype(np.float32), (n, horizon))
    return RandomPulls(prev_action, prev_reward, pulls_left.copy(), (1 + wins) / (2 + tries))


def random_histories(n: int, arms: int, horizon: int, seed: int = 0) -> tuple[Timesteps, np.ndarray]:
    """`random_pulls` as icrl's Timesteps [n, horizon], and the posterior [n, horizon, arms]."""
    from icrl.types import Timesteps

    h = random_pulls(n, arms, horizon, seed)
    reset = np.zeros((n, horizon), bool)
    reset[:, 0] = True
    ts = Timesteps(obs={"obs": torch.from_numpy(h.pulls_left[..., None])},
                   prev_action=torch.from_numpy(h.prev_action), prev_reward=torch.from_numpy(h.prev_reward),
                   time=torch.arange(horizon).repeat(n, 1), reset=torch.from_numpy(reset))
    return ts, h.posterior


def centred_correlation(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson correlation of two arrays whose last dim is the arm, each centred over the arms first."""
    x = (x - x.mean(-1, keepdims=True)).ravel()
    y = (y - y.mean(-1, keepdims=True)).ravel()
    return float(np.corrcoef(x, y)[0, 1]) if x.std() > 0 and y.std() > 0 else 0.0


def arm_offset(q: np.ndarray) -> dict:
    """Q [..., A] of one discount, centred over the arms, split in two: `q_arm_offset` [A], its mean over every
    history (a preference between arms that no history moves: the critic's initialisation, or a lean of the data),
    and `q_history_sd`, the spread of the rest (what the history moves), in the same units."""
    qc = q - q.mean(-1, keepdims=True)
    offset = qc.reshape(-1, qc.shape[-1]).mean(0)
    return {"q_arm_offset": [round(float(v), 3) for v in offset], "q_history_sd": round(float((qc - offset).std()), 3)}


def run_checkpoints(run_dir: Path) -> list[Path]:
    """A run's checkpoints, oldest first; a clear exit where it kept none."""
    checkpoints = sorted((run_dir / "checkpoints").glob("ckpt-*"))
    if not checkpoints:
        raise SystemExit(f"{run_dir}/checkpoints holds no ckpt-N folder: train with --checkpoint-every 1")
    return checkpoints


@torch.no_grad()
def probe(path: Path, ts: Timesteps, posterior: np.ndarray) -> dict:
    import icrl

    agent = icrl.load(str(path)).agent
    agent.eval()
    s = agent(ts)  # [n, H, d]
    q = agent.critic.every_action(s).mean(-3).numpy()[:, 1:]  # [n, H-1, G, A] normalised, ensemble mean
    logits = agent.actor(s).logits[..., -1, :].numpy()[:, 1:]  # [n, H-1, A] of the acting discount
    post = posterior[:, 1:]
    return {
        "q_r": [round(centred_correlation(q[..., g, :], post), 3) for g in range(q.shape[-2])],  # per discount
        **arm_offset(q[..., -1, :]),
        "policy_r": round(centred_correlation(logits, post), 3),
        "policy_logit_sd": round(float((logits - logits.mean(-1, keepdims=True)).std()), 3),
        "greedy_picks_best_posterior": round(float((logits.argmax(-1) == post.argmax(-1)).mean()), 3),
        "popart_sigma": [round(float(v), 3) for v in agent.popart.sigma.flatten()],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", type=Path)
    p.add_argument("--histories", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    cfg = json.loads((args.run_dir / "config.json").read_text())
    kwargs = json.loads(cfg["env"]["env_kwargs"] or "{}")
    ts, posterior = random_histories(args.histories, int(kwargs.get("arms", 2)), int(kwargs.get("horizon", 50)),
                                     args.seed)
    for ckpt in run_checkpoints(args.run_dir):
        print(json.dumps({"checkpoint": ckpt.name, **probe(ckpt, ts, posterior)}), flush=True)


if __name__ == "__main__":
    main()
