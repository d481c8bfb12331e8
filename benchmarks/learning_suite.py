"""Learning suite: train icrl on named task sets under one step budget and write JSON + PNG learning curves.

Suites (several may be given to `--suite`):

  tmaze_lengths     Passive T-Maze at each corridor length of `--lengths` (the paper's return-vs-length figure),
                    each run starting from `icrl.config.presets.tmaze(length)`.
  popgym_easy       every `popgym/*Easy` task in `icrl.envs.make.BUILTIN_ENVS` (or those of `--popgym-tasks`)
                    with a small Transformer (d_model 64, 2 layers).
  meta_frozen_lake  Meta-Frozen-Lake, 3 episodes of one hidden lake per rollout: success by episode index within
                    a rollout is the in-context-learning curve.
  dark_key_door     Dark Key-To-Door with 500-step rollouts (about ten 50-step episodes of one room).

Every run is one `icrl.train(cfg)` with `cfg` built by the plain functions below (`tmaze_config`,
`popgym_config`, `meta_frozen_lake_config`, `dark_key_door_config`), its budget set to `--steps` env steps;
runs go to `<run-root>/<suite>/<name>_seed<k>` (an old run of the same name is deleted first).

    python benchmarks/learning_suite.py --suite tmaze_lengths --lengths 10 20 50 --steps 10000 --seeds 0 1
    python benchmarks/learning_suite.py --suite popgym_easy meta_frozen_lake --steps 20000
    python benchmarks/learning_suite.py --suite dark_key_door --steps 50000 --set optim.lr=1e-4

Writes `<out>.json` (per run: final and best eval return / success, env steps, wall time, the effective config;
per suite: aggregates) and PNGs `<out>_tmaze_lengths.png`, `<out>_popgym_easy.png`, `<out>_meta_frozen_lake.png`
(each when its suite ran) and `<out>_curves.png` (learning curves of all runs), then prints a markdown table
with the published AMAGO numbers beside ours. CPU budgets here are orders of magnitude below the paper's:
the table's header line says which budget was used.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from icrl.config import (
    EnvConfig,
    ExperimentConfig,
    ExploreConfig,
    LossConfig,
    ModelConfig,
    apply_overrides,
)

SUITES = ("tmaze_lengths", "popgym_easy", "meta_frozen_lake", "dark_key_door")
DEFAULT_LENGTHS = (10, 20, 50, 100, 200, 500, 1000)
DEFAULT_STEPS = 5_000
EVALS_PER_RUN = 10  # evaluations spread over each run (plus the final one)

# Published AMAGO results (Grigsby et al., ICLR 2024), GPU and millions of env steps; quoted, not reproduced.
PUBLISHED = {
    "tmaze_lengths": "return 1.0 at every length tried (up to 10,000; GPU)",
    "popgym_easy": "mean ≈0.63 / median ≈0.86 over 39 POPGym tasks (PPO-GRU ≈0.33)",
    "meta_frozen_lake": "— (adaptation curve shown in the paper; no single number)",
    "dark_key_door": "return crosses 10 at ≈6M env steps",
    "half_cheetah_velocity": "return ≈ −55 (not in this suite)",
}
PUBLISHED_TMAZE_RETURN = 1.0
PUBLISHED_TMAZE_MAX_LENGTH = 10_000
PUBLISHED_POPGYM_MEAN = 0.63
PUBLISHED_POPGYM_MEDIAN = 0.86
PUBLISHED_POPGYM_TASKS = 39
PUBLISHED_POPGYM_PPO_GRU_MEAN = 0.33
PUBLISHED_KEY_DOOR_RETURN_10_STEPS = 6_000_000
PUBLISHED_HALF_CHEETAH_VELOCITY_RETURN = -55.0


# ----------------------------------------------------------------------------------------------- configs


def tmaze_config(length: int) -> ExperimentConfig:
    """Passive T-Maze at corridor `length`: the library's preset."""
    from icrl.config.presets import tmaze

    return tmaze(length)


def popgym_episode_length(name: str) -> int | None:
    """The task's `max_episode_length` when the POPGym class declares one (e.g. 51 for RepeatFirstEasy)."""
    from icrl.envs.tasks.popgym_envs import popgym_env_classes

    cls = popgym_env_classes().get(name.split("/", 1)[-1])
    try:
        n = getattr(cls(), "max_episode_length", None) if cls is not None else None
    except Exception:  # noqa: BLE001 - a class that needs kwargs: fall back to the default context
        return None
    return int(n) if isinstance(n, int) and n > 0 else None


def popgym_config(name: str) -> ExperimentConfig:
    """A small Transformer for one POPGym task; the context covers a whole episode when it is <= 256 steps."""
    length = popgym_episode_length(name)
    return ExperimentConfig(
        env=EnvConfig(env=name, parallel_envs=8),
        model=ModelConfig(d_model=64, layers=2, heads=4, max_seq_len=min(256, length + 1) if length else 256),
    ).replace(eval_rollouts=16, steps_per_epoch=1000, updates_per_epoch=200)


def meta_frozen_lake_config() -> ExperimentConfig:
    """Meta-Frozen-Lake (5×5, 50-step episodes), 3 episodes of one hidden lake per rollout."""
    return ExperimentConfig(
        env=EnvConfig(env="meta_frozen_lake", episodes_per_rollout=3, parallel_envs=8),
        model=ModelConfig(d_model=64, layers=2, heads=4, max_seq_len=256),
        loss=LossConfig(entropy_coeff=0.02),
        explore=ExploreConfig(eps_start=0.5, eps_anneal_steps=2_500),  # per env: 20,000 env steps of the 8
    ).replace(eval_rollouts=16, steps_per_epoch=1000, updates_per_epoch=200)


def dark_key_door_config() -> ExperimentConfig:
    """Dark Key-To-Door (9×9, 50-step episodes) with 500-step rollouts of one room."""
    return ExperimentConfig(
        env=EnvConfig(env="dark_key_door", rollout_horizon=500, parallel_envs=8),
        model=ModelConfig(d_model=64, layers=2, heads=4, max_seq_len=512, max_time=4096),
        explore=ExploreConfig(eps_start=0.5, eps_anneal_steps=6_250),  # per env: 50,000 env steps of the 8
    ).replace(eval_rollouts=16, steps_per_epoch=1000, updates_per_epoch=200)


def popgym_easy_names() -> list[str]:
    from icrl.envs.make import BUILTIN_ENVS

    return sorted(n for n in BUILTIN_ENVS if n.startswith("popgym/") and n.endswith("Easy"))


def suite_runs(suite: str, args: argparse.Namespace) -> list[tuple[str, dict[str, Any], ExperimentConfig]]:
    """[(run name, what the run is about, base config)] of one suite."""
    if suite == "tmaze_lengths":
        return [(f"N{n}", {"length": n}, tmaze_config(n)) for n in args.lengths]
    if suite == "popgym_easy":
        names = [
            n if n.startswith("popgym/") else f"popgym/{n}" for n in args.popgym_tasks
        ] or popgym_easy_names()
        if not names:
            raise SystemExit("popgym_easy: popgym is not installed (pip install 'icrl[popgym]')")
        return [(n.split("/", 1)[1], {"task": n}, popgym_config(n)) for n in names]
    if suite == "meta_frozen_lake":
        return [("meta_frozen_lake", {}, meta_frozen_lake_config())]
    if suite == "dark_key_door":
        return [("dark_key_door", {}, dark_key_door_config())]
    raise SystemExit(f"unknown suite {suite!r}; choose from {', '.join(SUITES)}")


def with_budget(
    cfg: ExperimentConfig, *, steps: int, seed: int, run_dir: Path, threads: int, device: str
) -> ExperimentConfig:
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


# ----------------------------------------------------------------------------------------------- running


def _mean(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def run_one(
    suite: str, name: str, about: dict, cfg: ExperimentConfig, seed: int, args: argparse.Namespace
) -> dict:
    from icrl import train
    from icrl.run.loggers import read_metrics

    run_dir = Path(args.run_root) / suite / f"{name}_seed{seed}"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    cfg = with_budget(
        cfg, steps=args.steps, seed=seed, run_dir=run_dir, threads=args.threads, device=args.device
    )
    cfg = apply_overrides(cfg, args.set)
    effective = json.loads(cfg.to_json())
    t0 = time.perf_counter()
    final = train(cfg)
    wall = time.perf_counter() - t0
    evals = [
        r
        for r in read_metrics(run_dir / "metrics.jsonl")
        if r.get("kind") == "eval" and r.get("return_mean") is not None
    ]
    best = max(evals, key=lambda r: r["return_mean"]) if evals else final
    succ = [r["success_rate"] for r in evals if r.get("success_rate") is not None]
    if not args.keep_replay:
        shutil.rmtree(run_dir / "replay", ignore_errors=True)
    return {
        "suite": suite,
        "name": name,
        **about,
        "seed": seed,
        "final_return": final.get("return_mean"),
        "final_success": final.get("success_rate"),
        "best_return": best.get("return_mean"),
        "best_return_env_steps": best.get("env_steps"),
        "best_success": max(succ) if succ else None,
        "return_by_episode": final.get("return_by_episode"),
        "success_by_episode": final.get("success_by_episode"),
        "env_steps": final.get("env_steps"),
        "updates": final.get("updates"),
        "wall_time_s": wall,
        "curve": [
            {k: r.get(k) for k in ("env_steps", "wall_time", "return_mean", "success_rate")} for r in evals
        ],
        "run_dir": str(run_dir),
        "config": effective,
    }


def aggregate(suite: str, runs: list[dict]) -> dict:
    """Per-suite summary: means over seeds, per task / length."""
    by_name: dict[str, list[dict]] = {}
    for r in runs:
        by_name.setdefault(r["name"], []).append(r)
    per = {
        n: {
            "final_return": _mean([r["final_return"] for r in rs]),
            "final_success": _mean([r["final_success"] for r in rs]),
            "best_return": _mean([r["best_return"] for r in rs]),
            "env_steps": _mean([r["env_steps"] for r in rs]),
            "wall_time_s": _mean([r["wall_time_s"] for r in rs]),
            "seeds": len(rs),
        }
        for n, rs in by_name.items()
    }
    out: dict[str, Any] = {"per_run_name": per}
    if suite == "tmaze_lengths":
        out["return_vs_length"] = [
            {"length": rs[0]["length"], "final_return": per[n]["final_return"], "final_success": per[n]["final_success"],
             "best_return": per[n]["best_return"], "seeds": len(rs)}
            for n, rs in sorted(by_name.items(), key=lambda kv: kv[1][0]["length"])
        ]  # fmt: skip
    if suite == "popgym_easy":
        finals = [v["final_return"] for v in per.values() if v["final_return"] is not None]
        out["tasks"] = len(per)
        out["mean_final_return"] = statistics.fmean(finals) if finals else None
        out["median_final_return"] = statistics.median(finals) if finals else None
    if suite == "meta_frozen_lake":
        curves = [r["success_by_episode"] for r in runs if r.get("success_by_episode")]
        n = min(map(len, curves)) if curves else 0
        out["success_by_episode"] = [statistics.fmean(c[i] for c in curves) for i in range(n)] if n else None
        out["success_by_episode_per_seed"] = curves
        rets = [r["return_by_episode"] for r in runs if r.get("return_by_episode")]
        m = min(map(len, rets)) if rets else 0
        out["return_by_episode"] = [statistics.fmean(c[i] for c in rets) for i in range(m)] if m else None
    return out


# ----------------------------------------------------------------------------------------------- plots


def plot_suites(out: Path, runs: list[dict], summary: dict[str, dict]) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from icrl.run.plot import plot_learning_curves

    written: dict[str, str] = {}

    def save(fig, key: str) -> None:
        path = out.with_name(f"{out.name}_{key}.png")
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written[key] = str(path)

    if "tmaze_lengths" in summary:
        rows = summary["tmaze_lengths"]["return_vs_length"]
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        xs = [r["length"] for r in rows]
        for r in runs:
            if r["suite"] == "tmaze_lengths" and r["final_return"] is not None:
                ax.scatter(r["length"], r["final_return"], s=12, color="C0", alpha=0.4)
        ax.plot(xs, [r["final_return"] for r in rows], marker="o", color="C0", label="icrl (mean over seeds)")
        ax.axhline(PUBLISHED_TMAZE_RETURN, ls="--", color="k", alpha=0.6,
                   label=f"AMAGO published (up to N={PUBLISHED_TMAZE_MAX_LENGTH:,})")  # fmt: skip
        ax.set_xscale("log")
        ax.set_xticks(xs, [f"{x:,}" for x in xs])
        ax.minorticks_off()
        ax.set_xlabel("corridor length N")
        ax.set_ylabel("final eval return")
        ax.set_title(f"Passive T-Maze, {runs[0]['config']['schedule']['total_env_steps']:,} env steps per run")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
        save(fig, "tmaze_lengths")
    if "popgym_easy" in summary:
        per = summary["popgym_easy"]["per_run_name"]
        names = list(per)
        vals = [per[n]["final_return"] or 0.0 for n in names]
        fig, ax = plt.subplots(figsize=(max(5.0, 0.5 * len(names) + 2), 4.2))
        ax.bar(range(len(names)), vals, color="C0")
        ax.axhline(PUBLISHED_POPGYM_MEAN, ls="--", color="k", alpha=0.6, label="AMAGO mean (39 tasks)")
        if summary["popgym_easy"]["mean_final_return"] is not None:
            ax.axhline(
                summary["popgym_easy"]["mean_final_return"],
                color="C0",
                alpha=0.8,
                label="icrl mean (these tasks)",
            )
        ax.axhline(PUBLISHED_POPGYM_PPO_GRU_MEAN, ls=":", color="C3", alpha=0.8, label="PPO-GRU mean")
        ax.set_xticks(
            range(len(names)), [n.removesuffix("Easy") for n in names], rotation=60, ha="right", fontsize=7
        )
        ax.set_ylabel("final eval return")
        ax.set_ylim(-1.05, 1.05)
        ax.set_title("POPGym Easy")
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=7)
        save(fig, "popgym_easy")
    if "meta_frozen_lake" in summary:
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        for r in runs:
            if r["suite"] == "meta_frozen_lake" and r.get("success_by_episode"):
                y = r["success_by_episode"]
                ax.plot(range(1, len(y) + 1), y, marker="o", alpha=0.5, label=f"seed {r['seed']}")
        mean = summary["meta_frozen_lake"].get("success_by_episode")
        if mean:
            ax.plot(range(1, len(mean) + 1), mean, marker="o", color="k", lw=2, label="mean")
        ax.set_xlabel("episode index within the rollout (last eval)")
        ax.set_ylabel("success rate")
        ax.set_ylim(-0.05, 1.05)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_title("Meta-Frozen-Lake: in-context adaptation")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        save(fig, "meta_frozen_lake")
    if runs:
        path = out.with_name(f"{out.name}_curves.png")
        plot_learning_curves([r["run_dir"] for r in runs], path, title="learning suite: all runs")
        written["curves"] = str(path)
    return written


# ----------------------------------------------------------------------------------------------- table


def _f(x: float | None, digits: int = 2) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def markdown_table(summary: dict[str, dict], runs: list[dict], args: argparse.Namespace) -> str:
    seeds = ", ".join(map(str, args.seeds))
    head = (f"Budget: {args.steps:,} env steps per run, seeds {seeds}, {args.threads} torch thread(s), "
            f"device {args.device} (published AMAGO: GPU, millions of steps per run)")  # fmt: skip
    lines = [head, "", "| suite | task | icrl final return (mean over seeds) | success | best return | "
             "env steps | wall s | published AMAGO |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for suite, s in summary.items():
        for name, v in s["per_run_name"].items():
            pub = {"tmaze_lengths": f"{PUBLISHED_TMAZE_RETURN:.1f}", "popgym_easy": "—"}.get(
                suite, PUBLISHED[suite]
            )
            lines.append(
                f"| {suite} | {name} | {_f(v['final_return'])} | {_f(v['final_success'])} | {_f(v['best_return'])} | "
                f"{int(v['env_steps'] or 0):,} | {_f(v['wall_time_s'], 0)} | {pub} |"
            )
        if suite == "popgym_easy":
            lines.append(
                f"| popgym_easy | **mean / median over {s['tasks']} Easy tasks** | {_f(s['mean_final_return'])} / "
                f"{_f(s['median_final_return'])} | | | | | {PUBLISHED['popgym_easy']} |"
            )
        if suite == "meta_frozen_lake" and s.get("success_by_episode"):
            by = " → ".join(_f(x) for x in s["success_by_episode"])
            lines.append(
                f"| meta_frozen_lake | success by episode 1..K | {by} | | | | | {PUBLISHED['meta_frozen_lake']} |"
            )
    lines.append(f"| (not run) | Half-Cheetah velocity | — | | | | | {PUBLISHED['half_cheetah_velocity']} |")
    if "tmaze_lengths" in summary:
        lines.append("")
        lines.append(f"T-Maze published: {PUBLISHED['tmaze_lengths']}.")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", nargs="+", choices=SUITES, default=["tmaze_lengths"])
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="env steps per run")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument(
        "--lengths", type=int, nargs="+", default=list(DEFAULT_LENGTHS), help="T-Maze corridor lengths"
    )
    p.add_argument("--popgym-tasks", nargs="*", default=[], help="POPGym names (default: every *Easy task)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/learning_suite/learning_suite"),
                   help="writes OUT.json and OUT_*.png")  # fmt: skip
    p.add_argument("--run-root", type=Path, default=Path("runs/learning_suite"))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="auto")
    p.add_argument("--set", action="append", default=[], metavar="GROUP.FIELD=VALUE",
                   help="override any ExperimentConfig field of every run (value parsed as JSON)")  # fmt: skip
    p.add_argument("--keep-replay", action="store_true", help="keep each run's replay folder")
    return p


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    if args.steps < 1:
        raise SystemExit("--steps must be >= 1")
    import torch

    torch.set_num_threads(max(1, args.threads))
    suites = list(dict.fromkeys(args.suite))
    runs: list[dict] = []
    summary: dict[str, dict] = {}
    t0 = time.perf_counter()
    for suite in suites:
        suite_results = []
        for name, about, cfg in suite_runs(suite, args):
            for seed in args.seeds:
                r = run_one(suite, name, about, cfg, seed, args)
                print(f"[{suite}] {name} seed {seed}: final return {_f(r['final_return'])}, success "
                      f"{_f(r['final_success'])}, {r['env_steps']:,} env steps, {r['wall_time_s']:.0f} s", flush=True)  # fmt: skip
                suite_results.append(r)
        runs.extend(suite_results)
        summary[suite] = aggregate(suite, suite_results)
    out = Path(args.out)
    plots = plot_suites(out, runs, summary)
    table = markdown_table(summary, runs, args)
    result = {
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "published_amago": {
            **PUBLISHED,
            "tmaze_return": PUBLISHED_TMAZE_RETURN,
            "tmaze_max_length": PUBLISHED_TMAZE_MAX_LENGTH,
            "popgym_mean": PUBLISHED_POPGYM_MEAN,
            "popgym_median": PUBLISHED_POPGYM_MEDIAN,
            "popgym_tasks": PUBLISHED_POPGYM_TASKS,
            "popgym_ppo_gru_mean": PUBLISHED_POPGYM_PPO_GRU_MEAN,
            "key_door_return_10_env_steps": PUBLISHED_KEY_DOOR_RETURN_10_STEPS,
            "half_cheetah_velocity_return": PUBLISHED_HALF_CHEETAH_VELOCITY_RETURN,
        },
        "total_wall_s": time.perf_counter() - t0,
        "load_avg_end": [round(x, 2) for x in os.getloadavg()],
        "suites": summary,
        "runs": runs,
        "plots": plots,
        "markdown": table,
    }
    json_path = out.with_name(f"{out.name}.json")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print()
    print(table)
    print(f"\nwrote {json_path} and {', '.join(plots.values())}", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
