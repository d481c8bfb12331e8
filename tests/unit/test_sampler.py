"""The windowed sampler: window contents, padding and masks, coverage of long rollouts, corrupt and
evicted files, the transform hook, the LRU cache, DataLoader workers and seeding."""

from __future__ import annotations

import dataclasses
import hashlib
import warnings
from itertools import islice
from pathlib import Path

import numpy as np
import pytest
import torch

from icrl.data import (
    DiskReplay,
    EmptyReplayError,
    ReplayDataset,
    RolloutCache,
    collate_windows,
    make_loader,
    rollout_file_name,
)
from icrl.types import ActionSpec, Batch, Rollout

DISCRETE, CONTINUOUS = ActionSpec("discrete", 3), ActionSpec("continuous", 2)


def make_rollout(T: int, spec: ActionSpec, tag: int = 0, goals: bool = False) -> Rollout:
    """T actions; obs['state'][:, 0] = tag, obs['state'][:, 1] = t, so every timestep is identifiable."""
    rng = np.random.default_rng(tag)
    if spec.kind == "discrete":
        action = rng.integers(spec.dim, size=T).astype(np.int64)
    else:
        action = rng.uniform(-1, 1, (T, spec.dim)).astype(np.float32)
    reward = (np.arange(T) + 1).astype(np.float32)
    prev_action = np.zeros((T + 1, spec.dim), np.float32)
    prev_action[1:] = spec.to_vector(action)
    state = np.stack([np.full(T + 1, tag), np.arange(T + 1), np.ones(T + 1), np.ones(T + 1)], 1)
    reset = np.zeros(T + 1, bool)
    reset[0] = True
    terminated = np.zeros(T, bool)
    terminated[-1:] = True
    achieved = np.full((T + 1, 2), 4, np.int64) if goals else None
    return Rollout(
        obs={"state": state.astype(np.float32), "image": np.full((T + 1, 4, 4, 3), 200, np.uint8)},
        prev_action=prev_action,
        prev_reward=np.concatenate([[0.0], reward]).astype(np.float32),
        time=np.arange(T + 1, dtype=np.int64),
        reset=reset,
        action=action,
        reward=reward,
        terminated=terminated,
        truncated=np.zeros(T, bool),
        achieved=achieved,
    )


def fill(root: Path, lengths: list[int], spec: ActionSpec, protected: int = 0) -> DiskReplay:
    replay = DiskReplay(root, capacity_timesteps=10**9, fsync=False)
    for i, T in enumerate(lengths):
        replay.write(make_rollout(T, spec, tag=i + 1), protected=i < protected)
    return replay


def batches_equal(a: Batch, b: Batch) -> bool:
    ta = [*a.inputs.obs.values(), a.inputs.prev_action, a.inputs.prev_reward, a.inputs.time, a.inputs.reset]
    tb = [*b.inputs.obs.values(), b.inputs.prev_action, b.inputs.prev_reward, b.inputs.time, b.inputs.reset]
    ta += [a.action, a.reward, a.terminated, a.truncated, a.mask, a.has_action]
    tb += [b.action, b.reward, b.terminated, b.truncated, b.mask, b.has_action]
    return all(torch.equal(x, y) for x, y in zip(ta, tb))


def all_fields(batch: Batch) -> dict[str, torch.Tensor]:
    out = {f"obs/{k}": v for k, v in batch.inputs.obs.items()}
    out.update(prev_action=batch.inputs.prev_action, prev_reward=batch.inputs.prev_reward)
    out.update(time=batch.inputs.time, reset=batch.inputs.reset, action=batch.action, reward=batch.reward)
    out.update(terminated=batch.terminated, truncated=batch.truncated, has_action=batch.has_action)
    if batch.achieved is not None:
        out["achieved"] = batch.achieved
    return out


# ------------------------------------------------------------------------------------------------------
# Windows
# ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", [DISCRETE, CONTINUOUS], ids=lambda s: s.kind)
def test_short_rollout_is_padded_with_zeros(spec: ActionSpec) -> None:
    r = make_rollout(4, spec, tag=3, goals=True)  # 5 timesteps
    b = collate_windows([(r, 0)], length=8, action_spec=spec)
    assert b.shape == (1, 8)
    assert b.mask[0].tolist() == [True] * 5 + [False] * 3
    assert b.has_action[0].tolist() == [True] * 4 + [False] * 4  # the rollout's last timestep has no action
    for name, v in all_fields(b).items():
        assert not v[0, 5:].any(), f"{name} padding is not zero"
    assert not b.action[0, 4].any() and b.reward[0, 4] == 0 and not b.terminated[0, 4]
    np.testing.assert_array_equal(b.action[0, :4].numpy(), spec.to_vector(r.action))
    np.testing.assert_array_equal(b.inputs.obs["state"][0, :5].numpy(), r.obs["state"])
    np.testing.assert_array_equal(b.inputs.prev_action[0, :5].numpy(), r.prev_action)
    assert b.reward[0, :4].tolist() == r.reward.tolist()
    assert b.terminated[0, :4].tolist() == [False, False, False, True]
    assert b.inputs.reset[0, :5].tolist() == [True, False, False, False, False]
    assert b.achieved is not None and b.achieved[0, :5].eq(4).all()
    wide = dataclasses.replace(r, achieved=np.full((5, 3), 6, np.int64))
    b = collate_windows([(r, 0), (wide, 0)], length=8, action_spec=spec)
    assert b.achieved.shape == (2, 8, 3)
    assert b.achieved[0, :5, 2].eq(-1).all() and b.achieved[1, :5].eq(6).all() and not b.achieved[:, 5:].any()


def test_windows_inside_and_at_the_end_of_a_long_rollout() -> None:
    r = make_rollout(19, DISCRETE)  # 20 timesteps
    b = collate_windows([(r, 5), (r, 12), (r, 0)], length=8, action_spec=DISCRETE)
    assert b.mask.all()
    assert b.inputs.time[0].tolist() == list(range(5, 13))
    assert b.inputs.time[1].tolist() == list(range(12, 20))
    assert b.has_action[0].all() and b.has_action[2].all()
    assert b.has_action[1].tolist() == [True] * 7 + [False]
    assert not b.inputs.reset[0].any() and b.inputs.reset[2, 0]  # only a true episode start is a reset
    assert b.reward[1, :7].tolist() == r.reward[12:19].tolist()
    np.testing.assert_array_equal(b.action[0].numpy(), np.eye(3, dtype=np.float32)[r.action[5:13]])


def test_batch_shapes_and_dtypes(tmp_path: Path) -> None:
    fill(tmp_path, [3, 30, 7], CONTINUOUS, protected=1)
    ds = ReplayDataset(tmp_path, batch_size=6, max_seq_len=10, action_spec=CONTINUOUS, seed=0)
    b = next(iter(ds))
    B, L, A = 6, 10, 2
    assert b.inputs.obs["state"].shape == (B, L, 4) and b.inputs.obs["state"].dtype == torch.float32
    assert b.inputs.obs["image"].shape == (B, L, 4, 4, 3) and b.inputs.obs["image"].dtype == torch.uint8
    assert b.inputs.prev_action.shape == (B, L, A) and b.action.shape == (B, L, A)
    for t in (b.inputs.prev_reward, b.reward):
        assert t.shape == (B, L) and t.dtype == torch.float32
    assert b.inputs.time.dtype == torch.int64
    for t in (b.inputs.reset, b.terminated, b.truncated, b.mask, b.has_action):
        assert t.shape == (B, L) and t.dtype == torch.bool
    assert b.achieved is None
    assert not (b.has_action & ~b.mask).any()
    lengths = b.mask.sum(1)
    assert set(lengths.tolist()) <= {4, 8, 10}
    # every field is a view of one buffer, so a batch crosses from a worker as one shared-memory segment
    tensors = [*all_fields(b).values(), b.mask]
    assert len({t.untyped_storage().data_ptr() for t in tensors}) == 1


def test_random_start_covers_the_whole_rollout(tmp_path: Path) -> None:
    fill(tmp_path, [29], DISCRETE)  # 30 timesteps, windows of 8: starts 0..22
    ds = ReplayDataset(tmp_path, batch_size=64, max_seq_len=8, action_spec=DISCRETE, seed=1)
    starts = torch.cat([b.inputs.time[:, 0] for b in islice(iter(ds), 10)])
    assert set(starts.tolist()) == set(range(23))
    seen = torch.zeros(30, dtype=torch.bool)
    seen[torch.cat([b.inputs.time[b.mask] for b in islice(iter(ds), 2)])] = True
    assert seen.all()


def test_files_are_drawn_uniformly_from_both_folders(tmp_path: Path) -> None:
    fill(tmp_path, [2, 2, 2, 2], DISCRETE, protected=2)
    ds = ReplayDataset(tmp_path, batch_size=200, max_seq_len=4, action_spec=DISCRETE, seed=2)
    tags = torch.cat([b.inputs.obs["state"][:, 0, 0] for b in islice(iter(ds), 4)])
    counts = torch.bincount(tags.long(), minlength=5)[1:]
    assert counts.min() > 150 and counts.max() < 250  # 800 draws over 4 files


# ------------------------------------------------------------------------------------------------------
# Robustness
# ------------------------------------------------------------------------------------------------------


def test_corrupt_files_are_skipped_with_one_warning_each(tmp_path: Path) -> None:
    replay = fill(tmp_path, [5, 6], DISCRETE)
    good = replay.files()[0].path.read_bytes()
    truncated = replay.fifo_dir / rollout_file_name(6)
    truncated.write_bytes(good[: len(good) // 2])
    garbage = replay.protected_dir / rollout_file_name(9)
    garbage.write_bytes(b"not a rollout" * 50)
    ds = ReplayDataset(tmp_path, batch_size=16, max_seq_len=8, action_spec=DISCRETE, seed=0, refresh_every=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tags = torch.cat([b.inputs.obs["state"][:, 0, 0] for b in islice(iter(ds), 20)])
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2, "\n".join(m[-150:] for m in messages)
    assert sum(truncated.name in m for m in messages) == 1
    assert sum(garbage.name in m for m in messages) == 1
    assert set(tags.tolist()) == {1.0, 2.0}


def test_evicted_files_are_dropped_silently(tmp_path: Path) -> None:
    replay = fill(tmp_path, [5, 6, 7], DISCRETE)
    ds = ReplayDataset(tmp_path, batch_size=8, max_seq_len=8, action_spec=DISCRETE, seed=0, cache_bytes=0)
    it = iter(ds)
    next(it)
    replay.files()[0].path.unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tags = torch.cat([b.inputs.obs["state"][:, 0, 0] for b in islice(it, 10)])
    assert set(tags.tolist()) == {2.0, 3.0}


class FakeClock:
    """Stands in for the `time` module of icrl.data.sampler: time moves only when a test advances it, so
    rate limits are tested on exact durations, never on how fast the machine happens to be."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    perf_counter = monotonic

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_new_files_are_seen_and_evicted_ones_resampled(tmp_path: Path, monkeypatch) -> None:
    """On the sampler's own clock (`FakeClock`): whether a re-listing is due must not depend on how fast this
    machine lists a folder (the listing-cost rate limit), or cached copies of the vanished files keep coming."""
    import icrl.data.sampler as sampler

    clock = FakeClock()
    monkeypatch.setattr(sampler, "time", clock)
    replay = fill(tmp_path, [5, 6], DISCRETE)
    ds = ReplayDataset(tmp_path, batch_size=8, max_seq_len=8, action_spec=DISCRETE, seed=0, refresh_seconds=0)
    it = iter(ds)
    next(it)
    replay.write(make_rollout(7, DISCRETE, tag=3))
    for f in replay.files()[:2]:
        f.path.unlink()  # both files the sampler knew vanish: it resamples, then re-lists
    clock.sleep(1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tags = torch.cat([b.inputs.obs["state"][:, 0, 0] for b in islice(it, 3)])
    assert set(tags.tolist()) == {3.0}


def test_refresh_is_rate_limited_by_the_listing_cost(tmp_path: Path, monkeypatch) -> None:
    """A slow listing is repeated at most every cost / refresh_time_fraction seconds, even with
    refresh_seconds=0 and refresh_every=1 (which ask for a listing before every batch)."""
    import icrl.data.sampler as sampler
    from icrl.data.storage import FolderIndex

    fill(tmp_path, [5, 6, 7], DISCRETE)
    clock = FakeClock()
    monkeypatch.setattr(sampler, "time", clock)
    real_scan, calls = FolderIndex.scan, []

    def slow_scan(self):
        calls.append(clock.now)
        clock.now += 0.05  # each folder's listing costs 0.05 s on the sampler's clock
        return real_scan(self)

    monkeypatch.setattr(FolderIndex, "scan", slow_scan)
    kw = dict(batch_size=4, max_seq_len=8, action_spec=DISCRETE, refresh_seconds=0, refresh_every=1)
    ds = ReplayDataset(tmp_path, refresh_time_fraction=0.1, **kw)  # a refresh (2 scans) costs 0.1 s: 1 s apart
    it = iter(ds)
    batches = list(islice(it, 20))
    assert len(batches) == 20 and len(calls) == 2  # one refresh (two folders), then none while time stands
    start = calls[0]
    clock.now = start + 0.95
    next(it)
    assert len(calls) == 2  # not yet cost / fraction = 1 s after the last listing started
    clock.now = start + 1.05
    next(it)
    assert len(calls) == 4  # due again: one more refresh
    next(it)
    assert len(calls) == 4


def test_empty_or_unreadable_buffer_raises_clear_error(tmp_path: Path) -> None:
    kw = dict(batch_size=2, max_seq_len=4, action_spec=DISCRETE, empty_timeout_s=0.2)
    ds = ReplayDataset(tmp_path / "nothing", **kw)
    with pytest.raises(EmptyReplayError, match="no readable rollout"):
        next(iter(ds))
    replay = DiskReplay(tmp_path / "bad", capacity_timesteps=100)
    (replay.fifo_dir / rollout_file_name(3)).write_bytes(b"junk")
    ds = ReplayDataset(tmp_path / "bad", **kw)
    with pytest.warns(RuntimeWarning, match="corrupt"), pytest.raises(EmptyReplayError, match="1 corrupt"):
        next(iter(ds))


def _add_100_reward(rollout: Rollout, rng: np.random.Generator) -> Rollout:
    return dataclasses.replace(rollout, reward=rollout.reward + 100)


def _in_place(rollout: Rollout, rng: np.random.Generator) -> Rollout:
    rollout.reward[:] = 0
    return rollout


def test_transform_sees_a_copy_and_never_changes_the_file(tmp_path: Path) -> None:
    replay = fill(tmp_path, [6], DISCRETE)
    path = replay.files()[0].path
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    ds = ReplayDataset(tmp_path, batch_size=4, max_seq_len=8, action_spec=DISCRETE, transform=_add_100_reward)
    b = next(iter(ds))
    assert (b.reward[b.has_action] > 100).all() and (b.reward[~b.has_action] == 0).all()
    bad = ReplayDataset(tmp_path, batch_size=4, max_seq_len=8, action_spec=DISCRETE, transform=_in_place)
    with pytest.raises(ValueError, match="read-only"):  # cached arrays are frozen
        next(iter(bad))
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest


def test_lru_cache_is_bounded_by_bytes() -> None:
    rs = [make_rollout(9, DISCRETE, tag=i) for i in range(4)]
    size = sum(a.nbytes for a in rs[0].to_arrays().values())
    cache = RolloutCache(max_bytes=int(2.5 * size))
    for i, r in enumerate(rs[:3]):
        cache.put(Path(str(i)), r)
    assert len(cache) == 2 and Path("0") not in cache and cache.nbytes == 2 * size
    assert cache.get(Path("1")) is rs[1]  # 1 becomes most recent, 2 is next to go
    cache.put(Path("3"), rs[3])
    assert Path("2") not in cache and Path("1") in cache and Path("3") in cache
    cache.put(Path("huge"), make_rollout(200, DISCRETE))  # larger than the cache: not cached
    assert Path("huge") not in cache and cache.nbytes <= cache.max_bytes


# ------------------------------------------------------------------------------------------------------
# Seeds and workers
# ------------------------------------------------------------------------------------------------------


def _stamp_rng(rollout: Rollout, rng: np.random.Generator) -> Rollout:
    """Writes one draw of the worker's generator into every prev_reward: batches reveal the stream."""
    return dataclasses.replace(rollout, prev_reward=np.full_like(rollout.prev_reward, rng.random()))


def _take(loader, n: int) -> list[Batch]:
    with loader:
        return list(islice(loader, n))


def test_same_seed_same_batches(tmp_path: Path) -> None:
    fill(tmp_path, [3, 12, 25, 40], CONTINUOUS, protected=1)
    kw = dict(batch_size=5, max_seq_len=16, action_spec=CONTINUOUS)
    a = _take(make_loader(tmp_path, seed=7, **kw), 4)
    b = _take(make_loader(tmp_path, seed=7, **kw), 4)
    c = _take(make_loader(tmp_path, seed=8, **kw), 4)
    assert all(batches_equal(x, y) for x, y in zip(a, b))
    assert not all(batches_equal(x, y) for x, y in zip(a, c))


@pytest.mark.slow
def test_two_workers_valid_batches_distinct_seeds_reproducible(tmp_path: Path) -> None:
    fill(tmp_path, [3, 12, 25, 40], DISCRETE, protected=1)
    kw = dict(batch_size=4, max_seq_len=16, action_spec=DISCRETE, transform=_stamp_rng)
    serial = _take(make_loader(tmp_path, seed=3, num_workers=0, **kw), 3)
    first = _take(make_loader(tmp_path, seed=3, num_workers=2, **kw), 6)
    second = _take(make_loader(tmp_path, seed=3, num_workers=2, **kw), 6)
    assert all(batches_equal(x, y) for x, y in zip(first, second))
    for b in first:
        assert b.shape == (4, 16) and b.mask[:, 0].all()
        assert not (b.has_action & ~b.mask).any()
        assert torch.equal(b.action.sum(-1), b.has_action.float())  # one-hot where an action exists
    # DataLoader alternates workers: batches 0, 2, 4 come from worker 0, which equals num_workers=0
    assert all(batches_equal(first[2 * i], serial[i]) for i in range(3))
    draw = lambda b: b.inputs.prev_reward[0, 0].item()  # noqa: E731
    assert {draw(b) for b in first[0::2]}.isdisjoint({draw(b) for b in first[1::2]})


def test_training_windows_hold_a_full_context_and_the_step_after_it(tmp_path: Path) -> None:
    """A rollout of exactly context + 1 timesteps (T-Maze: corridor, junction, final observation) is one
    training window: the cue at t = 0 and the junction's transition to the final state are learned together.
    With windows of only `max_seq_len` timesteps, one of the two fell outside every window."""
    from icrl.config import ExperimentConfig, ModelConfig
    from icrl.run.build import make_train_loader

    spec = ActionSpec("discrete", 4)
    context = 11
    cfg = ExperimentConfig(model=ModelConfig(max_seq_len=context)).replace(batch_size=4)
    assert cfg.model.training_window == context + 1
    fill(tmp_path / "replay", [context], spec)  # `context` actions: context + 1 timesteps
    loader = make_train_loader(cfg, tmp_path / "replay", spec, torch.device("cpu"), seed=0)
    try:
        batch = next(loader)
    finally:
        loader.close()
    assert batch.shape == (4, context + 1)
    assert (batch.inputs.time[:, 0] == 0).all()  # the window starts at the cue
    valid = batch.has_action & torch.cat([batch.mask[:, 1:], torch.zeros_like(batch.mask[:, :1])], 1)
    assert valid[:, context - 1].all()  # ... and still trains the last in-context step's transition
