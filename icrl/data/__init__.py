"""Replay on disk (docs/design.md §6): atomic rollout files, a FIFO/protected buffer, and a windowed sampler."""

from icrl.data.collate import collate_windows
from icrl.data.sampler import (
    EmptyReplayError,
    ReplayDataset,
    ReplayLoader,
    RolloutCache,
    make_loader,
    worker_seed,
)
from icrl.data.storage import (
    CorruptRolloutError,
    DiskReplay,
    RolloutFile,
    list_rollout_files,
    load_rollout,
    rollout_file_name,
    save_rollout,
)

__all__ = [
    "CorruptRolloutError",
    "DiskReplay",
    "EmptyReplayError",
    "ReplayDataset",
    "ReplayLoader",
    "RolloutCache",
    "RolloutFile",
    "collate_windows",
    "list_rollout_files",
    "load_rollout",
    "make_loader",
    "rollout_file_name",
    "save_rollout",
    "worker_seed",
]
