"""icrl.fileio.atomic_path: the one way icrl writes files and folders atomically."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from icrl.fileio import atomic_path, write_text_atomic


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
