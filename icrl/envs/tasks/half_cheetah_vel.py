"""Half-Cheetah-Vel: run at a hidden target velocity (the meta-RL benchmark of Finn et al. 2017, MAML; also
PEARL, Rakelly et al. 2019, and the AMAGO papers).

The body, physics and 17-dim observation are Gymnasium's `HalfCheetah-v5` (MuJoCo); only the reward and the
time limit change. Every task draws a target forward velocity uniformly from `target_velocities` (default
(0, 3) m/s, as in MAML/PEARL). The target is NOT in the observation: the agent has to infer it from the
rewards it gets, so later episodes of one task (a multi-episode rollout, `--episodes-per-rollout k`) can run
at the right speed from the first step.

Reward (per step; MAML's `half_cheetah_env_rand` / PEARL's `HalfCheetahVelEnv`):

    reward = -|v - v_target| - ctrl_cost_weight * sum(a**2),   ctrl_cost_weight = 0.05 (= 0.5 * 1e-1)

with `v = info["x_velocity"]` as reported by `HalfCheetah-v5` ((x_after - x_before) / dt, dt = 0.05 s) and `a`
the action passed to `step` (Gymnasium's own v5 reward uses ctrl weight 0.1; the benchmark uses 0.05, which
is what published Half-Cheetah-Vel returns are measured with, so we follow the benchmark). There is no
termination and no success signal; the episode is truncated after `episode_steps` steps (200, as in
MAML/PEARL; Gymnasium's HalfCheetah default is 1000).

Needs MuJoCo: `pip install "gymnasium[mujoco]"` (or `pip install "icrl[mujoco]"`). The import happens in the
constructor, so this module imports without it.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from icrl.envs.tasks.grid import wants_new_task

MUJOCO_HINT = 'HalfCheetahVel needs MuJoCo: pip install "gymnasium[mujoco]"  (or: pip install "icrl[mujoco]")'


def _half_cheetah_class() -> type:
    try:
        from gymnasium.envs.mujoco.half_cheetah_v5 import HalfCheetahEnv
    except (ImportError, gym.error.DependencyNotInstalled) as e:
        raise ImportError(f"{MUJOCO_HINT} ({e})") from e
    return HalfCheetahEnv


class HalfCheetahVel(gym.Env):
    """HalfCheetah-v5 with a hidden target velocity per task; reward -|v - target| - 0.05 |a|^2.

    Args:
      target_velocities: (low, high) of the uniform target-velocity distribution (m/s), low <= high.
      episode_steps: time limit of one episode (truncation), >= 1.
      ctrl_cost_weight: weight of sum(a**2) in the reward (0.05 in the benchmark).
      render_mode: passed to HalfCheetah-v5 ("rgb_array", "depth_array", "human" or None).
      **kwargs: other HalfCheetah-v5 constructor arguments (reset_noise_scale, frame_skip, width, height...).

    The target velocity is a hidden task parameter (`self.target_velocity`; never in obs or info):
    `reset()` with `options=None` or `{"new_task": True}` (or a seed) samples a new one, `{"new_task": False}`
    keeps it.
    """

    def __init__(
        self,
        target_velocities: tuple[float, float] = (0.0, 3.0),
        episode_steps: int = 200,
        ctrl_cost_weight: float = 0.05,
        render_mode: str | None = None,
        **kwargs: Any,
    ):
        low, high = (float(v) for v in target_velocities)
        if not np.isfinite([low, high]).all() or low > high:
            raise ValueError(
                "HalfCheetahVel target_velocities must be finite (low, high) with low <= high, "
                f"got {target_velocities}"
            )
        if int(episode_steps) < 1:
            raise ValueError(f"HalfCheetahVel episode_steps must be >= 1, got {episode_steps}")
        for bad in ("forward_reward_weight", "exclude_current_positions_from_observation"):
            if bad in kwargs:
                raise ValueError(f"HalfCheetahVel does not accept {bad!r} (fixed by the benchmark)")
        self.target_velocities = (low, high)
        self.episode_steps = int(episode_steps)
        self.ctrl_cost_weight = float(ctrl_cost_weight)
        # The inner env's own reward is ignored; we recompute it from its reported velocity.
        self.cheetah = _half_cheetah_class()(render_mode=render_mode, **kwargs)
        self.render_mode = render_mode
        self.metadata = dict(self.cheetah.metadata)
        self.observation_space = self.cheetah.observation_space  # Box(-inf, inf, (17,), float64)
        self.action_space = self.cheetah.action_space  # Box(-1, 1, (6,), float32)
        self.target_velocity = low
        self._t = 0
        self._has_task = False

    def _sample_task(self) -> None:
        low, high = self.target_velocities
        self.target_velocity = float(self.np_random.uniform(low, high))
        self._has_task = True

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        if wants_new_task(options, seed, self._has_task):
            self._sample_task()
        # The inner env gets a seed drawn from ours: one reset seed fixes both the task and the physics noise.
        inner_seed = int(self.np_random.integers(2**31 - 1)) if seed is not None else None
        obs, _ = self.cheetah.reset(seed=inner_seed)
        self._t = 0
        return obs, {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        action = np.asarray(action, dtype=np.float32).reshape(self.action_space.shape)
        obs, _, _, _, inner = self.cheetah.step(action)
        self._t += 1
        velocity = float(inner["x_velocity"])
        forward = -abs(velocity - self.target_velocity)
        ctrl_cost = self.ctrl_cost_weight * float(np.sum(np.square(action, dtype=np.float64)))
        info = {
            "x_position": float(inner["x_position"]),
            "x_velocity": velocity,
            "reward_forward": forward,
            "reward_ctrl": -ctrl_cost,
        }
        truncated = self._t >= self.episode_steps
        return obs, forward - ctrl_cost, False, truncated, info

    def render(self) -> np.ndarray | None:
        return self.cheetah.render()

    def close(self) -> None:
        self.cheetah.close()
