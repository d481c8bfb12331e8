"""What a discrete run's greedy policy does in the first episode of a new task.

    python benchmarks/greedy_rollout_probe.py RUN_DIR [RUN_DIR ...] [--episodes 64] [--out FILE.jsonl]

Plays `--episodes` first episodes (each a new task: the policy's memory starts empty) with the run's final weights,
acting greedily as the evaluation does, on the run's own env (`config.json`), and reports the share of each
action, the share of steps that leave the observation unchanged (on a grid task: a move into the border, which
stores the same state again) and how the episodes end (`reward`: the last reward was positive; `terminated`
without it; `truncated`: the time limit). An evaluation that sits at 0 while the episodes last the whole time
limit says the policy walks into a wall; this says which action and how often (docs/results.md, "The conservative
term's temperature"). One JSON line per run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def same_observation(a: object, b: object) -> bool:
    if isinstance(a, dict):
        return all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)  # type: ignore[index]
    return bool(np.array_equal(np.asarray(a), np.asarray(b)))


def probe(run_dir: Path, episodes: int, seed: int) -> dict:
    import icrl
    from icrl.envs.make import make_env
    from icrl.envs.user import run_env_config
    from icrl.types import ActionSpec

    policy = icrl.load(str(run_dir))
    env_cfg = run_env_config(policy.config, run_dir).env  # refuses a run env that names code, as `icrl eval` does
    env = make_env(env_cfg.env, env_cfg.kwargs)
    spec = ActionSpec.from_space(env.action_space)
    if spec.kind != "discrete":
        raise SystemExit(f"the run's env has {spec.kind} actions: this probe reads discrete ones only")
    actions = np.zeros(spec.dim, dtype=np.int64)
    unchanged = steps = 0
    ends = {"reward": 0, "terminated": 0, "truncated": 0}
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        state, start, reward = None, True, 0.0
        while True:
            action, state = policy.predict(obs, state, start, reward=reward)
            a = int(np.asarray(action).reshape(-1)[0])
            next_obs, r, terminated, truncated, _ = env.step(a)
            reward = float(r)
            actions[a] += 1
            steps += 1
            unchanged += same_observation(obs, next_obs)
            obs, start = next_obs, False
            if terminated or truncated:
                ends["reward" if reward > 0 else "terminated" if terminated else "truncated"] += 1
                break
    return {"run": str(run_dir), "episodes": episodes, "steps": steps,
            "action_share": (actions / max(steps, 1)).round(3).tolist(),
            "unchanged_share": round(unchanged / max(steps, 1), 3), "ends": ends}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dirs", nargs="+", type=Path)
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1000, help="env seed of the first episode (then +1 per episode)")
    ap.add_argument("--out", type=Path, default=None, help="also append the lines to this file")
    args = ap.parse_args()
    for run_dir in args.run_dirs:
        line = json.dumps(probe(run_dir, args.episodes, args.seed))
        print(line)
        if args.out is not None:
            with args.out.open("a") as f:
                f.write(line + "\n")


if __name__ == "__main__":
    main()
