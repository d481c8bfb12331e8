"""Rollout files and the shared disk buffer: exact round trips, atomicity under SIGKILL, concurrent
writers, FIFO eviction, protected data, and refusal of pickled / corrupt files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from icrl.data import CorruptRolloutError, DiskReplay, list_rollout_files, load_rollout, save_rollout
from icrl.types import ActionSpec, Rollout

SPECS = [ActionSpec("discrete", 5), ActionSpec("continuous", 3), ActionSpec("multibinary", 4)]


def make_rollout(T: int, spec: ActionSpec, seed: int = 0, image: bool = True, goals: bool = False) -> Rollout:
    """A contract-conforming rollout of T actions; obs['state'][:, 0] counts timesteps."""
    rng = np.random.default_rng(seed)
    if spec.kind == "discrete":
        action = rng.integers(spec.dim, size=T).astype(np.int64)
    elif spec.kind == "continuous":
        action = rng.uniform(-1, 1, (T, spec.dim)).astype(np.float32)
    else:
        action = rng.integers(2, size=(T, spec.dim)).astype(np.int8)
    reward = rng.normal(size=T).astype(np.float32)
    prev_action = np.zeros((T + 1, spec.dim), np.float32)
    prev_action[1:] = spec.to_vector(action)
    prev_reward = np.concatenate([[0.0], reward]).astype(np.float32)
    state = rng.normal(size=(T + 1, 4)).astype(np.float32)
    state[:, 0] = np.arange(T + 1)
    obs = {"state": state}
    if image:
        obs["image"] = rng.integers(256, size=(T + 1, 6, 5, 3), dtype=np.uint8)
    reset = np.zeros(T + 1, bool)
    reset[0] = True
    terminated = np.zeros(T, bool)
    terminated[-1:] = True
    achieved = None
    if goals:
        achieved = np.full((T + 1, 2), -1, np.int64)
        achieved[1::3, 0] = 7
    return Rollout(
        obs=obs,
        prev_action=prev_action,
        prev_reward=prev_reward,
        time=np.arange(T + 1, dtype=np.int64),
        reset=reset,
        action=action,
        reward=reward,
        terminated=terminated,
        truncated=np.zeros(T, bool),
        achieved=achieved,
    )


def assert_rollouts_equal(a: Rollout, b: Rollout) -> None:
    aa, bb = a.to_arrays(), b.to_arrays()
    assert aa.keys() == bb.keys()
    for k in aa:
        assert aa[k].dtype == bb[k].dtype, k
        assert aa[k].shape == bb[k].shape, k
        np.testing.assert_array_equal(aa[k], bb[k], err_msg=k)


# ------------------------------------------------------------------------------------------------------
# One file
# ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kind)
@pytest.mark.parametrize("goals", [False, True])
def test_round_trip_exact(tmp_path: Path, spec: ActionSpec, goals: bool) -> None:
    r = make_rollout(9, spec, seed=1, goals=goals)
    path = save_rollout(tmp_path / "r.npz", r)
    assert path == tmp_path / "r.npz"
    assert os.listdir(tmp_path) == ["r.npz"]  # no temp file left
    back = load_rollout(path)
    assert_rollouts_equal(r, back)
    assert back.obs["image"].dtype == np.uint8
    assert back.action.dtype == spec.storage_dtype


def test_single_timestep_rollout(tmp_path: Path) -> None:
    r = make_rollout(0, SPECS[0])
    assert_rollouts_equal(r, load_rollout(save_rollout(tmp_path / "r.npz", r)))


def test_save_refuses_object_arrays(tmp_path: Path) -> None:
    r = make_rollout(3, SPECS[0])
    r.obs["bad"] = np.array([{}, {}, {}, {}], dtype=object)
    with pytest.raises(TypeError, match="object"):
        save_rollout(tmp_path / "r.npz", r)
    assert os.listdir(tmp_path) == []


class _Trap:
    """Unpickling this creates a marker file: proof that loading never runs pickle."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_load_refuses_pickled_arrays(tmp_path: Path) -> None:
    marker = tmp_path / "unpickled"
    arrays = make_rollout(3, SPECS[0]).to_arrays()
    arrays["obs/evil"] = np.array([_Trap(str(marker))] * 4, dtype=object)
    path = tmp_path / "evil.npz"
    np.savez(path, **arrays)  # numpy pickles object arrays by default
    with pytest.raises(CorruptRolloutError, match="evil.npz") as e:
        load_rollout(path)
    assert "pickle" in e.value.reason.lower()
    assert e.value.path == path
    assert not marker.exists()
    # a bare pickle file, too
    raw = tmp_path / "raw.npz"
    import pickle

    raw.write_bytes(pickle.dumps(_Trap(str(marker))))
    with pytest.raises(CorruptRolloutError):
        load_rollout(raw)
    assert not marker.exists()


def test_corrupt_files_raise_clear_error(tmp_path: Path) -> None:
    good = save_rollout(tmp_path / "good.npz", make_rollout(20, SPECS[1]))
    data = good.read_bytes()
    cases = {
        "truncated.npz": data[: len(data) // 2],
        "truncated_tail.npz": data[:-10],
        "garbage.npz": b"\x00\x13garbage" * 100,
        "empty.npz": b"",
    }
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF  # CRC mismatch inside a member
    cases["flipped.npz"] = bytes(flipped)
    for name, content in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(CorruptRolloutError, match=name):
            load_rollout(tmp_path / name)
    # missing fields / inconsistent lengths
    arrays = make_rollout(5, SPECS[0]).to_arrays()
    np.savez(tmp_path / "missing.npz", **{k: v for k, v in arrays.items() if k != "reward"})
    with pytest.raises(CorruptRolloutError, match="reward"):
        load_rollout(tmp_path / "missing.npz")
    arrays["reward"] = arrays["reward"][:-1]
    np.savez(tmp_path / "short.npz", **arrays)
    with pytest.raises(CorruptRolloutError, match="reward"):
        load_rollout(tmp_path / "short.npz")
    with pytest.raises(FileNotFoundError):
        load_rollout(tmp_path / "absent.npz")


# ------------------------------------------------------------------------------------------------------
# The buffer
# ------------------------------------------------------------------------------------------------------


def test_names_sort_by_creation_and_encode_length(tmp_path: Path) -> None:
    replay = DiskReplay(tmp_path, capacity_timesteps=10**6, fsync=False)
    paths = [replay.write(make_rollout(T, SPECS[0], image=False)) for T in (3, 1, 4, 1, 5)]
    listed = replay.files("fifo")
    assert [f.path for f in listed] == paths
    assert [f.num_timesteps for f in listed] == [4, 2, 5, 2, 6]
    assert replay.num_timesteps() == 19 and replay.num_rollouts() == 5
    assert len({p.name for p in paths}) == 5


def test_fifo_eviction_and_protected_folder(tmp_path: Path) -> None:
    replay = DiskReplay(tmp_path, capacity_timesteps=25, fsync=False)
    demos = [replay.write(make_rollout(30, SPECS[0], image=False), protected=True) for _ in range(2)]
    written = []
    for i in range(10):
        written.append(replay.write(make_rollout(9, SPECS[0], seed=i, image=False)))  # 10 timesteps each
        assert replay.num_timesteps("fifo") <= 25
    # oldest first: only the two newest fifo files fit
    assert [f.path for f in replay.files("fifo")] == written[-2:]
    assert [f.path for f in replay.files("protected")] == demos  # over capacity, yet never evicted
    assert replay.num_timesteps() == 20 + 62
    for f in replay.files():
        load_rollout(f.path)
    # the newest file is kept even when it alone exceeds the capacity
    big = replay.write(make_rollout(40, SPECS[0], image=False))
    assert [f.path for f in replay.files("fifo")] == [big]
    assert replay.evict() == []


def test_eviction_tolerates_files_deleted_by_others(tmp_path: Path, monkeypatch) -> None:
    import icrl.data.storage as storage

    replay = DiskReplay(tmp_path, capacity_timesteps=10**6, fsync=False)
    for _i in range(4):
        replay.write(make_rollout(9, SPECS[0], image=False))
    replay.capacity_timesteps = 10
    files = replay.files("fifo")
    names = os.listdir(replay.fifo_dir)
    files[0].path.unlink()  # another process evicted it after this process listed the folder
    monkeypatch.setattr(storage, "_listdir", lambda folder: list(names))
    deleted = replay.evict()
    monkeypatch.undo()
    assert deleted == [f.path for f in files[1:3]]
    assert replay.num_timesteps("fifo") == 10 == replay.fifo_estimate


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _count_listings(monkeypatch, folder: Path) -> list[int]:
    """Counts real listings (readdir) of `folder`."""
    import icrl.data.storage as storage

    calls = [0]
    real = storage._listdir

    def listdir(path):
        calls[0] += os.fspath(path) == os.fspath(folder)
        return real(path)

    monkeypatch.setattr(storage, "_listdir", listdir)
    return calls


def test_writes_list_the_folder_only_when_eviction_is_due(tmp_path: Path, monkeypatch) -> None:
    """One writer: the running estimate is exact, capacity holds after every write, and the folder is
    listed only when the estimate crosses the capacity; eviction goes down to the low-water mark."""
    replay = DiskReplay(tmp_path, capacity_timesteps=100, fsync=False, low_water=0.8, recount_seconds=1e9)
    listings = _count_listings(monkeypatch, replay.fifo_dir)
    written, per_write = [], []
    for i in range(30):
        written.append(replay.write(make_rollout(9, SPECS[0], seed=i, image=False)))  # 10 timesteps each
        per_write.append(listings[0])
    assert per_write[:10] == [0] * 10  # 100 timesteps: at capacity, not over it
    # the 11th write lists and evicts down to 80 (8 files); then every 3rd write (110 > 100) does
    assert [per_write[i] - per_write[i - 1] for i in range(10, 30)] == [1, 0, 0] * 6 + [1, 0]
    assert replay.fifo_estimate == 90
    on_disk = replay.files("fifo")
    assert [f.path for f in on_disk] == written[-9:] and replay.num_timesteps("fifo") == 90


def test_each_write_checks_the_capacity_after_writes_by_others(tmp_path: Path) -> None:
    """Two writers (two instances, one process, fake clocks): each one sees the other's files at its next
    recount, so the capacity holds again within one `recount_seconds` interval; `evict()` enforces it."""
    kw = dict(capacity_timesteps=100, fsync=False, recount_seconds=10.0)
    a, b = DiskReplay(tmp_path, **kw), DiskReplay(tmp_path, **kw)
    a._clock, a._last_count = (clock_a := _Clock()), 0.0
    b._clock, b._last_count = (clock_b := _Clock()), 0.0
    r = make_rollout(9, SPECS[0], image=False)  # 10 timesteps
    for _ in range(5):
        a.write(r)
    for _ in range(8):
        b.write(r)  # b has not seen a's 50 timesteps
    a.write(r)
    assert (a.fifo_estimate, b.fifo_estimate, a.num_timesteps("fifo")) == (60, 80, 140)  # over capacity
    clock_a.t = 10.0  # one recount interval later, a's next write lists the folder and evicts
    a.write(r)
    assert a.num_timesteps("fifo") == a.fifo_estimate == 90  # down to <= 95% of the capacity
    b.write(r)  # b's estimate is stale (90) but low, so its writes stay cheap; reality is 100
    assert b.num_timesteps("fifo") == 100 and b.fifo_estimate == 90
    clock_b.t = 10.0
    b.write(r)
    assert b.num_timesteps("fifo") <= 100 and b.fifo_estimate == b.num_timesteps("fifo")
    for _ in range(3):
        b.write(r)  # 100, 110 -> evicts to 90, 100
    a.write(r)
    assert a.fifo_estimate == 100 and a.num_timesteps("fifo") == 110  # a's stale estimate: overshoot...
    a.evict()
    assert a.num_timesteps("fifo") <= 95  # ...until the next recount or an explicit evict()


def test_default_durability_and_options(tmp_path: Path, monkeypatch) -> None:
    """fsync applies to fifo writes, fsync_protected to protected ones (default True): both independent."""
    synced = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd))
    replay = DiskReplay(tmp_path, capacity_timesteps=100, fsync=False)
    replay.write(make_rollout(3, SPECS[0], image=False))
    assert synced == []
    replay.write(make_rollout(3, SPECS[0], image=False), protected=True)
    assert len(synced) == 2  # the file and its folder
    DiskReplay(tmp_path, capacity_timesteps=100).write(make_rollout(3, SPECS[0], image=False))
    assert len(synced) == 4
    with pytest.raises(ValueError, match="low_water"):
        DiskReplay(tmp_path, capacity_timesteps=100, low_water=0.0)


def test_folder_index_is_incremental_and_trusts_only_old_mtimes(tmp_path: Path, monkeypatch) -> None:
    from icrl.data.storage import FolderIndex, rollout_file_name

    folder = tmp_path / "f"
    folder.mkdir()
    names = [rollout_file_name(t) for t in (3, 5, 7)]
    for n in names:
        (folder / n).write_bytes(b"")
    (folder / "notes.txt").write_bytes(b"")
    (folder / (names[0] + ".abcd1234.tmp")).write_bytes(b"")
    listings = _count_listings(monkeypatch, folder)
    index = FolderIndex(folder, trust_after_s=1.0)
    assert index.scan() and index.names == names and index.total == 15 and listings[0] == 1
    assert index.scan() and listings[0] == 2  # the folder changed just now: its mtime is not trusted yet
    old = time.time() - 60
    os.utime(folder, (old, old))
    assert index.scan() and listings[0] == 3
    assert not index.scan() and listings[0] == 3  # unchanged since a trusted listing: nothing read
    snapshot = index.names
    (folder / names[1]).unlink()
    new = rollout_file_name(11)
    (folder / new).write_bytes(b"")
    assert index.scan() and listings[0] == 4
    assert index.names == [names[0], names[2], new] and index.total == 3 + 7 + 11
    assert snapshot == names  # earlier snapshots are never mutated
    assert [f.name for f in list_rollout_files(folder)] == index.names  # listing 5
    never = FolderIndex(folder, trust_after_s=None)
    os.utime(folder, (old, old))
    never.scan(), never.scan()
    assert listings[0] == 7  # never trusted: always read
    index.forget_oldest(2)
    assert index.names == [new] and index.steps == {new: 11} and index.total == 11
    assert FolderIndex(tmp_path / "missing").scan() is True


def test_temp_files_are_ignored_and_stale_ones_cleaned(tmp_path: Path) -> None:
    replay = DiskReplay(tmp_path, capacity_timesteps=100, fsync=False)
    replay.write(make_rollout(3, SPECS[0], image=False))
    stale = replay.fifo_dir / "00000000000000000001-1-abcdef01-T9.npz.1234abcd.tmp"
    fresh = replay.protected_dir / "00000000000000000002-1-abcdef02-T9.npz.1234abcd.tmp"
    foreign = replay.fifo_dir / "notes.txt"
    for p in (stale, fresh, foreign):
        p.write_bytes(b"partial")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    assert replay.num_rollouts() == 1
    DiskReplay(tmp_path, capacity_timesteps=100, stale_tmp_seconds=600)
    assert not stale.exists() and fresh.exists() and foreign.exists()


# ------------------------------------------------------------------------------------------------------
# Several processes
# ------------------------------------------------------------------------------------------------------

_WRITER = r"""
import sys
import numpy as np
from icrl.data import DiskReplay
from icrl.types import Rollout

mode, seed, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
roots = sys.argv[4::3]
caps = [int(c) for c in sys.argv[5::3]]
recounts = [float(c) for c in sys.argv[6::3]]
replays = [DiskReplay(r, c, recount_seconds=s) for r, c, s in zip(roots, caps, recounts)]


def rollout(T, img, tag):
    obs = {"state": np.full((T + 1, 4), tag, np.float32),
           "image": np.full((T + 1, img, img, 3), tag % 251, np.uint8)}
    z = lambda *shape, dtype=np.float32: np.zeros(shape, dtype)  # noqa: E731
    return Rollout(obs=obs, prev_action=z(T + 1, 2), prev_reward=z(T + 1), time=np.arange(T + 1),
                   reset=np.arange(T + 1) == 0, action=z(T, dtype=np.int64), reward=z(T),
                   terminated=z(T, dtype=bool), truncated=z(T, dtype=bool))


i = 0
while mode == "forever" or i < n:
    T = 5 + (seed * 1000 + i) % 50 if mode == "count" else 400
    r = rollout(T, 64 if mode == "forever" else 4, seed * 1000 + i)
    for replay in replays:
        replay.write(r)
    i += 1
"""


def _spawn_writer(mode: str, seed: int, n: int, *buffers: tuple) -> subprocess.Popen:
    """buffers: (root, capacity) or (root, capacity, recount_seconds)."""
    args = [sys.executable, "-c", _WRITER, mode, str(seed), str(n)]
    for root, cap, *recount in buffers:
        args += [str(root), str(cap), str(recount[0] if recount else 5.0)]
    return subprocess.Popen(args, stderr=subprocess.PIPE)


def _wait_for(cond, timeout: float, proc: subprocess.Popen) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        if proc.poll() is not None:
            raise AssertionError(f"writer exited early: {proc.stderr.read().decode()}")
        time.sleep(0.002)
    return False


def _freeze_mid_write(proc: subprocess.Popen, fifo: Path, timeout: float) -> bool:
    """Stop `proc` (SIGSTOP) at a moment it has a temp file in `fifo`, i.e. mid-write; True once it is
    frozen there. A temp file seen just before the stop may be renamed before the stop lands, so the check
    is repeated on the frozen process, which is thawed to try again when the write had finished."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _wait_for(lambda: any(n.endswith(".tmp") for n in os.listdir(fifo)), deadline - time.monotonic(), proc):
            return False
        proc.send_signal(signal.SIGSTOP)
        if not _stopped(proc):
            return False
        if any(n.endswith(".tmp") for n in os.listdir(fifo)):
            return True
        proc.send_signal(signal.SIGCONT)
    return False


def _stopped(proc: subprocess.Popen) -> bool:
    """Block until `proc` has stopped (SIGSTOP is asynchronous); False if it exited instead. WUNTRACED
    reports the stop without reaping the process, so Popen still owns it."""
    _, status = os.waitpid(proc.pid, os.WUNTRACED)
    return os.WIFSTOPPED(status)


@pytest.mark.slow
def test_sigkill_mid_write_leaves_only_complete_files(tmp_path: Path) -> None:
    """A writer killed while writing ~10 MB rollouts: every listed file loads; the temp file is ignored.
    Each kill lands mid-write by construction, not by timing: the writer is frozen (SIGSTOP) and killed
    only if a temp file is there while it is frozen, else it is thawed and caught at a later write."""
    for trial in range(3):
        root = tmp_path / f"b{trial}"
        fifo = root / "fifo"
        proc = _spawn_writer("forever", trial, 0, (root, 1200))
        try:
            assert _wait_for(lambda: len(list_rollout_files(fifo)) >= 1, 60, proc), "writer never wrote"  # noqa: B023 - called within this iteration
            assert _freeze_mid_write(proc, fifo, 60), "never caught the writer with a temp file open"
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.communicate()  # reap it and close its stderr pipe
        assert proc.returncode == -signal.SIGKILL
        leftovers = [n for n in os.listdir(fifo) if n.endswith(".tmp")]
        assert leftovers  # killed mid-write: the half-written temp file is still there
        replay = DiskReplay(root, capacity_timesteps=1200, stale_tmp_seconds=3600)
        files = replay.files()
        assert files and len(files) <= 3
        for f in files:
            r = load_rollout(f.path)
            assert r.num_timesteps == f.num_timesteps == 401
            assert r.obs["image"].shape == (401, 64, 64, 3)
            assert np.all(r.obs["state"] == r.obs["state"][0, 0])
        for name in leftovers:  # a killed writer's temp file is invisible and cleaned once stale
            assert name not in {f.name for f in files}
        DiskReplay(root, capacity_timesteps=1200, stale_tmp_seconds=0)
        assert not [n for n in os.listdir(fifo) if n.endswith(".tmp")]


@pytest.mark.slow
def test_two_writer_processes_share_one_buffer(tmp_path: Path) -> None:
    """`big` never evicts; `small` is recounted at every write (recount_seconds=0), so the last listing
    sees every file and the capacity holds once both are done; `lazy` uses the default interval, and
    one explicit evict() after both are done enforces the capacity."""
    n, cap = 40, 300
    big, small, lazy = tmp_path / "big", tmp_path / "small", tmp_path / "lazy"
    buffers = (big, 10**9), (small, cap, 0.0), (lazy, cap, 3600.0)
    procs = [_spawn_writer("count", seed, n, *buffers) for seed in (1, 2)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
    expected = sorted(5 + (seed * 1000 + i) % 50 + 1 for seed in (1, 2) for i in range(n))
    full = DiskReplay(big, capacity_timesteps=10**9)
    files = full.files()
    assert len(files) == 2 * n
    assert sorted(f.num_timesteps for f in files) == expected
    assert full.num_timesteps() == sum(expected)
    tags = set()
    for f in files:
        r = load_rollout(f.path)
        assert r.num_timesteps == f.num_timesteps
        tags.add(int(r.obs["state"][0, 0]))
    assert tags == {seed * 1000 + i for seed in (1, 2) for i in range(n)}
    capped = DiskReplay(small, capacity_timesteps=cap)
    assert 0 < capped.num_timesteps() <= cap  # the last evictor saw every file
    for f in capped.files():
        assert load_rollout(f.path).num_timesteps == f.num_timesteps
    lazy_replay = DiskReplay(lazy, capacity_timesteps=cap)
    lazy_replay.evict()
    assert 0 < lazy_replay.num_timesteps() <= cap
    for f in lazy_replay.files():
        assert load_rollout(f.path).num_timesteps == f.num_timesteps


def test_eviction_reads_lengths_from_the_files_not_their_names(tmp_path: Path) -> None:
    """A copied rollout renamed `-T<huge>` once made eviction delete every genuine rollout (issue 20)."""
    from icrl.data.storage import stored_timesteps

    replay = DiskReplay(tmp_path, capacity_timesteps=100, fsync=False)
    genuine = [replay.write(make_rollout(9, SPECS[0], seed=i, image=False)) for i in range(5)]  # 50 timesteps
    assert stored_timesteps(genuine[0]) == 10
    forged = replay.fifo_dir / f"{time.time_ns():020d}-1-deadbeef-T{10**30}.npz"
    forged.write_bytes(genuine[-1].read_bytes())
    warned: list[str] = []
    again = DiskReplay(tmp_path, capacity_timesteps=100, fsync=False, log=warned.append)
    assert again.num_timesteps("fifo") == 50 and again.evict() == []
    again.write(make_rollout(9, SPECS[0], image=False))
    assert all(p.exists() for p in [*genuine, forged])
    assert len(warned) == 1 and str(forged) in warned[0] and "contents 10" in warned[0]


def _header_only_npz(path: Path, fields: dict[str, tuple[tuple[int, ...], str]]) -> None:
    """An npz whose members hold only an .npy header (the shape and dtype given), no data: a few hundred bytes
    that announce as many timesteps as the forger likes."""
    import io
    import zipfile

    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for name, (shape, dtype) in fields.items():
            head = io.BytesIO()
            np.lib.format.write_array_header_1_0(head, {"descr": np.dtype(dtype).str, "fortran_order": False,
                                                        "shape": shape})
            zf.writestr(f"{name}.npy", head.getvalue())


@pytest.mark.parametrize("length", [5_000_000, 10**30])
def test_eviction_trusts_no_header_without_its_data(tmp_path: Path, length: int) -> None:
    """A ~200-byte file in replay/fifo whose headers claim `length` timesteps (named to match, the newest) once
    made a resumed run delete every genuine rollout; its members must hold what their headers describe."""
    from icrl.data.storage import rollout_file_name, stored_timesteps

    replay = DiskReplay(tmp_path, capacity_timesteps=100, fsync=False)
    genuine = [replay.write(make_rollout(9, SPECS[0], seed=i, image=False)) for i in range(5)]
    forged = replay.fifo_dir / rollout_file_name(length)
    T, per_step = (length,), ("prev_action", "prev_reward", "time", "reset", "obs/obs")
    _header_only_npz(forged, {**{k: (T, "<i8") for k in per_step},
                              **{k: ((length - 1,), "<i8") for k in ("action", "reward", "terminated", "truncated")}})
    assert forged.stat().st_size < 4096  # nine headers
    with pytest.raises(CorruptRolloutError, match="claims"):
        stored_timesteps(forged)
    warned: list[str] = []
    again = DiskReplay(tmp_path, capacity_timesteps=100, fsync=False, log=warned.append)
    assert again.num_timesteps("fifo") == 50 and again.evict() == []
    again.write(make_rollout(9, SPECS[0], image=False))
    assert all(p.exists() for p in genuine) and len(warned) == 1 and str(forged) in warned[0]


def test_stored_timesteps_needs_every_field_at_its_length(tmp_path: Path) -> None:
    from icrl.data.storage import stored_timesteps

    good = DiskReplay(tmp_path / "r", capacity_timesteps=100, fsync=False).write(make_rollout(9, SPECS[0], image=False))
    assert stored_timesteps(good) == 10
    only_time = tmp_path / "t.npz"
    np.savez(only_time, time=np.arange(10))
    with pytest.raises(CorruptRolloutError, match="missing fields"):
        stored_timesteps(only_time)
    arrays = dict(np.load(good))
    arrays["reward"] = np.zeros(40, np.float32)  # a real array, at the wrong length
    bad = tmp_path / "b.npz"
    np.savez(bad, **arrays)
    with pytest.raises(CorruptRolloutError, match="disagree"):
        stored_timesteps(bad)


def test_non_regular_entries_named_like_rollouts_are_corrupt_not_blocking(tmp_path: Path) -> None:
    from icrl.data.storage import rollout_file_name

    replay = DiskReplay(tmp_path, capacity_timesteps=5, fsync=False, log=lambda line: None)
    fifo = replay.fifo_dir / rollout_file_name(3)
    os.mkfifo(fifo)
    with pytest.raises(CorruptRolloutError, match="a FIFO"):
        load_rollout(fifo)
    for _ in range(3):
        replay.write(make_rollout(3, SPECS[0], image=False))  # over capacity: evicts, never the FIFO
    assert fifo.exists() and replay.num_rollouts("fifo") == 1


def test_stale_temp_cleanup_removes_only_the_writers_own_temporary_files(tmp_path: Path) -> None:
    from icrl.data.storage import clean_stale_tmp, rollout_file_name

    ours = tmp_path / f"{rollout_file_name(3)}.1234abcd.tmp"
    others = [tmp_path / "notes.tmp", tmp_path / f"{rollout_file_name(3)}.folder0.tmp"]
    ours.write_bytes(b"partial")
    others[0].write_text("a user's file")
    (tmp_path / f"{rollout_file_name(4)}.abcdef01.tmp").mkdir()  # named like ours, but a folder
    others[1].write_bytes(b"")
    old = time.time() - 3600
    for p in tmp_path.iterdir():
        os.utime(p, (old, old))
    assert clean_stale_tmp(tmp_path, older_than_s=60) == 1
    assert not ours.exists() and all(p.exists() for p in others) and len(list(tmp_path.iterdir())) == 3


def test_the_eviction_index_reads_each_file_once_and_never_its_own_writes(tmp_path: Path, monkeypatch) -> None:
    import icrl.data.storage as storage

    reads: list[str] = []
    real = storage.stored_timesteps
    monkeypatch.setattr(storage, "stored_timesteps", lambda path: reads.append(path) or real(path))
    replay = DiskReplay(tmp_path, capacity_timesteps=30, fsync=False)
    for i in range(6):
        replay.write(make_rollout(9, SPECS[0], seed=i, image=False))  # 10 timesteps each: evicts as it goes
    assert reads == [] and replay.num_timesteps("fifo") <= 30
    other = DiskReplay(tmp_path, capacity_timesteps=30, fsync=False)  # another process: reads each file once
    listed = other.num_rollouts("fifo")
    other.evict(), other.num_timesteps("fifo")
    assert len(reads) == listed
