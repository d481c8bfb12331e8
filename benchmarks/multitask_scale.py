"""AMAGO-2's claim on a CPU: a scale-resistant update learns a multi-task mix whose tasks' rewards differ by hidden
factors, where the regression update does not.

The mix is `popgym_multi` over `GAMES` (one game per rollout, no task id in the observation) with every reward
of game i multiplied by `SCALES[i]` (`--mix scaled`), or by 1 (`--mix unscaled`, the control). POPGym scales
every game's return into [-1, 1], so a game's *normalised* return is its logged return divided by its factor,
and the score of a run is the mean of the games' normalised returns (each game weighs the same).

Updates, all at the `multitask` preset's model, context (52), 8 envs, 0.2 updates per env step, batch 32,
lr 3e-4 after 50 warm-up updates, discounts (0.9, 0.99) and exploration (`icrl.config.presets.multitask`):

- `twohot`: the preset, AMAGO-2's recipe: a two-hot critic over 64 symlog bins on
  [-MULTITASK_VALUE_BOUND, MULTITASK_VALUE_BOUND] (one range for both mixes: the factor is hidden, so it cannot
  set the range), discrete actions as critic inputs, filtered behaviour cloning only (online 0, offline 1);
- `regression`: the library's default single-task update on the same model: regressed critics with PopArt,
  one output per action, online 1 + filtered BC 0.1, 1 value sample;
- `amago`: the official AMAGO's `MultiTaskAgent` on the same mix (`benchmarks/amago_popgym_mix.py`, run
  through `parity_amago_run.py` in the official code's virtualenv; `parity.py --setup-amago` makes it).

    python benchmarks/multitask_scale.py --updates twohot regression --mixes scaled unscaled --seeds 0 1 2
    python benchmarks/multitask_scale.py --updates amago --mixes scaled --seeds 0 1 2 \\
        --amago-src /path/amago-src --amago-venv /path/amago-venv
    python benchmarks/multitask_scale.py --report

Writes one `runs/<mix>_<update>_s<seed>.json` per run under `benchmarks/results/multitask_scale/` (run output,
not kept in git; resumable: a stored run is skipped unless `--rerun`), then `multitask_scale.json` (the table's
rows and every run's per-game curve), `.md` and `.png` from all stored runs (`--report`: from them alone).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as `python benchmarks/<name>.py`: the repo root, for `from benchmarks import`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.parity import GIN, amago_curve, subprocess_env  # noqa: E402

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "multitask_scale"
GAMES = ("RepeatFirstEasy", "RepeatPreviousEasy", "HigherLowerEasy", "MineSweeperEasy")
SCALES = (1.0, 10.0, 100.0, 1000.0)
EVAL_ROLLOUTS = 64  # ~16 per game: at the preset's 24 one game's return moved by up to 1.8 between evaluations
UPDATES = ("twohot", "regression", "amago")
MIXES = ("scaled", "unscaled")


def scales(mix: str) -> dict[str, float]:
    return dict(zip(GAMES, SCALES if mix == "scaled" else (1.0,) * len(GAMES)))


def icrl_config(update: str, mix: str, steps: int, seed: int, run_dir: Path, threads: int):
    from icrl.config import LossConfig
    from icrl.config.presets import multitask

    cfg = multitask()
    cfg = cfg.replace(env_kwargs=json.dumps({"names": list(GAMES), "reward_scales": scales(mix)}),
                      total_env_steps=steps, seed=seed, run_dir=str(run_dir), threads=threads, device="cpu",
                      checkpoint_every=1_000_000, eval_rollouts=EVAL_ROLLOUTS)
    if update == "twohot":
        return cfg
    return dataclasses.replace(cfg, loss=LossConfig(gammas=cfg.loss.gammas))  # every other loss field: defaults


def icrl_run(update: str, mix: str, seed: int, args: argparse.Namespace) -> dict:
    from icrl import train
    from icrl.run.reporting import read_metrics

    run_dir = Path(args.run_root) / f"{mix}_{update}_s{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    cfg = icrl_config(update, mix, args.steps, seed, run_dir, args.threads).validate()
    t0 = time.perf_counter()
    train(cfg)
    curve = [{"env_steps": r["env_steps"], "updates": r["updates"], "wall_s": round(r["wall_time"], 1),
              "tasks": {k[len("return/"):]: v for k, v in r.items() if k.startswith("return/")}}
             for r in read_metrics(run_dir / "metrics.jsonl") if r.get("kind") == "eval"]
    shutil.rmtree(run_dir / "replay", ignore_errors=True)
    return {"config": json.loads(cfg.to_json()), "wall_s": round(time.perf_counter() - t0, 1), "curve": curve}




def amago_command(mix: str, seed: int, steps: int, work: Path, amago_venv: Path) -> list[str]:
    """The official MultiTaskAgent at icrl's twohot settings (read from the same config, so they cannot drift)."""
    # resolved as icrl's run resolves it: the ε anneal from the budget
    from icrl.run.build import with_task_defaults

    cfg = with_task_defaults(icrl_config("twohot", mix, steps, seed, Path("unused"), 1)).validate()
    m, loss, ex, sch = cfg.model, cfg.loss, cfg.explore, cfg.schedule
    envs = cfg.env.parallel_envs
    epochs = steps // sch.steps_per_epoch + 1  # the official evaluates at the start of an epoch
    return [str(amago_venv / "bin" / "python"), str(HERE / "parity_amago_run.py"), str(HERE / "amago_popgym_mix.py"),
            "--names", *GAMES, "--scales", *[str(s) for s in scales(mix).values()],
            "--max_seq_len", str(m.max_seq_len), "--gammas", *[str(g) for g in loss.gammas],
            "--bins", str(loss.critic_bins), "--value_bound", str(loss.critic_max_value),
            "--reward_multiplier", str(loss.reward_scale), "--lr", str(cfg.optim.lr),
            "--warmup", str(cfg.optim.warmup_updates), "--eps_anneal", str(ex.eps_anneal_steps),
            "--tstep_hidden", str(m.tstep_hidden),
            "--val_steps", str(-(-cfg.eval.eval_rollouts // envs) * m.max_seq_len),  # per env: as many rollouts or more
            "--run_name", f"mt_{mix}_s{seed}", "--buffer_dir", str(work / "buffers"), "--memory_size", str(m.d_model),
            "--memory_layers", str(m.layers), "--parallel_actors", str(envs), "--env_mode", "sync",
            "--epochs", str(epochs), "--timesteps_per_epoch", str(sch.steps_per_epoch // envs),
            "--batches_per_epoch", str(sch.updates_per_epoch),
            "--batch_size", str(cfg.optim.batch_size), "--val_interval", str(cfg.eval.eval_every),
            "--ckpt_interval", "1000000", "--dloader_workers", "1", "--no_log", "--configs", str(work / "cpu.gin")]


def amago_run(mix: str, seed: int, args: argparse.Namespace) -> dict:
    from icrl.config.presets import multitask

    work = Path(args.run_root) / f"{mix}_amago_s{seed}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    (work / "cpu.gin").write_text(GIN.format(heads=multitask().model.heads))
    cmd = amago_command(mix, seed, args.steps, work, args.amago_venv)
    t0 = time.perf_counter()
    log = work / "stdout.log"
    with open(log, "w") as out:
        rc = subprocess.run(cmd, cwd=str(args.amago_src), stdout=out, stderr=subprocess.STDOUT,
                            env=subprocess_env(args.threads)).returncode
    rows = amago_curve(log)
    if rc != 0 or not rows:
        raise RuntimeError(f"the official run failed (rc {rc}); see {log}")
    curve = [{"env_steps": r["env_steps"], "updates": r["updates"], "wall_s": r["wall_s"], "tasks": r["tasks"]}
             for r in rows]
    shutil.rmtree(work / "buffers", ignore_errors=True)
    return {"command": cmd, "wall_s": round(time.perf_counter() - t0, 1), "curve": curve}


# ---------------------------------------------------------------------------------------------- report
def normalised(run: dict) -> list[dict]:
    """Per evaluation: each game's return divided by its factor, and their mean (None until every game was played)."""
    factor = scales(run["mix"])
    out = []
    for r in run["curve"]:
        per = {g: r["tasks"][g] / factor[g] for g in GAMES if r["tasks"].get(g) is not None}
        out.append({"env_steps": r["env_steps"], "per_task": per,
                    "mean": statistics.fmean(per.values()) if len(per) == len(GAMES) else None})
    return out


def summarize(runs: list[dict]) -> list[dict]:
    rows = []
    for mix in MIXES:
        for update in UPDATES:
            rs = sorted((r for r in runs if r["mix"] == mix and r["update"] == update), key=lambda r: r["seed"])
            if not rs:
                continue
            # the last two evaluations' mean: one evaluation of 64 rollouts holds ~16 per game
            tails = [normalised(r)[-2:] for r in rs]
            lasts = [statistics.fmean(x["mean"] for x in t if x["mean"] is not None) for t in tails]
            rows.append({"mix": mix, "update": update, "seeds": [r["seed"] for r in rs],
                         "env_steps": rs[0]["curve"][-1]["env_steps"], "score_last2": lasts,
                         "score_mean": statistics.fmean(lasts), "score_sd": statistics.pstdev(lasts),
                         "per_task_last2": {g: statistics.fmean(statistics.fmean(x["per_task"][g] for x in t)
                                                                for t in tails) for g in GAMES},
                         "wall_s": [r["wall_s"] for r in rs]})
    return rows


def random_play(rollouts: int = 200, seed: int = 0) -> dict[str, float]:
    """Each game's mean return under uniformly random actions (over the mix's action space, as ε = 1 plays):
    the floor that a normalised score is read against."""
    import numpy as np

    from icrl.envs.tasks.popgym_envs import PopGymMulti

    env, rng = PopGymMulti(list(GAMES), seed=seed), np.random.default_rng(seed)
    returns: dict[str, list[float]] = {g: [] for g in GAMES}
    for _ in range(rollouts):
        _, info = env.reset()
        total, done = 0.0, False
        while not done:
            _, r, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))
            total, done = total + r, terminated or truncated
        returns[info["task"]].append(total)
    return {g: statistics.fmean(v) for g, v in returns.items()}


def markdown(rows: list[dict], random: dict[str, float] | None = None) -> str:
    lines = ["| mix | update | seeds | env steps | mean normalised return, last 2 evals (per seed) | "
             + " | ".join(f"{g} (scaled: x{s:g})" for g, s in zip(GAMES, SCALES)) + " |",
             "|---|---|---|---|---|" + "---|" * len(GAMES)]
    if random:
        lines.append(f"| either | random actions | | | {statistics.fmean(random.values()):+.2f} | "
                     + " | ".join(f"{random[g]:+.2f}" for g in GAMES) + " |")
    for r in rows:
        per = " / ".join(f"{x:+.2f}" for x in r["score_last2"])
        lines.append(f"| {r['mix']} | {r['update']} | {len(r['seeds'])} | {r['env_steps']:,} | "
                     f"**{r['score_mean']:+.2f}** ± {r['score_sd']:.2f} ({per}) | "
                     + " | ".join(f"{r['per_task_last2'][g]:+.2f}" for g in GAMES) + " |")
    return "\n".join(lines)


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from icrl.run.artifacts import save_figure  # a PNG with a palette: a third of the bytes

    fig, axes = plt.subplots(len(MIXES), len(GAMES) + 1, figsize=(4 * (len(GAMES) + 1), 3.4 * len(MIXES)),
                             squeeze=False)
    colors = {"twohot": "tab:blue", "regression": "tab:red", "amago": "tab:green"}
    for i, mix in enumerate(MIXES):
        for run in (r for r in runs if r["mix"] == mix):
            curve = normalised(run)
            xs = [c["env_steps"] for c in curve]
            label = (f"{run['update']}" if run["seed"] == min(r["seed"] for r in runs if r["update"] == run["update"])
                     else None)
            for j, g in enumerate(GAMES):
                axes[i][j].plot(xs, [c["per_task"].get(g) for c in curve], color=colors[run["update"]], alpha=0.6,
                                label=label)
            axes[i][-1].plot(xs, [c["mean"] for c in curve], color=colors[run["update"]], alpha=0.6, label=label)
        for j, title in enumerate([f"{g} (x{s:g})" if mix == "scaled" else g for g, s in zip(GAMES, SCALES)]
                                  + ["mean"]):
            axes[i][j].set_title(f"{mix}: {title}", fontsize=9)
            axes[i][j].set_xlabel("env steps")
            axes[i][j].set_ylim(-1.05, 1.05)
        axes[i][0].set_ylabel("normalised return")
        axes[i][-1].legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)  # closes it


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--updates", nargs="+", choices=UPDATES, default=["twohot", "regression"])
    p.add_argument("--mixes", nargs="+", choices=MIXES, default=list(MIXES))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=20_000)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--run-root", default="runs/multitask_scale")
    p.add_argument("--rerun", action="store_true", help="run again even where a stored run exists")
    p.add_argument("--report", action="store_true", help="run nothing: table and plot from the stored runs")
    p.add_argument("--amago-src", type=Path, help="the official AMAGO checkout (--updates amago)")
    p.add_argument("--amago-venv", type=Path, help="its virtualenv (parity.py --setup-amago makes both)")
    args = p.parse_args(argv)
    (OUT / "runs").mkdir(parents=True, exist_ok=True)
    if not args.report:
        if "amago" in args.updates and (args.amago_src is None or args.amago_venv is None):
            p.error("--updates amago needs --amago-src and --amago-venv (see benchmarks/parity.py --setup-amago)")
        for mix in args.mixes:
            for update in args.updates:
                for seed in args.seeds:
                    path = OUT / "runs" / f"{mix}_{update}_s{seed}.json"
                    if path.exists() and not args.rerun:
                        print(f"{path.name}: stored, skipped (--rerun to run it again)")
                        continue
                    run = amago_run(mix, seed, args) if update == "amago" else icrl_run(update, mix, seed, args)
                    run = {"mix": mix, "update": update, "seed": seed, "steps": args.steps, "games": GAMES,
                           "scales": scales(mix), "loadavg": os.getloadavg(), **run}
                    path.write_text(json.dumps(run, indent=1))
                    print(f"{path.name}: normalised mean {normalised(run)[-1]['mean']}, {run['wall_s']:.0f} s",
                          flush=True)
    runs = [json.loads(f.read_text()) for f in sorted((OUT / "runs").glob("*.json"))]
    if not runs:
        sys.exit(f"no stored runs in {OUT / 'runs'}")
    rows, random = summarize(runs), random_play()
    curves = [{k: r[k] for k in ("mix", "update", "seed", "wall_s", "loadavg", "curve")} for r in runs]
    (OUT / "multitask_scale.json").write_text(json.dumps({"rows": rows, "random_actions": random, "runs": curves}))
    table = markdown(rows, random)
    (OUT / "multitask_scale.md").write_text(table + "\n")
    plot(runs, OUT / "multitask_scale.png")
    print(table)


if __name__ == "__main__":
    main()
