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


def position_obs(pos: tuple[int, int], size: int, obs_mode: str) -> np.ndarray:
    r, c = pos
    if obs_mode == "xy":
        return np.array([r, c], dtype=np.float32) / np.float32(max(size - 1, 1))
    obs = np.zeros(size**2, dtype=np.float32)
    obs[r * size + c] = 1.0
    return obs


def move(pos: tuple[int, int], delta: tuple[int, int], size: int) -> tuple[int, int]:
    """One step on a size x size grid; walls stop the agent."""
    return min(max(pos[0] + delta[0], 0), size - 1), min(max(pos[1] + delta[1], 0), size - 1)


def time_limit_reached(terminated: bool, t: int, limit: int, info: dict) -> bool:
    """`truncated` for a step that did not terminate: the episode hit its time limit (an unfinished task, so
    `info["success"] = 0.0`)."""
    truncated = not terminated and t >= limit
    if truncated:
        info["success"] = 0.0
    return truncated


class RenderModes:
    """`render()` of the built-in tasks: `_frame()` for render_mode "rgb_array", `_ansi()` for "ansi", else None."""

    render_mode: str | None = None

    def render(self) -> str | np.ndarray | None:
        if self.render_mode == "rgb_array":
            return self._frame()  # type: ignore[attr-defined]
        if self.render_mode == "ansi":
            return self._ansi()  # type: ignore[attr-defined]
        return None
