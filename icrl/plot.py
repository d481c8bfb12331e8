"""Learning curves from metrics.jsonl files (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from icrl.metrics import read_metrics  # noqa: E402


def plot_learning_curves(run_dirs: list[str | Path], out: str | Path, title: str | None = None) -> Path:
    """Eval return and success rate vs env steps, one line per run directory."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for run_dir in run_dirs:
        rows = [r for r in read_metrics(Path(run_dir) / "metrics.jsonl") if r.get("kind") == "eval"]
        if not rows:
            continue
        steps = [r["env_steps"] for r in rows]
        label = Path(run_dir).name
        axes[0].plot(steps, [r["return_mean"] for r in rows], marker="o", ms=3, label=label)
        if any(r.get("success_rate") is not None for r in rows):
            axes[1].plot(steps, [r.get("success_rate") or 0.0 for r in rows], marker="o", ms=3, label=label)
    axes[0].set_ylabel("eval return (mean over rollouts)")
    axes[1].set_ylabel("eval success rate")
    axes[1].set_ylim(-0.05, 1.05)
    for ax in axes:
        ax.set_xlabel("env steps")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
