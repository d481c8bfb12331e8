"""DiskReplay write cost and folder-listing cost as the fifo fills with files.

For each size N, a fifo folder is pre-filled with N valid rollout files (hard links to one file, so
setup is fast) holding exactly `capacity_timesteps`, i.e. the steady state of a full buffer where
writes keep evicting. Then it times `DiskReplay.write` of short T-Maze-like rollouts (12 actions, 13
timesteps) with:

* `fsync=False`  - the configuration the training loop is expected to use for the fifo;
* `fsync=True`   - the default (power-loss safe; costs two fsyncs per write on a real disk);
* `recount_seconds=0, low_water=1.0` - lists the folder and evicts on every write, as DiskReplay did
  before the running estimate (but with the new, faster listing);

Eviction runs once per cycle of ~(1 - low_water) * capacity timesteps of writes; "amortized_ms" spreads
its cost (listing + deletes, "mean_evict_ms") over that cycle. Also timed: the listing itself (what a
sampler refresh or an eviction pays): a cold `FolderIndex.scan()` (every name parsed), an incremental
re-scan after one new file, a scan of an unchanged folder whose mtime is trusted, and
`list_rollout_files` (which also builds Path objects).

    python benchmarks/replay_write.py                      # N = 100, 1000, 10000
    python benchmarks/replay_write.py --sizes 100 80000    # 80k files: 1M timesteps of T-Maze rollouts

Prints a table and writes JSON to benchmarks/results/replay_write/replay_write.json (see --out).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from icrl.data import DiskReplay, list_rollout_files, rollout_file_name, save_rollout
from icrl.data.storage import FolderIndex
from icrl.types import ActionSpec, Rollout

SPEC = ActionSpec("discrete", 4)


def tmaze_rollout(T: int, rng: np.random.Generator) -> Rollout:
    action = rng.integers(SPEC.dim, size=T)
    reward = np.zeros(T, np.float32)
    prev_action = np.zeros((T + 1, SPEC.dim), np.float32)
    prev_action[1:] = SPEC.to_vector(action)
    reset = np.zeros(T + 1, bool)
    reset[0] = True
    terminated = np.zeros(T, bool)
    terminated[-1] = True
    return Rollout(
        obs={"obs": rng.normal(size=(T + 1, 4)).astype(np.float32)},
        prev_action=prev_action,
        prev_reward=np.zeros(T + 1, np.float32),
        time=np.arange(T + 1),
        reset=reset,
        action=action,
        reward=reward,
        terminated=terminated,
        truncated=np.zeros(T, bool),
    )


def prefill(fifo: Path, n: int, rollout: Rollout) -> None:
    """n valid rollout files (hard links of a few files; names sort before any new write)."""
    fifo.mkdir(parents=True, exist_ok=True)
    base = time.time_ns() - 10**12  # older than anything written later
    for i in range(n):
        if i % 50_000 == 0:  # ext4 allows 65,000 links per inode
            src = save_rollout(fifo.parent / f"src{i}.npz", rollout, fsync=False)
        os.link(src, fifo / f"{base + i:020d}-1-{i % 16**8:08x}-T{rollout.num_timesteps}.npz")
        if i % 50_000 == 49_999 or i == n - 1:
            src.unlink()


def time_writes(root: Path, n: int, writes: int, rollout: Rollout, **kw) -> dict:
    capacity = n * rollout.num_timesteps
    t0 = time.perf_counter()
    replay = DiskReplay(root, capacity, **kw)
    construct_ms = 1e3 * (time.perf_counter() - t0)
    evict_ms, deleted = [], [0]
    real_evict = replay.evict

    def timed_evict():
        t = time.perf_counter()
        out = real_evict()
        evict_ms.append(1e3 * (time.perf_counter() - t))
        deleted[0] += len(out)
        return out

    replay.evict = timed_evict  # type: ignore[method-assign]
    ms, plain, evicting = [], [], []
    for _ in range(writes):  # the buffer starts exactly full: the first write evicts
        before = len(evict_ms)
        t = time.perf_counter()
        replay.write(rollout)
        ms.append(1e3 * (time.perf_counter() - t))
        (evicting if len(evict_ms) > before else plain).append(ms[-1])
    fifo = replay.num_timesteps("fifo")
    assert fifo <= capacity, (fifo, capacity)
    ms_sorted = sorted(ms)
    # Steady state: one eviction (listing + deletes) per cycle of writes that refill the freed space.
    cycle = max(1, round(capacity * (1 - replay.low_water) / rollout.num_timesteps))
    if not plain or cycle == 1:  # every write evicts
        amortized = statistics.fmean(ms)
    else:
        base = statistics.fmean(plain)
        amortized = base + ((statistics.fmean(evicting) - base) / cycle if evicting else 0.0)
    return {
        "writes": writes,
        "mean_ms": statistics.fmean(ms),
        "median_ms": statistics.median(ms),
        "p99_ms": ms_sorted[min(len(ms) - 1, int(0.99 * len(ms)))],
        "max_ms": ms_sorted[-1],
        "evictions": len(evict_ms),
        "files_deleted": deleted[0],
        "mean_evict_ms": statistics.fmean(evict_ms) if evict_ms else 0.0,
        "writes_per_eviction_cycle": cycle,
        "amortized_ms": amortized,
        "construct_ms": construct_ms,
        "fifo_timesteps_after": fifo,
        "capacity_timesteps": capacity,
    }


def time_listing(fifo: Path, reps: int = 3) -> dict:
    def best(f) -> float:
        out = float("inf")
        for _ in range(reps):
            t = time.perf_counter()
            f()
            out = min(out, time.perf_counter() - t)
        return 1e3 * out

    cold = best(lambda: FolderIndex(fifo, trust_after_s=None).scan())
    index = FolderIndex(fifo, trust_after_s=None)
    index.scan()
    extra = fifo / rollout_file_name(13)

    def one_new() -> None:
        extra.write_bytes(b"")
        t = time.perf_counter()
        index.scan()
        one_new.ms.append(1e3 * (time.perf_counter() - t))  # type: ignore[attr-defined]
        extra.unlink()
        index.scan()

    one_new.ms = []  # type: ignore[attr-defined]
    for _ in range(reps):
        one_new()
    old = time.time() - 60
    os.utime(fifo, (old, old))
    trusted = FolderIndex(fifo, trust_after_s=1.0)
    trusted.scan()
    return {
        "cold_scan_ms": cold,
        "incremental_scan_ms": min(one_new.ms),  # type: ignore[attr-defined]
        "unchanged_scan_ms": best(trusted.scan),
        "list_rollout_files_ms": best(lambda: list_rollout_files(fifo)),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000], help="existing fifo files")
    p.add_argument("--writes", type=int, default=1000, help="timed writes per setting (fsync=False)")
    p.add_argument("--fsync-writes", type=int, default=200, help="timed writes with fsync=True")
    p.add_argument("--old-writes", type=int, default=200, help="timed writes listing on every write")
    p.add_argument("--rollout-len", type=int, default=12, help="actions per rollout (T-Maze: 12-22)")
    p.add_argument("--dir", type=Path, default=None, help="where to make the buffers (default: temp dir)")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "replay_write" / "replay_write.json")
    args = p.parse_args()

    rollout = tmaze_rollout(args.rollout_len, np.random.default_rng(0))
    settings = {
        "fsync=False": (args.writes, dict(fsync=False)),
        "fsync=True": (args.fsync_writes, dict(fsync=True)),
        "list+evict every write": (args.old_writes, dict(fsync=False, recount_seconds=0.0, low_water=1.0)),
    }
    results = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for n in args.sizes:
            row: dict = {"existing_files": n}
            for k, (name, (writes, kw)) in enumerate(settings.items()):
                root = Path(tmp) / f"n{n}-{k}"
                prefill(root / "fifo", n, rollout)
                if k == 0:
                    row["listing"] = time_listing(root / "fifo")
                row[name] = time_writes(root, n, writes, rollout, **kw)
            results.append(row)
            lst = row["listing"]
            print(
                f"N={n:>6}: write ms amortized/median/evict "
                + "  ".join(
                    f"[{k}] {r['amortized_ms']:.2f}/{r['median_ms']:.2f}/{r['mean_evict_ms']:.1f}"
                    for k, r in ((k, row[k]) for k in settings)
                )
                + f" | listing ms cold {lst['cold_scan_ms']:.1f}, +1 file {lst['incremental_scan_ms']:.1f}, "
                f"unchanged {lst['unchanged_scan_ms']:.3f}, "
                f"list_rollout_files {lst['list_rollout_files_ms']:.1f}",
                flush=True,
            )

    report = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "rollout_timesteps": rollout.num_timesteps,
        "results": results,
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
