"""Hindsight instruction relabeling ablation: success vs env steps with `--relabel none / some / all`.

Each goal-conditioned task (GoalGrid, MazeRunner, Package Delivery; Crafter with instructions when installed)
is trained under the same budget and seeds once per relabeling mode; the script writes `<out>.json`
(per run: final/best success and return, the eval curve, wall time, the effective config), `<out>.png`
(one panel per task: eval success vs env steps, mean over seeds with min/max band, one line per mode) and
prints a markdown table. Runs go to `<run-root>/<task>/<mode>_seed<k>`.

    python benchmarks/relabel_ablation.py --tasks goal_grid mazerunner package_delivery --steps 20000 --seeds 0 1

The paper's numbers (GPU, millions of steps) are quoted in the table header, not reproduced here.

    python benchmarks/relabel_ablation.py --probe RUN_DIR [RUN_DIR ...] [--probe-mode none|some|all]

probes finished runs (train with --keep-replay): relabeled windows per batch and the critic's Q beside the
discounted return (`probe`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

from icrl.config import ExperimentConfig, apply_overrides
from icrl.config.presets import goal_grid

MODES = ("none", "some", "all")
EVALS_PER_RUN = 10  # evaluations spread over each run (plus the final one)
PUBLISHED = {
    "crafter": "Crafter, all procedurally generated instructions: 62% success with relabeling, 27% without",
    "mazerunner": "MazeRunner 15x15, 3 goals: relabeling needed to learn at all (AMAGO Figure 6)",
    "package_delivery": "Package Delivery: relabeling 'some' learns fastest (AMAGO Figure 6)",
}


def task_config(task: str) -> ExperimentConfig:
    """The `goal_grid` preset (`icrl.config.presets.goal_grid`: its small Transformer, loss, exploration,
    optimiser and schedule) on every task; only the env, the context (a whole episode) and, for Crafter, the
    batch differ.

    Built from the preset rather than restated: the script once listed the preset's fields itself but not its
    learning rate, so when the library default went from 3e-4 to 1e-4 (commit 7a711a8, measured on T-Maze 100
    at the official update ratio) the ablation silently trained at 1e-4 and goal_grid's `all` fell from 0.97
    to 0.56 at 12,000 env steps while the preset kept 3e-4 (docs/results.md, hindsight relabeling).
    `tests/unit/test_relabel_ablation.py` checks that the two stay the same."""
    kwargs: dict = {
        "goal_grid": {"size": 5, "num_goals": 3},
        "mazerunner": {"size": 7, "num_goals": 2},
        "package_delivery": {"length": 15, "min_packages": 1, "max_packages": 2, "time_limit": 80},
        "crafter": {"size": 32, "area": 32, "episode_length": 300, "instruction_length": [1, 2]},
    }.get(task, {})
    from icrl.envs.make import make_env

    env = make_env(task, kwargs)
    horizon = int(getattr(env, "time_limit", 0) or getattr(env.spec, "max_episode_steps", 0) or 256)
    env.close()
    # Crafter's 32x32 images make whole-episode windows too slow for a CPU budget: a 64-step context there
    # (the instruction is in every observation, so the agent needs no memory to follow it).
    seq_len, batch = (64, 16) if task == "crafter" else (min(horizon + 1, 512), 32)
    base = goal_grid(relabel="none")
    return dataclasses.replace(
        base,
        env=dataclasses.replace(base.env, env=task, env_kwargs=json.dumps(kwargs)),
        model=dataclasses.replace(base.model, max_seq_len=seq_len),
    ).replace(batch_size=batch)


def with_budget(cfg: ExperimentConfig, *, steps: int, seed: int, run_dir: Path, threads: int,
                device: str) -> ExperimentConfig:
    """Set the run's budget, seed and directory; shrink the epoch (keeping updates per env step) to fit tiny
    budgets, and spread about EVALS_PER_RUN evaluations over the run."""
    s = cfg.schedule
    spe = max(cfg.env.parallel_envs, min(s.steps_per_epoch, steps))
    upe = max(1, round(s.updates_per_epoch * spe / s.steps_per_epoch)) if s.updates_per_epoch else 0
    epochs = max(1, steps // spe)
    every = max(1, epochs // EVALS_PER_RUN)
    return cfg.replace(
        run_dir=str(run_dir), seed=seed, total_env_steps=max(steps, spe), steps_per_epoch=spe,
        updates_per_epoch=upe, eval_every=every, log_every=every, checkpoint_every=max(every, epochs),
        keep_checkpoints=1, threads=threads, device=device, resume=False,
    )  # fmt: skip


def run_one(task: str, mode: str, cfg: ExperimentConfig, seed: int, args: argparse.Namespace) -> dict:
    """One in-process `icrl.train` of `cfg` under the ablation's budget: final and best success, the curve."""
    from icrl import train
    from icrl.run.reporting import read_metrics

    run_dir = Path(args.run_root) / task / f"{mode}_seed{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    cfg = apply_overrides(with_budget(cfg, steps=args.steps, seed=seed, run_dir=run_dir, threads=args.threads,
                                      device=args.device), args.set)
    t0 = time.perf_counter()
    final = train(cfg)
    wall = time.perf_counter() - t0
    evals = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("kind") == "eval"
             and r.get("return_mean") is not None]
    succ = [r["success_rate"] for r in evals if r.get("success_rate") is not None]
    if not args.keep_replay:
        shutil.rmtree(run_dir / "replay", ignore_errors=True)
    return {"task": task, "mode": mode, "seed": seed, "final_return": final.get("return_mean"),
            "final_success": final.get("success_rate"), "best_success": max(succ) if succ else None,
            "best_return": max((r["return_mean"] for r in evals), default=final.get("return_mean")),
            "env_steps": final.get("env_steps"), "updates": final.get("updates"), "wall_time_s": wall,
            "curve": [{k: r.get(k) for k in ("env_steps", "wall_time", "return_mean", "success_rate")} for r in evals],
            "run_dir": str(run_dir), "config": json.loads(cfg.to_json())}


def plot(out: Path, runs: list[dict]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from icrl.run.artifacts import save_figure  # a PNG with a palette: a third of the bytes

    tasks = sorted({r["task"] for r in runs})
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for mode in MODES:
            curves = [r["curve"] for r in runs if r["task"] == task and r["mode"] == mode]
            if not curves:
                continue
            n = min(len(c) for c in curves)
            xs = [curves[0][i]["env_steps"] for i in range(n)]
            ys = [[c[i]["success_rate"] or 0.0 for c in curves] for i in range(n)]
            ax.plot(xs, [statistics.fmean(y) for y in ys], label=f"relabel {mode}")
            ax.fill_between(xs, [min(y) for y in ys], [max(y) for y in ys], alpha=0.2)
        ax.set(title=task, xlabel="env steps", ylabel="eval success", ylim=(-0.02, 1.02))
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = out.with_suffix(".png")
    save_figure(fig, path, dpi=110)  # closes it
    return path


def markdown(runs: list[dict], args: argparse.Namespace) -> str:
    lines = [
        f"Budget: {args.steps:,} env steps per run, seeds {args.seeds}, CPU ({args.threads} thread(s)).",
        "",
        "| task | relabel | final success (mean over seeds) | best success | wall time / run |",
        "|---|---|---|---|---|",
    ]
    for task in sorted({r["task"] for r in runs}):
        for mode in MODES:
            rs = [r for r in runs if r["task"] == task and r["mode"] == mode]
            if rs:
                final = statistics.fmean(r["final_success"] or 0.0 for r in rs)
                best = statistics.fmean(r["best_success"] or 0.0 for r in rs)
                wall = statistics.fmean(r["wall_time_s"] for r in rs)
                lines.append(f"| {task} | {mode} | {final:.2f} | {best:.2f} | {wall:.0f} s |")
    lines += ["", *(f"- Published: {v}" for k, v in PUBLISHED.items() if any(r["task"] == k for r in runs))]
    return "\n".join(lines)


def probe(run_dir: Path, mode: str | None = None, batches: int = 20, seed: int = 1) -> dict:
    """What a finished run (kept with --keep-replay) trains on and what its critic predicts: `batches` batches
    drawn from its replay through the relabeler of `mode` (default: the run's own). Per window: whether it
    holds a reward and ends in a success; for the windows that start a rollout and end in a success, the
    critic's Q(s_0, a_0) at the policy's discount (ensemble mean, unnormalised, in units of the run's reward
    scale) beside the window's discounted return, which is what a policy that follows the instruction earns."""
    import numpy as np
    import torch

    import icrl
    from icrl.data.relabel import HindsightRelabeler
    from icrl.data.sampler import make_loader
    from icrl.envs.make import make_env
    from icrl.types import ActionSpec

    cfg = json.loads((run_dir / "config.json").read_text())
    mode = mode or cfg["replay"]["relabel"]
    env = make_env(cfg["env"]["env"], json.loads(cfg["env"]["env_kwargs"]))
    spec = ActionSpec.from_space(env.action_space)
    env.close()
    agent = icrl.load(str(run_dir)).agent.eval()
    scale, gamma = cfg["loss"]["reward_scale"], cfg["loss"]["gammas"][-1]
    loader = iter(make_loader(run_dir / "replay", batch_size=32, max_seq_len=cfg["model"]["max_seq_len"] + 1,
                              action_spec=spec, seed=seed,
                              transform=None if mode == "none" else HindsightRelabeler(mode)))  # fmt: skip
    windows = rewarded = succeeded = 0
    q0: list[float] = []
    ret0: list[float] = []
    for _ in range(batches):
        b = next(loader)
        reward = b.reward * b.has_action  # [B, L]
        success = (b.terminated & b.has_action).any(1)  # [B]
        windows, rewarded, succeeded = windows + len(success), rewarded + int((reward.sum(1) > 0).sum()), \
            succeeded + int(success.sum())  # fmt: skip
        with torch.no_grad():
            q = agent.critic(agent(b.inputs))  # [B, L, C, G, A] normalised
            q = agent.popart.denormalize_per_action(q).mean(2)[:, 0, -1]  # [B, A]
        for i in np.flatnonzero(success.numpy() & (b.inputs.time[:, 0] == 0).numpy()):
            T = int(b.has_action[i].sum())
            q0.append(float(q[i, int(b.action[i, 0].argmax())]))
            ret0.append(float(sum(scale * float(reward[i, t]) * gamma**t for t in range(T))))
    return {"run_dir": str(run_dir), "mode": mode, "windows": windows, "with_reward": rewarded,
            "ending_in_success": succeeded, "success_windows_from_t0": len(q0),
            "critic_q0": statistics.fmean(q0) if q0 else None,
            "discounted_return0": statistics.fmean(ret0) if ret0 else None}  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", nargs="+", default=["goal_grid", "mazerunner", "package_delivery"])
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--steps", type=int, default=20_000)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--set", action="append", default=[], help="config override group.field=value (repeatable)")
    p.add_argument("--run-root", default="runs/relabel_ablation")
    p.add_argument("--keep-replay", action="store_true")
    p.add_argument("--out", default="benchmarks/results/relabel_ablation/relabel_ablation")
    p.add_argument("--probe", nargs="+", type=Path, metavar="RUN_DIR",
                   help="train nothing: count what these runs' replays hold per batch and what their critics predict")
    p.add_argument("--probe-mode", choices=MODES, help="--probe: the relabeling to sample with (default: the run's)")
    args = p.parse_args(argv)
    if args.probe:
        import torch

        torch.set_num_threads(args.threads)
        probes = [probe(run, args.probe_mode) for run in args.probe]
        for row in probes:
            print(json.dumps(row))
        return {"probes": probes}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    runs: list[dict] = []
    t0 = time.perf_counter()
    for task in args.tasks:
        base = task_config(task)
        for mode in args.modes:
            cfg = dataclasses.replace(base).replace(relabel=mode)
            for seed in args.seeds:
                r = run_one(task, mode, cfg, seed, args)
                runs.append(r)
                print(f"{task} relabel={mode} seed={seed}: final success {r['final_success']}, "
                      f"{r['wall_time_s']:.0f} s", flush=True)
    result = {"args": vars(args), "wall_time_s": time.perf_counter() - t0, "runs": runs,
              "host": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}}  # fmt: skip
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    png = plot(out, runs)
    table = markdown(runs, args)
    out.with_suffix(".md").write_text(table + "\n")
    print(table, f"\nwrote {out.with_suffix('.json')}, {png}", sep="\n")
    return result


if __name__ == "__main__":
    main()
