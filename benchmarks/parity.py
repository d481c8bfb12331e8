"""Side by side with the official AMAGO: the same task, model size, context, parallel envs and update ratio.

Each run is a subprocess, one after the other (never two at once: on a small machine they would slow each
other down): `icrl train` with icrl's own defaults for everything the table below does not fix, and the
official AMAGO (UT-Austin-RPL/amago) running its own example script unmodified, with that script's own
settings for everything else (reward scale, discounts, exploration, learning rate). Both evaluate after
every epoch (the libraries evaluate differently: the official POPGym example plays 2,000 steps per actor;
so wall times to the threshold leave evaluation time out); a run stops once it has held the threshold
for `--hold` evaluations in a row, or at its env-step budget.

    # once: the official code into its own virtualenv, from a local checkout or a bare git mirror
    python benchmarks/parity.py --setup-amago --amago-git-dir /path/to/amago.git
    # the runs (results are kept per run: an interrupted sweep resumes where it stopped)
    python benchmarks/parity.py --tasks tmaze20 tmaze100 repeat_previous --seeds 0 1 2
    python benchmarks/parity.py --report      # table + plot from the stored runs only

Writes `benchmarks/results/parity/runs/<task>_<lib>_s<seed>.json` (one learning curve each),
`parity.json` (env steps and wall time to the threshold, best and final return, per task, library and
seed), `parity.md` and `parity.png`.

Settings per task (both libraries): T-Maze N: d_model 64, 2 layers, 4 heads, context N + 1, 8 envs,
100 updates of batch 24 per 5 (N + 1) steps of each env (the official example's ratio). POPGym: d_model
128, 2 layers, 4 heads, context 64, 8 envs, 100 updates of batch 24 per 102 steps of each env.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

if __package__ in (None, ""):  # run as `python benchmarks/parity.py`: the repo root, for `from benchmarks import`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "parity"
CACHE = Path(os.environ.get("ICRL_PARITY_CACHE", Path.home() / ".cache" / "icrl-parity"))
ENVS = 8
TORCH = "torch==2.13.0"  # the CPU wheel of these machines; pinned on every pip call of the official venv
GIN = """# Plain attention on CPU (no flash-attn); VanillaAttention is not gin-configurable: dynamic registration.
from __gin__ import dynamic_registration
import amago.nets.transformer
import amago.nets.traj_encoders

amago.nets.traj_encoders.TformerTrajEncoder.attention_type = @amago.nets.transformer.VanillaAttention
amago.nets.traj_encoders.TformerTrajEncoder.n_heads = {heads}
"""


def subprocess_env(threads: int) -> dict[str, str]:
    """The environment of a run's subprocess, either library: its threads, no wandb, no torch.compile."""
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "WANDB_MODE": "disabled", "TORCH_COMPILE_DISABLE": "1",
            "PYTHONUNBUFFERED": "1"}


@dataclass(frozen=True)
class Task:
    name: str
    icrl_env: str
    icrl_kwargs: dict
    d_model: int
    context: int
    steps_per_env: int  # env steps of each env copy per epoch; 100 updates per epoch
    budget: int  # env steps (all envs)
    threshold: float  # on the mean evaluation return
    amago_script: str
    amago_args: list[str] = field(default_factory=list)
    eval_rollouts: int = 8  # icrl; the official evaluates as many as its val steps hold
    icrl_args: list[str] = field(default_factory=list)
    run_full: bool = False  # run the whole budget even once solved: the late curve (a fall after the best) is a result
    references: Callable[[], dict[str, float]] | None = None  # known returns drawn beside the curves
    explore_as_icrl: bool = False  # the official side gets icrl's resolved ε anneal (`--eps_anneal`)


def tmaze(n: int, budget: int) -> Task:
    return Task(f"tmaze{n}", "tmaze", {"length": n}, 64, n + 1, 5 * (n + 1), budget, 0.95,
                "examples/04_tmaze.py", ["--horizon", str(n)], eval_rollouts=8)


def popgym(name: str, threshold: float, budget: int = 10_608) -> Task:
    return Task(name, f"popgym/{name}", {}, 128, 64, 102, budget, threshold, "examples/03_popgym_suite.py",
                ["--env", name, "--max_seq_len", "64"], eval_rollouts=32)


def meta(name: str, icrl_env: str, icrl_kwargs: dict, rollout: int, threshold: float, budget: int,
         amago_args: list[str], icrl_args: Sequence[str] = (),
         references: Callable[[], dict[str, float]] | None = None) -> Task:
    """A meta-RL row: context = the whole rollout, 100 updates per 100 steps of each env (0.125 updates per env
    step, the official Meta-Frozen-Lake example's ratio), 128 evaluation rollouts, the whole budget (whether
    the return holds after its best is part of the result). The official side is
    `amago_meta_rl.py` (the example with the harness's settings), exploring over icrl's anneal."""
    return Task(name, icrl_env, icrl_kwargs, 64, rollout, 100, budget, threshold, str(HERE / "amago_meta_rl.py"),
                [*amago_args, "--max_seq_len", str(rollout), "--val_steps", str(128 // ENVS * rollout)],
                eval_rollouts=128, icrl_args=list(icrl_args), run_full=True, references=references,
                explore_as_icrl=True)


def bandit_references(arms: int, horizon: int) -> dict[str, float]:
    from benchmarks.bandit_baselines import bayes_optimal_return, thompson_return, win_stay_lose_shift_return

    return {"Bayes-optimal": bayes_optimal_return(arms, horizon), "Thompson sampling": thompson_return(arms, horizon),
            "win-stay lose-shift": win_stay_lose_shift_return(arms, horizon), "random": horizon / 2}


# Thresholds: T-Maze and the Repeat tasks are solved at ~1.0; for the others a fixed bar that separates
# learning from chance (POPGym's returns lie in [-1, 1]).
TASKS = {t.name: t for t in [
    tmaze(20, 20_160), tmaze(100, 101_000),
    popgym("RepeatPreviousEasy", 0.95), popgym("RepeatFirstEasy", 0.95), popgym("CountRecallEasy", 0.0, 20_400),
    popgym("AutoencodeEasy", 0.0, 20_400), popgym("PositionOnlyCartPoleEasy", 0.9, 20_400),
    popgym("PositionOnlyPendulumEasy", 0.5, 20_400), popgym("HigherLowerEasy", 0.5, 20_400),
    # Bayes-optimal 32.0, Thompson sampling 31.3, win-stay lose-shift 29.4, random 25 (icrl.envs.tasks.bandit)
    meta("bandit", "bandit", {"arms": 2, "horizon": 50}, 50, 30.0, 30_000,
         ["--env", "bandit", "--arms", "2", "--horizon", "50"], references=lambda: bandit_references(2, 50)),
    # the official example's task (one 1,000-step episode per rollout, a hidden target in [0, 3] m/s) and context 32;
    # 100 updates per 250 steps of each env. A random policy scores about -1,600.
    Task("halfcheetahvel", "half_cheetah_vel", {"episode_steps": 1000}, 64, 32, 250, 40_000, -400.0,
         "examples/12_half_cheetah_vel.py", ["--policy_seq_len", "32"], eval_rollouts=8, run_full=True,
         icrl_args=["--chunk-len", "192"]),  # stored in pieces of 192 steps, as the example's traj_save_len
    # 3 attempts of 25 steps at one random 5x5 lake; return = attempts that reached the goal
    meta("metafrozenlake", "meta_frozen_lake", {"size": 5, "max_episode_steps": 25}, 75, 1.5, 40_000,
         ["--env", "meta_frozen_lake", "--lake_size", "5", "--k_episodes", "3"], ["--episodes-per-rollout", "3"]),
]}
ALIASES = {"repeat_previous": "RepeatPreviousEasy", "repeat_first": "RepeatFirstEasy",
           "count_recall": "CountRecallEasy", "autoencode": "AutoencodeEasy", "cartpole": "PositionOnlyCartPoleEasy",
           "pendulum": "PositionOnlyPendulumEasy", "higher_lower": "HigherLowerEasy",
           "meta_frozen_lake": "metafrozenlake", "half_cheetah_vel": "halfcheetahvel"}

# ---------------------------------------------------------------------------------------------- set-up
def setup_amago(args: argparse.Namespace) -> None:
    """The official AMAGO, editable, in its own venv (CPU torch pinned first so pip never fetches CUDA)."""
    src = args.amago_src
    if not (src / "amago").is_dir():
        if args.amago_git_dir is None:
            sys.exit("--setup-amago: no checkout at --amago-src; pass --amago-git-dir (a bare mirror) to extract one")
        src.mkdir(parents=True, exist_ok=True)
        git = ["git", f"--git-dir={args.amago_git_dir}"]
        tree = subprocess.run([*git, "ls-tree", "-r", "HEAD"], check=True, capture_output=True, text=True).stdout
        for line in tree.splitlines():  # blob by blob: `git archive` aborts on a mirror with absent blobs
            meta, path = line.split("\t", 1)
            blob = subprocess.run([*git, "cat-file", "blob", meta.split()[2]], capture_output=True)
            if blob.returncode == 0:
                (src / path).parent.mkdir(parents=True, exist_ok=True)
                (src / path).write_bytes(blob.stdout)
        head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout
        (src / "PARITY_COMMIT").write_text(head)
    py = args.amago_venv / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(args.amago_venv)], check=True)
    pip = [str(py), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, TORCH], check=True)
    subprocess.run([*pip, "-e", str(src), TORCH, "gymnasium<=0.29.1"], check=True)
    # tmaze.py imports matplotlib
    subprocess.run([*pip, "matplotlib", "popgym", TORCH, "gymnasium<=0.29.1"], check=True)
    # the Half-Cheetah-Vel row: MuJoCo 3.3 (HalfCheetah-v4 of gymnasium 0.29; its renderer module imports imageio)
    subprocess.run([*pip, "mujoco==3.3.0", "imageio", TORCH, "gymnasium<=0.29.1"], check=True)
    subprocess.run([str(py), "-c", "import torch; assert torch.version.cuda is None, 'a CUDA torch was installed'"],
                   check=True)
    print(f"official AMAGO ready: {py} (source {src})")


# ---------------------------------------------------------------------------------------------- commands
def icrl_command(task: Task, seed: int, run_dir: Path, threads: int) -> list[str]:
    return [sys.executable, "-m", "icrl", "train", "--env", task.icrl_env, "--env-kwargs", json.dumps(task.icrl_kwargs),
            "--d-model", str(task.d_model), "--layers", "2", "--heads", "4", "--max-seq-len", str(task.context),
            "--parallel-envs", str(ENVS), "--steps-per-epoch", str(ENVS * task.steps_per_env),
            "--updates-per-epoch", "100", "--batch-size", "24", "--total-env-steps", str(task.budget),
            "--eval-every", "1", "--eval-rollouts", str(task.eval_rollouts), "--checkpoint-every", "1000000",
            "--seed", str(seed), "--threads", str(threads), "--device", "cpu", "--run-dir", str(run_dir),
            *task.icrl_args]


def icrl_config(task: Task) -> Any:
    """The ExperimentConfig icrl's run of `task` resolves to (its CLI parse of `icrl_command`, then the task's
    and the library's defaults): what the official side must be given where the row says so."""
    from icrl.cli import parse
    from icrl.run.build import with_task_defaults

    cmd = icrl_command(task, 0, Path("unused"), 1)
    return with_task_defaults(parse(cmd[cmd.index("train"):]).config).validate()


def amago_command(task: Task, seed: int, args: argparse.Namespace, buffers: Path) -> list[str]:
    explore = ["--eps_anneal", str(icrl_config(task).explore.eps_anneal_steps)] if task.explore_as_icrl else []
    epochs = task.budget // (ENVS * task.steps_per_env) + 1  # evaluation comes at the start of each epoch
    gin = CACHE / "cpu_tformer.gin"
    gin.parent.mkdir(parents=True, exist_ok=True)
    gin.write_text(GIN.format(heads=4))
    return [str(args.amago_venv / "bin" / "python"), str(HERE / "parity_amago_run.py"), task.amago_script,
            *task.amago_args, *explore, "--run_name", f"parity_{task.name}_s{seed}", "--buffer_dir", str(buffers),
            "--memory_size", str(task.d_model), "--memory_layers", "2", "--parallel_actors", str(ENVS),
            "--env_mode", "sync", "--epochs", str(epochs), "--timesteps_per_epoch", str(task.steps_per_env),
            "--batches_per_epoch", "100", "--batch_size", "24", "--val_interval", str(args.amago_val_interval),
            "--ckpt_interval", "1000000",
            "--dloader_workers", "1", "--no_log", "--configs", str(gin)]


# ---------------------------------------------------------------------------------------------- running
def icrl_curve(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    curve, eval_s = [], 0.0
    for r in rows:
        if r.get("kind") == "eval":
            eval_s += r.get("time/eval_s", 0.0)
            curve.append({"env_steps": r["env_steps"], "updates": r["updates"], "wall_s": round(r["wall_time"], 2),
                          "eval_s": round(eval_s, 2), "return": r["return_mean"], "success": r.get("success_rate"),
                          "success_by_episode": r.get("success_by_episode")})
    return curve


def amago_curve(log: Path) -> list[dict]:
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    return [json.loads(x[len("PARITY "):]) for x in lines if x.startswith("PARITY ")]


def success_by_episode(row: dict) -> list[float] | None:
    """One evaluation's success rate by attempt within a rollout (attempt 1 first), from either library's curve:
    icrl logs the list, the official code one "Average Episode k Success in <env>" per attempt."""
    if row.get("success_by_episode"):
        return row["success_by_episode"]
    per = {int(k.split()[2]): v for k, v in row.get("specials", {}).items() if k.startswith("Average Episode ")
           and k.split()[3:4] == ["Success"]}
    return [per[k] for k in sorted(per)] or None


def solved_at(curve: list[dict], threshold: float, hold: int) -> dict | None:
    """The first evaluation that starts `hold` evaluations in a row at or above the threshold."""
    for i in range(len(curve)):
        window = curve[i:i + hold]
        if len(window) == hold and all(r["return"] is not None and r["return"] >= threshold for r in window):
            return curve[i]
    return None


def run_one(task: Task, lib: str, seed: int, args: argparse.Namespace) -> dict:
    """One run in a subprocess, stopped once the threshold has held `args.hold` evaluations (or at the budget)."""
    work = CACHE / "runs" / f"{task.name}_{lib}_s{seed}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    log = work / "stdout.log"
    if lib == "icrl":
        cmd, cwd = icrl_command(task, seed, work / "run", args.threads), None
        curve_of = lambda: icrl_curve(work / "run")  # noqa: E731
    else:
        cmd, cwd = amago_command(task, seed, args, work / "buffers"), str(args.amago_src)
        curve_of = lambda: amago_curve(log)  # noqa: E731
    env = subprocess_env(args.threads)
    start = time.time()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env)
        stopped_early = False
        while proc.poll() is None:
            time.sleep(2.0)
            if args.hold and not task.run_full and solved_at(curve_of(), task.threshold, args.hold) is not None:
                proc.terminate()  # both libraries stop cleanly on SIGTERM
                stopped_early = True
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
            elif time.time() - start > args.max_wall:
                proc.kill()
    curve = curve_of()
    if not curve:
        raise RuntimeError(f"{lib} {task.name} seed {seed} logged no evaluation; see {log}:\n"
                           + "\n".join(log.read_text(errors="replace").splitlines()[-15:]))
    solve = solved_at(curve, task.threshold, max(args.hold, 1))
    returns = [r["return"] for r in curve if r["return"] is not None]
    return {"task": task.name, "lib": lib, "seed": seed, "threshold": task.threshold, "hold": args.hold,
            "solved_env_steps": solve and solve["env_steps"],
            "solved_wall_s": solve and round(solve["wall_s"] - solve["eval_s"], 1),  # evaluation time left out
            "solved_updates": solve and solve["updates"], "best_return": max(returns), "final_return": returns[-1],
            "stopped_at_threshold": stopped_early, "process_wall_s": round(time.time() - start, 1),
            "command": cmd, "curve": curve, "loadavg": os.getloadavg()}


# ---------------------------------------------------------------------------------------------- report
def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def summarize(runs: list[dict]) -> list[dict]:
    rows = []
    for name in TASKS:
        for lib in ("icrl", "amago"):
            rs = [r for r in runs if r["task"] == name and r["lib"] == lib]
            if not rs:
                continue
            rs = sorted(rs, key=lambda r: r["seed"])
            solved = [r for r in rs if r["solved_env_steps"] is not None]
            rows.append({"task": name, "lib": lib, "seeds": [r["seed"] for r in rs],
                         "solved": f"{len(solved)}/{len(rs)}", "threshold": rs[0]["threshold"],
                         "env_steps_to_threshold": _mean([r["solved_env_steps"] for r in solved]),
                         "env_steps_per_seed": [r["solved_env_steps"] for r in rs],  # None: not solved
                         "wall_s_to_threshold": _mean([r["solved_wall_s"] for r in solved]),
                         "best_return": _mean([r["best_return"] for r in rs]),
                         "final_return": _mean([r["final_return"] for r in rs]),
                         "final_return_range": [min(r["final_return"] for r in rs),
                                                max(r["final_return"] for r in rs)]})
    return rows


def markdown(rows: list[dict]) -> str:
    """Means over seeds with their spread: each seed's env steps to the threshold (— where it was not reached
    within the budget) and the range of final returns."""
    def f(x, d=0):
        return "—" if x is None else f"{x:,.{d}f}"

    out = ["| task | library | seeds solved | threshold | env steps to it: mean of solved (per seed) | "
           "wall s to it (no eval) | best return | final return: mean (min–max) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        per_seed = " / ".join(f(x) for x in r.get("env_steps_per_seed", []))
        lo, hi = r.get("final_return_range", [r["final_return"]] * 2)
        final = f(r["final_return"], 3) + (f" ({f(lo, 3)}–{f(hi, 3)})" if len(r["seeds"]) > 1 else "")
        out.append(f"| {r['task']} | {r['lib']} | {r['solved']} | {r['threshold']} | {f(r['env_steps_to_threshold'])} "
                   f"({per_seed}) | {f(r['wall_s_to_threshold'])} | {f(r['best_return'], 3)} | {final} |")
    return "\n".join(out) + "\n"


README_TASKS = ("tmaze20", "tmaze100", "RepeatPreviousEasy", "RepeatFirstEasy")


def readme_table(rows: list[dict], tasks: tuple[str, ...] = README_TASKS) -> str:
    """The README's results table, made from parity.json's rows (a test holds the README to it): for each task and
    library the seeds solved, the mean env steps to the threshold over the solved seeds in bold where it is the
    lower of the two, each seed's, the wall time to it and the final returns' mean and range."""
    def f(x, d=0):
        return "—" if x is None else f"{x:,.{d}f}"

    out = ["| task | library | solved | threshold | env steps to it (per seed) | wall s to it | "
           "final return: mean (min–max) |",
           "|---|---|---|---|---|---|---|"]
    for task in tasks:
        pair = [r for r in rows if r["task"] == task]
        best = min((r["env_steps_to_threshold"] for r in pair if r["env_steps_to_threshold"] is not None), default=None)
        for r in pair:
            steps = f(r["env_steps_to_threshold"])
            steps = f"**{steps}**" if len(pair) > 1 and r["env_steps_to_threshold"] == best else steps
            per_seed = " / ".join(f(x) for x in r["env_steps_per_seed"])
            lo, hi = r["final_return_range"]
            out.append(f"| {task} | {r['lib']} | {r['solved']} | {r['threshold']} | {steps} ({per_seed}) | "
                       f"{f(r['wall_s_to_threshold'])} | {f(r['final_return'], 3)} ({f(lo, 3)}–{f(hi, 3)}) |")
    return "\n".join(out)


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from icrl.run.artifacts import save_figure  # a PNG with a palette: a third of the bytes

    names = [n for n in TASKS if any(r["task"] == n for r in runs)]
    cols = min(4, len(names))
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    for ax in axes.flat[len(names):]:
        ax.axis("off")
    for ax, name in zip(axes.flat, names):
        for r in (r for r in runs if r["task"] == name):
            xs = [c["env_steps"] for c in r["curve"]]
            ys = [c["return"] for c in r["curve"]]
            ax.plot(xs, ys, color="tab:blue" if r["lib"] == "icrl" else "tab:orange", alpha=0.8,
                    label=f"{r['lib']} s{r['seed']}")
        ax.axhline(TASKS[name].threshold, color="gray", ls=":", lw=1)
        refs = TASKS[name].references
        for (label, value), style in zip((refs() if refs else {}).items(), ("-", "--", "-.", ":")):
            ax.axhline(value, color="black", ls=style, lw=0.8, alpha=0.6, label=f"{label} {value:.1f}")
        ax.set_title(name)
        ax.set_xlabel("env steps")
        ax.set_ylabel("eval return")
        ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)  # closes it


def stored_runs() -> list[dict]:
    """Every run this machine has (`runs/*.json`, not in git) over the runs recorded in the committed
    parity.json, matched by (task, library, seed): a fresh clone that reruns one task keeps the others' rows."""
    key = lambda r: (r["task"], r["lib"], r["seed"])  # noqa: E731
    recorded = json.loads((OUT / "parity.json").read_text()).get("runs", []) if (OUT / "parity.json").exists() else []
    runs = {key(r): r for r in recorded}
    runs.update({key(r): r for r in (json.loads(p.read_text()) for p in sorted((OUT / "runs").glob("*.json")))})
    order = {name: i for i, name in enumerate(TASKS)}
    return sorted(runs.values(), key=lambda r: (order.get(r["task"], len(order)), r["lib"] != "icrl", r["seed"]))


def _per_seed(xs: list[float | None]) -> str:
    return " / ".join("—" if x is None else f"{x:.2f}" for x in xs)


SMOOTH = 3  # evaluations averaged for the hold check: one evaluation's noise (128 rollouts) is a few % of the return


def smoothed(curve: list[dict]) -> list[float]:
    """The running mean of SMOOTH evaluations in a row (the first full window onwards)."""
    rets = [c["return"] for c in curve if c["return"] is not None]
    return [sum(rets[i - SMOOTH:i]) / SMOOTH for i in range(SMOOTH, len(rets) + 1)] or rets[-1:]


def meta_markdown(runs: list[dict]) -> str:
    """The rows that run their whole budget: does the return hold after its best, and success by attempt within
    a rollout at the last evaluation (the adaptation curve). The hold check compares means of SMOOTH evaluations
    (the last ones against the best such run): the best single evaluation is the top of the noise, so a
    single evaluation's last / best falls short of 1 even on a flat curve."""
    out = [f"| task | library | seeds | best / last single evaluation (per seed) | best / last mean of {SMOOTH} in a "
           f"row (per seed) | last / best, means of {SMOOTH} (per seed) | success by attempt, last evaluation "
           "(mean of seeds) |", "|---|---|---|---|---|---|---|"]
    for name in (n for n, t in TASKS.items() if t.run_full):
        for lib in ("icrl", "amago"):
            rs = sorted((r for r in runs if r["task"] == name and r["lib"] == lib), key=lambda r: r["seed"])
            if not rs:
                continue
            attempts = [success_by_episode(r["curve"][-1]) for r in rs]
            attempts = [a for a in attempts if a]
            by = " / ".join(f"{sum(col) / len(col):.2f}" for col in zip(*attempts)) if attempts else "—"
            single = " / ".join(f"{r['best_return']:.2f}, {r['final_return']:.2f}" for r in rs)
            smooth = [smoothed(r["curve"]) for r in rs]
            means = " / ".join(f"{max(m):.2f}, {m[-1]:.2f}" for m in smooth)
            ratio = _per_seed([m[-1] / max(m) if max(m) > 0 else None for m in smooth])
            out.append(f"| {name} | {lib} | {len(rs)} | {single} | {means} | {ratio} | {by} |")
    return "\n".join(out) + "\n" if len(out) > 2 else ""


def report() -> list[dict]:
    runs = stored_runs()
    rows = summarize(runs)
    (OUT / "parity.json").write_text(json.dumps({"rows": rows, "runs": runs}, indent=1))
    (OUT / "parity.md").write_text(markdown(rows) + "\n" + meta_markdown(runs))
    if any(r.get("curve") for r in runs):  # runs recorded before curves were kept have none to draw
        plot([r for r in runs if r.get("curve")], OUT / "parity.png")
    print(markdown(rows) + "\n" + meta_markdown(runs))
    print("README's table (tests/integration/test_readme.py holds the README to it):\n" + readme_table(rows))
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", nargs="+", default=["tmaze20", "tmaze100", "RepeatPreviousEasy"],
                   help=f"of {sorted(TASKS)} (aliases {sorted(ALIASES)})")
    p.add_argument("--libs", nargs="+", default=["icrl", "amago"], choices=["icrl", "amago"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--hold", type=int, default=2, help="evaluations in a row at the threshold that end a run "
                                                      "(0: run the whole budget)")
    p.add_argument("--max-wall", type=float, default=10_800.0, help="seconds before a run is killed (the official "
                   "PositionOnlyPendulumEasy run needs ~75 minutes here beside another job)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rerun", action="store_true", help="run again even where a stored result exists")
    p.add_argument("--report", action="store_true", help="only rebuild the table and plot from the stored runs")
    p.add_argument("--setup-amago", action="store_true")
    p.add_argument("--amago-src", type=Path, default=CACHE / "amago-src")
    p.add_argument("--amago-git-dir", type=Path, default=None)
    p.add_argument("--amago-venv", type=Path, default=CACHE / "amago-venv")
    p.add_argument("--amago-val-interval", type=int, default=1,
                   help="epochs between the official code's evaluations (its POPGym example plays 2,000 steps per "
                        "actor in each: 2 halves the sweep's time; evaluation time is left out of the results)")
    args = p.parse_args(argv)
    if args.setup_amago:
        return setup_amago(args)
    if not args.report:
        (OUT / "runs").mkdir(parents=True, exist_ok=True)
        if "amago" in args.libs and not (args.amago_venv / "bin" / "python").exists():
            sys.exit(f"no official AMAGO venv at {args.amago_venv}: run with --setup-amago first")
        for name in args.tasks:
            task = TASKS[ALIASES.get(name, name)]
            for seed in args.seeds:
                for lib in args.libs:
                    path = OUT / "runs" / f"{task.name}_{lib}_s{seed}.json"
                    if path.exists() and not args.rerun:
                        continue
                    print(f"parity: {task.name} {lib} seed {seed} ...", flush=True)
                    result = run_one(task, lib, seed, args)
                    path.write_text(json.dumps(result, indent=1))
                    print(f"parity: {task.name} {lib} seed {seed}: solved at {result['solved_env_steps']} env steps, "
                          f"{result['solved_wall_s']} s; best {result['best_return']:.3f}", flush=True)
    report()


if __name__ == "__main__":
    main()
