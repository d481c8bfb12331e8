"""What a finished run leaves beside its checkpoints: the final weights, the learning-curve plot and the
result line; `save_weights` also publishes an asynchronous learner's weights."""

from __future__ import annotations

import os
from pathlib import Path

from safetensors import SafetensorError
from safetensors.torch import save_model

from icrl.agent.model import Agent
from icrl.config import ExperimentConfig
from icrl.fileio import atomic_path
from icrl.guards import assert_finite_weights
from icrl.run.loggers import say
from icrl.run.plot import plot_learning_curves


def save_weights(agent: Agent, path: Path, metadata: dict[str, str] | None = None) -> Path:
    """Write the agent's weights (safetensors) to a temp file and rename it over `path`: readers (icrl eval,
    asynchronous collectors) see the old file or the new one, never half of one."""
    assert_finite_weights(agent, str(path))  # a published NaN would reach every reader (icrl.guards)
    try:
        with atomic_path(path, fsync=False, tmp_name=f".{path.name}.tmp-{os.getpid()}") as tmp:
            save_model(agent, str(tmp), metadata=metadata)
    except (SafetensorError, OSError) as e:  # a full disk: one line (exit 2 on the command line), the old file kept
        text = str(e).strip().splitlines()
        raise OSError(f"could not write the weights {path} ({text[0] if text else type(e).__name__}); the previous "
                      "file and the checkpoints are kept: free some disk space and resume with --resume") from e
    return path


def finish_run(run_dir: Path, agent: Agent, cfg: ExperimentConfig, last_eval: dict, env_steps: int, updates: int) -> None:
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
