"""Checkpoints and exact resume (icrl.run.checkpoint, train --resume)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from icrl import train
from icrl.config import (
    ConfigError,
    EnvConfig,
    ExperimentConfig,
    ExploreConfig,
    LossConfig,
    ModelConfig,
)
from icrl.nets.transformer import SigmaReparamLinear
from icrl.run.checkpoint import (
    CheckpointError,
    list_checkpoints,
    load_checkpoint,
    read_checkpoint,
    save_checkpoint,
)
from icrl.run.reporting import read_metrics

ROOT = Path(__file__).resolve().parents[2]


def tiny(run_dir: Path, total: int = 32, **train_kw) -> ExperimentConfig:
    """T-Maze of length 1: every episode lasts exactly 2 steps, so epochs (8 steps, 2 envs) end on rollout
    boundaries and a resumed run's hard reset draws exploration scales exactly as the straight run does."""
    kw = dict(
        run_dir=str(run_dir), seed=3, total_env_steps=total, steps_per_epoch=8, updates_per_epoch=2,
        batch_size=4, warmup_updates=1, lr=1e-3, eval_every=100, device="cpu", threads=1, checkpoint_every=1,
    )
    kw.update(train_kw)
    return ExperimentConfig(
        env=EnvConfig(env="tmaze", env_kwargs='{"length": 1}', parallel_envs=2),
        model=ModelConfig(d_model=16, layers=1, heads=2, max_seq_len=8, max_time=16, head_hidden=16, head_layers=1),
        loss=LossConfig(num_critics=2, redq_subset=2, gammas=(0.9, 0.99)),
        explore=ExploreConfig(eps_anneal_steps=100),
    ).replace(eval_rollouts=2, **kw)


def _resume(cfg: ExperimentConfig, **kw) -> ExperimentConfig:
    return cfg.replace(resume=True, **kw)


def _state(path: Path) -> dict:
    return json.loads((path / "state.json").read_text())


def _epochs(run_dir: Path, kind: str = "train") -> list[int]:
    return [r["epoch"] for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == kind]


def _objects(cfg: ExperimentConfig):
    from icrl.agent.exploration import Exploration
    from icrl.agent.learner import Learner
    from icrl.agent.model import Agent
    from icrl.config import resolve
    from icrl.envs import Collector, make_vector_env
    from icrl.types import ActionSpec

    venv = make_vector_env(cfg.env.env, cfg.env.kwargs, cfg.env.parallel_envs)
    spec = ActionSpec.from_space(venv.single_action_space)
    agent = Agent(venv.single_observation_space["obs"], spec, cfg.model, cfg.loss)
    learner = Learner(agent, cfg, torch.device("cpu"))
    collector = Collector(venv, spec, seed=0)
    exploration = Exploration(resolve(cfg).explore, spec, cfg.env.parallel_envs, seed=123)
    return agent, learner, collector, exploration


def test_round_trip_restores_everything(tmp_path):
    cfg = tiny(tmp_path / "run", total=16)
    train(cfg)
    ckpt = list_checkpoints(tmp_path / "run")[-1]
    assert ckpt.name == "ckpt-000002" and (tmp_path / "run/checkpoints/latest").read_text().strip() == ckpt.name
    assert sorted(p.name for p in ckpt.iterdir()) == ["agent.safetensors", "optimizer.pt", "state.json"]

    agent, learner, collector, exploration = _objects(cfg)
    sigma_layers = [m for m in agent.modules() if isinstance(m, SigmaReparamLinear)]
    with torch.no_grad():
        fresh = [m.acting_weight().clone() for m in sigma_layers]  # acting snapshots of the untrained weights
    state = load_checkpoint(ckpt, agent=agent, learner=learner, collector=collector, exploration=exploration)
    assert state["epoch"] == 2 and collector.total_env_steps == 16 and learner.updates == 4
    with torch.no_grad():  # acting after the restore multiplies by the restored weights
        for m, w in zip(sigma_layers, fresh):
            assert torch.equal(m.acting_weight(), m.effective_weight()) and not torch.equal(w, m.acting_weight())
    tensors, optim, _ = read_checkpoint(ckpt)
    for k, v in agent.state_dict().items():  # online and target heads, PopArt and normalisation buffers
        if k in tensors:
            assert torch.equal(v, tensors[k]), k
    assert any("popart" in k for k in tensors) and any("target_critic" in k for k in tensors)
    for a, b in zip(learner.optimizer.state_dict()["state"].values(), optim["optimizer"]["state"].values()):
        for key in a:
            assert torch.equal(torch.as_tensor(a[key]), torch.as_tensor(b[key]))
    assert learner.scheduler.last_epoch == 4
    assert exploration.scale.tolist() == state["exploration"]["scale"]

    # save again from the loaded objects: an identical agent file
    again = save_checkpoint(tmp_path / "other", agent=agent, learner=learner, collector=collector,
                            exploration=exploration, epoch=2, extra={})
    assert (again / "agent.safetensors").read_bytes() == (ckpt / "agent.safetensors").read_bytes()
    assert _state(again)["exploration"] == state["exploration"]
    assert _state(again)["learner"]["generator"] == state["learner"]["generator"]


def test_resume_continues_like_a_straight_run(tmp_path):
    a = tmp_path / "a"
    train(tiny(a, total=32))
    b = tmp_path / "b"
    train(tiny(b, total=16))
    train(_resume(tiny(b, total=16), total_env_steps=32))
    sa, sb = _state(a / "checkpoints/ckpt-000004"), _state(b / "checkpoints/ckpt-000004")
    assert sa["env_steps"] == sb["env_steps"] == 32
    assert sa["updates"] == sb["updates"] == 8
    assert sa["collector"]["total_env_steps"] == sb["collector"]["total_env_steps"]
    assert sa["exploration"] == sb["exploration"]  # same final per-env scales and generator state
    ra = [r for r in read_metrics(a / "metrics.jsonl") if r["kind"] == "train"]
    rb = [r for r in read_metrics(b / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["epoch"] for r in rb] == [1, 2, 3, 4]
    assert [r["train/epsilon"] for r in ra] == [r["train/epsilon"] for r in rb]
    assert [r["env_steps"] for r in ra] == [r["env_steps"] for r in rb]
    assert json.loads((b / "config.json").read_text())["schedule"]["total_env_steps"] == 32


def test_resume_skips_a_corrupt_checkpoint_and_truncates_metrics(tmp_path):
    run = tmp_path / "run"
    train(tiny(run, total=24))
    (run / "checkpoints/ckpt-000003/agent.safetensors").write_bytes(b"torn")
    train(_resume(tiny(run, total=24), total_env_steps=32))
    assert _epochs(run) == [1, 2, 3, 4]  # epoch 3's row from before was dropped, then written again
    assert _state(run / "checkpoints/ckpt-000004")["env_steps"] == 32
    read_checkpoint(run / "checkpoints/ckpt-000003")  # rewritten whole


def test_missing_or_corrupt_checkpoint_names_the_path(tmp_path):
    with pytest.raises(CheckpointError, match="ckpt-000009"):
        read_checkpoint(tmp_path / "ckpt-000009")
    (tmp_path / "c").mkdir()
    (tmp_path / "c/state.json").write_text("{}")
    with pytest.raises(CheckpointError, match="incomplete"):
        read_checkpoint(tmp_path / "c")


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/icrl_pwned_by_checkpoint",))


def test_pickled_payload_is_refused(tmp_path):
    run = tmp_path / "run"
    train(tiny(run, total=8))
    ckpt = list_checkpoints(run)[-1]
    marker = Path("/tmp/icrl_pwned_by_checkpoint")
    marker.unlink(missing_ok=True)
    torch.save({"optimizer": _Evil(), "scheduler": {}}, ckpt / "optimizer.pt")
    agent, learner, collector, exploration = _objects(tiny(run, total=8))
    with pytest.raises(CheckpointError, match="optimizer.pt.*weights-only"):
        load_checkpoint(ckpt, agent=agent, learner=learner, collector=collector, exploration=exploration)
    assert not marker.exists()


def test_keep_checkpoints_prunes(tmp_path):
    run = tmp_path / "run"
    train(tiny(run, total=40, keep_checkpoints=2))
    assert [p.name for p in list_checkpoints(run)] == ["ckpt-000004", "ckpt-000005"]
    assert (run / "checkpoints/latest").read_text().strip() == "ckpt-000005"
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".tmp")]


def test_existing_run_needs_resume_and_same_config(tmp_path):
    run = tmp_path / "run"
    train(tiny(run, total=8))
    before = sorted(str(p) for p in run.rglob("*"))
    with pytest.raises(ConfigError, match="resume=True"):  # Python words in Python (the CLI says --resume)
        train(tiny(run, total=8))
    assert sorted(str(p) for p in run.rglob("*")) == before
    with pytest.raises(ConfigError, match=r"optim\.lr"):
        train(_resume(tiny(run, total=8), lr=5e-4))
    with pytest.raises(ConfigError, match=r"model\.d_model"):
        cfg = _resume(tiny(run, total=8))
        train(dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, d_model=32)))


def test_a_run_saved_before_the_long_context_rule_still_resumes(tmp_path):
    """Its config.json has `popart_max_ratio: null`, which meant no floor then (0 now) and is never written now."""
    run = tmp_path / "run"
    train(tiny(run, total=8))
    path = run / "config.json"
    saved = json.loads(path.read_text())
    assert saved["loss"]["popart_max_ratio"] == 0.0 and saved["loss"]["n_step"] == 1  # resolved, not null
    saved["loss"]["popart_max_ratio"] = None
    path.write_text(json.dumps(saved))
    train(_resume(tiny(run, total=16)))
    assert json.loads(path.read_text())["schedule"]["total_env_steps"] == 16


def test_sigkill_then_resume_reaches_the_target(tmp_path):
    run = tmp_path / "run"
    args = [
        sys.executable, "-m", "icrl", "train", "--env", "tmaze", "--env-kwargs", '{"length": 1}',
        "--parallel-envs", "2", "--eval-rollouts", "2", "--d-model", "16", "--layers", "1", "--heads", "2",
        "--max-seq-len", "8", "--max-time", "16", "--head-hidden", "16", "--head-layers", "1",
        "--num-critics", "2", "--steps-per-epoch", "8", "--updates-per-epoch", "2", "--batch-size", "4",
        "--total-env-steps", "800", "--eval-every", "1000", "--log-every", "1000", "--device", "cpu",
        "--threads", "1", "--checkpoint-every", "1", "--run-dir", str(run),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and not (run / "checkpoints/ckpt-000005").exists():
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()
    out = subprocess.run(args + ["--resume"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "resuming from" in out.stdout
    final = _state(run / "checkpoints/ckpt-000100")
    assert final["env_steps"] == 800 and final["updates"] == 200
    assert _epochs(run) == list(range(1, 101))
