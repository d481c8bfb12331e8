"""Crash-safe writes: a killed process leaves either the old file (or folder) or the new one, never half of one.

Every atomic write in icrl goes through `atomic_path`: write to a temporary name beside the target (same file
system, so the rename is atomic), then `os.replace` it onto the target.

A run directory may be shared or downloaded, so what it contains is not trusted: `check_inside` is the one test that
a path icrl writes, truncates or deletes resolves inside the run directory (a symlink in it that leads out is
refused), and `open_regular` opens a file without following a symlink or blocking on a FIFO.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from icrl.config.errors import flag


class OutsideRunDirError(ValueError):
    """A path icrl would write, truncate or delete leads outside its run directory (a symlink inside it)."""


def check_inside(root: str | os.PathLike, path: str | os.PathLike) -> Path:
    """Return `path` when it resolves inside `root` (symlinks followed, `root` itself may be one); raise
    OutsideRunDirError (one line, naming the path and the fix) when a symlink in it leads elsewhere. Why: icrl must
    never write, truncate or delete outside the run directory, whatever a shared or downloaded one contains."""
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if os.path.commonpath([real_root, real]) != real_root:
        raise OutsideRunDirError(f"{path} leads outside {root} (to {real}): icrl writes only inside the run "
                                 f"directory; remove that symlink or choose another {flag('run_dir')}")
    return Path(path)


def open_regular(path: str | os.PathLike, flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
    """A descriptor of the regular file `path`, opened without following a final symlink and without blocking on
    a FIFO; OSError when `path` is a symlink, FIFO, folder or device (a bad file, skipped or refused by callers)."""
    nofollow = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    fd = os.open(path, flags | nofollow, mode)
    try:
        kind = os.fstat(fd).st_mode
        if not stat.S_ISREG(kind):
            what = "a folder" if stat.S_ISDIR(kind) else "a FIFO" if stat.S_ISFIFO(kind) else "a device or socket"
            raise OSError(errno.EINVAL, what, os.fspath(path))
        if nofollow and hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_json_record(path: str | os.PathLike, limit: int = 16 << 20) -> Any:
    """The JSON of a small regular file icrl wrote (a run's state.json, spaces.json): never blocks on a FIFO, never
    reads more than `limit` bytes. OSError or ValueError (not JSON, too large) for anything else."""
    with os.fdopen(open_regular(path), "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{path} is larger than {limit:,} bytes: not a record icrl wrote")
    return json.loads(data.decode("utf-8"))


def fsync_dir(folder: str | os.PathLike) -> None:
    """Make a rename inside `folder` durable (POSIX). Not supported everywhere (e.g. Windows): best effort."""
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


def fsync_file(path: str | os.PathLike) -> None:
    """Flush a written file's data to disk (any descriptor of the file will do)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_path(
    path: str | os.PathLike, *, fsync: bool = True, tmp_name: str | None = None, suffix: str = ".tmp"
) -> Iterator[Path]:
    """Yield a temporary path beside `path` to write a file or a folder to; on success it is renamed onto
    `path`, on an exception it is removed.

    fsync: fsync the temporary file (or folder) before the rename and the parent folder after it, so the
    new contents survive a power loss; without it the write is still crash-safe. The temporary name is
    `tmp_name` (not created; the caller writes it), or else a new empty file `.<name>.<random><suffix>`
    from `tempfile.mkstemp` (`suffix` keeps an extension that writers choose a format by).
    """
    path = Path(path)
    if tmp_name is None:
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
        os.close(fd)
        tmp = Path(name)
    else:
        tmp = path.with_name(tmp_name)
    try:
        yield tmp
        if fsync and tmp.is_dir():
            fsync_dir(tmp)
        elif fsync:
            fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        raise
    if fsync:
        fsync_dir(path.parent)


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write `text` to `path` atomically and durably (see `atomic_path`)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)
