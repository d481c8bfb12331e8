"""Learner throughput of data-parallel training: 1 process vs N processes (torchrun, icrl.parallel).

Fills a DiskReplay with random-policy Passive T-Maze rollouts once, then times `Learner.update` on batches
from it (make_loader, in-process) in 1 process (no launcher: the plain single-process learner) and under
`torchrun --standalone --nproc_per_node N` (DDP through Accelerate; gloo on CPU, NCCL on GPUs). Each
process samples its own `--batch-size` windows, so N processes make one optimiser step from N x batch-size
windows: the numbers to compare are optimiser steps/s and windows/s (= steps/s x N x batch-size).

    python benchmarks/distributed_throughput.py                    # 1 vs 2 CPU processes, 1 thread each
    python benchmarks/distributed_throughput.py --procs 1 2 4 --device cuda

The LAST line printed is one JSON object (also written to
benchmarks/results/distributed_throughput/
distributed_throughput_<device>_d<d-model>_l<layers>_L<seq-len>_b<batch-size>.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from icrl.agent.learner import Learner
from icrl.agent.model import Agent
from icrl.config import EnvConfig, ExperimentConfig, ModelConfig
from icrl.data import DiskReplay, make_loader
from icrl.envs import Collector, RandomPolicy, make_vector_env
from icrl.parallel import init_replicas
from icrl.seeding import derive_seed, seed_everything
from icrl.types import ActionSpec

RESULTS = Path(__file__).parent / "results" / "distributed_throughput"


def config(args: argparse.Namespace) -> ExperimentConfig:
    return ExperimentConfig(
        env=EnvConfig(env="tmaze", env_kwargs=json.dumps({"length": args.seq_len}), parallel_envs=8),
        model=ModelConfig(d_model=args.d_model, layers=args.layers, heads=4, max_seq_len=args.seq_len),
    ).replace(batch_size=args.batch_size, device=args.device, threads=args.threads, seed=0)


def fill_replay(cfg: ExperimentConfig, root: Path, env_steps: int) -> int:
    venv = make_vector_env(cfg.env.env, cfg.env.kwargs, cfg.env.parallel_envs)
    spec = ActionSpec.from_space(venv.single_action_space)
    rollouts, _ = Collector(venv, spec, seed=0).collect(RandomPolicy(spec, seed=0), env_steps)
    venv.close()
    replay = DiskReplay(root, capacity_timesteps=10**9, fsync=False)
    for r in rollouts:
        replay.write(r)
    return len(rollouts)


def worker(args: argparse.Namespace) -> None:
    """One process of a timed run (rank 0 writes the result to --out)."""
    cfg = ExperimentConfig.from_json(Path(args.config).read_text())
    replicas = init_replicas(cfg.run.device)
    seed_everything(0, replicas.rank)
    torch.set_num_threads(cfg.run.threads)
    venv = make_vector_env(cfg.env.env, cfg.env.kwargs, 1)
    spec = ActionSpec.from_space(venv.single_action_space)
    agent = Agent(venv.single_observation_space["obs"], spec, cfg.model, cfg.loss).to(replicas.device)
    venv.close()
    learner = Learner(agent, cfg, replicas.device, replicas)
    loader = make_loader(args.replay, batch_size=cfg.optim.batch_size, max_seq_len=cfg.model.training_window,
                         action_spec=spec, seed=derive_seed(replicas.rank_seed(0), "loader"))
    batches = [next(loader) for _ in range(8)]  # sampling is not what is timed: cycle through these
    for i in range(args.warmup):
        learner.update(batches[i % len(batches)])
    replicas.barrier()
    start = time.perf_counter()
    for i in range(args.updates):
        metrics = learner.update(batches[i % len(batches)])
    float(metrics["loss"])  # waits for the device
    seconds = time.perf_counter() - start
    seconds = max(replicas.sum([seconds])[0] / replicas.world_size, 1e-9)  # the ranks' mean
    if replicas.is_main:
        world = replicas.world_size
        Path(args.out).write_text(json.dumps({
            "processes": world, "updates": args.updates, "seconds": seconds,
            "optimizer_steps_per_s": args.updates / seconds,
            "windows_per_s": args.updates * world * cfg.optim.batch_size / seconds,
        }))
    loader.close()
    replicas.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--procs", type=int, nargs="+", default=[1, 2])
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=24)
    p.add_argument("--updates", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=2, help="timed runs per process count (the best is kept)")
    p.add_argument("--env-steps", type=int, default=20_000, help="random-policy env steps in the replay")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    p.add_argument("--replay", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    cfg = config(args)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "config.json").write_text(cfg.to_json())
        rollouts = fill_replay(cfg, tmp / "replay", args.env_steps)
        common = [__file__, "--worker", "--config", str(tmp / "config.json"), "--replay", str(tmp / "replay"),
                  "--out", str(tmp / "out.json"), "--updates", str(args.updates), "--warmup", str(args.warmup)]
        for n in args.procs:
            best = None
            for _ in range(args.repeats):
                launcher = [] if n == 1 else ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(n)]
                env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
                subprocess.run([sys.executable, *launcher, *common], check=True, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                result = json.loads((tmp / "out.json").read_text())
                print(json.dumps(result))
                if best is None or result["optimizer_steps_per_s"] > best["optimizer_steps_per_s"]:
                    best = result
            runs.append(best)
    base = runs[0]["windows_per_s"]
    for r in runs:
        r["windows_speedup_vs_first"] = r["windows_per_s"] / base
    out = {
        "benchmark": "distributed_throughput",
        "config": {k: v for k, v in vars(args).items() if k not in ("worker", "config", "replay", "out")},
        "replay_rollouts": rollouts,
        "host": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
                 "load_average_1min_at_end": os.getloadavg()[0]},
        "runs": runs,
    }
    RESULTS.mkdir(exist_ok=True)
    tag = f"{args.device}_d{args.d_model}_l{args.layers}_L{args.seq_len}_b{args.batch_size}"
    (RESULTS / f"distributed_throughput_{tag}.json").write_text(json.dumps(out, indent=2))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
