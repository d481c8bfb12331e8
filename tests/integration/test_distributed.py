"""Data-parallel training (icrl.parallel): a real 2-process CPU run under torchrun (gloo)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from icrl.agent.model import Agent
from icrl.config import ExperimentConfig
from icrl.data import list_rollout_files
from icrl.envs import make_vector_env
from icrl.parallel import Replicas, init_replicas, state_sha256
from icrl.run.checkpoint import list_checkpoints, load_checkpoint
from icrl.run.reporting import read_metrics
from icrl.types import ActionSpec

TINY = [
    "--env", "tmaze", "--env-kwargs", '{"length": 1}', "--parallel-envs", "2", "--eval-rollouts", "2",
    "--d-model", "16", "--layers", "1", "--heads", "2", "--max-seq-len", "8", "--max-time", "16",
    "--head-hidden", "16", "--head-layers", "1", "--num-critics", "2", "--gammas", "0.9", "0.99",
    "--batch-size", "4", "--warmup-updates", "1", "--steps-per-epoch", "16", "--updates-per-epoch", "3",
    "--eval-every", "2", "--checkpoint-every", "2", "--device", "cpu", "--seed", "5",
]


def _torchrun(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "icrl", "train", *TINY, *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def _checkpoint_state(run: Path) -> tuple[str, dict]:
    """The SHA-256 of rank 0's checkpointed agent, recomputed here, and the checkpoint's state.json."""
    cfg = ExperimentConfig.from_json((run / "config.json").read_text())
    venv = make_vector_env(cfg.env.env, cfg.env.kwargs, 1)
    spec = ActionSpec.from_space(venv.single_action_space)
    agent = Agent(venv.single_observation_space["obs"], spec, cfg.model, cfg.loss)
    venv.close()
    state = load_checkpoint(list_checkpoints(run)[-1], agent=agent, restore_rng=False)
    return state_sha256(agent), state


def test_without_a_launcher_nothing_is_distributed(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    replicas = init_replicas("cpu")
    assert type(replicas) is Replicas and replicas.world_size == 1 and replicas.is_main
    assert replicas.rank_seed(7) == 7 and replicas.sum([1.0, 2.0]) == [1.0, 2.0] and replicas.max([3, 1]) == [3, 1]
    x, m, rows = torch.ones(2, 3, 4), torch.ones(2, 3, dtype=torch.bool), torch.ones(3, 4)
    assert replicas.gather_padded(x, m, 3)[0] is x and replicas.gather_rows(rows, 3) is rows


def _two_rank_gather(method: str, inputs: list[tuple], *size) -> tuple:
    """What rank 0's `method` returns when rank r called it with inputs[r]: each rank's one collective
    payload is captured, then handed to rank 0 as the all_gather result."""
    from icrl.parallel import _Ranks

    payloads = []
    rank = _Ranks.__new__(_Ranks)  # no process group: only the packing and unpacking are exercised
    rank.world_size = 2
    for args in inputs:
        rank._all_gather = lambda t: payloads.append(t) or [t, t]
        getattr(rank, method)(*args, *size)
    rank._all_gather = lambda t: payloads
    return getattr(rank, method)(*inputs[0], *size)


def test_packed_gathers_return_every_ranks_rows_in_rank_order():
    rows = [torch.randn(3, 2), torch.randn(5, 2)]
    assert torch.equal(_two_rank_gather("gather_rows", [(rows[0],), (rows[1],)], 5), torch.cat(rows))
    ys = [torch.randn(2, 4, 3), torch.randn(2, 6, 3)]  # [B, L_rank, G]
    masks = [torch.rand(2, 4) > 0.5, torch.rand(2, 6) > 0.5]
    y, mask = _two_rank_gather("gather_padded", list(zip(ys, masks)), 6)
    assert y.shape == (4, 6, 3) and mask.shape == (4, 6) and mask.dtype == torch.bool
    assert torch.equal(y[:2, :4], ys[0]) and torch.equal(y[2:], ys[1]) and not mask[:2, 4:].any()
    assert torch.equal(mask[:2, :4], masks[0]) and torch.equal(mask[2:], masks[1])


def test_json_gather_returns_every_ranks_value_in_rank_order():
    """Per-task sums differ in their keys between ranks: each rank's JSON text, padded to the longest, comes back
    whole (names with any characters, values as sent)."""
    from icrl.parallel import _Ranks

    values = [{"RepeatFirstEasy": {"rollouts": 2.0, "return_sum": -0.5}}, {"go to é": {"rollouts": 1.0}, "b": {}}]
    longest = max(len(json.dumps(v).encode("utf-8")) for v in values)
    payloads: list[torch.Tensor] = []
    rank = _Ranks.__new__(_Ranks)  # no process group: only the packing and unpacking are exercised
    rank.world_size, rank.device = 2, torch.device("cpu")
    rank.max = lambda v: [longest]  # the all-reduce of the two lengths
    for v in values:
        rank._all_gather = lambda t: payloads.append(t) or [t, t]
        rank.gather_json(v)
    assert {p.shape for p in payloads} == {(longest + 8,)}
    rank._all_gather = lambda t: payloads
    assert rank.gather_json(values[0]) == values


def test_state_digest_sees_every_tensor_bit():
    net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    before = state_sha256(net)
    net[1].running_mean.view(torch.int32)[0] ^= 1  # one bit of one buffer
    assert state_sha256(net) != before


@pytest.mark.slow
def test_two_processes_train_one_agent_with_identical_replicas_and_one_writer(tmp_path):
    pytest.importorskip("accelerate",
                        reason="data-parallel training needs the distributed extra (pip install accelerate)")
    run = tmp_path / "run"
    out = _torchrun("--total-env-steps", "64", "--run-dir", str(run))
    assert out.stdout.count("result:") == 1  # rank 0 alone reports
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # one run directory
    assert sorted(p.name for p in run.iterdir()) == [
        ".lock", "agent.safetensors", "checkpoints", "config.json", "learning_curve.png", "metrics.jsonl", "plan.json",
        "replay", "spaces.json"]
    rows = read_metrics(run / "metrics.jsonl")
    train_rows = [r for r in rows if r["kind"] == "train"]
    assert [r["epoch"] for r in train_rows] == [1, 2, 3, 4]  # one writer: no row twice
    assert train_rows[-1]["env_steps"] == 64 and train_rows[-1]["updates"] == 12
    # each rank collected with its own envs into the shared replay (file names carry the writer's pid)
    pids = {f.name.split("-")[1] for f in list_rollout_files(run / "replay" / "fifo")}
    assert len(pids) == 2

    # every checkpoint hashes both ranks' full states (weights, PopArt, running norms, targets, σReparam
    # vectors); they agree, and agree with rank 0's checkpoint as loaded here
    digest, state = _checkpoint_state(run)
    assert state["extra"]["world_size"] == 2
    assert state["extra"]["replica_sha256"] == [digest, digest]
    assert state["updates"] == 12 and state["env_steps"] * 2 == 64  # the collector counter is per rank

    # resume under the launcher: continues from the checkpoint (more updates: a new state), replicas identical
    _torchrun("--total-env-steps", "96", "--run-dir", str(run), "--resume")
    rows = [r for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["epoch"] for r in rows] == [1, 2, 3, 4, 5, 6] and rows[-1]["updates"] == 18
    digest2, state2 = _checkpoint_state(run)
    assert state2["extra"]["replica_sha256"] == [digest2, digest2] and digest2 != digest
    assert state2["env_steps"] * 2 == 96
