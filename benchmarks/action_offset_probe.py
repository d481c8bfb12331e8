"""Does a discrete-action run's policy follow its history, or a preference between actions that no history moves?

    python benchmarks/action_offset_probe.py RUN_DIR     # a run of `icrl train` with --checkpoint-every 1

`bandit_probe.py` asks the bandit's critic about the one statistic the bandit has; any other discrete task has no
such known statistic, but the failure it found has a signature of its own: early on, the critic's Q(h, a) carries a
part that is the same for every history (its initialisation, or a lean of the data), the policy learns that part
first, plays one action everywhere, and the data it then collects leans the same way. This probe plays `--rollouts`
episodes of uniformly random actions on the run's own env (the data of the first epochs, where ε is near 1; one
rollout per episode, at most the run's context long), and reports per checkpoint:

* `q_arm_offset` / `q_history_sd` (`bandit_probe.arm_offset`): the acting discount's Q (ensemble mean, PopArt
  units, centred over the actions) split into its mean over every step of every history, per action, and the
  spread of the rest;
* `policy_mean_probs` (the acting policy's mean probability of each action), `policy_entropy` (its mean, nats),
  `greedy_share` (how often each action is the policy's argmax), `policy_prob_sd` (the spread over histories of
  the policy's probabilities: near 0 when it plays the same everywhere).

One JSON line per checkpoint (`RUN_DIR/checkpoints/ckpt-N`). The critic's preference can change sign between
checkpoints while the policy keeps following it: `action_offset_trace.py` reads it on every 5th update's batch.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

if __package__ in (None, ""):  # run as `python benchmarks/<name>.py`: the repo root, for `from benchmarks import`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.bandit_probe import arm_offset, run_checkpoints  # noqa: E402

if TYPE_CHECKING:
    from icrl.agent.model import Agent
    from icrl.types import Batch


def random_rollouts(run_dir: Path, n: int, seed: int) -> Batch:
    """n rollouts of uniformly random actions on the run's env (the library's collector and `RandomPolicy`), as one
    Batch of windows [n, the run's context] from each rollout's start; the probe reads the steps with an action."""
    from icrl.data.collate import collate_windows
    from icrl.envs.collect import Collector, RandomPolicy
    from icrl.envs.make import make_vector_env
    from icrl.envs.user import run_env_config
    from icrl.run.load import load_config
    from icrl.types import ActionSpec

    cfg = run_env_config(load_config(run_dir), run_dir)  # refuses a run env that names code, as `icrl eval` does
    venv = make_vector_env(cfg.env.env, cfg.env.kwargs, num_envs=1)
    spec = ActionSpec.from_space(venv.single_action_space)
    if spec.kind != "discrete":
        raise SystemExit(f"the run's env has {spec.kind} actions: this probe reads discrete ones only")
    rollouts, _ = Collector(venv, spec, seed=seed).collect_rollouts(RandomPolicy(spec, seed=seed), n, seed=seed)
    venv.close()
    return collate_windows([(r, 0) for r in rollouts], cfg.model.max_seq_len, spec)


def acting_discount(agent: Agent, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the acting (last) discount makes of a batch: every critic member's Q of every action [B, L, C, A]
    (PopArt units), the policy's π [B, L, A], and the steps with an action [B, L] (a rollout's last and padding
    have none). Shared with `action_offset_trace.py`, which reads it on each traced update's batch."""
    s = agent(batch.inputs)  # [B, L, d]
    return agent.critic.every_action(s)[..., -1, :], agent.actor(s).probs[..., -1, :], batch.has_action & batch.mask


@torch.no_grad()
def probe(path: Path, batch: Batch) -> dict:
    import icrl

    agent = icrl.load(str(path)).agent
    agent.eval()
    q_members, probs, acted = acting_discount(agent, batch)
    q_all = q_members.mean(-2)[acted].numpy()  # [N, A]: ensemble mean
    p = probs[acted].numpy()  # [N, A]
    entropy = -(p * np.log(np.clip(p, 1e-12, 1.0))).sum(-1)
    return {
        **arm_offset(q_all),
        "policy_mean_probs": [round(float(v), 3) for v in p.mean(0)],
        "policy_prob_sd": round(float(p.std(0).mean()), 3),
        "policy_entropy": round(float(entropy.mean()), 3),
        "greedy_share": [round(float(v), 3) for v in np.bincount(p.argmax(-1), minlength=p.shape[-1]) / len(p)],
        "popart_sigma": round(float(agent.popart.sigma.flatten()[-1]), 4),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", type=Path)
    p.add_argument("--rollouts", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    checkpoints = run_checkpoints(args.run_dir)
    batch = random_rollouts(args.run_dir, args.rollouts, args.seed)
    for ckpt in checkpoints:
        print(json.dumps({"checkpoint": ckpt.name, **probe(ckpt, batch)}), flush=True)


if __name__ == "__main__":
    main()
