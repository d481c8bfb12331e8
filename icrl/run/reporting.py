"""What a run reports: one JSON object per line in RUN_DIR/metrics.jsonl, its other logging back-ends, the
progress lines on screen, the seconds per phase of an epoch, and the tables `icrl eval` prints. `icrl train` and
the asynchronous learner share it: the head every metrics row starts with, when an evaluation or progress line
is due.

Optional back-ends behind one `Logger` protocol (`write(row)`, `close()`): `JsonlLogger` (always),
`TensorBoardLogger` (needs `pip install tensorboard`) and `WandbLogger` (needs `pip install wandb`);
`make_loggers(run_dir, backends, config_dict)` builds them as one `Logger`. Rows are the dicts the training loops
write (`kind`, `env_steps`, `train/...`, `time/...`, eval stats); scalar back-ends log them against
`env_steps`, with eval rows' unprefixed stats under `eval/` (`eval/return_mean`). `Timer` fills the `time/*`
columns.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from rich.console import Console

from icrl.config import ExperimentConfig
from icrl.config.errors import flag
from icrl.fileio import check_inside, open_regular


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
        try:  # appending through a symlink (or into a FIFO) would write outside the run directory, or block
            fd = open_regular(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        except OSError as e:
            raise OSError(f"{self.path} is not a regular file ({e.strerror or e}): icrl appends metrics only to "
                          f"its own file; remove it, or choose another {flag('run_dir')}") from e
        self._file = open(fd, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the run

    def write(self, row: dict[str, Any]) -> None:
        self._file.write(json.dumps({k: _clean(v) for k, v in row.items()}) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()


@runtime_checkable
class Logger(Protocol):
    def write(self, row: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class BackendUnavailable(ValueError):
    """A logging back-end whose package is not installed; the message names the pip command."""


JsonlLogger = MetricsLog
"""The JSONL back-end (RUN_DIR/metrics.jsonl): the run's record, always on."""


ROW_PREFIXES = ("train", "eval", "time", "async")
"""The prefixes a metrics row's keys may carry; an eval row's own stats have none (`return_mean`, `return/<task>`)."""


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """Flat scalar metrics of a row for TensorBoard / W&B, named with their `train/`, `eval/`, `time/` prefix.

    Keys that already carry one of `ROW_PREFIXES` keep it; the other numbers get the row's kind as prefix
    (`return_mean` of an eval row -> `eval/return_mean`, its per-task `return/<task>` -> `eval/return/<task>`);
    lists become one scalar per index (`eval/return_by_episode/1`, counted from 1); None, strings, `kind` and
    `env_steps` are skipped.
    """
    kind = str(row.get("kind", "train"))
    out: dict[str, float] = {}
    for key, value in row.items():
        if key in ("kind", "env_steps"):
            continue
        name = key if key.split("/", 1)[0] in ROW_PREFIXES else f"{kind}/{key}"
        if isinstance(value, (list, tuple)):
            for i, v in enumerate(value, start=1):
                v = _clean(v)
                if isinstance(v, (int, float)) and not isinstance(v, bool) and v is not None:
                    out[f"{name}/{i}"] = float(v)
            continue
        value = _clean(value)
        if isinstance(value, bool):
            value = float(value)
        if isinstance(value, (int, float)):
            out[name] = float(value)
    return out


class TensorBoardLogger:
    """Scalars to a TensorBoard event file in `log_dir` (torch.utils.tensorboard), stepped by env steps."""

    def __init__(self, log_dir: str | Path, config_dict: dict[str, Any] | None = None) -> None:
        import importlib.util

        if importlib.util.find_spec("tensorboard") is None:
            raise BackendUnavailable("the tensorboard logger needs the tensorboard package: pip install tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir))
        if config_dict is not None:
            self.writer.add_text("config", "```\n" + json.dumps(config_dict, indent=2) + "\n```", 0)

    def write(self, row: dict[str, Any]) -> None:
        step = int(row.get("env_steps") or 0)
        for name, value in scalars(row).items():
            self.writer.add_scalar(name, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    """Scalars to Weights & Biases (one run per icrl run), with `env_steps` as the x axis."""

    def __init__(self, run_dir: str | Path, config_dict: dict[str, Any] | None = None, **init_kwargs: Any) -> None:
        import importlib.util

        if importlib.util.find_spec("wandb") is None:
            raise BackendUnavailable("the wandb logger needs the wandb package: pip install wandb")
        import wandb

        init_kwargs.setdefault("project", "icrl")
        init_kwargs.setdefault("name", Path(run_dir).name)
        self.run = wandb.init(dir=str(run_dir), config=config_dict, **init_kwargs)
        self.run.define_metric("env_steps")
        self.run.define_metric("*", step_metric="env_steps")

    def write(self, row: dict[str, Any]) -> None:
        self.run.log({"env_steps": int(row.get("env_steps") or 0), **scalars(row)})

    def close(self) -> None:
        self.run.finish()


class MultiLogger:
    """Several loggers as one: `write` and `close` go to each, in order."""

    def __init__(self, loggers: list[Logger]) -> None:
        self.loggers = list(loggers)

    def write(self, row: dict[str, Any]) -> None:
        for logger in self.loggers:
            logger.write(row)

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()


BACKENDS = ("jsonl", "tensorboard", "wandb")


def make_loggers(
    run_dir: str | Path, backends: tuple[str, ...] = ("jsonl",), config_dict: dict[str, Any] | None = None
) -> MultiLogger:
    """One Logger writing to every named back-end: `jsonl` (RUN_DIR/metrics.jsonl), `tensorboard`
    (RUN_DIR/tensorboard/) and `wandb`. The JSONL log is always included (plots and `icrl eval` read it).

    Raises BackendUnavailable (a ValueError) naming `pip install ...` for a back-end that is not
    installed, and ValueError for an unknown name; checks every name before creating any file.
    """
    import importlib.util

    run_dir = Path(run_dir)
    names = ["jsonl", *[b for b in backends if b != "jsonl"]]
    for name in names:
        if name not in BACKENDS:
            raise ValueError(f"unknown logging back-end {name!r}; choose from {', '.join(BACKENDS)}")
        if name != "jsonl" and importlib.util.find_spec(name) is None:
            raise BackendUnavailable(f"the {name} logger needs the {name} package: pip install {name}")
    loggers: list[Logger] = []
    try:
        for name in dict.fromkeys(names):
            if name == "jsonl":
                loggers.append(JsonlLogger(run_dir / "metrics.jsonl"))
            elif name == "tensorboard":
                loggers.append(TensorBoardLogger(check_inside(run_dir, run_dir / "tensorboard"), config_dict))
            else:
                check_inside(run_dir, run_dir / "wandb")  # where wandb writes: a symlink there may not lead out
                loggers.append(WandbLogger(run_dir, config_dict))
    except BaseException:
        for logger in loggers:
            logger.close()
        raise
    return MultiLogger(loggers)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a metrics.jsonl: each line's JSON object. A line that is not one (a torn last line from a killed
    process, a hand-edited row, one nested too deeply to parse) is skipped: a plot or a resume never fails on it."""
    rows = []
    for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


# ------------------------------------------------------------------------------------ an epoch's report
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


# ------------------------------------------------------------------------------------ seconds per phase
class Timer:
    """Seconds spent in named phases, summed over every `with timer("name"):` block; a phase never entered
    reads 0.0. One object per epoch keeps the loop free of hand-paired `perf_counter` calls. `clock` is
    replaceable so a test can check the sums exactly rather than against the machine's timing."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._seconds: dict[str, float] = defaultdict(float)
        self._clock = clock

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        t0 = self._clock()
        try:
            yield
        finally:
            self._seconds[phase] += self._clock() - t0

    def __getitem__(self, phase: str) -> float:
        return self._seconds.get(phase, 0.0)


# -------------------------------------------------------------------------------------------- on screen
console = Console(highlight=False, soft_wrap=True)


def say(text: str) -> None:
    """Print a progress line now, also when stdout is a file or a CI log (block-buffered otherwise)."""
    console.print(text)
    console.file.flush()


def say_literally(text: str) -> None:
    """`say` without rich markup: for lines that quote file names, which may hold brackets."""
    console.print(text, markup=False, highlight=False)
    console.file.flush()


def progress_line(row: dict[str, Any], new_eval: dict[str, Any] | None, live: bool = False) -> str:
    """The epoch's line: counters, speeds, the train return and, in the epoch it ran, the evaluation.
    `live`: the short form the progress bar shows, which fits an 80-column terminal beside the bar."""
    upd, train = row.get("time/updates_per_s", 0), row.get("train/return_mean")
    if live:
        parts = [f"{upd:5.1f} upd/s"] + ([f"train {train:+.2f}"] if train is not None else [])
        if new_eval is not None and new_eval.get("return_mean") is not None:
            parts.append(f"[cyan]eval {new_eval['return_mean']:+.2f}[/cyan]")
        return " ".join(parts)
    parts = [
        f"[bold]epoch {row['epoch']:>4}[/bold]",
        f"env steps {row['env_steps']:>8,}",
        f"updates {row['updates']:>6,}",
        f"{row.get('time/env_steps_per_s', 0):7.0f} env steps/s",
        f"{upd:5.1f} updates/s",
    ]
    if train is not None:
        parts.append(f"train return {train:+.3f}")
    if new_eval is not None:
        text = f"eval return {new_eval['return_mean']:+.3f}" if new_eval.get("return_mean") is not None else "eval"
        if new_eval.get("success_rate") is not None:
            text += f" success {new_eval['success_rate']:.2f}"
        parts.append(f"[cyan]{text}[/cyan]")
    return " | ".join(parts)


def progress_bar(total_env_steps: int):
    """A live bar of env steps (rich) under the printed epoch lines; invisible when stdout is not a
    terminal (CI logs keep just the lines). Call `.update(task, completed=..., description=...)`."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    bar = Progress(
        TextColumn("{task.description}"),  # progress_line(..., live=True): at most ~34 columns
        BarColumn(bar_width=12),
        MofNCompleteColumn(),
        TextColumn("steps"),
        TimeRemainingColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )
    task = bar.add_task("training", total=total_env_steps)
    return bar, task


# ----------------------------------------------------------------------------------- icrl eval's tables
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
