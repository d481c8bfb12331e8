"""XLand-MiniGrid as a vector env: N copies stepped by one jitted, vmapped xminigrid step (extra icrl[jax]).

`make_vector_env("xland/<env-id>", ...)` builds `XLandVectorEnv` (the "xland/" family's vector form, icrl.envs.make),
as the official AMAGO runs XLand-MiniGrid "already vectorised". It is `icrl.envs.batched.BatchedTaskEnv`'s
contract (the same timesteps, SAME_STEP autoresets, bridge steps of multi-episode rollouts, `final_obs` /
`final_info`, `success`, `episode_end`) on jax state, and gives exactly what the per-copy envs (`XLandMiniGrid`
in a SyncVectorEnv, `make_vector_env(..., native=False)`) give under the same seed: copy i draws its rulesets
and layouts from its own generator (seed + i) with the per-copy env's calls (`XLandSetup.draw_task`,
`reset_seed`), and reports `info["task"]` on every reset and step as the per-copy env does
(tests/unit/test_xland_envs.py steps both side by side).

A step costs one jitted call for every copy, and one more (every copy's reset computed, the ending copies' kept)
on steps where some copy starts an episode: the reset copies' rulesets and key seeds go in as [N] arrays, so
jax compiles each function once per number of copies. Observations come back to numpy once per call.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from icrl.envs.batched import BatchedTaskEnv, CopyArrays, StepArrays
from icrl.envs.tasks.xland import XLandMiniGrid


class XLandCopies(CopyArrays):
    """The copies' state on jax (xminigrid TimeSteps, batched) and the rules that step them: one jitted call."""

    def __init__(self, setup: Any) -> None:
        self.setup = setup

    def _allocate(self, n: int) -> None:
        self._task = np.zeros(n, np.int32)  # [N] each copy's ruleset index in the split
        self._labels = np.full(n, None, dtype=object)  # [N] each copy's info["task"]
        self._state: Any = None  # the copies' xminigrid TimeSteps, batched
        self._current: dict[str, np.ndarray] = {}  # the observation's keys -> [N, ...] of the current state

    def _draw_tasks(self, rows: np.ndarray) -> None:
        for i in rows.tolist():
            self._task[i] = self.setup.draw_task(self._rng(i))
            self._labels[i] = self.setup.task_label(int(self._task[i]))

    def _reset_rows(self, rows: np.ndarray) -> None:
        seeds = np.zeros(self.num_copies, np.uint32)
        for i in rows.tolist():
            seeds[i] = self.setup.reset_seed(self._rng(i))
        k = self.setup.kernels
        if self._state is None or len(rows) == self.num_copies:
            self._state, obs = k.fresh(self.setup.rulesets, self._task, seeds)
        else:
            mask = np.zeros(self.num_copies, bool)
            mask[rows] = True
            self._state, obs = k.masked(self.setup.rulesets, self._state, mask, self._task, seeds)
        self._current = self.setup.to_numpy(obs)

    def _obs(self) -> dict[str, np.ndarray]:
        return {k: v.copy() for k, v in self._current.items()}

    def _step_arrays(self, actions: np.ndarray) -> StepArrays:
        self._state, obs, reward, terminated, truncated = self.setup.kernels.step(
            self._state, np.asarray(actions, np.int32).reshape(self.num_copies))
        self._current = self.setup.to_numpy(obs)
        term, trunc = np.array(terminated, bool), np.array(truncated, bool)
        success = np.where(term, 1.0, np.where(trunc, 0.0, np.nan))  # reported where an episode ends
        return StepArrays(reward=np.asarray(reward, np.float64), terminated=term, success=success, truncated=trunc)


class XLandVectorEnv(BatchedTaskEnv):
    """`num_envs` copies of `xland/<env_id>` (kwargs as `XLandMiniGrid`'s) in one `gymnasium.vector.VectorEnv`,
    TimestepWrapper timesteps, rollouts of `episodes_per_rollout` episodes or `rollout_horizon` steps."""

    copies: XLandCopies

    def __init__(self, env_id: str, num_envs: int, episodes_per_rollout: int = 1,
                 rollout_horizon: int | None = None, **kwargs: Any) -> None:
        if kwargs.get("render_mode") is not None:
            raise ValueError("XLandVectorEnv does not render; build XLandMiniGrid copies to render")
        proto = XLandMiniGrid(env_id, **kwargs)
        super().__init__(XLandCopies(proto.setup), num_envs, episodes_per_rollout, rollout_horizon, proto=proto)
        self.setup = proto.setup

    # ---------------------------------------------------------------- info["task"], as the per-copy env's
    def reset(self, *, seed: int | list[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        obs, info = super().reset(seed=seed, options=options)
        return obs, {**info, **self._task_info()}

    def step(self, actions: Any) -> tuple[dict[str, Any], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        before = self.copies._labels.copy()  # a copy whose rollout ends this step reports its old task in final_info
        obs, reward, terminated, truncated, info = super().step(actions)
        done = terminated | truncated
        if done.any():
            final = np.full(self.num_envs, None, dtype=object)
            final[done] = before[done]
            info["final_info"] = {**info["final_info"], "task": final, "_task": done.copy()}
        return obs, reward, terminated, truncated, {**info, **self._task_info()}

    def _task_info(self) -> dict[str, Any]:
        """Every copy's current task (after this step's resets), as a SyncVectorEnv gathers it."""
        return {"task": self.copies._labels.copy(), "_task": np.ones(self.num_envs, bool)}


def make_xland_vector(member: str, kwargs: dict[str, Any], num_envs: int, episodes_per_rollout: int = 1,
                      rollout_horizon: int | None = None) -> XLandVectorEnv:
    """The "xland/" family's vector form for `make_vector_env` (which builds per-copy envs to render)."""
    return XLandVectorEnv(member, num_envs, episodes_per_rollout, rollout_horizon, **kwargs)
