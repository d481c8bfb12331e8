"""icrl.fileio.atomic_path: the one way icrl writes files and folders atomically."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from icrl.fileio import OutsideRunDirError, atomic_path, check_inside, open_regular, write_text_atomic


def test_success_replaces_the_target_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "a.txt"
    target.write_text("old")
    with atomic_path(target, suffix=".txt") as tmp:
        assert tmp.parent == tmp_path and tmp.name.endswith(".txt") and tmp.exists()  # mkstemp made it
        assert target.read_text() == "old"  # nothing visible before the rename
        tmp.write_text("new")
    assert target.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]
    assert write_text_atomic(target, "newer") == target and target.read_text() == "newer"


def test_failure_keeps_the_old_file_and_removes_the_temp(tmp_path: Path) -> None:
    target = tmp_path / "a.bin"
    target.write_bytes(b"old")
    for tmp_name in (None, "a.bin.1234.tmp"):
        with pytest.raises(RuntimeError), atomic_path(target, tmp_name=tmp_name) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("killed mid-write")
        assert target.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["a.bin"]


def test_folders_and_fsync_switch(tmp_path: Path, monkeypatch) -> None:
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    with atomic_path(tmp_path / "ckpt", tmp_name=".tmp-ckpt") as tmp:
        tmp.mkdir()
        (tmp / "x").write_text("1")
    assert (tmp_path / "ckpt" / "x").read_text() == "1" and len(synced) == 2  # the folder, then its parent
    with pytest.raises(ValueError), atomic_path(tmp_path / "ckpt2", tmp_name=".tmp-ckpt2") as tmp:
        tmp.mkdir()
        (tmp / "x").write_text("1")
        raise ValueError
    assert not (tmp_path / ".tmp-ckpt2").exists() and not (tmp_path / "ckpt2").exists()
    synced.clear()
    with atomic_path(tmp_path / "b", fsync=False) as tmp:
        tmp.write_text("b")
    assert synced == [] and (tmp_path / "b").read_text() == "b"


def test_check_inside_follows_the_root_but_refuses_links_that_lead_out(tmp_path: Path) -> None:
    real, outside = tmp_path / "real", tmp_path / "outside"
    (real / "sub").mkdir(parents=True)
    outside.mkdir()
    root = tmp_path / "root"
    root.symlink_to(real)  # a run dir the user names through a symlink is fine
    assert check_inside(root, root / "sub" / "f") == root / "sub" / "f"
    (real / "out").symlink_to(outside)
    (real / "dangling").symlink_to(outside / "missing")
    for name in ("out", "dangling", "../x"):
        with pytest.raises(OutsideRunDirError, match="leads outside"):
            check_inside(root, root / name)


def test_open_regular_refuses_symlinks_fifos_and_folders_without_blocking(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    os.close(open_regular(tmp_path / "file"))
    (tmp_path / "link").symlink_to(tmp_path / "file")
    (tmp_path / "loop").symlink_to("loop")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    for name in ("link", "loop", "fifo", "dir"):
        with pytest.raises(OSError):
            open_regular(tmp_path / name)
    with pytest.raises(OSError, match="a FIFO"):
        open_regular(tmp_path / "fifo", os.O_RDWR)
