"""The run directory: refusing to overwrite or mis-resume a run, taking it (the run lock), resuming from its
newest checkpoint and writing the files that describe the run. `icrl train` and the asynchronous learner
share these, so both refuse at the same points with the same one-line errors.

Refusals come before anything is written: a bad env, `--relabel` or run dir leaves nothing behind.

The run lock (`RunLock`): one process per run directory, an exclusive `flock` on RUN_DIR/.lock, and checks that a
run dir is usable. Why: two `icrl train` (or a `--resume` beside a running run) on one folder both ran to exit 0,
interleaving metrics rows and overwriting each other's checkpoints. A `flock` lock is released by the kernel when
its holder dies, even on SIGKILL, so a crashed run never leaves a stale lock that blocks `--resume`; the file
itself only carries the holder's pid and command for the refusal message. Asynchronous collectors
(`icrl collect`) share a run directory by design and take no lock; `icrl train` and `icrl learn` do.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from icrl.agent.learner import Learner
from icrl.agent.model import Agent
from icrl.config import ConfigError, ExperimentConfig
from icrl.config.errors import flag, setting
from icrl.dicts import flatten
from icrl.fileio import open_regular, read_json_record, write_text_atomic
from icrl.parallel import Replicas
from icrl.run.checkpoint import list_checkpoints, load_latest_checkpoint, set_aside
from icrl.run.reporting import say
from icrl.spaces_json import write_spaces

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory locks, runs are not protected
    fcntl = None  # type: ignore[assignment]


# Fields that may change when a run is resumed: the flag itself, how far to train, and the run-only settings
# that say where and how this process runs but not what it learns (the folder's spelling or location, the
# device, threads, workers, logging, checkpoint retention). The rest is the run's learning config.
RESUMABLE_CHANGES = (
    "run.resume", "schedule.total_env_steps", "run.run_dir", "run.device", "run.threads", "replay.num_workers",
    "run.log_backends", "run.log_every", "run.keep_checkpoints", "run.checkpoint_seconds", "optim.compile",
    "env.async_envs",
    "eval.eval_max_steps", "optim.fused_adam", "optim.cuda_graphs", "asynchronous.utd", "asynchronous.publish_every",
    "asynchronous.max_lead", "eval.stop_at_return", "eval.stop_patience",
)


def holds_run(run_dir: Path) -> bool:
    """True when `run_dir` already holds a run: checkpoints or a non-empty metrics.jsonl."""
    metrics = run_dir / "metrics.jsonl"
    return bool(list_checkpoints(run_dir)) or (metrics.is_file() and metrics.stat().st_size > 0)


def default_run_dir(env: str, seed: int, stamp: float | None = None, root: Path = Path("runs")) -> Path:
    """A folder no earlier run uses: runs/<env>-<seed>-<date>-<time> (a suffix -2, -3... when that exists,
    e.g. a notebook cell run twice within a second). Readable, sorted by time, and never the same for two
    runs, so running one command after another, a second seed or a rerun of a script is never refused."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", env).strip("._") or "env"
    base = f"{slug[:60]}-{seed}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(stamp))}"
    path, n = root / base, 1
    while path.exists():
        n += 1
        path = root / f"{base}-{n}"
    return path


def with_run_dir(cfg: ExperimentConfig, stamp: float | None = None) -> ExperimentConfig:
    """`cfg` with its run dir chosen when unset (`default_run_dir`); every rank passes the same `stamp`.
    Resuming needs the run named: there is nothing to guess."""
    if cfg.run.run_dir is not None:
        return cfg
    if cfg.run.resume:
        raise ConfigError(f"{setting('resume')} continues a run: name it with {setting('run_dir', 'RUN_DIR')}")
    return cfg.replace(run_dir=str(default_run_dir(cfg.env.env, cfg.run.seed, stamp)))


def run_path(cfg: ExperimentConfig) -> Path:
    """The run's directory; `icrl.train` names one (`with_run_dir`) before anything reads it."""
    if cfg.run.run_dir is None:
        raise ValueError("the run dir is not resolved yet (icrl.run.rundir.with_run_dir names one)")
    return Path(cfg.run.run_dir)


def check_resume_target(cfg: ExperimentConfig) -> None:
    """`--resume` on a run dir that does not exist is a typo (or the wrong folder), not a new run: refused in
    one line, so a mistyped path never silently trains from scratch beside the run it meant."""
    run_dir = run_path(cfg)
    if cfg.run.resume and not run_dir.exists():
        raise ConfigError(f"{setting('resume')}: {setting('run_dir', str(run_dir))} does not exist (a typo?); pass the "
                          f"run's folder, or drop {setting('resume')} to start a new run there")


def check_run_dir(cfg: ExperimentConfig) -> None:
    """Refuse to overwrite an existing run without --resume, and to resume one with a different config."""
    run_dir = run_path(cfg)
    if not cfg.run.resume:
        if holds_run(run_dir):
            raise ConfigError(
                f"{setting('run_dir', str(run_dir))} already holds a run (checkpoints or metrics.jsonl): pass "
                f"{setting('resume')} to continue it, or choose another run dir (leave it unset for a new one)"
            )
        return
    path = run_dir / "config.json"
    if not path.is_file():
        return
    try:
        old = json.loads(ExperimentConfig.from_json(path.read_text(encoding="utf-8")).to_json())
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{setting('resume')}: cannot read the run's config {path} ({e}); "
                          f"choose another {flag('run_dir')}") from e
    new = json.loads(cfg.to_json())
    diffs = config_differences(old, new, "in the run")
    if diffs:
        raise ConfigError(
            f"{setting('resume')}: the config differs from {path} in {', '.join(diffs)}; resume with the run's values "
            f"(only {setting('total_env_steps', 'N')} may change), or start a new run in another run dir"
        )
    check_record_agrees(run_dir, new)


def config_differences(old: dict[str, Any], new: dict[str, Any], where: str) -> list[str]:
    """The learning fields (all but RESUMABLE_CHANGES) in which two configs' JSON forms differ, each as
    "field (old where, new now)"."""
    a, b = flatten(old), flatten(new)
    if "loss.popart_max_ratio" in a and a["loss.popart_max_ratio"] is None:
        # config.json records resolved values; before the long-context rule (icrl.config.resolve) null meant
        # no floor, which is 0 now, so runs saved then still resume
        a["loss.popart_max_ratio"] = 0.0
    return [f"{k} ({a.get(k)!r} {where}, {b.get(k)!r} now)" for k in sorted(set(a) | set(b))
            if k not in RESUMABLE_CHANGES and a.get(k) != b.get(k)]


def check_record_agrees(run_dir: Path, config: dict[str, Any]) -> None:
    """Refuse to resume a run whose config.json (`config`, its JSON form) disagrees with what the run recorded as
    it ran: the config its newest checkpoint was saved with, and the env its replay was collected in
    (spaces.json). An edited config.json would otherwise find no checkpoint that fits and start the run over,
    replacing its history; refused here, before anything is written, nothing in the run dir changes."""
    fix = (f"put the recorded values back in {run_dir / 'config.json'}, or start a fresh run in another run dir "
           "(nothing was changed)")
    recorded = checkpoint_config(run_dir)
    if recorded is not None:
        ckpt, saved = recorded
        diffs = config_differences(saved, config, f"in {ckpt.name}")
        if diffs:
            raise ConfigError(f"{setting('resume')}: {run_dir / 'config.json'} disagrees with the run's checkpoint "
                              f"in {', '.join(diffs)}: {fix}")
    env = _recorded_env(run_dir)
    if env is not None and (env.get("name"), env.get("kwargs")) != (config["env"]["env"], _kwargs(config)):
        raise ConfigError(
            f"{setting('resume')}: {run_dir / 'config.json'} names the env {config['env']['env']!r} with kwargs "
            f"{_kwargs(config)}, but the run's replay was collected in {env.get('name')!r} with kwargs "
            f"{env.get('kwargs')} ({run_dir / 'spaces.json'}): {fix}")


def checkpoint_config(run_dir: Path) -> tuple[Path, dict[str, Any]] | None:
    """(checkpoint, the config it was saved with, in its JSON form) of the newest checkpoint that records one."""
    for path in reversed(list_checkpoints(run_dir)):
        try:
            extra = read_json_record(path / "state.json").get("extra")
            return path, json.loads(ExperimentConfig.from_json(json.dumps(extra["config"])).to_json())
        except (OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError):
            continue  # unreadable, or from before checkpoints recorded their config: the loader checks it
    return None


def _recorded_env(run_dir: Path) -> dict[str, Any] | None:
    """spaces.json's env record ({"name", "kwargs", ...}), or None when there is none to read."""
    try:
        env = read_json_record(run_dir / "spaces.json").get("env")
    except (OSError, ValueError, AttributeError, RecursionError):
        return None
    return env if isinstance(env, dict) else None


def _kwargs(config: dict[str, Any]) -> Any:
    try:
        return json.loads(config["env"]["env_kwargs"] or "{}")
    except (ValueError, TypeError):
        return config["env"]["env_kwargs"]


def check_run_dir_free(cfg: ExperimentConfig) -> None:
    """Every refusal that needs no env: a run dir that is a file or unwritable, one another live process
    trains in, one that holds another run (`check_run_dir`). Called before anything is built or written."""
    check_run_dir_usable(run_path(cfg))
    check_not_locked(run_path(cfg))
    check_run_dir(cfg)


def take_run_dir(cfg: ExperimentConfig, main: bool = True) -> RunLock | None:
    """Lock the run dir (rank 0; the OS releases the lock if this process dies), check it again under the
    lock (a run may have started meanwhile) and create it. Called once the envs exist, so a bad env name
    leaves nothing behind; the lock is taken before the first write."""
    run_dir = run_path(cfg)
    lock = RunLock.acquire(run_dir) if main else None
    try:
        if main:
            check_run_dir(cfg)
        run_dir.mkdir(parents=True, exist_ok=True)
    except BaseException:  # refused under the lock: the run dir is free again at once
        if lock is not None:
            lock.release()
        raise
    return lock


@contextmanager
def run_scope(lock: RunLock | None, close: Callable[[], None]) -> Iterator[None]:
    """The body of a run once its run dir is taken (`icrl train`, the asynchronous learner): on an error or
    Ctrl-C anywhere in it (resuming, the first log writes, the epochs) the run lock is released at once, so the
    run dir is free for the next attempt; always, `close` runs (no orphaned env processes)."""
    try:
        yield
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    finally:
        close()


def recorded_config(cfg: ExperimentConfig) -> ExperimentConfig | None:
    """The config.json of the run `cfg` resumes (`icrl.config.resolve` keeps its schedule), or None: not resuming,
    or no readable record (`check_run_dir` says what is wrong with it)."""
    if not cfg.run.resume or cfg.run.run_dir is None:
        return None
    try:
        return ExperimentConfig.from_json((Path(cfg.run.run_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError):
        return None


def truncate_metrics(path: Path, epoch: int) -> int:
    """Drop rows of epochs after `epoch` (written after the checkpoint, before a crash) and torn lines,
    by writing a temp file and renaming it over the log. Returns the number of rows dropped."""
    if not path.is_file():
        return 0
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = []
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        row_epoch = row.get("epoch", 0) if isinstance(row, dict) else None
        if isinstance(row_epoch, int) and row_epoch <= epoch:  # anything else is a torn or foreign line
            kept.append(line)
    if len(kept) != len(lines):
        write_text_atomic(path, "".join(line + "\n" for line in kept))
    return len(lines) - len(kept)


def prune_after(run_dir: Path, epoch: int) -> None:
    """Set aside the checkpoints newer than `epoch` (skipped on resume as unreadable) and drop the metrics
    rows after it, so the resumed run writes those epochs anew."""
    for path in list_checkpoints(run_dir):
        if int(path.name.split("-")[-1]) > epoch:
            set_aside(path)
    truncate_metrics(run_dir / "metrics.jsonl", epoch)


def resume_point(state: dict[str, Any]) -> tuple[int, float]:
    """(epoch, wall-clock seconds) a loaded checkpoint's state continues from."""
    return int(state["epoch"]), float(state["extra"].get("wall_time", 0.0))


def resume_training(cfg: ExperimentConfig, replicas: Replicas, *, agent: Agent, learner: Learner, collector: Any,
                    exploration: Any, resumed: Callable[[int, dict[str, Any]], None]) -> tuple[int, float]:
    """Continue a run from the newest checkpoint consistent with it (checked before anything is applied); returns
    (epoch, wall-clock seconds) to continue from, (0, 0.0) without one. `collector` and `exploration` are the
    data source's (icrl.run.sources.DataSource): the env-step counter, told `resumed(epoch, state)` once loaded.

    The checkpoint holds rank 0's exploration and RNG states; the other ranks keep their own.
    """
    run_dir, main, world = run_path(cfg), replicas.is_main, replicas.world_size
    found = load_latest_checkpoint(run_dir, agent=agent, log=say if main else None, learner=learner,
                                   collector=collector, exploration=exploration if main else None,
                                   restore_rng=main)
    start_epoch, wall_offset = 0, 0.0
    if found is not None:
        ckpt, state = found
        start_epoch, wall_offset = resume_point(state)
        resumed(start_epoch, state)
        if main:
            say(f"icrl: resuming from {ckpt} (epoch {start_epoch}, {world * collector.total_env_steps:,} env steps, "
                f"{learner.updates:,} updates)")
    elif main and list_checkpoints(run_dir):
        raise ConfigError(
            f"{setting('resume')}: none of the checkpoints in {run_dir / 'checkpoints'} fits this run (see the "
            "warnings above), and nothing was changed: move that folder aside to start the run over with its "
            "replay, or start a fresh run in another run dir")
    elif main and holds_run(run_dir):
        say(f"icrl: no readable checkpoint in {run_dir}; starting the run over (the replay is reused)")
    replicas.barrier()  # every rank has read the checkpoint before rank 0 prunes newer, unreadable ones
    if main:
        prune_after(run_dir, start_epoch)
    return start_epoch, wall_offset


def write_run_files(run_dir: Path, cfg: ExperimentConfig, spaces: dict[str, Any]) -> None:
    """RUN_DIR/config.json (what ran, read by `--resume`, collectors and `icrl eval`) and spaces.json (so
    `icrl.load(RUN_DIR)` needs no env)."""
    write_text_atomic(run_dir / "config.json", cfg.to_json())
    write_spaces(run_dir, spaces)


# ----------------------------------------------------------------------------------------- the run lock
LOCK_NAME = ".lock"
_HELD: dict[str, RunLock] = {}  # this process's locks, by real path


class RunDirLockedError(ConfigError):
    """Another live process holds the run directory's lock; the message names it."""


def check_run_dir_usable(run_dir: str | os.PathLike) -> None:
    """Raise ConfigError (one line: the problem and the fix) when `run_dir` cannot hold a run: it is a file,
    a part of its path is a file, or the folder (or the nearest existing parent it would be created in)
    is not writable. Writes nothing."""
    path = Path(run_dir)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag('run_dir')} {path} is a file, not a folder: "
                          f"remove it or choose another {flag('run_dir')}")
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise ConfigError(f"{flag('run_dir')} {path}: {probe} is a file, so the folder cannot be created; "
                          f"choose another {flag('run_dir')}")
    if probe.exists() and not os.access(probe, os.W_OK | os.X_OK):
        what = "folder" if probe == path else f"parent folder {probe}"
        raise ConfigError(f"{flag('run_dir')} {path}: the {what} is not writable by this user; fix its permissions or "
                          f"choose another {flag('run_dir')}")


def _holder(lock_path: Path) -> str:
    try:
        text = lock_path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        text = ""
    return f"process {text}" if text.startswith("pid ") else "another process"


def _refusal(run_dir: Path, lock_path: Path) -> RunDirLockedError:
    return RunDirLockedError(
        f"{setting('run_dir', str(run_dir))} is in use by {_holder(lock_path)}; wait for it to finish (or stop it), "
        f"then {setting('resume')}, or choose another {flag('run_dir')}"
    )


def _open_lock(lock_path: Path, flags: int) -> int:
    """The lock file's descriptor; a symlink, FIFO or folder named `.lock` is refused in one line, since writing
    the holder's line through it would truncate a file outside the run directory (or block on the FIFO)."""
    try:
        return open_regular(lock_path, flags)
    except OSError as e:
        raise ConfigError(f"{lock_path} is not a regular file ({e.strerror or e}): icrl writes its lock only to its "
                          "own file; remove it, then run again") from e


def _try_lock(fd: int, shared: bool = False) -> bool:
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def hold_exclusive(lock_path: Path) -> int | None:
    """A descriptor holding an exclusive lock on `lock_path` (created; a symlink, FIFO or folder there is refused
    in one line) until it is closed or the process dies, or None when another process holds it. For a name
    only one live process may use at a time (a run dir: `RunLock`; an asynchronous collector's id)."""
    fd = _open_lock(lock_path, os.O_RDWR | os.O_CREAT)
    if fcntl is None or _try_lock(fd):  # pragma: no branch - no flock (Windows): nothing to hold
        return fd
    os.close(fd)
    return None


class RunLock:
    """An exclusive lock on a run directory, held until `release()` or the process's death."""

    def __init__(self, run_dir: Path, fd: int | None) -> None:
        self.run_dir, self.fd = run_dir, fd

    @classmethod
    def acquire(cls, run_dir: str | os.PathLike) -> RunLock:
        """Create RUN_DIR (and RUN_DIR/.lock) if needed and lock it; RunDirLockedError when another process
        holds it. A lock this process still holds on the same folder (left by a call that raised) is taken
        over: one process runs one training per folder at a time."""
        run_dir = Path(run_dir)
        check_run_dir_usable(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        key = os.path.realpath(run_dir)
        if key in _HELD:
            _HELD.pop(key).release()
        if fcntl is None:  # pragma: no cover
            return cls(run_dir, None)
        lock_path = run_dir / LOCK_NAME
        fd = _open_lock(lock_path, os.O_RDWR | os.O_CREAT)
        if not _try_lock(fd):
            os.close(fd)
            raise _refusal(run_dir, lock_path)
        command = "icrl " + sys.argv[1] if len(sys.argv) > 1 and sys.argv[1].isidentifier() else "python"
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} ({command} on {socket.gethostname()}, started {stamp} UTC)\n".encode())
        lock = cls(run_dir, fd)
        _HELD[key] = lock
        return lock

    def release(self) -> None:
        """Unlock (also for forked children that share the descriptor) and close; idempotent."""
        if self.fd is None:
            return
        try:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            os.close(self.fd)
            self.fd = None
            key = os.path.realpath(self.run_dir)
            if _HELD.get(key) is self:
                del _HELD[key]

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def check_not_locked(run_dir: str | os.PathLike) -> None:
    """Refuse early (before any env is built) when another process holds RUN_DIR's lock. Writes nothing:
    a folder without a lock file is free, and an existing lock file is only opened and tested.

    The test takes a shared lock: it fails only against a holder's exclusive one, so the ranks of a
    data-parallel run, which all check the folder at once, never see each other's test as a holder."""
    run_dir = Path(run_dir)
    lock_path = run_dir / LOCK_NAME
    if fcntl is None or not os.path.lexists(lock_path) or os.path.realpath(run_dir) in _HELD:
        return
    fd = _open_lock(lock_path, os.O_RDONLY)
    try:
        if not _try_lock(fd, shared=True):
            raise _refusal(run_dir, lock_path)
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
