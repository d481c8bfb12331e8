"""What a run leaves beside its checkpoints, and the pictures of it: the final weights, the learning-curve plot and
the result line (`finish_run`); `save_weights` also publishes an asynchronous learner's weights and keeps a callback's.

Learning curves come from metrics.jsonl files (matplotlib, no display needed). Runs whose config.json agree
except for the seed (and run dir) form one group, drawn as the mean over seeds with a min/max band; groups are
labelled by the config fields that differ between them (or by the run dir's name). Multi-episode tasks also get
an adaptation curve: return / success by episode index within a rollout, at each run's last evaluation.

`record_video` records a run's greedy policy as an animated GIF, for envs that render `rgb_array` frames (`icrl
eval RUN_DIR --video N`). One env copy acts with the same AgentPolicy (and KV cache) as evaluation; frames come
from `env.render()` after every step. Pillow (a matplotlib dependency) writes the GIF, so no video codec is needed.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import gymnasium as gym
import matplotlib
import numpy as np
from safetensors import SafetensorError
from safetensors.torch import save_model

from icrl.agent.model import Agent
from icrl.config import ExperimentConfig
from icrl.config.errors import first_line, flag
from icrl.dicts import flatten
from icrl.envs.user import EnvOverride, run_env_config
from icrl.fileio import atomic_path
from icrl.guards import assert_finite_weights
from icrl.run.reporting import read_metrics, say
from icrl.run.rundir import RESUMABLE_CHANGES

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def save_weights(agent: Agent, path: Path, metadata: dict[str, str] | None = None) -> Path:
    """Write the agent's weights (safetensors) to a temp file and rename it over `path`: readers (icrl eval,
    asynchronous collectors) see the old file or the new one, never half of one."""
    assert_finite_weights(agent, str(path))  # a published NaN would reach every reader (icrl.guards)
    try:
        with atomic_path(path, fsync=False, tmp_name=f".{path.name}.tmp-{os.getpid()}") as tmp:
            save_model(agent, str(tmp), metadata=metadata)
    except (SafetensorError, OSError) as e:  # a full disk: one line (exit 2 on the command line), the old file kept
        raise OSError(f"could not write the weights {path} ({first_line(e)}); the previous file and the checkpoints "
                      f"are kept: free some disk space and resume with {flag('resume')}") from e
    return path


def finish_run(run_dir: Path, agent: Agent, cfg: ExperimentConfig, last_eval: dict, env_steps: int,
               updates: int) -> None:
    """Final weights (RUN_DIR/agent.safetensors), the learning-curve plot and the result line."""
    save_weights(agent, run_dir / "agent.safetensors")
    plot = plot_learning_curves([run_dir], run_dir / "learning_curve.png", title=f"{cfg.env.env} {cfg.env.env_kwargs}")
    success, ret = last_eval.get("success_rate"), last_eval.get("return_mean")
    say(
        "[bold green]result[/bold green]: eval return "
        + (f"{ret:+.3f}" if ret is not None else "none (no evaluation rollout ended: raise --eval-max-steps)")
        + (f", success rate {success:.2f}" if success is not None else "")
        + f" over {last_eval['rollouts']} rollouts after {env_steps:,} env steps and "
        f"{updates:,} updates in {last_eval['wall_time']:.0f} s; plot: {plot}"
    )


# -------------------------------------------------------------------------------------- learning curves
X_AXES = {"env_steps": "env steps", "wall_time": "wall time (s)"}
# Not what a run learns, so neither a group nor a label: the seed, and the run-only settings that may change
# on --resume (the flag itself, the device, ...), except the budget.
_IGNORED = ("run.seed", *(k for k in RESUMABLE_CHANGES if k != "schedule.total_env_steps"))
MULTI_RUN_PLOT = "learning_curves.png"
"""Where `icrl plot A B ...` draws by default: the working directory, never one of the runs' own plots."""


def _config(run_dir: Path) -> dict[str, Any] | None:
    """The run's config as dotted fields; lists as JSON text, so that every value is hashable."""
    try:
        tree = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return {k: json.dumps(v) if isinstance(v, list) else v for k, v in flatten(tree).items()}


def group_runs(run_dirs: list[str | Path]) -> list[tuple[str, list[Path]]]:
    """[(label, run dirs)]: runs whose configs agree except seed and run dir share a group, in first-seen order."""
    groups: dict[str, list[Path]] = {}
    configs: dict[str, dict[str, Any] | None] = {}
    seeds: dict[str, list[Any]] = {}
    for d in map(Path, run_dirs):
        cfg = _config(d)
        if cfg is None:
            key = f"dir:{d}"
        else:
            key = json.dumps({k: v for k, v in cfg.items() if k not in _IGNORED}, sort_keys=True, default=str)
        groups.setdefault(key, []).append(d)
        configs.setdefault(key, cfg)
        seeds.setdefault(key, []).append(None if cfg is None else cfg.get("run.seed"))
    known = [c for c in configs.values() if c is not None]
    differing = sorted(
        k for k in set().union(*known) if k not in _IGNORED and len({json.dumps(c.get(k)) for c in known}) > 1
    ) if len(known) > 1 else []
    out = []
    for key, dirs in groups.items():
        cfg = configs[key]
        if cfg is not None and differing:
            label = ", ".join(f"{k.split('.')[-1]}={cfg.get(k)}" for k in differing[:3])
        else:
            label = dirs[0].name if len(dirs) == 1 else f"{dirs[0].name} +{len(dirs) - 1}"
        if len(dirs) > 1:  # "seeds" only when they are: three runs of seed 0 are three runs
            distinct = None not in seeds[key] and len(set(seeds[key])) == len(dirs)
            label += f" ({len(dirs)} {'seeds' if distinct else 'runs'})"
        out.append((label, dirs))
    return out


def _eval_rows(run_dir: Path, kind: str = "eval", key: str = "return_mean") -> list[dict[str, Any]]:
    """The run's rows of `kind` that carry `key` (train rows: "train/return_mean") as a number, with numeric
    x values: a hand-edited or foreign row (strings where numbers belong) is left out, not plotted into a crash."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []

    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    return [r for r in read_metrics(path) if r.get("kind") == kind and number(r.get(key))
            and all(number(r.get(x)) for x in ("env_steps", "wall_time") if x in r)]


def _band(ax, xs: list[list[float]], ys: list[list[float]], label: str, color, style: str = "-") -> None:
    """Mean over runs with a min/max band, over the evaluations every run has (the shortest run)."""
    n = min(len(y) for y in ys)
    if n == 0:
        return
    x = np.mean([xi[:n] for xi in xs], axis=0)
    y = np.array([yi[:n] for yi in ys], dtype=float)
    ax.plot(x, y.mean(0), marker="o" if style == "-" else None, ms=3, label=label, color=color, ls=style)
    if len(ys) > 1:
        ax.fill_between(x, y.min(0), y.max(0), alpha=0.2, color=color)


def plot_learning_curves(
    run_dirs: list[str | Path], out: str | Path, title: str | None = None, x: str = "env_steps"
) -> Path:
    """Eval return (and, dashed, the training rollouts' return) and success rate vs env steps (or wall time),
    one line (mean, min/max band) per group."""
    if x not in X_AXES:
        raise ValueError(f"x must be one of {', '.join(X_AXES)}, got {x!r}")
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for gi, (label, dirs) in enumerate(group_runs(run_dirs)):
        runs = [rows for rows in map(_eval_rows, dirs) if rows]
        if not runs:
            continue
        color = colors[gi % len(colors)]
        xs = [[float(r.get(x) or 0.0) for r in rows] for rows in runs]
        _band(axes[0], xs, [[r["return_mean"] for r in rows] for rows in runs], label, color)
        train = [rows for rows in (_eval_rows(d, "train", "train/return_mean") for d in dirs) if rows]
        if train:  # dashed: the exploring policy's return on the training rollouts
            _band(axes[0], [[float(r.get(x) or 0.0) for r in rows] for rows in train],
                  [[r["train/return_mean"] for r in rows] for rows in train], f"{label} (train)", color, "--")
        if any(r.get("success_rate") is not None for rows in runs for r in rows):
            _band(axes[1], xs, [[r.get("success_rate") or 0.0 for r in rows] for rows in runs], label, color)
    axes[0].set_ylabel("return (solid: eval, dashed: train)")
    axes[1].set_ylabel("eval success rate")
    axes[1].set_ylim(-0.05, 1.05)
    for ax in axes:
        ax.set_xlabel(X_AXES[x])
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return save_figure(fig, out)


def adaptation_path(out: str | Path) -> Path:
    """Where the adaptation curve goes beside a learning-curve PNG: `NAME_adaptation.png`."""
    out = Path(out)
    return out.with_name(f"{out.stem}_adaptation.png")


def plot_adaptation(run_dirs: list[str | Path], out: str | Path, title: str | None = None) -> Path | None:
    """Return and success by episode index within a rollout at each run's last eval (mean, min/max over seeds).

    Returns None (and writes nothing) when no run's eval rows carry `return_by_episode`.
    """
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    drawn = False
    for gi, (label, dirs) in enumerate(group_runs(run_dirs)):
        last = [rows[-1] for rows in map(_eval_rows, dirs) if rows and rows[-1].get("return_by_episode")]
        if not last:
            continue
        color = colors[gi % len(colors)]
        rets = [r["return_by_episode"] for r in last]
        _band(axes[0], [list(range(1, len(y) + 1)) for y in rets], rets, label, color)
        succ = [r["success_by_episode"] for r in last if r.get("success_by_episode")]
        if succ:
            _band(axes[1], [list(range(1, len(y) + 1)) for y in succ], succ, label, color)
        drawn = True
    if not drawn:
        plt.close(fig)
        return None
    axes[0].set_ylabel("return of episode k (mean over rollouts)")
    axes[1].set_ylabel("success of episode k")
    axes[1].set_ylim(-0.05, 1.05)
    for ax in axes:
        ax.set_xlabel("episode index within the rollout (last eval)")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(title or "adaptation curve")
    fig.tight_layout()
    return save_figure(fig, out)


def save_figure(fig: Any, out: str | Path, dpi: int = 120) -> Path:
    """Save `fig` and close it. Atomically: a symlink at `out` (say, in a downloaded run dir) is replaced, never
    written through. A PNG is written with a 256-colour palette: a line plot looks the same in a third of the bytes
    (the benchmarks' plots, kept in the repository, save through here too)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out, fsync=False, suffix=out.suffix) as tmp:  # matplotlib picks the format by the extension
        if out.suffix.lower() == ".png":
            from PIL import Image  # a matplotlib dependency

            buffer = io.BytesIO()
            fig.savefig(buffer, format="png", dpi=dpi)
            image = Image.open(buffer).convert("RGB")
            image.quantize(256, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE).save(
                tmp, "PNG", optimize=True)
        else:
            fig.savefig(tmp, dpi=dpi)
    plt.close(fig)
    return out


# ----------------------------------------------------------------------------------------------- videos
def _batched(tree):
    """One env's nested timestep dict -> the vector env's layout with a leading axis of 1."""
    if isinstance(tree, dict):
        return {k: _batched(v) for k, v in tree.items()}
    return np.asarray(tree)[None]


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
    from icrl.run.load import load_agent

    if num_rollouts < 1:
        raise ValueError(f"{flag('video')} needs at least 1 rollout, got {num_rollouts}")
    override = override or EnvOverride()
    agent, cfg = load_agent(run_dir, checkpoint, override=override)
    e = run_env_config(cfg, run_dir, override).env
    try:
        env = make_wrapped_env(
            e.env, {**e.kwargs, "render_mode": "rgb_array"}, e.episodes_per_rollout, e.rollout_horizon
        )
    except (ValueError, gym.error.DependencyNotInstalled) as err:
        raise ValueError(f"env {e.env!r} cannot make rgb_array frames for a video ({first_line(err)})") from err
    policy = AgentPolicy(agent, 1, greedy=True)
    frames: list[np.ndarray] = []
    try:
        frames = _frames(env, policy, num_rollouts, seed, cfg.eval.eval_max_steps, e.env)
    except gym.error.DependencyNotInstalled as err:  # e.g. pygame for CartPole / FrozenLake: not an ImportError
        raise ImportError(f"env {e.env!r} cannot render frames for a video: {first_line(err)}") from err
    finally:
        env.close()
    scale = max(1, -(-min_height // frames[0].shape[0]))
    images = [Image.fromarray(np.kron(f, np.ones((scale, scale, 1), np.uint8))) for f in frames]
    out = Path(out) if out is not None else Path(run_dir) / "eval_video.gif"
    with atomic_path(out, fsync=False, suffix=".gif") as tmp:  # PIL picks the format by the extension
        images[0].save(tmp, save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0)
    return out
