"""The file protocol of an asynchronous run (docs/design.md §8): collector processes and a learner process
share one run directory.

    icrl learn RUN_DIR [--preset ...] [flags]      # writes RUN_DIR/config.json, trains, publishes weights
    icrl collect RUN_DIR --collector-id 0          # any number of these, started and stopped at will
    icrl collect RUN_DIR --collector-id 1

What they share, all through files that are replaced atomically (temp file + os.replace), so no process
ever reads half of one and any of them may be killed at any moment:

* `config.json`: written by the learner; collectors wait for it and build the same envs and agent;
* `replay/`: the DiskReplay; collectors write one file per finished rollout, the learner samples;
* `async/weights.safetensors`: the learner publishes its weights (metadata: the update count) after every
  `publish_every` updates; collectors reload when the file's mtime changes (one stat per round);
* `async/collectors/<id>.json`: each collector's counters (env steps taken, env steps and rollouts stored,
  return sums for the learner's train log), rewritten every round; the learner sums them;
* `async/done`: the learner's finish marker; collectors exit when they see it.

Update-to-data ratio. The learner makes at most `utd` updates per env step *stored* (summed over the
collectors' counters), waiting when it gets ahead: updates <= utd x stored env steps. The default `utd` is
the synchronous run's updates_per_epoch / steps_per_epoch, and the learner stops after
floor(utd x total_env_steps) updates, as many as `icrl train` makes. Collectors stop when the collectors
together have taken total_env_steps; the learner then finishes its remaining updates (only the rollouts
in progress at that moment were never stored). Collectors run free unless given `--max-lead STEPS`: then
they pause while the stored env steps exceed the learner's published updates / utd by more than STEPS, so
data and updates advance together as in `icrl train`, but overlapped. Weights reach a rollout in progress at
the collector's next round: its memory (KV cache) keeps what the older weights computed.

A collector restarted with the same id continues its counters and draws new env seeds. The learner
resumes from its checkpoints with `--resume`, like `icrl train`. SIGTERM / SIGINT stop either process at
its next step: a collector stores its counters (its finished rollouts are already on disk), the learner
writes a checkpoint; both exit with code 0.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from icrl.agent.model import Agent
from icrl.config import ConfigError, ExperimentConfig
from icrl.fileio import check_inside, open_regular, write_text_atomic
from icrl.run.artifacts import save_weights
from icrl.run.checkpoint import unmatched_names
from icrl.run.evaluate import SUM_KEYS, add_task_sums
from icrl.run.reporting import say


class AsyncPaths:
    """Where the processes of one asynchronous run meet."""

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.run_dir = Path(run_dir)
        self.config = self.run_dir / "config.json"
        self.replay = self.run_dir / "replay"
        self.root = self.run_dir / "async"
        self.weights = self.root / "weights.safetensors"
        self.collectors = self.root / "collectors"
        self.done = self.root / "done"

    def make_collectors_dir(self) -> None:
        """Create async/collectors; a symlink on the way that leads out of the run dir is refused, since the
        learner publishes weights and every collector its counters there."""
        for folder in (self.root, self.collectors):
            check_inside(self.run_dir, folder)
        self.collectors.mkdir(parents=True, exist_ok=True)

    def counter(self, collector_id: int) -> Path:
        return self.collectors / f"{collector_id}.json"


class StopFlag:
    """Turns SIGTERM and SIGINT into a flag the loops check at every step (main thread only)."""

    def __init__(self) -> None:
        self.signal: str | None = None
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        self.signal = signal.Signals(signum).name

    def __bool__(self) -> bool:
        return self.signal is not None


def wait_for(path: Path, wait_s: float, what: str, stop: StopFlag | None = None) -> bool:
    """Poll until `path` exists; False when stopped. Raises ConfigError after `wait_s` seconds. Says once
    what it waits for, so a collector started before its learner is not silent for minutes."""
    deadline, said = time.monotonic() + wait_s, False
    while not path.exists():
        if not said and time.monotonic() > deadline - wait_s + 2.0:
            say(f"icrl: waiting up to {wait_s:.0f} s for {path}: start `{what}` for this run dir")
            said = True
        if stop:
            return False
        if time.monotonic() > deadline:
            raise ConfigError(f"{path} did not appear within {wait_s:.0f} s: start `{what}` for this run dir")
        time.sleep(0.2)
    return True


# ------------------------------------------------------------------------------------------- counters
COUNTS = ("env_steps", "stored_env_steps", "stored_rollouts", "rollouts")


def counter_limit(cfg: ExperimentConfig) -> int:
    """The most env steps one collector can have taken: the run's, plus the round it started before they ran out."""
    return cfg.schedule.env_steps + cfg.schedule.steps_per_epoch


def counter_problem(counters: object, limit: int) -> str | None:
    """Why a collector's counters file cannot be a collector's own (None when it can): every count a whole number
    in [0, limit] (`limit`: the run's env steps plus one round of a collector, more than any collector takes),
    no more env steps stored than taken, the sums finite numbers. A forged or damaged file would otherwise end
    the run at once (1e15 env steps) or stop the learner and every collector with a traceback."""
    if not isinstance(counters, dict):
        return "not a JSON object"
    for key in COUNTS:
        v = counters.get(key, 0)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= limit:
            return f"{key} {str(v)[:40]} is not a count in [0, {limit:,}]"
    if counters.get("stored_env_steps", 0) > counters.get("env_steps", 0):
        return "it stored more env steps than it took"
    tasks = counters.get("tasks", {})
    sums = [counters.get(k, 0) for k in SUM_KEYS]
    if not isinstance(tasks, dict) or not all(isinstance(t, dict) for t in tasks.values()):
        return "its per-task sums are not a JSON object of objects"
    sums += [t.get(k, 0) for t in tasks.values() for k in SUM_KEYS]
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and abs(x) < float("inf") for x in sums):
        return "its sums are not finite numbers"
    return None


_REPORTED: set[tuple[str, str]] = set()


def _read_counter_file(path: Path, limit: int | None) -> dict | None:
    """One counters file, or None when it is being replaced (read next time) or is not a collector's (said once)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return None
    except (ValueError, RecursionError):
        data = None if path.stat().st_size == 0 else "not valid JSON"  # an empty file: a write in progress
        if data is None:
            return None
    problem = counter_problem(data, limit if limit is not None else 10**15)
    if problem is None:
        return data  # a dict: counter_problem checked it
    if (str(path), problem) not in _REPORTED:
        _REPORTED.add((str(path), problem))
        say(f"icrl: ignoring {path}: {problem}; a collector's counters file is written by `icrl collect` only")
    return None


def read_counters(paths: AsyncPaths, limit: int | None = None) -> list[dict]:
    """Every collector's latest counters (files being replaced are simply read next time; files that cannot be a
    collector's, `counter_problem` with `limit`, are ignored and said once)."""
    out: list[dict] = []
    try:
        names = os.listdir(paths.collectors)
    except FileNotFoundError:
        return out
    for name in names:
        if name.endswith(".json") and not name.startswith("."):
            if (counters := _read_counter_file(paths.collectors / name, limit)) is not None:
                out.append(counters)
    return out


def read_own_counters(paths: AsyncPaths, collector_id: int, limit: int | None = None) -> dict:
    """The counters a collector with this id left (a restart continues them); {} for a new one. ConfigError
    (one line) when the file is there but is not a collector's: continuing it would carry its numbers on."""
    path = paths.counter(collector_id)
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise ConfigError(f"{path} is not readable JSON ({type(e).__name__}); move it away to start collector "
                          f"{collector_id} afresh") from e
    problem = counter_problem(data, limit if limit is not None else 10**15)
    if problem:
        raise ConfigError(f"{path} is not collector {collector_id}'s counters ({problem}); move it away to start "
                          "it afresh")
    return data


def write_counters(paths: AsyncPaths, collector_id: int, counters: dict) -> None:
    write_text_atomic(paths.counter(collector_id), json.dumps(counters))


class RunCounters:
    """The collectors' summed counters, as the learner sees them; in the shape `save_checkpoint` stores as
    the collector's state."""

    def __init__(self, paths: AsyncPaths, limit: int | None = None) -> None:
        self.paths, self.limit = paths, limit  # limit: `counter_problem`'s
        self.env_steps = self.stored_env_steps = self.rollouts = 0
        self.sums = dict.fromkeys(SUM_KEYS, 0.0)  # the collectors' rollout_sums, added up
        self.tasks: dict[str, dict[str, float]] = {}  # per-task sums of multi-task envs (icrl.run.evaluate.task_sums)
        self.collectors = 0
        self.collector_env_steps: list[int] = []  # each collector's own env steps (all its env copies)

    def read(self) -> RunCounters:
        counters = read_counters(self.paths, self.limit)
        self.collectors = sum(c.get("state") == "collecting" for c in counters)
        self.collector_env_steps = [int(c.get("env_steps", 0)) for c in counters]
        self.env_steps = sum(int(c.get("env_steps", 0)) for c in counters)
        self.stored_env_steps = sum(int(c.get("stored_env_steps", 0)) for c in counters)
        self.rollouts = sum(int(c.get("stored_rollouts", 0)) for c in counters)
        self.sums = {k: float(sum(c.get(k, 0) for c in counters)) for k in self.sums}
        self.tasks = add_task_sums(*(c.get("tasks", {}) for c in counters))
        return self

    @property
    def total_env_steps(self) -> int:
        return self.env_steps

    def state_dict(self) -> dict[str, int]:
        return {"total_env_steps": self.env_steps, "total_rollouts": self.rollouts, "eval_env_steps": 0,
                "next_rollout_id": 0}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Nothing to restore on resume: the collectors' counter files hold the counts, read afresh."""


# -------------------------------------------------------------------------------------------- weights
def publish_weights(agent: Agent, paths: AsyncPaths, updates: int, utd: float) -> int:
    """Publish the learner's weights with the update count and ratio the collectors' `max_lead` reads;
    returns `updates`."""
    save_weights(agent, paths.weights, {"updates": str(updates), "utd": str(utd)})
    return updates


class WeightsFileError(ValueError):
    """A published weights file that is unreadable (corrupt, truncated), not this run's agent's or not finite."""


def _read_published(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    try:
        os.close(open_regular(path))  # a FIFO (or symlink, folder) there would block safetensors' open for ever
    except FileNotFoundError:
        raise
    except OSError as e:
        raise WeightsFileError(f"the published weights {path} are not a regular file ({e.strerror or e}); remove it "
                               "and restart `icrl learn` to publish them") from e
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open has no __iter__
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise WeightsFileError(f"cannot read the published weights {path} (corrupt, truncated or not a "
                               f"safetensors file: {str(e).strip()[:200]}); "
                               "restart `icrl learn` to publish them") from e
    return tensors, meta


def _fit_error(agent: Agent, tensors: dict[str, torch.Tensor]) -> str | None:
    """What keeps `tensors` from being exactly the agent's weights (a name missing, unexpected, of another
    shape, or holding NaN / inf), or None. Names safetensors dropped as aliases of a stored tensor are fine."""
    own = agent.state_dict()
    missing, unexpected = unmatched_names(agent, tensors)
    if unexpected or missing:
        return f"missing {missing[:3]}, unexpected {unexpected[:3]}"
    shapes = [k for k, t in tensors.items() if tuple(t.shape) != tuple(own[k].shape)]
    if shapes:
        return f"{shapes[0]} has shape {tuple(tensors[shapes[0]].shape)}, the agent's {tuple(own[shapes[0]].shape)}"
    bad = [k for k, t in tensors.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    return f"{len(bad)} tensor(s) hold NaN or inf (first: {bad[0]})" if bad else None


def load_weights(agent: Agent, path: Path) -> dict[str, str]:
    """Load a published weights file into `agent`; returns its metadata (`updates`, `utd`). Checked before
    anything is applied (WeightsFileError otherwise): a foreign or broken file never reaches the agent."""
    tensors, meta = _read_published(path)
    error = _fit_error(agent, tensors)
    if error is not None:
        raise WeightsFileError(f"the published weights {path} do not fit the run's agent ({error}): was config.json "
                               "changed, or the file replaced? restart `icrl learn` to publish them")
    agent.load_state_dict(tensors, strict=False)
    agent.refresh_acting_weights()
    return meta


class WeightsWatcher:
    """A collector's view of the published weights: reloads them into its agent when the file changed
    (one stat per call)."""

    def __init__(self, agent: Agent, paths: AsyncPaths) -> None:
        self.agent, self.path, self.reloads = agent, paths.weights, 0
        self.stamp = os.stat(self.path).st_mtime_ns
        self.meta = load_weights(agent, self.path)

    def poll(self) -> dict[str, str]:
        """The metadata of the weights the agent now holds."""
        stamp = os.stat(self.path).st_mtime_ns
        if stamp != self.stamp:  # the learner published new weights
            self.stamp = stamp
            try:
                self.meta, self.reloads = load_weights(self.agent, self.path), self.reloads + 1
            except WeightsFileError as e:  # keep acting with the weights held; the next publish replaces the file
                say(f"icrl collect: warning: {e}; acting on with the weights loaded before")
        return self.meta
