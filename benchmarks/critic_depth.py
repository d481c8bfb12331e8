"""How far back a run's critic has carried value: Q against the number of steps left before termination.

    python benchmarks/critic_depth.py RUN_DIR                 # the newest 200 stored rollouts that terminated
    python benchmarks/critic_depth.py RUN_DIR --rollouts 500 --json

For every stored rollout of RUN_DIR's replay that ended in `terminated` (a fall, a crash: no bootstrap after
it), the run's latest checkpoint evaluates the critic at every step t, grouped by k = steps left (k = 1: the
last action). A critic that has learned the values of a dense reward r per step (CartPole: +1) gives, for
discount gamma, Q(k) = s r (1 - gamma^k) / (1 - gamma) (s: --reward-scale), growing with k until about
1 / (1 - gamma) steps. The target networks carry a value about one step further back per 1 / tau updates
(docs/results.md, continuous control), so early in a run Q stops growing at a depth of about tau x updates
(x n for n-step returns) and a decision whose consequence lies further ahead has no value signal.

Per bin of k: the ensemble-mean Q of the best action for three discounts (denormalised), its depth in reward
steps (the h with s r (1 - gamma^h) / (1 - gamma) = Q, r the stored rollouts' mean reward; meaningful for a
constant reward per step), the mean |Q(a0) - Q(a1)| of the policy's discount (discrete actions) and the policy's
largest action probability. A policy near probability 1 everywhere while |A| is flat in k has collapsed onto a bias
of the critic rather than a learned advantage.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import torch

import icrl
from icrl.agent.model import Agent
from icrl.data.collate import collate_windows
from icrl.data.storage import list_rollout_files, load_rollout
from icrl.types import Rollout

BINS = ((1, 1), (2, 2), (3, 3), (4, 5), (6, 10), (11, 20), (21, 50), (51, 100), (101, 10**9))


@torch.no_grad()
def rows(agent: Agent, rollouts: list[Rollout]) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """(k steps left, Q [G, A] ensemble mean denormalised, policy probabilities [A]) per action step of the
    terminated rollouts. Discrete actions only (the critic's output per action)."""
    agent.eval()
    out = []
    for r in rollouts:
        s = agent(collate_windows([(r, 0)], r.num_timesteps, agent.spec).inputs)  # [1, T+1, d]
        q = agent.popart.denormalize_per_action(agent.critic(s))[0].mean(1)  # [T+1, G, A] ensemble mean
        probs = agent.actor(s).probs[0, :, -1]  # [T+1, A] of the policy's discount
        steps = len(r.action)
        out += [(steps - t, q[t].numpy(), probs[t].numpy()) for t in range(steps)]
    return out


def depth(q: float, gamma: float, step_value: float) -> float | None:
    """h with step_value (1 - gamma^h) / (1 - gamma) = q: how many steps of a constant reward q accounts for."""
    if step_value <= 0:
        return None
    frac = q * (1.0 - gamma) / step_value
    if frac >= 1.0 - 1e-9:
        return math.inf
    return math.log(1.0 - frac) / math.log(gamma) if frac > 0 else 0.0


def summarise(data: list[tuple[int, np.ndarray, np.ndarray]], gammas: list[float], step_value: float) -> list[dict]:
    picks = [i for i, g in enumerate(gammas) if g in (0.9, 0.99, 0.999)] or list(range(len(gammas)))
    table = []
    for lo, hi in BINS:
        sel = [x for x in data if lo <= x[0] <= hi]
        if not sel:
            continue
        q = np.stack([x[1] for x in sel])  # [N, G, A]
        p = np.stack([x[2] for x in sel])  # [N, A]
        row: dict = {"k": f"{lo}" if lo == hi else f"{lo}-{hi if hi < 10**9 else ''}", "n": len(sel)}
        for i in picks:
            qm = float(q[:, i].max(-1).mean())  # the best action's value
            d = depth(qm, gammas[i], step_value)
            row[f"q_g{gammas[i]}"] = round(qm, 2)
            row[f"depth_g{gammas[i]}"] = None if d is None else round(d, 1)
        if q.shape[-1] == 2:
            row["abs_adv"] = round(float(np.abs(q[:, -1, 0] - q[:, -1, 1]).mean()), 3)
        row["pi_max"] = round(float(p.max(1).mean()), 3)
        table.append(row)
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--rollouts", type=int, default=200, help="the newest this many stored rollouts")
    ap.add_argument("--json", action="store_true", help="print the table as one JSON line")
    args = ap.parse_args()
    loaded = icrl.load(str(args.run_dir))
    if loaded.spec.kind != "discrete":
        raise SystemExit("critic_depth.py: discrete actions only (the critic's Q per action)")
    files = list_rollout_files(args.run_dir / "replay" / "fifo")[-args.rollouts:]
    terminated = [r for f in files if (r := load_rollout(f.path)).terminated[-1]]
    if not terminated:
        raise SystemExit(f"critic_depth.py: none of the newest {len(files)} stored rollouts terminated")
    cfg = json.loads((args.run_dir / "config.json").read_text())
    scale = float(cfg["loss"]["reward_scale"])
    step_value = scale * float(np.mean(np.concatenate([r.reward for r in terminated])))
    gammas = [round(float(g), 6) for g in loaded.agent.gammas]
    table = summarise(rows(loaded.agent, terminated), gammas, step_value)
    if args.json:
        print(json.dumps({"run_dir": str(args.run_dir), "rollouts": len(terminated), "step_value": step_value,
                          "table": table}))
        return
    print(f"{args.run_dir}: {len(terminated)} terminated rollouts; a step's reward x scale = {step_value:.3g}")
    keys = list(table[0])
    print(" | ".join(keys))
    for row in table:
        print(" | ".join("" if row.get(k) is None else str(row.get(k)) for k in keys))


if __name__ == "__main__":
    main()
