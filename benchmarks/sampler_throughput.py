"""Replay sampler throughput: batches/s of `make_loader` for 0, 1 and 2 DataLoader workers.

Writes N synthetic rollouts (T-Maze-like: 4 float observations, 4 discrete actions; optionally an
extra uint8 image key) into a fresh DiskReplay, then times batches of B x L windows. The learner needs
the sampler to stay well ahead of its update rate; this tells you how many workers that takes.

    python benchmarks/sampler_throughput.py --num-rollouts 200 --rollout-len 500 --workers 0 1 2
    python benchmarks/sampler_throughput.py --image 64      # 64x64x3 uint8 frames, exceeds the cache

Prints a table and writes JSON to benchmarks/results/sampler/sampler.json (see --out).
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from icrl.data import DiskReplay, make_loader
from icrl.types import ActionSpec, Rollout

SPEC = ActionSpec("discrete", 4)


def synthetic_rollout(T: int, rng: np.random.Generator, image: int) -> Rollout:
    action = rng.integers(SPEC.dim, size=T)
    reward = np.zeros(T, np.float32)
    reward[-1] = rng.choice([-1.0, 1.0])
    prev_action = np.zeros((T + 1, SPEC.dim), np.float32)
    prev_action[1:] = SPEC.to_vector(action)
    obs = {"obs": rng.normal(size=(T + 1, 4)).astype(np.float32)}
    if image:
        obs["image"] = rng.integers(256, size=(T + 1, image, image, 3), dtype=np.uint8)
    reset = np.zeros(T + 1, bool)
    reset[0] = True
    terminated = np.zeros(T, bool)
    terminated[-1] = True
    return Rollout(
        obs=obs,
        prev_action=prev_action,
        prev_reward=np.concatenate([[0.0], reward]).astype(np.float32),
        time=np.arange(T + 1),
        reset=reset,
        action=action,
        reward=reward,
        terminated=terminated,
        truncated=np.zeros(T, bool),
    )


def time_loader(root: Path, workers: int, args: argparse.Namespace) -> dict:
    t0 = time.perf_counter()
    loader = make_loader(
        root,
        batch_size=args.batch_size,
        max_seq_len=args.seq_len,
        action_spec=SPEC,
        seed=0,
        num_workers=workers,
        cache_bytes=args.cache_mb * 2**20,
    )
    with loader:
        for _ in range(args.warmup):
            next(loader)
        first = time.perf_counter() - t0
        t1 = time.perf_counter()
        for _ in range(args.batches):
            batch = next(loader)
            if args.learner_ms:
                time.sleep(args.learner_ms / 1000)  # a learner waiting on its GPU step
        dt = time.perf_counter() - t1
    assert batch.shape[0] == args.batch_size and batch.shape[1] <= args.seq_len  # padded to longest window
    bps = args.batches / dt
    return {
        "workers": workers,
        "batches_per_s": bps,
        "timesteps_per_s": bps * args.batch_size * args.seq_len,
        "ms_per_batch": 1000 * dt / args.batches,
        "sampler_ms_per_batch_beyond_learner": 1000 * dt / args.batches - args.learner_ms,
        "startup_and_warmup_s": first,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-rollouts", type=int, default=200)
    p.add_argument("--rollout-len", type=int, default=500, help="actions per rollout")
    p.add_argument("--image", type=int, default=0, help="side of an extra HxWx3 uint8 obs key (0: none)")
    p.add_argument("--batch-size", type=int, default=24)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--batches", type=int, default=50, help="timed batches per setting")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--learner-ms", type=float, default=0.0, help="simulated GPU update per batch (sleep)")
    p.add_argument("--cache-mb", type=int, default=256, help="per-worker LRU cache")
    p.add_argument("--root", type=Path, default=None, help="replay folder (default: a temp dir)")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "sampler" / "sampler.json")
    args = p.parse_args()

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.root or Path(tmp) / "replay"
        replay = DiskReplay(root, capacity_timesteps=10**12)
        rng = np.random.default_rng(0)
        template = [synthetic_rollout(args.rollout_len, rng, args.image) for _ in range(4)]
        t0 = time.perf_counter()
        for i in range(args.num_rollouts):
            replay.write(template[i % 4])
        write_s = time.perf_counter() - t0
        nbytes = sum(f.path.stat().st_size for f in replay.files())
        results = [time_loader(root, w, args) for w in args.workers]

    report = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "buffer": {
            "rollouts": args.num_rollouts,
            "timesteps": replay.num_timesteps() if args.root else args.num_rollouts * (args.rollout_len + 1),
            "mb_on_disk": nbytes / 2**20,
            "writes_per_s": args.num_rollouts / write_s,
        },
        "results": results,
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
        },
    }
    b = report["buffer"]
    print(
        f"buffer: {b['rollouts']} rollouts, {b['mb_on_disk']:.1f} MB, "
        f"written at {b['writes_per_s']:.0f} rollouts/s (fsync on)"
    )
    print(f"batch {args.batch_size} x {args.seq_len}, image={args.image or 'none'}")
    print(f"{'workers':>7} {'batches/s':>10} {'ms/batch':>9} {'timesteps/s':>12} {'startup s':>10}")
    for r in results:
        print(
            f"{r['workers']:>7} {r['batches_per_s']:>10.1f} {r['ms_per_batch']:>9.2f} "
            f"{r['timesteps_per_s']:>12.0f} {r['startup_and_warmup_s']:>10.2f}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
