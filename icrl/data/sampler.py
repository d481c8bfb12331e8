"""Random windows of stored rollouts, collated into `Batch`es, in DataLoader workers (docs/design.md §6).

Each sample: pick one rollout file uniformly among `root/fifo` and `root/protected` (or, with
`offline_fraction=p`, uniformly inside `protected` with probability p and inside `fifo` otherwise), load
it (through a per-worker LRU cache: files are immutable), apply the optional `transform` (hindsight
relabeling plugs in here), cut a uniformly random window of at most `max_seq_len` timesteps, and copy it
into a padded batch. The dataset yields whole batches, so the DataLoader runs with `batch_size=None` and
the collation cost is paid in the workers, not in the learner.

Reproducibility: every worker draws from its own numpy Generator seeded by (seed, worker id); the
DataLoader hands out batches round-robin over workers, so a fixed seed and a fixed `num_workers` give the
same batches whenever the buffer holds the same files. `num_workers=0` equals `num_workers=1`.
"""

from __future__ import annotations

import os
import random
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from icrl.data.collate import collate_windows
from icrl.data.storage import CorruptRolloutError, FolderIndex, load_rollout
from icrl.types import ActionSpec, Batch, Rollout

Transform = Callable[[Rollout, np.random.Generator], Rollout]


class EmptyReplayError(RuntimeError):
    """The replay folder held no readable rollout file within the waiting time."""


def worker_seed(seed: int, worker_id: int) -> int:
    """The seed of DataLoader worker `worker_id` (worker 0 also serves `num_workers=0`)."""
    return int(np.random.SeedSequence([seed, worker_id]).generate_state(1, dtype=np.uint32)[0])


def rollout_nbytes(rollout: Rollout) -> int:
    return sum(a.nbytes for a in rollout.to_arrays().values())


class RolloutCache:
    """LRU cache of loaded rollouts bounded by their total bytes.

    Cached arrays are made read-only, so a transform that would modify a rollout in place fails loudly
    instead of silently corrupting every later sample of that file.
    """

    def __init__(self, max_bytes: int):
        self.max_bytes = int(max_bytes)
        self.nbytes = 0
        self._items: OrderedDict[Hashable, tuple[Rollout, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, path: Hashable) -> bool:
        return path in self._items

    def get(self, path: Hashable) -> Rollout | None:
        item = self._items.get(path)
        if item is None:
            return None
        self._items.move_to_end(path)
        return item[0]

    def put(self, path: Hashable, rollout: Rollout) -> None:
        size = rollout_nbytes(rollout)
        if size > self.max_bytes or path in self._items:
            return
        for arr in rollout.to_arrays().values():
            arr.flags.writeable = False
        self._items[path] = (rollout, size)
        self.nbytes += size
        while self.nbytes > self.max_bytes:
            _, (_, old) = self._items.popitem(last=False)
            self.nbytes -= old

    def discard(self, path: Hashable) -> None:
        item = self._items.pop(path, None)
        if item is not None:
            self.nbytes -= item[1]


class ReplayDataset(IterableDataset):
    """Infinite stream of `Batch`es of `batch_size` random windows from a `DiskReplay` folder.

    Corrupt files, and files that do not fit `obs_shapes` (key -> per-step shape, when given) or the action
    width, are skipped with one warning per file. A file that disappears (evicted) is dropped
    silently and another one drawn. The file list is refreshed every `refresh_seconds` or `refresh_every`
    samples, whichever comes first, but never sooner than `last listing time / refresh_time_fraction`
    after the previous refresh: listing costs ~1 us per file, so with 80k files (~0.1 s) the list is
    refreshed at most every ~2 s by default, and listing stays under 5% of the sampler's time. Unchanged
    folders are not re-read at all (see `FolderIndex`). If no readable file exists, it retries for
    `empty_timeout_s`, then raises EmptyReplayError.
    Batches have length at most `max_seq_len`, padded with zeros and `mask == False`.
    """

    def __init__(
        self,
        replay_root: str | Path,
        *,
        batch_size: int,
        max_seq_len: int,
        action_spec: ActionSpec,
        seed: int = 0,
        transform: Transform | None = None,
        cache_bytes: int = 256 * 2**20,
        refresh_seconds: float = 1.0,
        refresh_every: int = 1024,
        refresh_time_fraction: float = 0.05,
        empty_timeout_s: float = 30.0,
        auto_refresh: bool = True,
        offline_fraction: float | None = None,
        obs_shapes: dict[str, tuple[int, ...]] | None = None,
    ):
        if batch_size < 1 or max_seq_len < 1:
            raise ValueError(f"batch_size and max_seq_len must be positive, got {batch_size}, {max_seq_len}")
        if not 0.0 < refresh_time_fraction <= 1.0:
            raise ValueError(f"refresh_time_fraction must be in (0, 1], got {refresh_time_fraction}")
        if offline_fraction is not None and not 0.0 <= offline_fraction <= 1.0:
            raise ValueError(f"offline_fraction must be in [0, 1] or None, got {offline_fraction}")
        self.root = Path(replay_root)
        self.batch_size = batch_size
        self.max_seq_len = max_seq_len
        self.action_spec = action_spec
        self.seed = seed
        self.transform = transform
        self.cache_bytes = cache_bytes
        self.refresh_seconds = refresh_seconds
        self.refresh_every = refresh_every
        self.refresh_time_fraction = refresh_time_fraction
        self.empty_timeout_s = empty_timeout_s
        self.auto_refresh = auto_refresh
        self.offline_fraction = offline_fraction
        self.obs_shapes = obs_shapes
        # Per-worker state, (re)built lazily in the worker process by `_setup`. A file is a key
        # (folder number, name): 0 = fifo, 1 = protected.
        self._rng: np.random.Generator | None = None
        self._cache: RolloutCache | None = None
        self._dirs = [os.path.join(self.root, "fifo", ""), os.path.join(self.root, "protected", "")]
        self._indexes: list[FolderIndex] = []
        self._lists: tuple[list[str], list[str]] = ([], [])  # snapshots of the indexes' sorted names
        self._bad: set[tuple[int, str]] = set()  # corrupt files, never drawn again
        self._excluded: set[tuple[int, str]] = set()  # listed files not to draw: corrupt or vanished
        self._last_refresh = -float("inf")
        self._refresh_cost = 0.0
        self._since_refresh = 0

    # -- file list --------------------------------------------------------------------------------------

    def _setup(self) -> None:
        info = get_worker_info()
        self._rng = np.random.default_rng(worker_seed(self.seed, 0 if info is None else info.id))
        self._cache = RolloutCache(self.cache_bytes)
        self._indexes = [FolderIndex(d) for d in self._dirs]
        self._lists = ([], [])
        self._excluded = set()
        self._last_refresh = -float("inf")
        self._refresh_cost = 0.0
        self._since_refresh = 0

    def refresh(self) -> None:
        """List the buffer now (in this process). With `auto_refresh=False` this is the only way new
        files become visible, so the batches are a function of the seed and of when the owner refreshed,
        never of timing: the training loop refreshes after each epoch's writes."""
        if self._rng is None:
            self._setup()
        self._refresh()

    def _refresh(self) -> None:
        self._last_refresh = time.monotonic()  # refreshes start >= cost / refresh_time_fraction apart
        t0 = time.perf_counter()
        for index in self._indexes:
            index.scan()
        self._lists = (self._indexes[0].names, self._indexes[1].names)
        steps = (self._indexes[0].steps, self._indexes[1].steps)
        # keep excluding what is still listed: vanished files are gone from the new listing
        self._excluded = {key for key in self._excluded | self._bad if key[1] in steps[key[0]]}
        self._refresh_cost = time.perf_counter() - t0
        self._since_refresh = 0

    def _num_listed(self) -> int:
        return len(self._lists[0]) + len(self._lists[1])

    def _refresh_due(self) -> bool:
        listed = self._num_listed()
        live = listed - len(self._excluded)
        if live <= 0:
            return True
        if not self.auto_refresh:  # the owner calls `refresh()` when it has written new files
            return False
        elapsed = time.monotonic() - self._last_refresh
        if elapsed < self._refresh_cost / self.refresh_time_fraction:
            return False
        return (
            elapsed > self.refresh_seconds
            or self._since_refresh >= self.refresh_every
            or 2 * len(self._excluded) > listed  # most of the list vanished: worth a listing
        )

    def _draw(self) -> tuple[int, str] | None:
        """A uniformly random listed file that is not excluded (None if there is none)."""
        if self.offline_fraction is not None:
            return self._draw_by_fraction(self.offline_fraction)
        fifo, protected = self._lists
        n_fifo, listed = len(fifo), len(fifo) + len(protected)
        if listed - len(self._excluded) <= 0:
            return None
        rng: np.random.Generator = self._rng  # type: ignore[assignment]
        for _ in range(64):  # rejection sampling: uniform over the files not excluded
            i = int(rng.integers(listed))
            key = (0, fifo[i]) if i < n_fifo else (1, protected[i - n_fifo])
            if key not in self._excluded:
                return key
        live = [(0, n) for n in fifo] + [(1, n) for n in protected]  # rare: mostly excluded files
        live = [key for key in live if key not in self._excluded]
        return live[int(rng.integers(len(live)))]

    def _draw_by_fraction(self, p: float) -> tuple[int, str] | None:
        """`protected` with probability p, else `fifo`; then a uniformly random live file inside it. For
        0 < p < 1 an empty side gives way to the other; p = 0 or 1 never draws from the other side."""
        rng: np.random.Generator = self._rng  # type: ignore[assignment]
        live = [len(names) for names in self._lists]
        for folder, _ in self._excluded:
            live[folder] -= 1
        folder = int(rng.random() < p)
        if live[folder] <= 0 and 0.0 < p < 1.0:
            folder = 1 - folder
        if live[folder] <= 0:
            return None
        names = self._lists[folder]
        for _ in range(64):  # rejection sampling: uniform over the folder's files not excluded
            key = (folder, names[int(rng.integers(len(names)))])
            if key not in self._excluded:
                return key
        keys = [(folder, n) for n in names if (folder, n) not in self._excluded]
        return keys[int(rng.integers(len(keys)))]

    def _load(self, key: tuple[int, str]) -> Rollout | None:
        path = self._dirs[key[0]] + key[1]
        rollout = self._cache.get(path)  # type: ignore[union-attr]
        if rollout is not None:
            return rollout
        try:
            rollout = self._check_fits(load_rollout(path), path)
        except FileNotFoundError:
            self._excluded.add(key)
            self._cache.discard(path)  # type: ignore[union-attr]
            return None
        except CorruptRolloutError as e:
            self._bad.add(key)
            self._excluded.add(key)
            self._cache.discard(path)  # type: ignore[union-attr]
            warnings.warn(f"skipping {e}", RuntimeWarning, stacklevel=2)
            return None
        self._cache.put(path, rollout)  # type: ignore[union-attr]
        return rollout

    def _check_fits(self, rollout: Rollout, path: str) -> Rollout:
        """`rollout`, or CorruptRolloutError naming `path` when its observations (against `obs_shapes`) or its
        action width do not fit: one misfit file would otherwise stop every batch it lands in."""
        shapes = {k: v.shape[1:] for k, v in rollout.obs.items()}
        if self.obs_shapes is not None and shapes != {k: tuple(s) for k, s in self.obs_shapes.items()}:
            raise CorruptRolloutError(path, f"observations of shapes {shapes}, the env's are {self.obs_shapes}")
        if rollout.prev_action.shape[1:] != (self.action_spec.dim,):
            raise CorruptRolloutError(path, f"actions of width {rollout.prev_action.shape[1:]}, the env's are "
                                            f"{self.action_spec.dim} wide")
        return rollout

    def sample_rollout(self) -> Rollout:
        """One uniformly chosen readable rollout (before the transform)."""
        if self._rng is None:
            self._setup()
        deadline = None
        while True:
            if self._refresh_due():
                self._refresh()
            key = self._draw()
            if key is not None:
                rollout = self._load(key)
                if rollout is not None:
                    self._since_refresh += 1
                    return rollout
                continue
            now = time.monotonic()
            deadline = now + self.empty_timeout_s if deadline is None else deadline
            if now >= deadline:
                raise EmptyReplayError(
                    f"no readable rollout file in {self.root}/fifo or {self.root}/protected after waiting "
                    f"{self.empty_timeout_s:.1f}s ({len(self._bad)} corrupt file(s) skipped). Write rollouts "
                    "with DiskReplay.write before sampling, or check replay_root."
                    + (f" With offline_fraction={self.offline_fraction} windows come only from "
                       f"{'protected' if self.offline_fraction == 1 else 'fifo'}."
                       if self.offline_fraction in (0.0, 1.0) else "")
                )
            time.sleep(min(0.1, max(0.0, deadline - now)))

    # -- windows and batches ----------------------------------------------------------------------------

    def sample_batch(self) -> Batch:
        """`batch_size` random windows, each from an independently chosen rollout."""
        windows = []
        for _ in range(self.batch_size):
            rollout = self.sample_rollout()
            rng: np.random.Generator = self._rng  # type: ignore[assignment]
            if self.transform is not None:
                rollout = self.transform(rollout, rng)
            n = rollout.num_timesteps
            start = int(rng.integers(n - self.max_seq_len + 1)) if n > self.max_seq_len else 0
            windows.append((rollout, start))
        # Pad to the longest window drawn, not to max_seq_len: short-rollout tasks then cost what they hold.
        length = max(min(r.num_timesteps - s, self.max_seq_len) for r, s in windows)
        return collate_windows(windows, length, self.action_spec)

    def __iter__(self) -> Iterator[Batch]:
        self._setup()
        while True:
            yield self.sample_batch()


def _seed_worker(worker_id: int) -> None:
    """Seed the global RNGs of a worker too (for transforms that ignore the rng they are given)."""
    s = torch.initial_seed() % 2**32  # distinct per worker, derived from the loader's generator
    random.seed(s)
    np.random.seed(s)


class ReplayLoader:
    """An endless iterator of Batches over a DataLoader; `close()` stops its worker processes."""

    def __init__(self, loader: DataLoader):
        self.loader = loader
        self._it: Iterator[Batch] | None = iter(loader)

    def refresh(self) -> None:
        """Make files written since the last refresh visible to in-process loading (num_workers=0).
        Worker processes refresh on their own, time-based schedule instead."""
        if self.loader.num_workers == 0:
            dataset = self.loader.dataset
            if not isinstance(dataset, ReplayDataset):
                raise TypeError(f"ReplayLoader reads a ReplayDataset, not a {type(dataset).__name__}")
            dataset.refresh()

    def __iter__(self) -> ReplayLoader:
        return self

    def __next__(self) -> Batch:
        if self._it is None:
            raise StopIteration
        return next(self._it)

    def close(self) -> None:
        it, self._it = self._it, None
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()

    def __enter__(self) -> ReplayLoader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def make_loader(
    replay_root: str | Path,
    *,
    batch_size: int,
    max_seq_len: int,
    action_spec: ActionSpec,
    seed: int,
    num_workers: int = 0,
    transform: Transform | None = None,
    pin_memory: bool = False,
    auto_refresh: bool | None = None,
    offline_fraction: float | None = None,
    **dataset_kwargs,
) -> ReplayLoader:
    """Endless Batches of random windows from the replay at `replay_root`, loaded in `num_workers`
    processes (0: in this process). Same seed and num_workers and the same files -> same batches.
    `auto_refresh` (default: only with workers) re-lists the buffer on a time-based schedule; without it,
    call `loader.refresh()` after writing new files, which keeps in-process training reproducible.
    `offline_fraction` (None: uniform over all files) is the probability that a window comes from
    `root/protected` (offline data) rather than `root/fifo` (collected rollouts).
    `dataset_kwargs` go to ReplayDataset (cache_bytes, refresh_seconds, empty_timeout_s, ...)."""
    dataset = ReplayDataset(
        replay_root,
        batch_size=batch_size,
        max_seq_len=max_seq_len,
        action_spec=action_spec,
        seed=seed,
        transform=transform,
        auto_refresh=num_workers > 0 if auto_refresh is None else auto_refresh,
        offline_fraction=offline_fraction,
        **dataset_kwargs,
    )
    loader = DataLoader(
        dataset,
        batch_size=None,
        num_workers=num_workers,
        pin_memory=pin_memory,
        worker_init_fn=_seed_worker if num_workers > 0 else None,
        generator=torch.Generator().manual_seed(seed),
        persistent_workers=num_workers > 0,
        prefetch_factor=2 if num_workers > 0 else None,
    )
    return ReplayLoader(loader)
