"""What a run reports at the end of an epoch, shared by `icrl train` and the asynchronous learner: the
metrics log, the head every metrics row starts with, when an evaluation or progress line is due."""

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
