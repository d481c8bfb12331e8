"""Rollouts on disk: one immutable `.npz` file per rollout, written atomically (docs/design.md §6).

Why files and not a big array: several collector processes and learner processes share one buffer
without locks. Every file is written under a temporary name, flushed (and fsynced, unless disabled),
then renamed into place, so a reader never sees a half-written rollout, even if the writer is killed.
Files never change after the rename, so readers may cache them freely.

File names carry the buffer's bookkeeping:

    {time_ns:020d}-{pid}-{uuid8}-T{num_timesteps}.npz

They sort by creation time (oldest first), are unique across processes, and encode the number of
timesteps. A name can be copied or forged, though (one renamed `-T1000...0.npz` once made eviction delete
every genuine rollout), so the buffer's eviction index reads each new file's length once from its contents
(`stored_timesteps`: every member's header, checked against the bytes the member and the file hold; no data
read) and skips, with one warning, any entry whose contents disagree or that is not a regular file (a FIFO,
folder or symlink named like a rollout). Temporary files end in
`.tmp` and are invisible to the listing; stale ones (left by a killed writer) are removed after
`stale_tmp_seconds`. Listing is the one cost that grows with the buffer (~1 us
per file), so `FolderIndex` lists incrementally and skips unchanged folders, and `DiskReplay` lists only
when eviction may be due.

Reading one file (safely, without pickle) is `icrl.data.rolloutfile`.
"""

from __future__ import annotations

import os
import re
import time
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from icrl.data.rolloutfile import (
    TMP_SUFFIX,
    CorruptRolloutError,
    load_rollout,
    save_rollout,
    stored_timesteps,
)
from icrl.fileio import check_inside
from icrl.types import Rollout

__all__ = ["TMP_SUFFIX", "CorruptRolloutError", "DiskReplay", "FolderIndex", "RolloutFile", "clean_stale_tmp",
           "list_rollout_files", "load_rollout", "rollout_file_name", "save_rollout", "stored_timesteps"]

Folder = Literal["fifo", "protected", "all"]

ROLLOUT_FILE_RE = re.compile(r"^(\d{20})-(\d+)-([0-9a-f]{8})-T(\d+)\.npz$")
_NAME_RE = re.compile(r"[0-9]{20}-[0-9]+-[0-9a-f]{8}-T([0-9]+)\.npz")  # the same, faster (fullmatch)
_TMP_RE = re.compile(_NAME_RE.pattern + r"\.[0-9a-f]{8}" + re.escape(TMP_SUFFIX))  # save_rollout's temporary names


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


def _warn(message: str) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=4)


# The one call that reads a folder's names; a module attribute so tests can simulate a stale listing.
_listdir = os.listdir


class FolderIndex:
    """The rollout files of one folder, kept up to date incrementally and cheaply.

    `scan()` re-reads the folder's names (`os.listdir`: no per-file stat, no Path objects), parses only
    the names it has not seen before, forgets the ones that disappeared, and keeps `names` sorted oldest
    first (new names are appended and merged: timsort does that in linear time). A re-scan costs ~1 us
    per file, most of it in the kernel's readdir (a first scan ~1.5 us); building a Path and a
    RolloutFile per file, as listings used to, cost ~10 us per file.

    It skips even the readdir when the folder has not changed: a directory's mtime changes whenever an
    entry is created, renamed into it or deleted from it, so an unchanged (device, inode, mtime) means an
    unchanged listing. File timestamps come from a coarse clock, though: two changes within one clock
    tick can leave the same mtime. So a listing is trusted only when the folder's mtime was already at
    least `trust_after_s` old when the listing began (git's "racy timestamp" rule); a folder written
    continuously is simply re-listed each time. Set `trust_after_s=None` to never trust mtimes (e.g. on
    a network file system whose server clock or attribute cache cannot be relied on).

    `names` is replaced, never mutated, so a reader may hold on to it as a consistent snapshot.

    `verify=True` (the buffer's eviction index) reads each new file's length from its contents once (~0.7 ms a
    file, once per process: files never change; not the files this process wrote, see `wrote`) and rejects, with
    one `log` line each (default: a RuntimeWarning), entries whose contents disagree with their names or that are
    not regular files, so a forged name can never make eviction delete genuine rollouts. Samplers list without it:
    they load every file they draw anyway, and skip bad ones then.
    """

    def __init__(self, folder: str | os.PathLike, *, trust_after_s: float | None = 1.0, verify: bool = False,
                 log: Callable[[str], None] | None = None):
        self.folder = os.fspath(folder)
        self.verify, self.log = verify, log or _warn
        self.rejected: set[str] = set()  # with `verify`: rollout-named entries that are not valid rollouts
        self._written: set[str] = set()  # names this process wrote since the last scan: known good, not re-read
        self.trust_after_ns = None if trust_after_s is None else int(trust_after_s * 1e9)
        self.names: list[str] = []  # rollout file names, oldest first
        self.steps: dict[str, int] = {}  # name -> num_timesteps
        self.total = 0  # sum of steps
        self._stamp: tuple[int, int, int] | None = None

    def __len__(self) -> int:
        return len(self.names)

    def scan(self) -> bool:
        """Bring the index up to date. Returns False if the folder was known unchanged (nothing read)."""
        now_ns = time.time_ns()
        try:
            st = os.stat(self.folder)
        except FileNotFoundError:
            self._replace([], {}, 0, None)
            return True
        stamp = (st.st_dev, st.st_ino, st.st_mtime_ns)
        if stamp == self._stamp:
            return False
        try:
            listing = _listdir(self.folder)
        except FileNotFoundError:
            self._replace([], {}, 0, None)
            return True
        steps, total, names = self.steps, self.total, self.names
        unknown = [n for n in listing if n not in steps]  # new files (and a few temporary / foreign ones)
        if len(listing) - len(unknown) < len(steps):  # some known files are gone
            gone = steps.keys() - set(listing)
            steps = dict(steps)
            for name in gone:
                total -= steps.pop(name)
            names = [n for n in names if n not in gone]
        added, lengths = self._parse(unknown, listing)
        if added:
            steps = dict(steps) if steps is self.steps else steps
            steps.update(zip(added, lengths))
            total += sum(lengths)
            added.sort()
            names = names + added
            names.sort()  # two sorted runs: a linear merge
        trusted = self.trust_after_ns is not None and st.st_mtime_ns < now_ns - self.trust_after_ns
        self._replace(names, steps, total, stamp if trusted else None)
        return True

    def _parse(self, unknown: list[str], listing: list[str]) -> tuple[list[str], list[int]]:
        """The rollout names among `unknown` and their lengths; with `verify`, only the files whose contents
        hold the length their name claims (the others are rejected once, with one warning naming them)."""
        match = _NAME_RE.fullmatch
        added, lengths = [], []  # (no per-file tuples: creating ~1e5 containers triggers the cyclic GC)
        if self.rejected:
            self.rejected.intersection_update(listing)  # forget rejected files that were removed
        written, self._written = self._written, set()  # (in this listing now, unless deleted meanwhile)
        for name in unknown:
            m = match(name)
            if m is None or name in self.rejected:
                continue
            if self.verify and name not in written:
                try:
                    stored = stored_timesteps(os.path.join(self.folder, name))
                    if stored != int(m[1]):
                        raise CorruptRolloutError(os.path.join(self.folder, name),
                                                  f"its name says {m[1]} timesteps, its contents {stored}")
                except FileNotFoundError:  # evicted by another process since the listing
                    continue
                except CorruptRolloutError as e:
                    self.rejected.add(name)
                    self.log(f"icrl: warning: skipping {e}")
                    continue
            added.append(name)
            lengths.append(int(m[1]))
        return added, lengths

    def wrote(self, name: str) -> None:
        """Note a file this process just wrote (its name states the length it holds): not re-read by `verify`."""
        self._written.add(name)

    def _replace(self, names, steps, total, stamp) -> None:
        self.names, self.steps, self.total, self._stamp = names, steps, total, stamp

    def forget_oldest(self, k: int) -> None:
        """Drop the `k` oldest names (just deleted by this process) without re-reading the folder."""
        if k <= 0:
            return
        steps = dict(self.steps)
        for name in self.names[:k]:
            self.total -= steps.pop(name)
        self.names, self.steps = self.names[k:], steps
        # the folder's mtime has changed, so the next scan() re-reads it anyway

    def rollout_files(self, memo: dict[str, RolloutFile] | None = None) -> list[RolloutFile]:
        """`names` as RolloutFile objects; `memo` (name -> RolloutFile) saves rebuilding known ones."""
        folder = Path(self.folder)
        if memo is None:
            return [RolloutFile(n, folder / n, self.steps[n]) for n in self.names]
        out = []
        for n in self.names:
            f = memo.get(n)
            if f is None:
                f = memo[n] = RolloutFile(n, folder / n, self.steps[n])
            out.append(f)
        if len(memo) > 2 * len(out) + 64:  # forget evicted files now and then
            memo.clear()
            memo.update((f.name, f) for f in out)
        return out


def list_rollout_files(folder: str | os.PathLike) -> list[RolloutFile]:
    """Finished rollout files in `folder`, oldest first, without opening any of them.

    Names that do not match the pattern (temporary files, foreign files) are ignored. A missing folder
    lists as empty. (Repeated listings of one folder are cheaper through a `FolderIndex`.)
    """
    index = FolderIndex(folder, trust_after_s=None)
    index.scan()
    return index.rollout_files()


def clean_stale_tmp(folder: str | os.PathLike[str], older_than_s: float) -> int:
    """Delete the temporary files `save_rollout` names (`<rollout name>.<8 hex>.tmp`) older than `older_than_s`
    (left by killed writers). Returns how many. Anything else, or anything not a regular file, is left alone."""
    removed = 0
    now = time.time()
    try:
        with os.scandir(folder) as it:
            entries = [e for e in it if e.name.endswith(TMP_SUFFIX) and _TMP_RE.fullmatch(e.name)]
    except FileNotFoundError:
        return 0
    for entry in entries:
        try:
            if entry.is_file(follow_symlinks=False) and now - entry.stat(follow_symlinks=False).st_mtime > older_than_s:
                os.unlink(entry.path)
                removed += 1
        except OSError:  # another process cleaned it, its writer finished, or it is a folder or symlink loop
            pass
    return removed


# ----------------------------------------------------------------------------------------------------
# The buffer
# ----------------------------------------------------------------------------------------------------


class DiskReplay:
    """A replay buffer shared by any number of processes through a folder.

    `root/fifo` holds collected rollouts and is capped at `capacity_timesteps`, oldest files evicted
    first; `root/protected` holds demonstrations / offline data and is never evicted. The newest fifo
    file is never evicted, so a single rollout longer than the capacity still reaches the learner.

    Cheap writes. Listing a folder costs ~1 us per file, and short rollouts make many files (80k for
    1M timesteps of 12-step episodes), so a write does not list the folder. Each instance keeps a
    running estimate of the fifo's timesteps: seeded by one listing at construction, increased by its
    own writes, and made exact again by `evict()`, which lists the folder. A write calls `evict()` only
    when the estimate exceeds the capacity, or when `recount_seconds` have passed since the last listing
    (other processes may have written meanwhile). When `evict()` finds the fifo over capacity, it deletes
    the oldest files down to `low_water * capacity_timesteps`, so the next listing is ~(1 - low_water) *
    capacity timesteps of writes away. Guarantees:

    * one writer: the fifo never exceeds the capacity after a write returns (the estimate is exact);
    * several writers: each one's writes are seen by the others within `recount_seconds` of their next
      write, so the fifo is back under the capacity within one recount interval of the last write of
      any of them (call `evict()` to enforce it at once). No locks: two processes evicting at once each
      delete a prefix of the oldest files, and a file already deleted by the other is skipped.

    Durability (`fsync`, `fsync_protected`). Every write is atomic whatever these say: data go to a
    temporary file that is renamed into place, so readers never see a torn file, even if the writer is
    killed. fsync (of the file, then of the folder) additionally makes the rollout survive a power loss
    or kernel crash; it costs milliseconds per write on a real disk. Collected rollouts are cheap to
    lose (`fsync=False` is a sensible choice for the fifo); demonstrations in `protected` are not
    (`fsync_protected` defaults to True and is independent of `fsync`).

    Untrusted folders. A replay may be shared or downloaded: only files whose contents hold the length their
    name says are counted and evicted (the fifo's index verifies them, see `FolderIndex`; bad ones are reported
    through `log` and left alone), and `root/fifo` or `root/protected` as a symlink leading out of `root` is
    refused (OutsideRunDirError), since eviction deletes there.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        capacity_timesteps: int,
        *,
        fsync: bool = True,
        fsync_protected: bool = True,
        low_water: float = 0.95,
        recount_seconds: float = 5.0,
        stale_tmp_seconds: float = 600.0,
        trust_mtime_after_s: float | None = 1.0,
        log: Callable[[str], None] | None = None,
    ):
        if capacity_timesteps < 1:
            raise ValueError(f"capacity_timesteps must be positive, got {capacity_timesteps}")
        if not 0.0 < low_water <= 1.0:
            raise ValueError(f"low_water must be in (0, 1], got {low_water}")
        self.root = Path(root)
        self.capacity_timesteps = int(capacity_timesteps)
        self.fsync = fsync
        self.fsync_protected = fsync_protected
        self.low_water = float(low_water)
        self.recount_seconds = float(recount_seconds)
        self.stale_tmp_seconds = stale_tmp_seconds
        self.fifo_dir = self.root / "fifo"
        self.protected_dir = self.root / "protected"
        for folder in (self.fifo_dir, self.protected_dir):
            check_inside(self.root, folder).mkdir(parents=True, exist_ok=True)  # a symlink out is refused
        self._clock = time.monotonic  # replaceable in tests
        self._index = {  # eviction deletes by the fifo's lengths: they are read from the files, not the names
            "fifo": FolderIndex(self.fifo_dir, trust_after_s=trust_mtime_after_s, verify=True, log=log),
            "protected": FolderIndex(self.protected_dir, trust_after_s=trust_mtime_after_s),
        }
        self._memo: dict[str, dict[str, RolloutFile]] = {"fifo": {}, "protected": {}}
        self._last_clean = 0.0
        self.clean_tmp()
        self._index["fifo"].scan()
        self._fifo_estimate = self._index["fifo"].total
        self._last_count = self._clock()

    def __repr__(self) -> str:
        return f"DiskReplay({str(self.root)!r}, capacity_timesteps={self.capacity_timesteps})"

    @property
    def fifo_estimate(self) -> int:
        """This instance's running estimate of the fifo's timesteps (exact after `evict()`)."""
        return self._fifo_estimate

    def write(self, rollout: Rollout, protected: bool = False) -> Path:
        """Store one rollout atomically; evicts old fifo files when due (see the class). Returns the path."""
        folder = self.protected_dir if protected else self.fifo_dir
        fsync = self.fsync_protected if protected else self.fsync
        path = save_rollout(folder / rollout_file_name(rollout.num_timesteps), rollout, fsync=fsync)
        now = self._clock()
        if not protected:
            self._index["fifo"].wrote(path.name)
            self._fifo_estimate += rollout.num_timesteps
            due = now - self._last_count >= self.recount_seconds
            if due or self._fifo_estimate > self.capacity_timesteps:
                self.evict()
        if now - self._last_clean > 60.0:
            self.clean_tmp()
        return path

    def _scan(self, folder: Folder) -> list[FolderIndex]:
        if folder not in ("fifo", "protected", "all"):
            raise ValueError(f"folder must be 'fifo', 'protected' or 'all', got {folder!r}")
        indexes = [self._index[k] for k in ("fifo", "protected") if folder in (k, "all")]
        for index in indexes:
            index.scan()
        return indexes

    def files(self, folder: Folder = "all") -> list[RolloutFile]:
        """Listed rollout files, oldest first within each folder (fifo first, then protected)."""
        out: list[RolloutFile] = []
        for key, index in zip(("fifo", "protected") if folder == "all" else (folder,), self._scan(folder)):
            out += index.rollout_files(self._memo[key])
        return out

    def num_timesteps(self, folder: Folder = "all") -> int:
        """Total timesteps stored, from the file names (checked against the contents in the fifo)."""
        return sum(index.total for index in self._scan(folder))

    def num_rollouts(self, folder: Folder = "all") -> int:
        return sum(len(index) for index in self._scan(folder))

    def evict(self) -> list[Path]:
        """List the fifo (making the estimate exact); if it holds more than `capacity_timesteps`, delete
        the oldest files until it holds at most `low_water * capacity_timesteps` (never the newest file).
        Returns the paths this call deleted."""
        index = self._index["fifo"]
        index.scan()
        names, steps, total = index.names, index.steps, index.total
        deleted: list[Path] = []
        if total > self.capacity_timesteps:
            target = int(self.low_water * self.capacity_timesteps)
            k = 0
            for name in names[:-1]:
                if total <= target:
                    break
                try:
                    os.unlink(os.path.join(index.folder, name))
                    deleted.append(self.fifo_dir / name)
                except FileNotFoundError:  # evicted concurrently by another process
                    pass
                total -= steps[name]
                k += 1
            index.forget_oldest(k)
        self._fifo_estimate = index.total
        self._last_count = self._clock()
        return deleted

    def clean_tmp(self) -> int:
        """Remove stale temporary files left by killed writers in both folders."""
        self._last_clean = self._clock()
        return sum(clean_stale_tmp(d, self.stale_tmp_seconds) for d in (self.fifo_dir, self.protected_dir))
