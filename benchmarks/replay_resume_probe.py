"""Does a run's replay keep it where it is? Resume one of its checkpoints with part of the replay it held then.

A run that stays at chance (T-Maze 500 seed 1 with --reward-action-input, 60,000 to 400,000 env steps) may be held
by its weights or by what its replay holds; resuming a checkpoint with and without that replay tells which
(docs/results.md, "Traced with its checkpoints"). This copies RUN_DIR's checkpoint N into a new run dir with the
replay that checkpoint had (the first `total_rollouts` rollouts the run wrote, oldest first), minus what `--keep`
drops, resumes it with `icrl train --resume` for `--env-steps` more, and prints its evaluations as one JSON line.

    python benchmarks/replay_resume_probe.py RUN_DIR --checkpoint 400 --keep all  --env-steps 30000 --out OUT
    python benchmarks/replay_resume_probe.py RUN_DIR --checkpoint 400 --keep none --env-steps 30000 --out OUT
    python benchmarks/replay_resume_probe.py RUN_DIR --checkpoint 400 --keep newest:100 ...   # the 100 newest only
    python benchmarks/replay_resume_probe.py RUN_DIR --checkpoint 400 --keep oldest:200 ...   # the 200 oldest only

RUN_DIR must have been trained with its replay kept (`icrl train` keeps it; the learning suite deletes it unless
`--keep-replay`) and with checkpoint N kept (`--keep-checkpoints`, `--checkpoint-every`). The resumed run is the
run's own config (only the env-step budget changes), so everything else (weights, optimiser, PopArt, exploration
level and its per-env scales, RNG states) is the checkpoint's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from icrl.data.storage import list_rollout_files
from icrl.run.checkpoint import checkpoint_epoch, list_checkpoints, read_checkpoint


def replay_subset(names: list[str], keep: str) -> list[str]:
    """The rollout file names (oldest first) `keep` leaves: all, none, newest:K or oldest:K."""
    if keep in ("all", "none"):
        return names if keep == "all" else []
    which, _, k = keep.partition(":")
    if which not in ("newest", "oldest") or not k.isdigit():
        raise SystemExit(f"--keep {keep!r}: expected all, none, newest:K or oldest:K")
    return names[len(names) - int(k):] if which == "newest" else names[:int(k)]


def prepare(run: Path, epoch: int, keep: str, out: Path) -> dict:
    """OUT as RUN_DIR stood at checkpoint `epoch`, with the replay subset; returns the checkpoint's state."""
    ckpt = next((p for p in list_checkpoints(run) if checkpoint_epoch(p) == epoch), None)
    if ckpt is None:
        raise SystemExit(f"{run} has no checkpoint of epoch {epoch}: "
                         "keep it with --keep-checkpoints / --checkpoint-every")
    if out.exists():
        raise SystemExit(f"{out} exists: choose a new --out")
    _, _, state = read_checkpoint(ckpt)
    written = state["collector"]["total_rollouts"]  # the run's first `written` rollouts: the replay it held then
    fifo = list_rollout_files(run / "replay" / "fifo")  # oldest first
    if len(fifo) < written:
        raise SystemExit(f"{run / 'replay'} holds {len(fifo)} rollouts, fewer than the {written} the checkpoint had "
                         "written: was the replay kept (and never evicted)?")
    held = [f.path.name for f in fifo[:written]]
    (out / "checkpoints").mkdir(parents=True)
    (out / "replay" / "fifo").mkdir(parents=True)
    for name in ("config.json", "spaces.json", "plan.json"):
        if (run / name).is_file():
            shutil.copy2(run / name, out / name)
    shutil.copytree(ckpt, out / "checkpoints" / ckpt.name)  # `--resume` takes the newest checkpoint it lists
    for name in replay_subset(held, keep):
        shutil.copy2(run / "replay" / "fifo" / name, out / "replay" / "fifo" / name)
    return state


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", type=Path)
    p.add_argument("--checkpoint", type=int, required=True, help="the epoch of the checkpoint to resume")
    p.add_argument("--keep", default="all", help="all, none, newest:K or oldest:K of the replay it held")
    p.add_argument("--env-steps", type=int, default=30_000, help="env steps to train after the checkpoint")
    p.add_argument("--out", type=Path, required=True, help="the new run dir")
    args = p.parse_args()
    state = prepare(args.run_dir, args.checkpoint, args.keep, args.out)
    start = int(state["env_steps"])
    cmd = [sys.executable, "-m", "icrl", "train", "--resume", "--run-dir", str(args.out), "--threads", "1",
           "--device", "cpu", "--total-env-steps", str(start + args.env_steps)]
    with open(args.out / "stdout.log", "w") as log:
        subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=True)
    rows = [json.loads(line) for line in (args.out / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["env_steps"], round(r["return_mean"], 3)) for r in rows
             if r["kind"] == "eval" and r["env_steps"] > start]
    kept = len(list_rollout_files(args.out / "replay" / "fifo"))
    print(json.dumps({"run_dir": str(args.run_dir), "checkpoint": args.checkpoint, "env_steps": start,
                      "keep": args.keep, "evals": evals, "rollouts_at_end": kept}))


if __name__ == "__main__":
    main()
