"""Train icrl on your own Gymnasium env, then act with the trained policy (README, "Python API").

    python examples/custom_env.py                       # trains into runs/signpost, then plays 5 episodes
    python examples/custom_env.py --steps 800 --quick   # a smoke test: tiny model, a few seconds

`Signpost` is a one-bit memory task: a sign (+1 or -1) is shown at the first step only, then `delay` blank
steps follow, and the last action must point the way the sign did (+1 reward). Only a policy that remembers
the first observation can solve it. `icrl.train` takes the class itself; `icrl.load` rebuilds the policy
from the run directory alone (the env's spaces are in RUN_DIR/spaces.json), so a process that acts with it
needs none of the training code.
"""

from __future__ import annotations

import argparse
import dataclasses

import gymnasium as gym
import numpy as np

import icrl
from icrl.config import EnvConfig, ExperimentConfig, ModelConfig


class Signpost(gym.Env):
    """Remember the sign shown at t=0 for `delay` steps, then answer: action 1 for +1, action 0 for -1."""

    def __init__(self, delay: int = 3) -> None:
        self.delay = delay
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)  # [sign (t=0 only), steps left]
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.sign, self.t = float(self.np_random.choice([-1.0, 1.0])), 0
        return np.array([self.sign, 1.0], np.float32), {}

    def step(self, action):
        self.t += 1
        left = max(self.delay + 1 - self.t, 0) / (self.delay + 1)
        if self.t <= self.delay:  # blank steps: any action, no reward
            return np.array([0.0, left], np.float32), 0.0, False, False, {}
        success = float(int(action) == (1 if self.sign > 0 else 0))
        return np.array([0.0, 0.0], np.float32), success, True, False, {"success": success}


def play(run_dir: str, episodes: int = 5, seed: int = 0) -> list[float]:
    """Load the run and act greedily in fresh envs, as the README shows; returns each episode's return."""
    policy = icrl.load(run_dir)
    env = Signpost()
    returns = []
    for i in range(episodes):
        obs, info = env.reset(seed=seed + i)
        state, start, reward, total, done = None, True, None, 0.0, False
        while not done:
            action, state = policy.predict(obs, state, episode_start=start, reward=reward)
            obs, reward, terminated, truncated, info = env.step(action)
            total, start, done = total + reward, False, terminated or truncated
        returns.append(total)
    return returns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", default="runs/signpost")
    parser.add_argument("--steps", type=int, default=6000, help="env steps to train for (default: 6 epochs)")
    parser.add_argument("--quick", action="store_true", help="a tiny model and few updates (smoke test)")
    args = parser.parse_args()
    cfg = ExperimentConfig().replace(run_dir=args.run_dir, total_env_steps=args.steps)
    if args.quick:
        cfg = dataclasses.replace(
            cfg,
            env=EnvConfig(parallel_envs=4),
            model=ModelConfig(d_model=16, layers=1, heads=2, head_hidden=16, max_seq_len=16),
        ).replace(eval_rollouts=8, steps_per_epoch=min(400, args.steps), updates_per_epoch=4, device="cpu")
    result = icrl.train(cfg, env=Signpost)
    print(f"trained: eval return {result['return_mean']:.2f}; greedy returns of 5 fresh episodes: "
          f"{play(args.run_dir)}")


if __name__ == "__main__":
    main()
