"""Callbacks: your code at the points of a run where SB3 users put theirs (`icrl.train(cfg, env, callbacks=[...])`).

A callback is any object with some of these methods (the others are skipped), each called on rank 0 only:

    on_train_start(run)   once, before the first epoch: `run` is a `TrainingRun` (config, run dir, agent, ...)
    on_epoch_end(row)     after every epoch, with its "train" metrics row (the dict metrics.jsonl records)
    on_eval(row)          after every evaluation, with its "eval" metrics row (return_mean, success_rate, ...)
    on_train_end(result)  once, with the final evaluation `icrl.train` returns

`on_epoch_end` and `on_eval` return a true value to stop the run after this epoch (it is checkpointed, its
final weights and plot written, and `--resume` can continue it). SB3's `_on_step` returns False to stop; here
True means "stop", so a callback that returns nothing never stops anything.

Built in: `StopTrainingOnRewardThreshold` (what `--stop-at-return` adds), `EvalCallback` (evaluate on another
env, keep the best weights) and `CheckpointCallback` (weights every N epochs). Evaluation and checkpoints
themselves are built into the loop (`--eval-every`, `--checkpoint-every`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from icrl.agent.model import Agent
from icrl.config import ExperimentConfig
from icrl.fileio import check_inside
from icrl.run.reporting import say


@dataclass
class TrainingRun:
    """What a callback may read (and use) of the run it is called in."""

    cfg: ExperimentConfig
    run_dir: Path
    agent: Agent  # the learning agent: act with it (icrl.run.evaluate), save it (icrl.run.artifacts)
    spaces: tuple  # the env's (observation space, action space)
    device: torch.device
    env_steps: Callable[[], int]
    env: Any = None  # the env the run trains on, as given to icrl.train (its name when built by name)

    def evaluate(self, env: Any = None, n_episodes: int = 8, deterministic: bool = True, **kwargs: Any) -> dict:
        """`icrl.evaluate` of the agent as it is now (env: any form `icrl.train` takes; None: the run's own,
        with its kwargs, also when it is a class or factory of a script)."""
        from icrl.run.evaluate import evaluate_agent

        if env is None:
            env = self.env if self.env is not None else self.cfg.env.env
            kwargs.setdefault("env_kwargs", self.cfg.env.kwargs)
        return evaluate_agent(self.agent, self.cfg, self.spaces, self.device, env, n_episodes, deterministic, **kwargs)


class Callback:
    """A base class to subclass (optional: any object with some of the methods works)."""

    run: TrainingRun | None = None

    def on_train_start(self, run: TrainingRun) -> None:
        self.run = run

    def on_epoch_end(self, row: dict[str, Any]) -> bool | None:
        return None

    def on_eval(self, row: dict[str, Any]) -> bool | None:
        return None

    def on_train_end(self, result: dict[str, Any]) -> None:
        return None


class StopTrainingOnRewardThreshold(Callback):
    """Stop once `patience` evaluations in a row reach `threshold` (return_mean >= threshold), as SB3's
    callback of that name (which stops after one); `--stop-at-return R --stop-patience N` adds one."""

    def __init__(self, threshold: float, patience: int = 1) -> None:
        if patience < 1:
            raise ValueError(f"patience must be >= 1, got {patience}")
        if not isinstance(threshold, (int, float)) or not math.isfinite(threshold):  # NaN would never stop the run
            raise ValueError(f"threshold must be a finite number (an eval return), got {threshold!r}")
        self.threshold, self.patience, self.streak = float(threshold), int(patience), 0

    def on_eval(self, row: dict[str, Any]) -> bool:
        ret = row.get("return_mean")
        self.streak = self.streak + 1 if ret is not None and ret >= self.threshold else 0
        if self.streak >= self.patience:
            say(f"icrl: stopping: eval return {ret:+.3f} >= {self.threshold:g} in {self.streak} evaluation(s) in a row")
            return True
        return False


class EvalCallback(Callback):
    """Evaluate on `eval_env` (any form `icrl.train` takes; None: the run's env) after every `every`-th
    evaluation, and keep the best weights in `best_path` (default RUN_DIR/best_agent.safetensors; loads
    with `icrl.load`). `results` holds (env steps, return_mean, success_rate) of each evaluation."""

    def __init__(self, eval_env: Any = None, n_episodes: int = 8, every: int = 1, deterministic: bool = True,
                 best_path: str | Path | None = None, verbose: bool = True) -> None:
        _positive("EvalCallback", every=every, n_episodes=n_episodes)
        self.eval_env, self.n_episodes, self.every, self.deterministic = eval_env, n_episodes, every, deterministic
        self.best_path, self.verbose = best_path, verbose
        self.best, self.calls = float("-inf"), 0
        self.results: list[tuple[int, float | None, float | None]] = []

    def on_eval(self, row: dict[str, Any]) -> None:
        self.calls += 1
        if self.run is None or self.calls % self.every:
            return
        stats = self.run.evaluate(self.eval_env, self.n_episodes, self.deterministic)
        steps = self.run.env_steps()
        self.results.append((steps, stats["return_mean"], stats["success_rate"]))
        if stats["return_mean"] is not None and stats["return_mean"] > self.best:
            from icrl.run.artifacts import save_weights

            self.best = stats["return_mean"]
            save_weights(self.run.agent, Path(self.best_path or self.run.run_dir / "best_agent.safetensors"))
        if self.verbose:
            say(f"icrl: EvalCallback at {steps:,} env steps: return {stats['return_mean']:+.3f} "
                f"(best {self.best:+.3f})")


class CheckpointCallback(Callback):
    """Save the weights every `every` epochs to `folder` (default RUN_DIR/weights) as
    `agent-<env steps>.safetensors` (each loads with `icrl.load`, beside the run's config.json). The full
    checkpoints `--resume` uses are written by the loop itself (`--checkpoint-every`)."""

    def __init__(self, every: int = 10, folder: str | Path | None = None) -> None:
        _positive("CheckpointCallback", every=every)
        self.every, self.folder, self.epochs = int(every), folder, 0

    def on_epoch_end(self, row: dict[str, Any]) -> None:
        self.epochs += 1
        if self.run is not None and self.epochs % self.every == 0:
            from icrl.run.artifacts import save_weights

            folder = Path(self.folder or check_inside(self.run.run_dir, self.run.run_dir / "weights"))
            folder.mkdir(parents=True, exist_ok=True)
            save_weights(self.run.agent, folder / f"agent-{row['env_steps']:09d}.safetensors")


def _positive(owner: str, **counts: Any) -> None:
    """Each count a whole number >= 1 (`every=0` would divide by zero at the first epoch), else ValueError."""
    for name, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{owner}({name}=...) must be a whole number >= 1, got {value!r}")


class Callbacks:
    """The run's callbacks as one: each hook calls every callback that has it; `--stop-at-return` adds one."""

    def __init__(self, callbacks: Sequence[Any] | Any = ()) -> None:
        items = list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks] if callbacks else []
        for cb in items:
            if not any(callable(getattr(cb, h, None)) for h in HOOKS):
                raise TypeError(f"callback {cb!r} has none of the hooks {', '.join(HOOKS)} (see icrl.run.callbacks)")
        self.items = items

    def _call(self, hook: str, arg: Any) -> bool:
        stop = False
        for cb in self.items:
            fn = getattr(cb, hook, None)
            if callable(fn):
                asked = bool(fn(arg))  # every callback sees the row, even after one asked to stop
                if asked and not isinstance(cb, StopTrainingOnRewardThreshold):  # that one says its own reason
                    say(f"icrl: stopping: the callback {type(cb).__name__}.{hook} returned True")
                stop = asked or stop
        return stop

    def start(self, run: TrainingRun) -> None:
        """on_train_start, after adding the stop `--stop-at-return` asks for (from the run's resolved config)."""
        e = run.cfg.eval
        if e.stop_at_return is not None:
            self.items.append(StopTrainingOnRewardThreshold(e.stop_at_return, e.stop_patience))
        self._call("on_train_start", run)

    def epoch_end(self, row: dict[str, Any], new_eval: dict[str, Any] | None) -> bool:
        """True when a callback asks to stop after this epoch."""
        stop = self._call("on_epoch_end", row)
        return (self._call("on_eval", new_eval) if new_eval is not None else False) or stop

    def end(self, result: dict[str, Any]) -> None:
        self._call("on_train_end", result)


HOOKS = ("on_train_start", "on_epoch_end", "on_eval", "on_train_end")
