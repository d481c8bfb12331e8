"""What a run says to its user when the numbers alone would not tell them: that nothing is being stored (so no
update runs), that rollouts outlast the context (so late steps cannot see the first ones), and, at the end of a run
that did not succeed, that the critic cannot have looked far enough ahead. Each is said once, in words that name
the flag that changes it.
"""

from __future__ import annotations

from icrl.config import ExperimentConfig
from icrl.run.reporting import say
from icrl.types import Rollout


def hint_nothing_stored(cfg: ExperimentConfig, epoch: int, steps_per_env: int, last: bool) -> bool:
    """Say why no update runs while the online epochs up to `epoch` stored nothing (each env took `steps_per_env`
    steps so far); True once said. Quiet, until the last epoch, while each env has taken no more steps than the
    context holds: a task whose rollouts fill the context (T-Maze 500 in 1,000-step epochs of 8 envs) finishes its
    first ones only after several epochs."""
    if steps_per_env <= cfg.model.context and not last:
        return False
    n = cfg.env.parallel_envs  # e.g. MountainCar: no episode ends within one epoch, nothing to learn from
    say(f"icrl: epoch {epoch} finished no rollout: no episode ended within the {steps_per_env} steps each of the {n} "
        "envs took so far, so nothing is stored and no update runs; pass --chunk-len 64 to store pieces of long "
        "rollouts, or raise --steps-per-epoch (or lower --parallel-envs)")
    return True


def hint_short_context(cfg: ExperimentConfig, rollouts: list[Rollout]) -> bool:
    """Say when a rollout had more action steps than the context: its late steps cannot attend to its first ones
    (a T-Maze cue), which no loss curve shows. True once said."""
    steps = max((int(r.time[-1]) for r in rollouts if len(r.time)), default=0)
    context = cfg.model.context
    if steps <= context:
        return False
    say(f"icrl: rollouts last {steps} steps but the context is {context} (--max-seq-len): late steps see only "
        f"the last {context}; pass --max-seq-len {steps} if the task needs memory of the whole rollout")
    return True


def critic_reach(cfg: ExperimentConfig, updates: int) -> float:
    """About how many steps ahead the critic can have seen by now: each update moves the target networks a
    fraction τ of the way, and each bootstrap hop spans n steps, so values propagate ~τ × updates × n steps
    (docs/results.md, "Why Pendulum-v1 learned slowly")."""
    return cfg.loss.tau * updates * cfg.loss.td_steps


def hint_critic_reach(cfg: ExperimentConfig, updates: int, last_eval: dict) -> bool:
    """At the end of a run that did not succeed, say once when its critic's reach (`critic_reach`) was far
    shorter than its episodes: the values cannot have reached rewards further away, whatever the task. True
    when said."""
    length, success = last_eval.get("episode_length_mean"), last_eval.get("success_rate")
    reach = critic_reach(cfg, updates)
    if not length or (success is not None and success >= 0.5) or reach >= length / 4:
        return False
    say(f"icrl: hint: the critic can have looked only ~{reach:.0f} steps ahead (τ {cfg.loss.tau:g} x {updates:,} "
        f"updates x {cfg.loss.td_steps}-step returns) in episodes of ~{length:.0f} steps; if rewards lie further "
        "away, raise --tau, --n-step or the updates (--replay-ratio, --total-env-steps), as --preset control does")
    return True
