"""Cost of one continuous-action `Learner.update` at the library defaults (issue 19), against a discrete task of
the same size: Pendulum-v1 (obs 3, action Box(1), 200-step episodes) vs T-Maze 199 (201 timesteps).

Batches are real random rollouts (RandomPolicy -> Collector -> DiskReplay -> make_loader), batch 24, the
library's ExperimentConfig defaults (d_model 64, 4 critics, 7 discounts, head_hidden 128, fp32, eager).

    PYTHONPATH=$PWD python benchmarks/continuous_cost.py --threads 1 --updates 5 [--profile] [--env tmaze]

Prints the median seconds per update (after 1 warm-up) and, with --profile, the top ops by self CPU time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import torch

from icrl.agent.learner import Learner
from icrl.agent.model import Agent
from icrl.config import ExperimentConfig, ModelConfig
from icrl.data import DiskReplay, make_loader
from icrl.envs import Collector, RandomPolicy, make_vector_env
from icrl.types import ActionSpec


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--env", default="Pendulum-v1")
    p.add_argument("--env-kwargs", default="{}")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--updates", type=int, default=5)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--num-value-samples", type=int, default=None, help="unset: the library default")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--profile-rows", type=int, default=25)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    kwargs = json.loads(args.env_kwargs)
    if args.env == "tmaze" and not kwargs:
        kwargs = {"length": 199}
    venv = make_vector_env(args.env, kwargs, 8)
    spec = ActionSpec.from_space(venv.single_action_space)
    collector = Collector(venv, spec, seed=0)
    rollouts, _ = collector.collect(RandomPolicy(spec, seed=0), 8 * 220)
    obs_space = venv.single_observation_space["obs"]
    venv.close()
    cfg = ExperimentConfig(model=ModelConfig(max_seq_len=args.seq_len)).replace(threads=args.threads, compile=False)
    if args.num_value_samples is not None:
        cfg = cfg.replace(num_value_samples=args.num_value_samples)
    torch.manual_seed(0)
    agent = Agent(obs_space, spec, cfg.model, cfg.loss)
    learner = Learner(agent, cfg, torch.device("cpu"))
    with tempfile.TemporaryDirectory() as d:
        replay = DiskReplay(d, capacity_timesteps=100_000, fsync=False)
        for r in rollouts:
            replay.write(r)
        with make_loader(replay.root, batch_size=cfg.optim.batch_size, max_seq_len=args.seq_len, action_spec=spec,
                         seed=0) as loader:
            batches = [next(loader) for _ in range(args.updates + 1)]
    learner.update(batches[0])
    times = []
    for b in batches[1:]:
        t = time.perf_counter()
        learner.update(b)
        times.append(time.perf_counter() - t)
    print(f"{args.env}: batch {tuple(batches[1].mask.shape)}, median {statistics.median(times):.3f} s/update "
          f"(min {min(times):.3f}, {len(times)} updates, {args.threads} thread)")
    if args.profile:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            learner.update(batches[1])
        print(prof.key_averages(group_by_input_shape=True).table(
            sort_by="self_cpu_time_total", row_limit=args.profile_rows, max_name_column_width=30,
            max_shapes_column_width=70))


if __name__ == "__main__":
    main()
