"""Learning suite at the defaults: every family, several seeds, one table (issue 33).

Each case is the `icrl train` command a user would type (the library's defaults, a preset where the family has
one, or the parity harness's settings where the row compares with the official AMAGO), run in a subprocess with
its env-step budget, a seed and a run directory; nothing else is set. Every evaluation is kept, so the table says
for each case and seed:

- the env steps, updates and wall time (evaluation left out) to the threshold: the first of two evaluations in
  a row at or above it (`benchmarks/parity.py`'s rule);
- the best and the last evaluation, and whether the run **held** what it reached: after solving, the lowest later
  evaluation (`min after`) and whether any fell below the threshold by more than `FALL` of it (`fell`: for a
  threshold of 0.95, below 0.8);
- the official AMAGO's env steps to the same threshold where the parity harness has run that task
  (`benchmarks/results/parity/parity.json`; the harness's settings, said in the `settings` column).

    python benchmarks/learning_suite.py --list                                # the cases and their commands
    python benchmarks/learning_suite.py --seeds 0 1 2                         # every default case, 3 seeds
    python benchmarks/learning_suite.py --cases tmaze100 bandit --seeds 0 1 2 --jobs 2
    python benchmarks/learning_suite.py --report                              # table + plot from stored runs

A finished run is stored as `benchmarks/results/learning_suite/runs/<case>_s<seed>.json` (its curve and the
command; a local cache, not committed) and skipped by later calls unless `--rerun`; `learning_suite.json` is the
committed record of every run with its curve, and it, the table (`learning_suite.md`) and the plot
(`learning_suite.png`) are rebuilt from the record and the local runs. `--jobs 2` runs two cases at once (one thread
each): their wall times then share a machine, which the table's `load` column shows. Long cases (T-Maze 1,000)
run only when named in `--cases`.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as `python benchmarks/<name>.py`: the repo root, for `from benchmarks import`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import parity  # noqa: E402
from benchmarks.parity import icrl_curve, solved_at  # noqa: E402  (one rule for "solved" in both harnesses)

HERE = Path(__file__).resolve().parent

OUT = HERE / "results" / "learning_suite"
RUN_ROOT = Path(os.environ.get("ICRL_SUITE_RUNS", Path.home() / ".cache" / "icrl-learning-suite"))
HOLD = 2  # evaluations in a row at the threshold that count as solved
FALL = 0.15  # after solving, an evaluation below threshold - FALL x max(|threshold|, 1) is a fall (0.95 -> 0.8)
POPGYM = ("--d-model", "128", "--max-seq-len", "64", "--parallel-envs", "8")  # the POPGym settings
OWN_FLAGS = ("--total-env-steps", "--seed", "--threads", "--device", "--run-dir")  # set per run by `Case.command`


@dataclass(frozen=True)
class Case:
    name: str
    family: str
    args: tuple[str, ...]  # `icrl train` flags besides budget, seed and run dir
    budget: int  # env steps
    threshold: float
    metric: str = "return"  # or "success"
    settings: str = "defaults"
    parity: str | None = None  # the parity harness's task whose official runs are quoted
    target: int | None = None  # env steps within which issue 33 asks for the threshold
    long: bool = False  # run only when named

    def command(self, seed: int, run_dir: Path, flags: tuple[str, ...] = ()) -> list[str]:
        """`flags` (a variant's, `--flags`) come last, so they override the case's own."""
        return [sys.executable, "-m", "icrl", "train", *self.args, "--total-env-steps", str(self.budget),
                "--seed", str(seed), "--threads", "1", "--device", "cpu", "--run-dir", str(run_dir), *flags]


def tmaze(n: int, budget: int, target: int, eval_every: int, long: bool = False) -> Case:
    return Case(f"tmaze{n}", "memory", ("--env", "tmaze", "--env-kwargs", json.dumps({"length": n}),
                                        "--eval-every", str(eval_every)),
                budget, 0.95, parity=f"tmaze{n}" if n in (20, 100) else None, target=target, long=long)


def parity_args(task: str) -> tuple[str, ...]:
    """The parity harness's icrl flags for `task` (its model, context, envs, update ratio, evaluation), less the
    ones each run sets itself: the suite's meta-RL rows are the harness's icrl runs, by construction."""
    cmd = parity.icrl_command(parity.TASKS[task], 0, Path("unused"), 1)
    flags = cmd[cmd.index("train") + 1:]
    out: list[str] = []
    for flag, value in zip(flags[::2], flags[1::2]):
        if flag not in OWN_FLAGS:
            out += [flag, value]
    return tuple(out)


def popgym(game: str, threshold: float, budget: int, target: int | None = None, held_out: bool = False) -> Case:
    return Case(game, "held out" if held_out else "popgym", ("--env", f"popgym/{game}", *POPGYM, "--eval-every", "1"),
                budget, threshold, settings=("held out: " if held_out else "") + "d128, context 64, 8 envs",
                parity=game, target=target)


CASES = {c.name: c for c in [
    tmaze(20, 20_000, 20_000, 1), tmaze(100, 100_000, 100_000, 2), tmaze(500, 400_000, 400_000, 5),
    tmaze(1000, 700_000, 700_000, 10, long=True),
    popgym("RepeatPreviousEasy", 0.95, 10_000, 10_000), popgym("RepeatFirstEasy", 0.95, 10_000),
    popgym("CountRecallEasy", 0.0, 20_000), popgym("PositionOnlyCartPoleEasy", 0.9, 20_000),
    Case("bandit", "meta", parity_args("bandit"), 30_000, 30.0,
         settings="parity: context 50, 0.125 updates per env step", parity="bandit", target=4_000),
    Case("meta_frozen_lake", "meta", parity_args("metafrozenlake"), 40_000, 1.5,
         settings="parity: 3 episodes, 0.125 updates per env step", parity="metafrozenlake"),
    Case("goal_grid", "goal", ("--preset", "goal_grid", "--relabel", "all", "--eval-every", "1"), 12_000, 0.95,
         metric="success", settings="--preset goal_grid --relabel all", target=12_000),
    Case("cartpole", "control", ("--preset", "control", "--env", "CartPole-v1", "--eval-every", "2"), 50_000, 475.0,
         settings="--preset control"),
    Case("pendulum", "control", ("--preset", "control", "--env", "Pendulum-v1", "--eval-every", "2"), 20_000, -200.0,
         settings="--preset control"),
    # held out: no default was tuned on these (a user's own meta-RL env, POPGym games outside the parity rows)
    Case("gaussian_arms", "held out",  # 128 evaluation rollouts: one return's spread is ~23, a mean of 32 still ~4
         ("--env", "benchmarks.heldout_envs:GaussianArms", "--eval-every", "1", "--eval-rollouts", "128"), 30_000,
         25.0, settings="held out: defaults, a user's env (benchmarks/heldout_envs.py)"),
    popgym("AutoencodeEasy", 0.0, 20_000, held_out=True), popgym("HigherLowerEasy", 0.5, 20_000, held_out=True),
]}  # fmt: skip


# ---------------------------------------------------------------------------------------------- one run
def summarize_curve(case: Case, curve: list[dict]) -> dict:
    """Threshold, best, last and hold of one run's evaluations (`curve` rows of `parity.icrl_curve`)."""
    key = "success" if case.metric == "success" else "return"
    rows = [{**r, "return": r.get(key)} for r in curve if r.get(key) is not None]  # solved_at reads "return"
    solve = solved_at(rows, case.threshold, HOLD)
    out: dict = {"solved_env_steps": None, "solved_updates": None, "solved_wall_s": None, "min_after": None,
                 "fell": None, "best": max((r["return"] for r in rows), default=None),
                 "last": rows[-1]["return"] if rows else None, "evaluations": len(rows)}
    if solve is not None:
        after = [r["return"] for r in rows if r["env_steps"] > solve["env_steps"]]
        bar = case.threshold - FALL * max(abs(case.threshold), 1.0)
        out.update(solved_env_steps=solve["env_steps"], solved_updates=solve["updates"],
                   solved_wall_s=round(solve["wall_s"] - solve["eval_s"], 1), min_after=min(after, default=None),
                   fell=any(x < bar for x in after))
    return out


def run_case(case: Case, seed: int, keep: bool, flags: tuple[str, ...] = ()) -> dict:
    work = RUN_ROOT / OUT.name / f"{case.name}_s{seed}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    cmd = case.command(seed, work / "run", flags)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    start = time.time()
    with open(work / "stdout.log", "w") as out:
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
    curve = icrl_curve(work / "run")
    if rc != 0 or not curve:
        tail = "\n".join((work / "stdout.log").read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"{case.name} seed {seed} failed (exit {rc}); {work / 'stdout.log'}:\n{tail}")
    record = {"case": case.name, "seed": seed, "threshold": case.threshold, "metric": case.metric,
              "budget": case.budget, "command": shlex.join(["icrl", *cmd[3:]]),
              "process_wall_s": round(time.time() - start, 1),
              "loadavg": [round(x, 2) for x in os.getloadavg()], **summarize_curve(case, curve), "curve": curve}
    (OUT / "runs").mkdir(parents=True, exist_ok=True)
    (OUT / "runs" / f"{case.name}_s{seed}.json").write_text(json.dumps(record, indent=1) + "\n")
    if not keep:
        shutil.rmtree(work / "run" / "replay", ignore_errors=True)
    return record


# ---------------------------------------------------------------------------------------------- report
def stored() -> list[dict]:
    """Every run on record: learning_suite.json (committed: each run with its curve) updated by the run files of
    this machine (`runs/`, a local cache that git ignores), so a fresh clone's new run adds to the record."""
    record = OUT / "learning_suite.json"
    runs = {(r["case"], r["seed"]): r for r in json.loads(record.read_text())["runs"]} if record.is_file() else {}
    for path in sorted((OUT / "runs").glob("*.json")) if (OUT / "runs").is_dir() else []:
        r = json.loads(path.read_text())
        runs[(r["case"], r["seed"])] = r
    order = {n: i for i, n in enumerate(CASES)}
    return sorted(runs.values(), key=lambda r: (order.get(r["case"], len(order)), r["seed"]))


def official(task: str | None) -> str:
    """The official AMAGO's env steps to the threshold per seed in the parity harness, or "—"."""
    path = HERE / "results" / "parity" / "parity.json"
    if task is None or not path.exists():
        return "—"
    runs = [r for r in json.loads(path.read_text()).get("runs", []) if r["task"] == task and r["lib"] == "amago"]
    per = [f"{r['solved_env_steps']:,}" if r.get("solved_env_steps") else "not solved"
           for r in sorted(runs, key=lambda r: r["seed"])]
    return " / ".join(per) if per else "—"


def _falls(case: Case, run: dict) -> str:
    n = falls_after_solving(case, run)
    return "—" if n is None else str(n)


def _num(x: float | None, digits: int = 2) -> str:
    return "—" if x is None else (f"{x:,.0f}" if abs(x) >= 100 else f"{x:.{digits}f}")


def falls_after_solving(case: Case, run: dict) -> int | None:
    """How many evaluations after the run solved its case fell below threshold - FALL (None: never solved)."""
    if not run.get("solved_env_steps"):
        return None
    key = "success" if case.metric == "success" else "return"
    bar = case.threshold - FALL * max(abs(case.threshold), 1.0)
    return sum(1 for c in run.get("curve", []) if c["env_steps"] > run["solved_env_steps"]
               and c.get(key) is not None and c[key] < bar)


def markdown(runs: list[dict]) -> str:
    lines = ["| case | settings | threshold | seed | solved at (env steps) | updates | wall s | best | last | "
             "min after | falls after solving | target | official AMAGO (parity, per seed) |", "|" + "---|" * 13]
    for r in runs:
        case = CASES.get(r["case"])
        if case is None:
            continue
        solved = f"{r['solved_env_steps']:,}" if r["solved_env_steps"] else f"not in {r['budget']:,}"
        fell = " (fell)" if r.get("fell") else ""
        target = f"{case.target:,}" if case.target else "—"
        lines.append(f"| {case.name} | {case.settings} | {case.metric} {_num(case.threshold)} | {r['seed']} | "
                     f"{solved} | {_num(r['solved_updates'])} | {_num(r['solved_wall_s'])} | {_num(r['best'])} | "
                     f"{_num(r['last'])} | "
                     f"{_num(r['min_after'])}{fell} | {_falls(case, r)} | {target} | {official(case.parity)} |")
    return "\n".join(lines)


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from icrl.run.artifacts import save_figure  # a PNG with a palette: a third of the bytes

    names = list(dict.fromkeys(r["case"] for r in runs if r["case"] in CASES))
    if not names:
        return
    cols = min(4, len(names))
    rows = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        case = CASES[name]
        key = "success" if case.metric == "success" else "return"
        for r in (r for r in runs if r["case"] == name):
            pts = [(c["env_steps"], c[key]) for c in r["curve"] if c.get(key) is not None]
            ax.plot(*zip(*pts), lw=1.2, label=f"seed {r['seed']}")
        ax.axhline(case.threshold, ls="--", color="k", alpha=0.5)
        if case.target:
            ax.axvline(case.target, ls=":", color="C3", alpha=0.7)
        ax.set_title(f"{name} ({case.settings})", fontsize=8)
        ax.set_xlabel("env steps", fontsize=8)
        ax.set_ylabel(f"eval {key}", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)  # closes it


def report() -> str:
    runs = stored()
    table = markdown(runs)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "learning_suite.md").write_text(table + "\n")
    (OUT / "learning_suite.json").write_text(json.dumps({"hold": HOLD, "fall": FALL, "runs": runs}) + "\n")
    plot(runs, OUT / "learning_suite.png")
    return table


# ---------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", nargs="+", default=None,
                   help=f"default: every case but the long ones ({', '.join(CASES)})")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--jobs", type=int, default=1, help="cases run at once, one thread each (default 1)")
    p.add_argument("--rerun", action="store_true", help="run again cases that have a stored result")
    p.add_argument("--keep-replay", action="store_true")
    p.add_argument("--list", action="store_true", help="print the cases' commands and exit")
    p.add_argument("--report", action="store_true", help="only rebuild the table and plot from stored runs")
    p.add_argument("--variant", default=None, help="a name for a change tried against the defaults: its runs and "
                   "table go to results/learning_suite/variants/NAME, apart from the defaults'")
    p.add_argument("--flags", default="", help="with --variant: `icrl train` flags added to every case "
                   "(e.g. \"--tau 0.01\"); a variant's flags are kept in its folder's flags.txt")
    args = p.parse_args(argv)
    global OUT
    flags = tuple(shlex.split(args.flags))
    if flags and not args.variant:
        p.error("--flags changes the defaults: name the variant with --variant NAME")
    if args.variant:
        if not args.variant.replace("-", "").replace("_", "").isalnum():
            p.error(f"--variant {args.variant!r}: letters, digits, - and _ only")
        OUT = OUT / "variants" / args.variant
        said = OUT / "flags.txt"
        if said.is_file() and flags and said.read_text().strip() != shlex.join(flags):
            p.error(f"variant {args.variant} was run with {said.read_text().strip()!r}, not {shlex.join(flags)!r}: "
                    "name this one differently")
        if flags:
            OUT.mkdir(parents=True, exist_ok=True)
            said.write_text(shlex.join(flags) + "\n")
        elif said.is_file():
            flags = tuple(shlex.split(said.read_text()))
    unknown = [c for c in args.cases or [] if c not in CASES]
    if unknown:
        p.error(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(CASES)}")
    if args.jobs < 1:
        p.error("--jobs must be >= 1")
    cases = [CASES[c] for c in args.cases] if args.cases else [c for c in CASES.values() if not c.long]
    if args.list:
        for c in cases:
            print(f"{c.name:26s} {shlex.join(['icrl', *c.command(0, Path('RUN_DIR'), flags)[3:]])}")
        return
    if not args.report:
        done = {(r["case"], r["seed"]) for r in stored()}
        todo = [(c, s) for c in cases for s in args.seeds if args.rerun or (c.name, s) not in done]
        with ThreadPoolExecutor(args.jobs) as pool:
            for r in pool.map(lambda cs: run_case(cs[0], cs[1], args.keep_replay, flags), todo):
                print(f"{r['case']} seed {r['seed']}: solved at {r['solved_env_steps']}, best {_num(r['best'])}, "
                      f"last {_num(r['last'])}, {r['process_wall_s']:.0f} s", flush=True)
    print(report())


if __name__ == "__main__":
    main()
