"""Collection throughput without a network: env steps/s of `Collector.collect` with `RandomPolicy`.

This is the ceiling of the acting loop (env + wrapper + vector env + the collector's per-env bookkeeping),
for 1, 8 and 32 parallel envs, Sync and Async vector envs, on Passive T-Maze and a POPGym task. The
time spent inside `venv.step` is reported separately, so the collector's own share is visible.

    python benchmarks/collection.py
    python benchmarks/collection.py --envs 1 8 --modes sync --steps 4000

Prints a table; the last line is one JSON object (also written to benchmarks/results/collection/collection.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

from icrl.envs import Collector, RandomPolicy, make_vector_env
from icrl.types import ActionSpec

TASKS = {
    "tmaze": ("tmaze", "{}"),  # corridor from --tmaze-length
    "popgym-repeat-previous-easy": ("popgym:popgym-RepeatPreviousEasy-v0", "{}"),
}


def measure(env_name: str, env_kwargs: dict, num_envs: int, asynchronous: bool, steps: int) -> dict:
    t0 = time.perf_counter()
    venv = make_vector_env(env_name, env_kwargs, num_envs, asynchronous=asynchronous)
    spec = ActionSpec.from_space(venv.single_action_space)
    collector = Collector(venv, spec, seed=0)
    policy = RandomPolicy(spec, seed=0)
    collector.collect(policy, 2 * num_envs)  # hard reset + warm-up
    startup = time.perf_counter() - t0

    step_s = [0.0]
    raw_step = venv.step

    def timed_step(actions):
        t = time.perf_counter()
        out = raw_step(actions)
        step_s[0] += time.perf_counter() - t
        return out

    venv.step = timed_step  # the collector calls self.venv.step
    n0 = collector.total_env_steps
    t = time.perf_counter()
    rollouts, _ = collector.collect(policy, steps)
    dt = time.perf_counter() - t
    taken = collector.total_env_steps - n0
    venv.close()
    return {
        "num_envs": num_envs,
        "mode": "async" if asynchronous else "sync",
        "env_steps": taken,
        "seconds": dt,
        "env_steps_per_s": taken / dt,
        "frac_in_venv_step": step_s[0] / dt,
        "us_per_env_step_collector": 1e6 * (dt - step_s[0]) / taken,
        "us_per_env_step_venv": 1e6 * step_s[0] / taken,
        "rollouts": len(rollouts),
        "startup_s": startup,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    p.add_argument("--envs", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--modes", nargs="+", default=["sync", "async"], choices=["sync", "async"])
    p.add_argument("--steps", type=int, default=8000, help="timed env steps (all envs together) per setting")
    p.add_argument("--tmaze-length", type=int, default=256)
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "collection" / "collection.json")
    args = p.parse_args()
    torch.set_num_threads(1)

    rows = []
    load0 = os.getloadavg()
    for task in args.tasks:
        name, kw = TASKS[task]
        kwargs = json.loads(kw)
        if task == "tmaze":
            kwargs["length"] = args.tmaze_length
        for mode in args.modes:
            for n in args.envs:
                r = {"task": task, **measure(name, kwargs, n, mode == "async", max(args.steps, n))}
                rows.append(r)
                print(f"{task:>28} {mode:>5} {n:>3} envs: {r['env_steps_per_s']:>8.0f} env steps/s "
                      f"(venv.step {r['us_per_env_step_venv']:6.1f} us + "
                      f"collector {r['us_per_env_step_collector']:6.1f} us "
                      f"per env step; startup {r['startup_s']:.2f} s)", flush=True)  # fmt: skip

    print()
    print(f"{'task':>28} {'mode':>5} {'envs':>4} {'steps/s':>9} {'venv us/step':>13} {'collector us/step':>18}")
    for r in rows:
        print(f"{r['task']:>28} {r['mode']:>5} {r['num_envs']:>4} {r['env_steps_per_s']:>9.0f} "
              f"{r['us_per_env_step_venv']:>13.1f} {r['us_per_env_step_collector']:>18.1f}")  # fmt: skip
    report = {
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "load_avg_start": [round(x, 2) for x in load0],
        "load_avg_end": [round(x, 2) for x in os.getloadavg()],
        "nproc": os.cpu_count(),
        "python": platform.python_version(),
        "results": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
