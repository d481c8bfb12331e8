"""`benchmarks/bandit_probe.py`'s measurement on the official AMAGO's bandit checkpoints, for a side-by-side reading.

Runs *inside the official AMAGO's virtualenv* (`benchmarks/parity.py --setup-amago`); imports nothing from icrl. It
builds the agent exactly as `amago_meta_rl.py` does (the same command-line arguments), then, instead of training,
loads each checkpoint and prints one JSON line: per discount, the correlation of the critic's Q(h, a) with the
posterior mean of each arm on random-pull histories (`bandit_probe.py` explains the measure), and the same for the
policy's log-probabilities.

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


def random_histories(n: int = 256, arms: int = 2, horizon: int = 50, seed: int = 0):
    """The histories of `bandit_probe.random_histories` (same generator, same draws) in the official layout:
    obs [n, H, 1], rl2s [n, H, 1 + arms] (previous reward, then previous action), time [n, H, 1], posterior."""
    rng = np.random.default_rng(seed)
    p = rng.uniform(size=(n, arms))
    pulls = rng.integers(0, arms, size=(n, horizon))
    reward = (rng.uniform(size=(n, horizon)) < np.take_along_axis(p, pulls, 1)).astype(np.float32)
    onehot = np.eye(arms, dtype=np.float32)[pulls]
    prev_action = np.zeros((n, horizon, arms), np.float32)
    prev_action[:, 1:] = onehot[:, :-1]
    prev_reward = np.zeros((n, horizon, 1), np.float32)
    prev_reward[:, 1:, 0] = reward[:, :-1]
    wins = np.cumsum(onehot * reward[..., None], 1) - onehot * reward[..., None]
    tries = np.cumsum(onehot, 1) - onehot
    posterior = (1 + wins) / (2 + tries)
    obs = np.broadcast_to(((horizon - np.arange(horizon)) / horizon).astype(np.float32)[None, :, None],
                          (n, horizon, 1)).copy()
    time = np.arange(horizon)[None, :, None].repeat(n, 0)
    return obs, np.concatenate([prev_reward, prev_action], -1), time, posterior


def _r(x: np.ndarray, y: np.ndarray) -> float:
    x = (x - x.mean(-1, keepdims=True)).ravel()
    y = (y - y.mean(-1, keepdims=True)).ravel()
    return float(np.corrcoef(x, y)[0, 1])


def main() -> None:
    pattern, script, argv = sys.argv[1], sys.argv[3], sys.argv[3:]
    checkpoints = sorted(glob.glob(pattern), key=lambda p: int(p.rsplit("_", 1)[-1].split(".")[0]))
    if not checkpoints:
        raise SystemExit(f"no checkpoint matches {pattern}")

    def probe_instead_of_learning(self: Experiment) -> None:
        obs, rl2s, time, posterior = random_histories()
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
                "q_r": [round(_r(q_all[..., g, :], post), 3) for g in range(G)],
                "policy_r": round(_r(logp, post), 3),
                "greedy_picks_best_posterior": round(float((logp.argmax(-1) == post.argmax(-1)).mean()), 3),
            }), flush=True)
        raise SystemExit(0)

    Experiment.learn = probe_instead_of_learning
    sys.argv = argv
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
