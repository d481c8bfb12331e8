"""One process per run directory: an exclusive `flock` on RUN_DIR/.lock, and checks that a run dir is usable.

Why: two `icrl train` (or a `--resume` beside a running run) on one folder both ran to exit 0, interleaving
metrics rows and overwriting each other's checkpoints. A `flock` lock is released by the kernel when its
holder dies, even on SIGKILL, so a crashed run never leaves a stale lock that blocks `--resume`; the file
itself only carries the holder's pid and command for the refusal message. Asynchronous collectors
(`icrl collect`) share a run directory by design and take no lock; `icrl train` and `icrl learn` do.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

from icrl.config import ConfigError
from icrl.fileio import open_regular

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory locks, runs are not protected
    fcntl = None  # type: ignore[assignment]

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
        raise ConfigError(f"--run-dir {path} is a file, not a folder: remove it or choose another --run-dir")
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise ConfigError(f"--run-dir {path}: {probe} is a file, so the folder cannot be created; choose another --run-dir")
    if probe.exists() and not os.access(probe, os.W_OK | os.X_OK):
        what = "folder" if probe == path else f"parent folder {probe}"
        raise ConfigError(f"--run-dir {path}: the {what} is not writable by this user; fix its permissions or "
                          "choose another --run-dir")


def _holder(lock_path: Path) -> str:
    try:
        text = lock_path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        text = ""
    return f"process {text}" if text.startswith("pid ") else "another process"


def _refusal(run_dir: Path, lock_path: Path) -> RunDirLockedError:
    return RunDirLockedError(
        f"--run-dir {run_dir} is in use by {_holder(lock_path)}; wait for it to finish (or stop it), then "
        "--resume, or choose another --run-dir"
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
