"""Cost of `--discrete-action-input` (issue 22): a discrete critic Q(s, one-hot a) instead of one output per action.

With the option the TD target's V(s') and the advantage's V(s) are exact sums Σ_a π(a|s) Q(s, a) over the A one-hot
actions (`Critic.every_action`: A critic rows per state, k = 2 target members and C = 4 online ones). The
alternative is the continuous path's estimate: one sampled action per discount for the target (G = 7 rows per
state) and V(s) from the online term's own samples (no extra rows). This script times one `Learner.update` of

    per_action   the default discrete critic (one output per action)
    exact        --discrete-action-input with exact sums (the library's choice while A <= G)
    sampled      --discrete-action-input with the sampled target and V(s) (the library's choice beyond)

(`Critic.sums_over_actions` forced either way here) and the two pieces that differ on their own, at A = 4 and A = 18
actions, on synthetic batches (obs 8, random rewards) at the library defaults (d_model 64, 2 layers, head_hidden 128,
4 critics, 7 discounts, batch 24, fp32).

    PYTHONPATH=$PWD python benchmarks/discrete_action_input_cost.py --threads 1 --seq-len 64 --updates 5

Prints and writes benchmarks/results/discrete_action_input/cost_L{seq_len}.json (seconds, best of --updates).
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path
from unittest import mock

import gymnasium as gym
import numpy as np
import torch

from icrl.agent.critic_kind import CriticReader
from icrl.agent.learner import Learner, target_values
from icrl.agent.losses import align_next, redq_members
from icrl.agent.model import Agent
from icrl.config import ExperimentConfig, ModelConfig
from icrl.nets.heads import Critic
from icrl.types import ActionSpec, Batch, Timesteps

OBS = 8


def synthetic_batch(B: int, L: int, A: int, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    act = torch.nn.functional.one_hot(torch.randint(A, (B, L), generator=g), A).float()
    prev = torch.cat([torch.zeros(B, 1, A), act[:, :-1]], 1)
    ts = Timesteps(obs={"obs": torch.randn(B, L, OBS, generator=g)}, prev_action=prev,
                   prev_reward=torch.randn(B, L, generator=g), time=torch.arange(L).expand(B, L).clone(),
                   reset=torch.zeros(B, L, dtype=torch.int8))
    ones = torch.ones(B, L, dtype=torch.bool)
    has_action = ones.clone()
    has_action[:, -1] = False
    return Batch(inputs=ts, action=act, reward=torch.randn(B, L, generator=g), terminated=~ones, truncated=~ones,
                 mask=ones, has_action=has_action)


def forced(exact: bool):
    """`Critic.sums_over_actions` forced for the action-input critic: exact sums (True) or sampled actions."""
    return mock.patch.object(Critic, "sums_over_actions", property(lambda self: self.discrete or exact))


def best_of(fn, reps: int) -> float:
    """The fastest of `reps` timed calls after one warm-up: the least disturbed by other load on a shared machine."""
    fn()  # warm-up
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def measure(A: int, seq_len: int, reps: int, batch_size: int) -> dict:
    obs_space = gym.spaces.Dict({"obs": gym.spaces.Box(-np.inf, np.inf, (OBS,), np.float32)})
    spec = ActionSpec("discrete", A)
    batch = synthetic_batch(batch_size, seq_len + 1, A)
    out: dict = {"A": A}
    for variant in ("per_action", "exact", "sampled"):
        cfg = ExperimentConfig(model=ModelConfig(max_seq_len=seq_len)).replace(compile=False, device="cpu")
        cfg = cfg.replace(discrete_action_input=variant != "per_action")
        torch.manual_seed(0)
        agent = Agent(obs_space, spec, cfg.model, cfg.loss)
        learner = Learner(agent, cfg, torch.device("cpu"))
        with forced(variant != "sampled"):
            out[f"update_{variant}_s"] = best_of(functools.partial(learner.update, batch), reps)
        if variant != "per_action":
            out.update(pieces(agent, batch, cfg, reps, variant))
    return out


def pieces(agent: Agent, batch: Batch, cfg: ExperimentConfig, reps: int, variant: str) -> dict:
    """The TD target alone (and the exact V(s) of the advantage), on one encoder pass's states (no grad)."""
    with torch.no_grad():
        s = agent(batch.inputs)
    valid = batch.has_action & align_next(batch.mask)
    members = redq_members(cfg.loss.num_critics, cfg.loss.redq_subset, torch.Generator().manual_seed(0))
    read = CriticReader.of(agent, cfg.loss, s.device)
    with forced(variant == "exact"):
        out = {f"target_{variant}_s": best_of(
            lambda: target_values(agent, s, batch, valid, cfg.loss, members, read), reps)}
    if variant == "exact":
        with torch.no_grad():
            out["v_exact_s"] = best_of(lambda: read.normalized_per_action(agent.critic.every_action(s)), reps)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=24)
    p.add_argument("--updates", type=int, default=5)
    p.add_argument("--actions", type=int, nargs="+", default=[4, 18])
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rows = [measure(A, args.seq_len, args.updates, args.batch_size) for A in args.actions]
    result = {"settings": vars(args) | {"torch": torch.__version__, "loadavg": list(np.round(np.array(
        __import__("os").getloadavg()), 2))}, "rows": rows}
    for r in rows:
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}))
    out = Path(args.out or f"benchmarks/results/discrete_action_input/cost_L{args.seq_len}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
