"""Short learning tests: the agent must actually learn, with fixed seeds, on CPU in about a minute each.

The T-Maze pair is the memory proof: the Transformer recalls the cue shown only at t=0; the memoryless
encoder, under the same budget, can only guess the side (success near 0.5).
"""

from __future__ import annotations

import json

import pytest
import torch

from icrl.config import EnvConfig, ExperimentConfig, ExploreConfig, LossConfig, ModelConfig, TrainConfig
from icrl.train import train

pytestmark = pytest.mark.learning


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tmaze_config(run_dir, traj_encoder: str, length: int = 20, steps: int = 10_000, seed: int = 0) -> ExperimentConfig:
    """The T-Maze preset of `icrl.presets`, shrunk to a tiny model so it runs in about a minute on CI."""
    return ExperimentConfig(
        env=EnvConfig(env="tmaze", env_kwargs=json.dumps({"length": length}), parallel_envs=8, eval_rollouts=16),
        model=ModelConfig(
            traj_encoder=traj_encoder, d_model=32, layers=2, heads=2, max_seq_len=length + 2, head_hidden=64
        ),
        loss=LossConfig(entropy_coeff=0.02),
        explore=ExploreConfig(eps_start=0.5, eps_anneal_steps=4000),
        train=TrainConfig(
            run_dir=str(run_dir),
            seed=seed,
            total_env_steps=steps,
            steps_per_epoch=200,
            updates_per_epoch=40,
            batch_size=32,
            lr=3e-4,
            warmup_updates=50,
            eval_every=10,
            log_every=10,
        ),
    )


def test_transformer_recalls_the_tmaze_cue(tmp_path):
    result = train(tmaze_config(tmp_path / "transformer", "transformer"))
    assert result["success_rate"] >= 0.95, result
    assert result["return_mean"] >= 0.9, result


def test_memoryless_encoder_stays_near_chance_on_tmaze(tmp_path):
    result = train(tmaze_config(tmp_path / "ff", "ff"))
    # Without memory the best policy walks the corridor and guesses: success ~0.5.
    assert result["success_rate"] <= 0.75, result
    assert result["return_mean"] <= 0.8, result


def test_continuous_actions_learn_cue_recall(tmp_path):
    """Continuous actions: recall a ±1 cue after 5 blank steps. Random or memoryless answers score ~0.5."""
    steps = 2400
    cfg = ExperimentConfig(
        env=EnvConfig(env="cue_recall", env_kwargs='{"delay": 5}', parallel_envs=8, eval_rollouts=16),
        model=ModelConfig(traj_encoder="transformer", d_model=32, layers=1, heads=2, max_seq_len=8, head_hidden=64),
        loss=LossConfig(gammas=(0.9, 0.99)),
        explore=ExploreConfig(eps_anneal_steps=steps // 2),
        train=TrainConfig(
            run_dir=str(tmp_path / "recall"),
            seed=0,
            total_env_steps=steps,
            steps_per_epoch=200,
            updates_per_epoch=40,
            batch_size=32,
            lr=3e-4,
            warmup_updates=50,
            eval_every=6,
            log_every=6,
        ),
    )
    result = train(cfg)
    assert result["return_mean"] >= 0.9, result
    assert result["success_rate"] >= 0.9, result
