"""Copy windows of rollouts into one padded `Batch` whose tensors share a single buffer.

Kept apart from the sampler: this is the hot per-batch copy, and the only place that decides the
padding rules (zeros, `mask == False`, `has_action == False` after a rollout's last action).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch
from torch.utils.data import get_worker_info

from icrl.types import ActionSpec, Batch, Rollout, Timesteps


def _carve(specs: dict[str, tuple[tuple[int, ...], np.dtype]]) -> dict[str, torch.Tensor]:
    """Zeroed tensors that are views of ONE byte buffer (64-byte aligned slices).

    Why: a DataLoader worker hands a batch to the learner through shared memory, one segment per
    storage; one storage per batch instead of ~12 cut that overhead about 3x in benchmarks. Inside a
    worker the buffer is allocated in shared memory directly (as torch's default_collate does), so
    sending it does not copy it again.
    """
    offsets, total = {}, 0
    for name, (shape, dtype) in specs.items():
        offsets[name] = total
        total += -(-int(np.prod(shape)) * np.dtype(dtype).itemsize // 64) * 64
    buf = torch.empty(0, dtype=torch.uint8)
    if get_worker_info() is not None:  # in a worker: allocate straight in shared memory, saving a copy
        buf = buf.new(buf._typed_storage()._new_shared(total, device="cpu")).zero_()
    else:  # numpy's calloc, no fill pass: torch.zeros fills on torch's thread pool, which stalled for ~0.7 ms a
        # batch (a third of it) on a loaded 2-core machine
        buf = torch.from_numpy(np.zeros(total, dtype=np.uint8))
    out = {}
    for name, (shape, dtype) in specs.items():
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        tdtype = torch.from_numpy(np.empty(0, dtype)).dtype
        out[name] = buf[offsets[name] : offsets[name] + nbytes].view(tdtype).view(shape)
    return out


def collate_windows(windows: list[tuple[Rollout, int]], length: int, action_spec: ActionSpec) -> Batch:
    """Copy windows `rollout[start : start + length]` into one zero-padded Batch of shape [B, length].

    A rollout with n timesteps has n - 1 actions: `has_action` is False at its last timestep, where
    action / reward / terminated / truncated stay zero.
    """
    first = windows[0][0]
    tensors = _carve(_batch_specs(windows, length, action_spec.dim))
    x = {name: t.numpy() for name, t in tensors.items()}  # numpy views, filled in place
    for b, (r, s) in enumerate(windows):
        _check_window(r, first, action_spec)
        _copy_window(x, b, r, s, length, action_spec)
    return _as_batch(tensors, first.obs.keys())


def _batch_specs(
    windows: list[tuple[Rollout, int]], L: int, A: int
) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Shape and dtype of every Batch tensor, named as `_as_batch` reads them (obs keys from the first
    rollout; `achieved` only when every rollout records goals, wide enough for the widest)."""
    B, first = len(windows), windows[0][0]
    with_goals = [r.achieved is not None for r, _ in windows]
    if any(with_goals) and not all(with_goals):
        raise ValueError("some rollouts in the batch record achieved goals and others do not")
    f32, i64, b8 = np.dtype(np.float32), np.dtype(np.int64), np.dtype(bool)
    specs = {f"obs/{k}": ((B, L, *v.shape[1:]), v.dtype) for k, v in first.obs.items()}  # [B, L, ...]
    specs.update(prev_action=((B, L, A), f32), action=((B, L, A), f32))  # [B, L, A]
    specs.update(prev_reward=((B, L), f32), reward=((B, L), f32), time=((B, L), i64))  # [B, L]
    for name in ("reset", "terminated", "truncated", "mask", "has_action"):
        specs[name] = ((B, L), b8)  # [B, L]
    if all(with_goals):
        K = max(r.achieved.shape[1] for r, _ in windows)  # type: ignore[union-attr]
        specs["achieved"] = ((B, L, K), i64)  # [B, L, K]
    return specs


def _check_window(r: Rollout, first: Rollout, action_spec: ActionSpec) -> None:
    """Refuse a rollout that does not fit the batch laid out from the first one."""
    if r.obs.keys() != first.obs.keys():
        raise ValueError(f"rollouts disagree on observation keys: {sorted(r.obs)} vs {sorted(first.obs)}")
    if r.prev_action.shape[1:] != (action_spec.dim,):
        raise ValueError(f"stored prev_action shape {r.prev_action.shape} does not match {action_spec}")


def _copy_window(
    x: dict[str, np.ndarray], b: int, r: Rollout, s: int, L: int, action_spec: ActionSpec
) -> None:
    """Fill row b of the batch arrays with timesteps [s, s + L) of r; the rest stays zero (padding)."""
    n = r.num_timesteps
    e = min(n, s + L)  # timesteps [s, e)
    ea = min(n - 1, e)  # actions [s, ea)
    m, ma = e - s, max(0, ea - s)
    for k, v in r.obs.items():
        x[f"obs/{k}"][b, :m] = v[s:e]
    for name in ("prev_action", "prev_reward", "time", "reset"):
        x[name][b, :m] = getattr(r, name)[s:e]
    x["mask"][b, :m] = True
    if ma > 0:
        x["action"][b, :ma] = action_spec.to_vector(r.action[s:ea])
        for name in ("reward", "terminated", "truncated"):
            x[name][b, :ma] = getattr(r, name)[s:ea]
        x["has_action"][b, :ma] = True
    if "achieved" in x:  # rollouts with fewer goal slots get -1 ("no goal") in the extra ones
        k = r.achieved.shape[1]  # type: ignore[union-attr]
        x["achieved"][b, :m, :k] = r.achieved[s:e]  # type: ignore[index]
        x["achieved"][b, :m, k:] = -1


def _as_batch(t: dict[str, torch.Tensor], obs_keys: Iterable[str]) -> Batch:
    """The carved tensors, arranged as a Batch."""
    return Batch(
        inputs=Timesteps(
            obs={k: t[f"obs/{k}"] for k in obs_keys},
            prev_action=t["prev_action"],
            prev_reward=t["prev_reward"],
            time=t["time"],
            reset=t["reset"],
        ),
        action=t["action"],
        reward=t["reward"],
        terminated=t["terminated"],
        truncated=t["truncated"],
        mask=t["mask"],
        has_action=t["has_action"],
        achieved=t.get("achieved"),
    )
