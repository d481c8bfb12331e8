"""Rollouts on disk: one immutable `.npz` file per rollout, written atomically (DESIGN §6).

Why files and not a big array: several collector processes and learner processes share one buffer
without locks. Every file is written under a temporary name, flushed and fsynced, then renamed into
place, so a reader never sees a half-written rollout, even if the writer is killed. Files never change
after the rename, so readers may cache them freely.

File names carry everything the buffer's bookkeeping needs, so counting and eviction never open a file:

    {time_ns:020d}-{pid}-{uuid8}-T{num_timesteps}.npz

They sort by creation time (oldest first), are unique across processes, and encode the number of
timesteps. Temporary files end in `.tmp` and are invisible to the listing; stale ones (left by a killed
writer) are removed after `stale_tmp_seconds`.

Loading uses `np.load(allow_pickle=False)` only: a replay folder is data, never code.
"""

from __future__ import annotations

import os
import re
import time
import uuid
import zipfile
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal

import numpy as np

from icrl.types import Rollout

Folder = Literal["fifo", "protected", "all"]

ROLLOUT_FILE_RE = re.compile(r"^(\d{20})-(\d+)-([0-9a-f]{8})-T(\d+)\.npz$")
TMP_SUFFIX = ".tmp"
_REQUIRED = tuple(f.name for f in fields(Rollout) if f.name not in ("obs", "achieved"))


class CorruptRolloutError(Exception):
    """A rollout file that exists but cannot be read as a valid Rollout (truncated, garbage, pickled,
    missing fields, inconsistent lengths). Samplers skip such files; they never stop training."""

    def __init__(self, path: str | os.PathLike, reason: str):
        super().__init__(path, reason)
        self.path = Path(path)
        self.reason = reason

    def __str__(self) -> str:
        return f"corrupt rollout file {self.path}: {self.reason}"


# ----------------------------------------------------------------------------------------------------
# One file
# ----------------------------------------------------------------------------------------------------


def _fsync_dir(folder: Path) -> None:
    """Make a rename durable (POSIX). Not supported everywhere (e.g. Windows): best effort."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_rollout(path: str | os.PathLike, rollout: Rollout, *, fsync: bool = True) -> Path:
    """Write `rollout` to `path` as an uncompressed `.npz`, atomically.

    The data go to a unique `.tmp` file in the same folder (same file system, so the rename is atomic),
    which is flushed and fsynced, then `os.replace`d onto `path`; the folder is fsynced so the rename
    survives a power loss. `fsync=False` skips both fsyncs (crash-safe still, not power-loss-safe).
    Object arrays are refused (TypeError): they would need pickle to load.
    """
    path = Path(path)
    rollout.validate()
    arrays = {k: np.asarray(v) for k, v in rollout.to_arrays().items()}
    for key, arr in arrays.items():
        if arr.dtype.hasobject:
            raise TypeError(f"field {key!r} has dtype {arr.dtype}: object arrays need pickle, refused")
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex[:8]}{TMP_SUFFIX}")
    try:
        with open(tmp, "wb") as f:
            np.savez(f, allow_pickle=False, **arrays)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if fsync:
        _fsync_dir(path.parent)
    return path


def load_rollout(path: str | os.PathLike) -> Rollout:
    """Read a file written by `save_rollout`, fully into memory.

    Raises FileNotFoundError if the file does not exist (e.g. evicted by another process: not an error
    for a sampler) and CorruptRolloutError for anything else that prevents a valid Rollout.
    """
    path = Path(path)
    # We open the file ourselves so it is closed on every error path (np.load leaks it on a bad zip).
    with open(path, "rb") as fh:  # FileNotFoundError propagates
        try:
            npz = np.load(fh, allow_pickle=False)
        except ValueError as e:  # not a zip; numpy then refuses to unpickle it
            raise CorruptRolloutError(path, f"not an npz archive ({e})") from e
        except (OSError, EOFError, zipfile.BadZipFile) as e:
            raise CorruptRolloutError(path, f"unreadable ({type(e).__name__}: {e})") from e
        if not isinstance(npz, np.lib.npyio.NpzFile):
            raise CorruptRolloutError(path, f"expected an npz archive, found a single {type(npz).__name__}")
        try:
            with npz:
                arrays = {key: npz[key] for key in npz.files}
        except ValueError as e:  # includes "Object arrays cannot be loaded when allow_pickle=False"
            raise CorruptRolloutError(path, f"refused or malformed array ({e})") from e
        except Exception as e:  # BadZipFile (CRC), EOFError, zlib.error, OSError on truncated members
            raise CorruptRolloutError(path, f"truncated or damaged ({type(e).__name__}: {e})") from e
    missing = [name for name in _REQUIRED if name not in arrays]
    if missing:
        raise CorruptRolloutError(path, f"missing fields {missing}")
    try:
        return Rollout.from_arrays(arrays)
    except (ValueError, TypeError) as e:
        raise CorruptRolloutError(path, f"inconsistent fields ({e})") from e


# ----------------------------------------------------------------------------------------------------
# File names
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class RolloutFile:
    """A listed rollout file. Orders by creation time (then name), which is the FIFO order."""

    name: str
    path: Path
    num_timesteps: int


def rollout_file_name(num_timesteps: int) -> str:
    """A new unique, time-sortable file name that encodes the rollout's length."""
    return f"{time.time_ns():020d}-{os.getpid()}-{uuid.uuid4().hex[:8]}-T{num_timesteps}.npz"


def list_rollout_files(folder: str | os.PathLike) -> list[RolloutFile]:
    """Finished rollout files in `folder`, oldest first, without opening any of them.

    Names that do not match the pattern (temporary files, foreign files) are ignored. A missing folder
    lists as empty.
    """
    out = []
    try:
        with os.scandir(folder) as it:
            for entry in it:
                m = ROLLOUT_FILE_RE.match(entry.name)
                if m is not None:
                    out.append(RolloutFile(entry.name, Path(entry.path), int(m.group(4))))
    except FileNotFoundError:
        return []
    out.sort()
    return out


def clean_stale_tmp(folder: str | os.PathLike, older_than_s: float) -> int:
    """Delete `.tmp` files older than `older_than_s` (left by killed writers). Returns how many."""
    removed = 0
    now = time.time()
    try:
        with os.scandir(folder) as it:
            entries = [e for e in it if e.name.endswith(TMP_SUFFIX)]
    except FileNotFoundError:
        return 0
    for entry in entries:
        try:
            if now - entry.stat().st_mtime > older_than_s:
                os.unlink(entry.path)
                removed += 1
        except FileNotFoundError:  # another process cleaned it or its writer finished
            pass
    return removed


# ----------------------------------------------------------------------------------------------------
# The buffer
# ----------------------------------------------------------------------------------------------------


class DiskReplay:
    """A replay buffer shared by any number of processes through a folder.

    `root/fifo` holds collected rollouts and is capped at `capacity_timesteps` (oldest files evicted
    first, after every write); `root/protected` holds demonstrations / offline data and is never evicted.
    There are no locks: two processes evicting at once each delete a prefix of the oldest files, and a
    file already deleted by the other one is simply skipped. The newest fifo file is never evicted, so a
    single rollout longer than the capacity still reaches the learner.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        capacity_timesteps: int,
        *,
        fsync: bool = True,
        stale_tmp_seconds: float = 600.0,
    ):
        if capacity_timesteps < 1:
            raise ValueError(f"capacity_timesteps must be positive, got {capacity_timesteps}")
        self.root = Path(root)
        self.capacity_timesteps = int(capacity_timesteps)
        self.fsync = fsync
        self.stale_tmp_seconds = stale_tmp_seconds
        self.fifo_dir = self.root / "fifo"
        self.protected_dir = self.root / "protected"
        self.fifo_dir.mkdir(parents=True, exist_ok=True)
        self.protected_dir.mkdir(parents=True, exist_ok=True)
        self._last_clean = 0.0
        self.clean_tmp()

    def __repr__(self) -> str:
        return f"DiskReplay({str(self.root)!r}, capacity_timesteps={self.capacity_timesteps})"

    def write(self, rollout: Rollout, protected: bool = False) -> Path:
        """Store one rollout atomically; evicts old fifo files afterwards. Returns the final path."""
        folder = self.protected_dir if protected else self.fifo_dir
        path = save_rollout(folder / rollout_file_name(rollout.num_timesteps), rollout, fsync=self.fsync)
        if not protected:
            self.evict()
        if time.monotonic() - self._last_clean > 60.0:
            self.clean_tmp()
        return path

    def files(self, folder: Folder = "all") -> list[RolloutFile]:
        """Listed rollout files, oldest first within each folder (fifo first, then protected)."""
        out: list[RolloutFile] = []
        if folder in ("fifo", "all"):
            out += list_rollout_files(self.fifo_dir)
        if folder in ("protected", "all"):
            out += list_rollout_files(self.protected_dir)
        if folder not in ("fifo", "protected", "all"):
            raise ValueError(f"folder must be 'fifo', 'protected' or 'all', got {folder!r}")
        return out

    def num_timesteps(self, folder: Folder = "all") -> int:
        """Total timesteps stored, from the file names alone."""
        return sum(f.num_timesteps for f in self.files(folder))

    def num_rollouts(self, folder: Folder = "all") -> int:
        return len(self.files(folder))

    def evict(self) -> list[Path]:
        """Delete the oldest fifo files until the fifo holds at most `capacity_timesteps` (never the
        newest file). Returns the paths this call deleted."""
        files = list_rollout_files(self.fifo_dir)
        total = sum(f.num_timesteps for f in files)
        deleted = []
        for f in files[:-1]:
            if total <= self.capacity_timesteps:
                break
            total -= f.num_timesteps
            try:
                f.path.unlink()
                deleted.append(f.path)
            except FileNotFoundError:  # evicted concurrently by another process
                pass
        return deleted

    def clean_tmp(self) -> int:
        """Remove stale temporary files left by killed writers in both folders."""
        self._last_clean = time.monotonic()
        return sum(clean_stale_tmp(d, self.stale_tmp_seconds) for d in (self.fifo_dir, self.protected_dir))
