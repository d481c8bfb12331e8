"""Hostile files and a full disk (issue 20): one line, exit 2, nothing already on disk lost."""

from __future__ import annotations

import pytest
import torch
from safetensors import SafetensorError

from icrl.cli.errors import run_stoppable
from icrl.config import EnvConfig, ExperimentConfig, LossConfig, ModelConfig
from icrl.run import checkpoint as ckpt_mod
from icrl.run.checkpoint import CheckpointError, list_checkpoints, save_checkpoint


def tiny_cfg(run_dir) -> ExperimentConfig:
    return ExperimentConfig(
        env=EnvConfig(env="tmaze", env_kwargs='{"length": 1}', parallel_envs=2),
        model=ModelConfig(d_model=16, layers=1, heads=2, max_seq_len=8, max_time=16, head_hidden=16, head_layers=1),
        loss=LossConfig(num_critics=2, redq_subset=2, gammas=(0.9, 0.99)),
    ).replace(run_dir=str(run_dir), device="cpu", batch_size=4, steps_per_epoch=8)


def objects(cfg: ExperimentConfig):
    from icrl.agent.exploration import Exploration
    from icrl.agent.learner import Learner
    from icrl.agent.model import Agent
    from icrl.envs import Collector, make_vector_env
    from icrl.types import ActionSpec

    venv = make_vector_env(cfg.env.env, cfg.env.kwargs, cfg.env.parallel_envs)
    spec = ActionSpec.from_space(venv.single_action_space)
    agent = Agent(venv.single_observation_space["obs"], spec, cfg.model, cfg.loss)
    return dict(agent=agent, learner=Learner(agent, cfg, torch.device("cpu")), collector=Collector(venv, spec, seed=0),
                exploration=Exploration(cfg.explore, spec, cfg.env.parallel_envs, seed=1))


def test_a_full_disk_during_a_checkpoint_is_one_line_exit_2_and_keeps_the_previous_one(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    parts = objects(tiny_cfg(run))
    first = save_checkpoint(run, epoch=1, **parts)
    before = (first / "agent.safetensors").read_bytes()

    def full_disk(model, filename, *a, **k):
        with open(filename, "wb") as f:
            f.write(b"partial")
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "
                              '"No space left on device" })')

    monkeypatch.setattr(ckpt_mod, "save_model", full_disk)
    with pytest.raises(CheckpointError, match="No space left on device.*previous checkpoints are kept"):
        save_checkpoint(run, epoch=2, **parts)
    assert list_checkpoints(run) == [first] and (first / "agent.safetensors").read_bytes() == before
    assert (run / "checkpoints/latest").read_text().strip() == first.name
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".tmp-")]

    with pytest.raises(SystemExit) as e:  # the CLI's wrapper: one line, exit 2
        run_stoppable(lambda: save_checkpoint(run, epoch=3, **parts))
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and "No space left on device" in err
