"""One rollout file: written atomically as an uncompressed `.npz`, read back without pickle, and its length read
from its contents. Why a module of its own: the buffer (`storage`) counts and evicts by file, and must never trust
a file's name or type, so reading one file safely is a contract of its own.

A replay folder may be shared or downloaded: loading uses `np.load(allow_pickle=False)` only (data, never code),
and opens only regular files (a FIFO named like a rollout would block a reader forever, a symlink could lead out).
"""

from __future__ import annotations

import os
import uuid
import zipfile
from dataclasses import fields
from pathlib import Path
from typing import BinaryIO

import numpy as np

from icrl.fileio import atomic_path, open_regular
from icrl.guards import nonfinite_keys
from icrl.types import Rollout

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
    with atomic_path(path, fsync=fsync, tmp_name=f"{path.name}.{uuid.uuid4().hex[:8]}{TMP_SUFFIX}") as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, allow_pickle=False, **arrays)
    return path


def load_rollout(path: str | os.PathLike) -> Rollout:
    """Read a file written by `save_rollout`, fully into memory.

    Raises FileNotFoundError if the file does not exist (e.g. evicted by another process: not an error
    for a sampler) and CorruptRolloutError for anything else that prevents a valid Rollout.
    """
    path = Path(path)
    # We open the file ourselves so it is closed on every error path (np.load leaks it on a bad zip).
    with _open_file(path) as fh:  # FileNotFoundError propagates
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
    nonfinite = nonfinite_keys(arrays)
    if nonfinite:  # one NaN reward or observation would poison every weight it reaches (icrl.guards)
        raise CorruptRolloutError(path, f"non-finite values (NaN or inf) in {nonfinite}")
    try:
        return Rollout.from_arrays(arrays)
    except (ValueError, TypeError) as e:
        raise CorruptRolloutError(path, f"inconsistent fields ({e})") from e


def _open_file(path: Path) -> BinaryIO:
    """`path` opened for reading; a symlink, FIFO or folder named like a rollout is a corrupt file (a FIFO would
    block the reader forever), a missing one FileNotFoundError."""
    try:
        return os.fdopen(open_regular(path), "rb")
    except FileNotFoundError:
        raise
    except OSError as e:
        raise CorruptRolloutError(path, f"not a regular file ({e.strerror or e})") from e


_PER_ACTION = ("action", "reward", "terminated", "truncated")  # T - 1 rows; every other field has T


def stored_timesteps(path: str | os.PathLike) -> int:
    """The rollout's length T read from the file's contents, and checked against them: every field is an
    uncompressed member whose size is exactly its header plus the data the header describes, the members
    together fit in the file as it is on disk, the required fields are there and their lengths agree (T
    timesteps, T - 1 actions). Only headers are read, not data. Why: eviction deletes by this length, so a
    forged name, or a file whose header claims data it does not hold (a 200-byte file announcing 5,000,000
    timesteps), must never count. CorruptRolloutError for any disagreement, FileNotFoundError when the file is
    gone."""
    path = Path(path)
    with _open_file(path) as fh:
        on_disk = os.fstat(fh.fileno()).st_size
        try:
            with zipfile.ZipFile(fh) as zf:
                shapes, held = _member_shapes(zf, path)
        except (KeyError, ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
            raise CorruptRolloutError(path, f"unreadable members ({type(e).__name__}: {e})") from e
    if held > on_disk:
        raise CorruptRolloutError(path, f"its members claim {held} bytes, the file holds {on_disk}")
    missing = [name for name in _REQUIRED if name not in shapes]
    if missing:
        raise CorruptRolloutError(path, f"missing fields {missing}")
    shape = shapes["time"]
    if len(shape) != 1 or shape[0] < 1:
        raise CorruptRolloutError(path, f"time array of shape {shape}, expected (T,)")
    T = int(shape[0])
    wrong = {k: v for k, v in shapes.items() if not v or v[0] != (T - 1 if k in _PER_ACTION else T)}
    if wrong:
        raise CorruptRolloutError(path, f"field lengths {wrong} disagree with its {T} timesteps")
    return T


def _member_shapes(zf: zipfile.ZipFile, path: Path) -> tuple[dict[str, tuple[int, ...]], int]:
    """Each `.npy` member's shape (by field name) from its header, and the bytes the members occupy; a member
    that is compressed, or whose size is not its header plus its data, is corrupt."""
    fmt, shapes, held = np.lib.format, {}, 0
    for info in zf.infolist():
        if not info.filename.endswith(".npy"):
            continue
        if info.compress_type != zipfile.ZIP_STORED:  # save_rollout writes uncompressed members
            raise CorruptRolloutError(path, f"member {info.filename} is compressed")
        with zf.open(info) as member:
            read = fmt.read_array_header_1_0 if fmt.read_magic(member) == (1, 0) else fmt.read_array_header_2_0
            shape, _, dtype = read(member)
            data = int(np.prod(shape, dtype=np.float64)) * dtype.itemsize
            if info.file_size != member.tell() + data:
                raise CorruptRolloutError(path, f"member {info.filename} claims {shape} {dtype} in {info.file_size} "
                                                "bytes")
        shapes[info.filename[: -len(".npy")]] = tuple(int(d) for d in shape)
        held += info.compress_size
    return shapes, held
