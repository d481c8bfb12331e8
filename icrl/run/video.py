"""Record a run's greedy policy as an animated GIF, for envs that render `rgb_array` frames.

Used by `icrl eval RUN_DIR --video N`. One env copy acts with the same AgentPolicy (and KV cache) as
evaluation; frames come from `env.render()` after every step. Pillow (a matplotlib dependency) writes
the GIF, so no video codec is needed.
"""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np

from icrl.envs.user import EnvOverride, run_env_config
from icrl.fileio import atomic_path


def _batched(tree):
    """One env's nested timestep dict -> the vector env's layout with a leading axis of 1."""
    if isinstance(tree, dict):
        return {k: _batched(v) for k, v in tree.items()}
    return np.asarray(tree)[None]


def _one_line(error: BaseException) -> str:
    """The first line of an error (icrl.cli.errors.one_line; the CLI is a higher layer)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _frames(env, policy, num_rollouts: int, seed: int, max_steps: int, name: str) -> list[np.ndarray]:
    """Every frame of `num_rollouts` greedy rollouts (`env.render()` before each step, and after the last)."""
    from icrl.types import Timesteps

    frames: list[np.ndarray] = []
    for i in range(num_rollouts):
        step, _ = env.reset(seed=seed + i)
        new_rollout, done, steps = np.ones(1, bool), False, 0
        while not done and steps < max_steps:  # an episode that never ends is cut, as in evaluation
            steps += 1
            frame = env.render()
            if not isinstance(frame, np.ndarray) or frame.ndim != 3:
                raise ValueError(f"env {name!r} did not return an rgb_array frame from render()")
            frames.append(frame)
            action = policy.act(Timesteps.from_numpy(_batched(step)), new_rollout)
            step, _, terminated, truncated, _ = env.step(action[0])
            new_rollout, done = np.zeros(1, bool), terminated or truncated
        frames.append(env.render())
    return frames


def record_video(
    run_dir: str | Path,
    num_rollouts: int = 1,
    out: str | Path | None = None,
    checkpoint: str | Path | None = None,
    seed: int = 0,
    fps: int = 8,
    min_height: int = 96,
    override: EnvOverride | None = None,
) -> Path:
    """Act greedily for `num_rollouts` rollouts and save every frame to a GIF (default RUN_DIR/eval_video.gif).

    The env is chosen as `icrl eval` chooses it (`override`: --env, --env-kwargs, --trust-run-env). Raises
    ValueError naming the env when it cannot render `rgb_array` frames, ImportError when rendering needs a
    package that is missing (Gymnasium's DependencyNotInstalled, e.g. pygame), so `icrl eval --video` fails
    in one line.
    """
    from PIL import Image

    from icrl.agent.model import AgentPolicy
    from icrl.envs import make_wrapped_env
    from icrl.run.evaluate import load_agent

    if num_rollouts < 1:
        raise ValueError(f"--video needs at least 1 rollout, got {num_rollouts}")
    override = override or EnvOverride()
    agent, cfg = load_agent(run_dir, checkpoint, override=override)
    e = run_env_config(cfg, run_dir, override).env
    try:
        env = make_wrapped_env(
            e.env, {**e.kwargs, "render_mode": "rgb_array"}, e.episodes_per_rollout, e.rollout_horizon
        )
    except (ValueError, gym.error.DependencyNotInstalled) as err:
        raise ValueError(f"env {e.env!r} cannot make rgb_array frames for a video ({_one_line(err)})") from err
    policy = AgentPolicy(agent, 1, greedy=True)
    frames: list[np.ndarray] = []
    try:
        frames = _frames(env, policy, num_rollouts, seed, cfg.eval.eval_max_steps, e.env)
    except gym.error.DependencyNotInstalled as err:  # e.g. pygame for CartPole / FrozenLake: not an ImportError
        raise ImportError(f"env {e.env!r} cannot render frames for a video: {_one_line(err)}") from err
    finally:
        env.close()
    scale = max(1, -(-min_height // frames[0].shape[0]))
    images = [Image.fromarray(np.kron(f, np.ones((scale, scale, 1), np.uint8))) for f in frames]
    out = Path(out) if out is not None else Path(run_dir) / "eval_video.gif"
    with atomic_path(out, fsync=False, suffix=".gif") as tmp:  # PIL picks the format by the extension
        images[0].save(tmp, save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0)
    return out
