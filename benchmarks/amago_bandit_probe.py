"""`benchmarks/bandit_probe.py`'s measurement on the official AMAGO's bandit checkpoints, for a side-by-side reading.

Runs *inside the official AMAGO's virtualenv* (`benchmarks/parity.py --setup-amago`) and imports nothing from icrl:
its histories and measure are `bandit_probe.py`'s (whose icrl imports sit in the functions only icrl's side calls),
so both sides read the same draws. It builds the agent exactly as `amago_meta_rl.py` does (the same command-line
arguments), then, instead of training, loads each checkpoint and prints one JSON line: per discount, the correlation
of the critic's Q(h, a) with the posterior mean of each arm on random-pull histories (`bandit_probe.py` explains the
measure), and the same for the policy's log-probabilities.

    # both with TORCH_COMPILE_DISABLE=1, as the parity harness runs the official code (inductor fails on these CPUs)
    # a run that keeps a checkpoint per epoch (policy_epoch_K.pt holds the weights after (K + 1) x 100 updates)
    python benchmarks/parity_amago_run.py benchmarks/amago_meta_rl.py --env bandit ... --ckpt_interval 1
    # the probe: the checkpoints' glob, then the same amago_meta_rl.py arguments (with another --run_name)
    python benchmarks/amago_bandit_probe.py "BUFFER_DIR/RUN/ckpts/policy_weights/policy_epoch_*.pt" -- \
        benchmarks/amago_meta_rl.py --env bandit ... --run_name probe_eval
"""

import glob
import json
import runpy
import sys

import numpy as np
import torch
from amago.experiment import Experiment

# the same draws and measure as icrl's side (run as a script, benchmarks/ is on the path; that module imports
# icrl only where icrl's side uses it)
from bandit_probe import arm_offset, centred_correlation, random_pulls


def official_inputs(n: int = 256, arms: int = 2, horizon: int = 50, seed: int = 0):
    """`random_pulls` in the official layout: obs [n, H, 1], rl2s [n, H, 1 + arms] (previous reward, then
    previous action), time [n, H, 1], and the posterior."""
    h = random_pulls(n, arms, horizon, seed)
    rl2s = np.concatenate([h.prev_reward[..., None], h.prev_action], -1)
    time = np.arange(horizon)[None, :, None].repeat(n, 0)
    return h.pulls_left[..., None], rl2s, time, h.posterior


def main() -> None:
    pattern, script, argv = sys.argv[1], sys.argv[3], sys.argv[3:]
    checkpoints = sorted(glob.glob(pattern), key=lambda p: int(p.rsplit("_", 1)[-1].split(".")[0]))
    if not checkpoints:
        raise SystemExit(f"no checkpoint matches {pattern}")

    def probe_instead_of_learning(self: Experiment) -> None:
        obs, rl2s, time, posterior = official_inputs()
        policy = self.policy
        arms = rl2s.shape[-1] - 1
        for ckpt in checkpoints:
            policy.load_state_dict(torch.load(ckpt, map_location="cpu", weights_only=True))
            policy.eval()
            with torch.no_grad():
                o = policy.tstep_encoder(obs={"observation": torch.from_numpy(obs)}, rl2s=torch.from_numpy(rl2s))
                s, _ = policy.traj_encoder(seq=o, time_idxs=torch.from_numpy(time), hidden_state=None)
                G = len(policy.gammas)
                q = []
                for a in range(arms):  # Q(s, e_a) for every arm: [1, B, L, C, G, 1] each
                    one_hot = torch.zeros(1, *s.shape[:2], G, arms)
                    one_hot[..., a] = 1
                    q.append(policy.critics(s, one_hot).mean(0)[..., 0])
                q_all = torch.stack(q, -1).mean(-3).numpy()[:, 1:]  # [B, L-1, G, A], ensemble mean
                logp = policy.actor(s).probs.log()[..., -1, :].numpy()[:, 1:]  # the acting discount
            post = posterior[:, 1:]
            print(json.dumps({
                "checkpoint": ckpt.rsplit("/", 1)[-1],
                "q_r": [round(centred_correlation(q_all[..., g, :], post), 3) for g in range(G)],
                **arm_offset(q_all[..., -1, :]),
                "policy_r": round(centred_correlation(logp, post), 3),
                "policy_logit_sd": round(float((logp - logp.mean(-1, keepdims=True)).std()), 3),
                "greedy_picks_best_posterior": round(float((logp.argmax(-1) == post.argmax(-1)).mean()), 3),
            }), flush=True)
        raise SystemExit(0)

    Experiment.learn = probe_instead_of_learning
    sys.argv = argv
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
