"""Continuous control learns: Pendulum-v1 (Gymnasium's classic swing-up, Box(-2, 2) torque, 200-step episodes),
the sanity floor of issue 19, at a CI budget.

Pendulum is memoryless, so the test runs the `ff` trajectory encoder (the learning update is the same one;
only the sequence model differs) with the short-run settings that the update budget needs: at ~1,000 updates
the TD targets must propagate fast enough. The bound is the targets' EMA rate: a target network moving at τ
per update carries values about τ x updates steps back, so the library's τ = 0.003 (tuned for thousands of
updates on memory tasks) gives ~3 steps of lookahead after 900 updates, too few for a swing-up; a plain SAC
with the same 950 updates measured the same: τ 0.003 -> -1,580, τ 0.02 -> -126 (docs/results.md, continuous
control). Random play scores about -1,200 to -1,500; a swing-up policy about -150 to -400.
"""

from __future__ import annotations

import pytest

from icrl import train
from icrl.config import EnvConfig, ExperimentConfig, ModelConfig

pytestmark = pytest.mark.learning


def pendulum_config(run_dir, **overrides) -> ExperimentConfig:
    """Pendulum-v1 at a CI budget: 8,000 env steps, 100 updates of 8 rollouts per 1,000 env steps (700 in all),
    lr 1e-3 after 100 warm-up updates and target EMA τ = 0.02 (the library's 1e-4, 500 and 0.003 are tuned for
    runs of thousands of updates)."""
    fields = dict(
        run_dir=str(run_dir), total_env_steps=8_000, steps_per_epoch=1_000, updates_per_epoch=100, batch_size=8,
        lr=1e-3, warmup_updates=100, tau=0.02, eval_every=8, eval_rollouts=8, log_every=2, seed=0, device="cpu",
    )
    fields.update(overrides)
    return ExperimentConfig(env=EnvConfig(env="Pendulum-v1"), model=ModelConfig(traj_encoder="ff")).replace(**fields)


def test_continuous_actor_critic_swings_the_pendulum_up(tmp_path):
    result = train(pendulum_config(tmp_path / "pendulum"))
    # random play and the library-default τ / lr at this budget: about -1,200 to -1,450 (docs/results.md)
    assert result["return_mean"] >= -500, result
