"""Time to solve Passive T-Maze: env steps and wall time until eval success first reaches a threshold.

Runs `icrl.train` on T-Maze with corridor `--length` for each seed, reads the run's metrics.jsonl
and reports, per seed, the first evaluation whose success rate is >= `--threshold` (default 0.95): its
env steps, updates and wall time (seconds since the run started, evaluation time included). Seeds that
never get there within `--total-env-steps` report null.

    python benchmarks/tmaze_time_to_solve.py --length 10 --seeds 0 1 2
    python benchmarks/tmaze_time_to_solve.py --length 100 --total-env-steps 200000 --set optim.lr=3e-4

`--set group.field=value` overrides any ExperimentConfig field (value parsed as JSON, else a string).
The last line printed is one JSON object (also written to
benchmarks/results/tmaze_time_to_solve/tmaze_solve_<tag>.json).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from pathlib import Path

from icrl.config import EnvConfig, ExperimentConfig, ModelConfig, apply_overrides
from icrl.run.reporting import read_metrics


def first_solve(rows: list[dict], threshold: float) -> dict | None:
    for r in rows:
        if r.get("kind") == "eval" and r.get("success_rate") is not None and r["success_rate"] >= threshold:
            return {k: r.get(k) for k in ("epoch", "env_steps", "updates", "wall_time", "success_rate", "return_mean")}
    return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--length", type=int, default=10, help="T-Maze corridor length N")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--threshold", type=float, default=0.95)
    p.add_argument("--total-env-steps", type=int, default=50_000)
    p.add_argument("--steps-per-epoch", type=int, default=None, help="default: the library's")
    p.add_argument("--updates-per-epoch", type=int, default=None, help="default: the library's")
    p.add_argument("--eval-every", type=int, default=1, help="epochs between evaluations (finer = sharper timing)")
    p.add_argument("--eval-rollouts", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=None, help="default: the library's")
    p.add_argument("--max-seq-len", type=int, default=None, help="default: length + 1 (the whole rollout in context)")
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--traj-encoder", default="transformer", choices=["transformer", "gru", "lstm", "ff"])
    p.add_argument("--parallel-envs", type=int, default=8)
    p.add_argument("--threads", type=int, default=None, help="default: the library's")
    p.add_argument("--device", default="auto")
    p.add_argument("--set", action="append", default=[], metavar="GROUP.FIELD=VALUE")
    p.add_argument("--preset", action="store_true",
                   help="start from icrl.config.presets.tmaze(length) "
                        "(model/explore/train flags above are then ignored; "
                        "--set still applies)")
    p.add_argument("--run-root", type=Path, default=Path("runs/bench_tmaze_solve"))
    p.add_argument("--keep-runs", action="store_true", help="keep run folders (replay included)")
    p.add_argument("--tag", default=None)
    args = p.parse_args()

    from icrl import train  # after argparse: --help stays fast

    tag = args.tag or f"N{args.length}_{args.traj_encoder}_d{args.d_model}_l{args.layers}"
    per_seed = []
    for seed in args.seeds:
        run_dir = args.run_root / f"{tag}_seed{seed}"
        if run_dir.exists():
            shutil.rmtree(run_dir)
        cfg = ExperimentConfig(
            env=EnvConfig(
                env="tmaze",
                env_kwargs=json.dumps({"length": args.length}),
                parallel_envs=args.parallel_envs,
            ),
            model=ModelConfig(
                traj_encoder=args.traj_encoder,
                d_model=args.d_model,
                layers=args.layers,
                heads=args.heads,
                max_seq_len=args.max_seq_len or args.length + 1,
            ),
        ).replace(**{k: getattr(args, k) for k in ("steps_per_epoch", "updates_per_epoch", "batch_size", "threads")
                     if getattr(args, k) is not None})
        if args.preset:
            from icrl.config.presets import tmaze

            cfg = tmaze(args.length)
        cfg = cfg.replace(eval_rollouts=args.eval_rollouts, run_dir=str(run_dir), seed=seed,
                          total_env_steps=args.total_env_steps, eval_every=args.eval_every, device=args.device)
        cfg = apply_overrides(cfg, args.set)
        effective = json.loads(cfg.to_json())
        t0 = time.perf_counter()
        final = train(cfg)
        total_wall = time.perf_counter() - t0
        rows = read_metrics(run_dir / "metrics.jsonl")
        solved = first_solve(rows, args.threshold)
        train_rows = [r for r in rows if r.get("kind") == "train"]
        per_seed.append({
            "seed": seed,
            "solved": solved is not None,
            "solve_env_steps": solved and solved["env_steps"],
            "solve_updates": solved and solved["updates"],
            "solve_wall_s": solved and solved["wall_time"],
            "solve_eval": solved,
            "final_success_rate": final.get("success_rate"),
            "final_return_mean": final.get("return_mean"),
            "total_env_steps": train_rows[-1]["env_steps"] if train_rows else None,
            "total_wall_s": total_wall,
            "mean_env_steps_per_s": statistics.fmean(r["time/env_steps_per_s"] for r in train_rows)
            if train_rows else None,
            "mean_updates_per_s": statistics.fmean(r["time/updates_per_s"] for r in train_rows
                                                   if r["time/updates_per_s"])
            if any(r["time/updates_per_s"] for r in train_rows) else None,
            "run_dir": str(run_dir),
            "config": effective,
        })  # fmt: skip
        s = per_seed[-1]
        print(f"seed {seed}: " + (f"solved at {s['solve_env_steps']:,} env steps / {s['solve_updates']} updates / "
              f"{s['solve_wall_s']:.1f} s" if s["solved"] else f"not solved in {s['total_env_steps']:,} env steps")
              + f"; final success {s['final_success_rate']}", flush=True)  # fmt: skip
        if not args.keep_runs:
            shutil.rmtree(run_dir / "replay", ignore_errors=True)

    solved = [s for s in per_seed if s["solved"]]
    summary = {
        "tag": tag,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "threshold": args.threshold,
        "seeds_solved": len(solved),
        "seeds": len(per_seed),
        "median_solve_env_steps": statistics.median(s["solve_env_steps"] for s in solved) if solved else None,
        "median_solve_wall_s": statistics.median(s["solve_wall_s"] for s in solved) if solved else None,
        "load_avg_end": [round(x, 2) for x in os.getloadavg()],
        "per_seed": per_seed,
    }
    out = Path(__file__).parent / "results" / "tmaze_time_to_solve" / f"tmaze_solve_{tag}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
