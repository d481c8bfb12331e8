"""Asynchronous vs synchronous training: wall time until Passive T-Maze is solved.

For each seed it runs, as real processes, (a) `icrl train --preset tmaze` and (b) `icrl learn` with the same
config plus `--collectors` `icrl collect` processes (each with `--max-lead`), then reads each run's
metrics.jsonl and reports the first evaluation whose success rate is >= `--threshold`: its wall time (the
run's own clock, from its first epoch; evaluation included), env steps and updates, and each run's whole
process time (start-up included). Both make the same updates per env step (the preset's 40 per 200; the
asynchronous learner's default --utd is that ratio) and evaluate every `--eval-every` epochs of 40 updates.

    python benchmarks/async_vs_sync.py --length 10 --seeds 0
    python benchmarks/async_vs_sync.py --length 20 --seeds 0 1 2 --collectors 2

The last line printed is one JSON object (also written to
benchmarks/results/async_vs_sync/async_vs_sync_N<length>.json).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from icrl.run.reporting import read_metrics

RESULTS = Path(__file__).parent / "results" / "async_vs_sync"


def first_solve(run_dir: Path, threshold: float) -> dict | None:
    for r in read_metrics(run_dir / "metrics.jsonl"):
        if r.get("kind") == "eval" and r.get("success_rate") is not None and r["success_rate"] >= threshold:
            return {k: r.get(k) for k in ("epoch", "env_steps", "updates", "wall_time", "success_rate")}
    return None


def icrl(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "icrl", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, **kw)


def run_sync(run_dir: Path, flags: list[str]) -> float:
    t0 = time.perf_counter()
    proc = icrl("train", *flags, "--run-dir", str(run_dir))
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(err)
    return time.perf_counter() - t0


def run_async(run_dir: Path, flags: list[str], collectors: int, max_lead: int | None) -> float:
    t0 = time.perf_counter()
    learner = icrl("learn", str(run_dir), *flags)
    lead = [] if max_lead is None else ["--max-lead", str(max_lead)]
    procs = [icrl("collect", str(run_dir), "--collector-id", str(k), *lead) for k in range(collectors)]
    _, err = learner.communicate()
    seconds = time.perf_counter() - t0
    for p in procs:  # they exit once the learner's done marker appears
        p.communicate(timeout=120)
    if learner.returncode != 0:
        raise RuntimeError(err)
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--length", type=int, default=10, help="T-Maze corridor length")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--threshold", type=float, default=0.95)
    p.add_argument("--total-env-steps", type=int, default=None, help="default: the preset's")
    p.add_argument("--eval-every", type=int, default=2, help="epochs (of 40 updates) between evaluations")
    p.add_argument("--collectors", type=int, default=1)
    p.add_argument("--max-lead", type=int, default=400, help="collectors' --max-lead; -1: none")
    p.add_argument("--run-root", type=Path, default=Path("runs/bench_async_vs_sync"))
    args = p.parse_args()
    flags = ["--preset", "tmaze", "--env-kwargs", json.dumps({"length": args.length}), "--eval-every",
             str(args.eval_every), "--log-every", "1000", "--device", "cpu"]
    if args.total_env_steps is not None:
        flags += ["--total-env-steps", str(args.total_env_steps)]
    per_seed = []
    for seed in args.seeds:
        row: dict = {"seed": seed}
        for mode in ("sync", "async"):
            run_dir = args.run_root / f"N{args.length}_{mode}_seed{seed}"
            shutil.rmtree(run_dir, ignore_errors=True)
            seed_flags = [*flags, "--seed", str(seed)]
            if mode == "sync":
                seconds = run_sync(run_dir, seed_flags)
            else:
                seconds = run_async(run_dir, seed_flags, args.collectors, None if args.max_lead < 0 else args.max_lead)
            rows = read_metrics(run_dir / "metrics.jsonl")
            last_eval = [r for r in rows if r["kind"] == "eval"][-1]
            row[mode] = {"solve": first_solve(run_dir, args.threshold), "process_s": seconds,
                         "final_success_rate": last_eval.get("success_rate"), "final_wall_time": last_eval["wall_time"],
                         "env_steps": last_eval["env_steps"], "updates": last_eval["updates"]}
            print(json.dumps({"seed": seed, mode: row[mode]}), flush=True)
        per_seed.append(row)
    out = {"benchmark": "async_vs_sync", "settings": {k: str(v) if isinstance(v, Path) else v
                                                       for k, v in vars(args).items()},
           "cpus": os.cpu_count(), "load_avg_end": list(os.getloadavg()), "per_seed": per_seed}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"async_vs_sync_N{args.length}.json").write_text(json.dumps(out, indent=2))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
