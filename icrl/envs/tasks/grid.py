"""Pieces shared by the built-in grid-world tasks and the meta-RL task protocol."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

OBS_MODES = ("xy", "onehot")


def wants_new_task(options: dict | None, seed: int | None, has_task: bool) -> bool:
    """The multi-episode contract: a reset samples a new hidden task unless `options={"new_task": False}`
    (a seeded reset or the first reset always samples one)."""
    new_task = True if options is None else bool(options.get("new_task", True))
    return new_task or seed is not None or not has_task


def position_space(size: int, obs_mode: str, owner: str) -> gym.spaces.Box:
    """The observation of a dark grid: the agent's cell only, as (row, col) / (size - 1) or one-hot."""
    if obs_mode not in OBS_MODES:
        raise ValueError(f"{owner} obs_mode must be one of {OBS_MODES}, got {obs_mode!r}")
    return gym.spaces.Box(0.0, 1.0, (2,) if obs_mode == "xy" else (size**2,), np.float32)


def position_rows(pos: np.ndarray, size: int, obs_mode: str) -> np.ndarray:
    """[N, 2] int64 cells -> the observations of `position_space`: [N, 2] float32 (row, col) / (size - 1) for
    obs_mode "xy", else [N, size**2] float32 one-hot."""
    if obs_mode == "xy":
        return pos.astype(np.float32) / np.float32(max(size - 1, 1))
    out = np.zeros((len(pos), size**2), np.float32)
    out[np.arange(len(pos)), pos[:, 0] * size + pos[:, 1]] = 1.0
    return out
