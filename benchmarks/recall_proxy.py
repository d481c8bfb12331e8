"""Can the trajectory encoder learn to retrieve one step L positions back, and what stops it? A supervised proxy
of Passive T-Maze that takes RL out of the question.

    python benchmarks/recall_proxy.py --lengths 100 500                     # the junction's loss only
    python benchmarks/recall_proxy.py --lengths 100 500 --dense-noise 0.5   # + a loss at every other step

Inputs are the optimal T-Maze walk as the agent sees it (`icrl.envs.tasks.tmaze.TMaze` observations, previous
actions, time, the reset flag), through the library's own `TimestepEncoder` and `TransformerTrajEncoder`
(d_model 64, 2 layers, 4 heads, context L + 1, the defaults of `ModelConfig`) and a 256-wide MLP head, trained
with the learner's optimiser (AdamW, lr 1e-4, 500 warm-up updates, weight decay 1e-4, gradient clip 1, batch 24).
The target at the junction is the cue (+1 / -1). `--dense-noise S` adds a squared error at every other step
against N(0, S²) targets, averaged with the junction's as the critic loss averages over a window's steps:
the RL critic's situation, where one step in L + 1 needs the cue and the others pull the shared encoder
elsewhere. Reported: updates until the junction's mean squared error over 100 updates is below 0.05 (none:
not within the budget). Writes benchmarks/results/recall_proxy/recall_proxy.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from icrl.nets.transformer import TransformerTrajEncoder
from icrl.nets.tstep import TimestepEncoder
from icrl.types import Timesteps

OUT = Path(__file__).resolve().parent / "results" / "recall_proxy"


def walk_batch(batch: int, length: int, rng: np.random.Generator) -> tuple[Timesteps, torch.Tensor]:
    """B optimal walks of a T-Maze of `length`, up to the junction: (timesteps [B, L + 1], cue [B] in {+1, -1})."""
    T = length + 1
    cue = rng.integers(2, size=batch)  # 0: up, 1: down (the observation's first two entries)
    obs = np.zeros((batch, T, 4), np.float32)  # [cue_up, cue_down, in_corridor, at_junction]
    obs[:, :length, 2] = 1.0
    obs[:, length, 3] = 1.0
    obs[np.arange(batch), 0, cue] = 1.0
    prev_action = np.zeros((batch, T, 4), np.float32)
    prev_action[:, 1:, 3] = 1.0  # walked right
    reset = torch.zeros(batch, T, dtype=torch.bool)
    reset[:, 0] = True
    ts = Timesteps(obs={"obs": torch.from_numpy(obs)}, prev_action=torch.from_numpy(prev_action),
                   prev_reward=torch.zeros(batch, T), time=torch.arange(T).expand(batch, T).clone(), reset=reset)
    return ts, torch.from_numpy(1.0 - 2.0 * cue).float()


def updates_to_recall(length: int, dense_noise: float | None, budget: int, seed: int, bf16: bool) -> dict:
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    space = gym.spaces.Dict({"obs": gym.spaces.Box(0.0, 1.0, (4,), np.float32)})
    tstep = TimestepEncoder(space, 4, d_out=64, hidden=128, max_time=4096)
    traj = TransformerTrajEncoder(64, d_model=64, layers=2, heads=4, context_len=length + 1, max_time=4096,
                                  pos_emb="sinusoidal")
    head = nn.Sequential(nn.Linear(64, 256), nn.LeakyReLU(), nn.Linear(256, 1))
    params = [*tstep.parameters(), *traj.parameters(), *head.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda u: min(1.0, (u + 1) / 500))
    errors, start = [], time.perf_counter()
    for update in range(1, budget + 1):
        ts, cue = walk_batch(24, length, rng)
        tstep.update_normalization(ts, torch.ones(ts.shape, dtype=torch.bool))
        with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            pred = head(traj(tstep(ts), ts.time)).float().squeeze(-1)  # [B, L + 1]
        junction_err = (pred[:, -1] - cue).square()  # [B]
        if dense_noise is None:
            loss = junction_err.mean()
        else:
            target = torch.randn_like(pred) * dense_noise
            target[:, -1] = cue
            loss = (pred - target).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        errors.append(float(junction_err.mean()))
        if update % 100 == 0:
            recent = float(np.mean(errors[-100:]))
            print(f"L={length} dense_noise={dense_noise} update {update}: junction mse {recent:.3f}", flush=True)
            if recent < 0.05:
                return {"updates": update, "wall_s": round(time.perf_counter() - start, 1)}
    return {"updates": None, "wall_s": round(time.perf_counter() - start, 1),
            "final_mse": round(float(np.mean(errors[-100:])), 3)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", type=int, nargs="+", default=[100, 500])
    p.add_argument("--dense-noise", type=float, nargs="*", default=[],
                   help="also run with a loss at every other step against N(0, S^2) targets, for each S")
    p.add_argument("--budget", type=int, default=2000, help="updates per run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--out", type=Path, default=OUT / "recall_proxy.json")
    args = p.parse_args()
    torch.set_num_threads(1)
    rows = []
    for noise in [None, *args.dense_noise]:
        for length in args.lengths:
            r = updates_to_recall(length, noise, args.budget, args.seed, args.bf16)
            rows.append({"length": length, "dense_noise": noise, "bf16": args.bf16, "seed": args.seed,
                         "budget": args.budget, **r})
            print(json.dumps(rows[-1]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    old = json.loads(args.out.read_text()) if args.out.exists() else []
    keep = [o for o in old if not any((o["length"], o["dense_noise"], o["bf16"], o["seed"], o["budget"]) ==
                                      (r["length"], r["dense_noise"], r["bf16"], r["seed"], r["budget"]) for r in rows)]
    args.out.write_text(json.dumps(keep + rows, indent=1))


if __name__ == "__main__":
    main()
