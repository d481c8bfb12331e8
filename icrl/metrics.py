"""Metrics: one JSON object per line in RUN_DIR/metrics.jsonl, plus a short progress line on screen."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from rich.console import Console


def _clean(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsLog:
    """Append-only JSONL: a killed run keeps every row it flushed; readers skip a torn last line."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the run

    def write(self, row: dict[str, Any]) -> None:
        self._file.write(json.dumps({k: _clean(v) for k, v in row.items()}) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    rows = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a torn last line from a killed process
    return rows


console = Console(highlight=False, soft_wrap=True)


def say(text: str) -> None:
    """Print a progress line now, also when stdout is a file or a CI log (block-buffered otherwise)."""
    console.print(text)
    console.file.flush()


def progress_line(row: dict[str, Any], last_eval: dict[str, Any] | None) -> str:
    parts = [
        f"[bold]epoch {row['epoch']:>4}[/bold]",
        f"env steps {row['env_steps']:>8,}",
        f"updates {row['updates']:>6,}",
        f"{row.get('time/env_steps_per_s', 0):7.0f} env steps/s",
        f"{row.get('time/updates_per_s', 0):5.1f} updates/s",
    ]
    if row.get("train/return_mean") is not None:
        parts.append(f"train return {row['train/return_mean']:+.3f}")
    if last_eval is not None:
        text = f"eval return {last_eval['return_mean']:+.3f}"
        if last_eval.get("success_rate") is not None:
            text += f" success {last_eval['success_rate']:.2f}"
        parts.append(f"[cyan]{text}[/cyan]")
    return " | ".join(parts)
