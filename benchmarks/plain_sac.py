"""A plain SAC on a Gymnasium Box-action env (the reference of issue 19's "compare with a plain SAC"): two Q
MLPs (256, 256), a TanhGaussian actor, automatic entropy tuning, one update of --batch-size transitions every
--train-every env steps after --learning-starts random steps. Nothing from icrl: it answers "how many updates does
an ordinary off-policy actor-critic need on this task", the bound of a run that can afford only so many updates.

    python benchmarks/plain_sac.py --env Pendulum-v1 --steps 20000 --train-every 1 --seed 0
    python benchmarks/plain_sac.py --env Pendulum-v1 --steps 20000 --train-every 20    # 1,000 updates in all

Prints a greedy eval return (mean of --eval-episodes) every --eval-every env steps, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def mlp(i, o, h=256):
    return nn.Sequential(nn.Linear(i, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, o))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--env", default="Pendulum-v1")
    p.add_argument("--steps", type=int, default=20_000)
    p.add_argument("--train-every", type=int, default=1, help="env steps per update")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--gamma", type=float, default=0.98)
    p.add_argument("--tau", type=float, default=0.02)
    p.add_argument("--learning-starts", type=int, default=1000)
    p.add_argument("--eval-every", type=int, default=2000)
    p.add_argument("--eval-episodes", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    env, eval_env = gym.make(args.env), gym.make(args.env)
    od, ad = env.observation_space.shape[0], env.action_space.shape[0]
    lo, hi = env.action_space.low, env.action_space.high
    actor, q1, q2 = mlp(od, 2 * ad), mlp(od + ad, 1), mlp(od + ad, 1)
    q1t, q2t = mlp(od + ad, 1), mlp(od + ad, 1)
    q1t.load_state_dict(q1.state_dict())
    q2t.load_state_dict(q2.state_dict())
    log_alpha = torch.zeros((), requires_grad=True)
    opt_a = torch.optim.Adam(actor.parameters(), args.lr)
    opt_q = torch.optim.Adam([*q1.parameters(), *q2.parameters()], args.lr)
    opt_al = torch.optim.Adam([log_alpha], args.lr)

    def pi(o):
        mu, ls = actor(o).chunk(2, -1)
        std = ls.clamp(-5, 2).exp()
        u = mu + std * torch.randn_like(mu)
        a = torch.tanh(u)
        logp = (-0.5 * ((u - mu) / std) ** 2 - std.log() - 0.5 * np.log(2 * np.pi)).sum(-1)
        logp = logp - (2 * (np.log(2) - u - F.softplus(-2 * u))).sum(-1)
        return a, logp, torch.tanh(mu)

    def to_env(a):
        return lo + 0.5 * (a + 1.0) * (hi - lo)

    buf = {k: np.zeros((args.steps, n), np.float32) for k, n in (("o", od), ("a", ad), ("r", 1), ("o2", od), ("d", 1))}
    o, _ = env.reset(seed=args.seed)
    curve, updates, t0 = [], 0, time.time()
    for t in range(args.steps):
        if t < args.learning_starts:
            a = rng.uniform(-1, 1, ad).astype(np.float32)
        else:
            with torch.no_grad():
                a = pi(torch.as_tensor(o, dtype=torch.float32))[0].numpy()
        o2, r, term, trunc, _ = env.step(to_env(a))
        for k, v in (("o", o), ("a", a), ("r", r), ("o2", o2), ("d", float(term))):
            buf[k][t] = v
        o = o2
        if term or trunc:
            o, _ = env.reset()
        if t >= args.learning_starts and (t + 1) % args.train_every == 0:
            idx = rng.integers(0, t + 1, args.batch_size)
            b = {k: torch.as_tensor(v[idx]) for k, v in buf.items()}
            alpha = log_alpha.exp().detach()
            with torch.no_grad():
                a2, lp2, _ = pi(b["o2"])
                x2 = torch.cat([b["o2"], a2], -1)
                y = b["r"] + args.gamma * (1 - b["d"]) * (torch.min(q1t(x2), q2t(x2)) - alpha * lp2.unsqueeze(-1))
            x = torch.cat([b["o"], b["a"]], -1)
            lq = F.mse_loss(q1(x), y) + F.mse_loss(q2(x), y)
            opt_q.zero_grad()
            lq.backward()
            opt_q.step()
            an, lp, _ = pi(b["o"])
            xn = torch.cat([b["o"], an], -1)
            la = (alpha * lp - torch.min(q1(xn), q2(xn)).squeeze(-1)).mean()
            opt_a.zero_grad()
            la.backward()
            opt_a.step()
            lal = -(log_alpha * (lp.detach() - ad).mean())  # target entropy -|A|
            opt_al.zero_grad()
            lal.backward()
            opt_al.step()
            with torch.no_grad():
                for tn, n in ((q1t, q1), (q2t, q2)):
                    for pt, pn in zip(tn.parameters(), n.parameters()):
                        pt.mul_(1 - args.tau).add_(args.tau * pn)
            updates += 1
        if (t + 1) % args.eval_every == 0:
            rets = []
            for e in range(args.eval_episodes):
                eo, _ = eval_env.reset(seed=10_000 + e)
                done, ret = False, 0.0
                while not done:
                    with torch.no_grad():
                        ea = pi(torch.as_tensor(eo, dtype=torch.float32))[2].numpy()
                    eo, er, et, etr, _ = eval_env.step(to_env(ea))
                    ret, done = ret + er, et or etr
                rets.append(ret)
            curve.append((t + 1, updates, round(float(np.mean(rets)), 1)))
            print(f"env steps {t + 1:6d} | updates {updates:6d} | eval return {np.mean(rets):8.1f} | "
                  f"{time.time() - t0:.0f} s", flush=True)
    print(json.dumps({"env": args.env, "train_every": args.train_every, "batch_size": args.batch_size, "lr": args.lr,
                      "gamma": args.gamma, "seed": args.seed, "curve": curve, "wall_s": round(time.time() - t0)}))


if __name__ == "__main__":
    main()
