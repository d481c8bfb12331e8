"""What a run reports at the end of an epoch, shared by `icrl train` and the asynchronous learner: the
metrics log, the head every metrics row starts with, when an evaluation or progress line is due; and the
tables `icrl eval` prints."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from icrl.config import ExperimentConfig
from icrl.run.loggers import Logger, make_loggers, progress_line, say


def open_log(run_dir: Path, cfg: ExperimentConfig) -> Logger:
    """RUN_DIR/metrics.jsonl plus the `--log-backends`, each told the run's config."""
    return make_loggers(run_dir, ("jsonl", *cfg.run.log_backends), json.loads(cfg.to_json()))


def due(epoch: int, every: int, num_epochs: int) -> bool:
    """Every `every` epochs, and always at the last one (so a run ends evaluated, logged and checkpointed)."""
    return epoch % every == 0 or epoch == num_epochs


def row_head(kind: str, epoch: int, env_steps: int, updates: int, start: float) -> dict[str, Any]:
    """The columns every metrics row starts with; `start`: the run's perf_counter origin (resumes included)."""
    return {"kind": kind, "epoch": epoch, "env_steps": env_steps, "updates": updates,
            "wall_time": time.perf_counter() - start}


def report_epoch(log: Logger, row: dict[str, Any], cfg: ExperimentConfig, *, epoch: int, num_epochs: int,
                 last_eval: dict | None, evaluate: Callable[[], dict],
                 progress: Callable[[dict, dict | None], None] | None = None) -> dict | None:
    """Write the train `row`, then (when due) an evaluation row and the progress line; returns the latest
    evaluation (this epoch's, else `last_eval`). `progress` sees every row (a progress bar). Lines show an
    evaluation only in the epoch it ran, so an old one is never printed again as if it were new."""
    log.write(row)
    new_eval = None
    if due(epoch, cfg.eval.eval_every, num_epochs):
        new_eval = evaluate()
        log.write(new_eval)
    if progress is not None:
        progress(row, new_eval)
    if due(epoch, cfg.run.log_every, num_epochs):
        say(progress_line(row, new_eval))
    return new_eval or last_eval


def _num(v: float | None, fmt: str = "+.3f") -> str:
    return "n/a" if v is None else format(v, fmt)


def eval_table(result: dict[str, Any]) -> tuple[Any, ...]:
    """Rich Tables of an `icrl.run.evaluate.evaluate_run` result: the summary, the adaptation curve of
    multi-episode tasks, and one row per task for multi-task envs (`return/<task>`, ...)."""
    from rich.table import Table

    table = Table(title=f"eval of {result['run_dir']} ({result['env']} {json.dumps(result['env_kwargs'])})")
    table.add_column("metric")
    table.add_column("value", justify="right")
    ret = _num(result.get("return_mean"))
    if result.get("return_std") is not None:
        ret += f" ± {result['return_std']:.3f}"
    table.add_row("return (mean ± std over rollouts)", ret)
    table.add_row("success rate", _num(result.get("success_rate"), ".2f"))
    table.add_row("rollouts", str(result.get("rollouts")))
    table.add_row("episode length (mean)", _num(result.get("episode_length_mean"), ".1f"))
    table.caption = f"weights: {result['weights']}, seed {result['seed']}"
    tables = [table]
    by_ep = result.get("return_by_episode")
    if by_ep:
        succ = result.get("success_by_episode")
        curve = Table(title="adaptation curve (by episode index within a rollout)")
        curve.add_column("episode", justify="right")
        curve.add_column("return", justify="right")
        if succ:
            curve.add_column("success", justify="right")
        for i, r in enumerate(by_ep):
            curve.add_row(str(i + 1), f"{r:+.3f}", *([f"{succ[i]:.2f}"] if succ else []))
        tables.append(curve)
    tasks = [k.removeprefix("rollouts/") for k in result if k.startswith("rollouts/")]
    if tasks:
        success = any(f"success/{t}" in result for t in tasks)  # a column only where some task reports it
        per_task = Table(title="by task (info[\"task\"])")
        for name in ("task", "rollouts", "return", *(["success"] if success else [])):
            per_task.add_column(name, justify="left" if name == "task" else "right")
        for t in tasks:
            per_task.add_row(t, str(result[f"rollouts/{t}"]), _num(result.get(f"return/{t}")),
                             *([_num(result.get(f"success/{t}"), ".2f")] if success else []))
        tables.append(per_task)
    return tuple(tables)
