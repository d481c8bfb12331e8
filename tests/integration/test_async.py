"""Asynchronous mode (icrl.asynchronous.collect, icrl.asynchronous.learn): real `icrl learn` / `icrl collect`
processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors import SafetensorError, safe_open

from icrl.data import list_rollout_files, load_rollout
from icrl.run.checkpoint import list_checkpoints, read_checkpoint
from icrl.run.reporting import read_metrics

pytestmark = pytest.mark.slow

# T-Maze of length 1: 2-step episodes, so every env step is stored within a step of being taken.
TINY = [
    "--env", "tmaze", "--env-kwargs", '{"length": 1}', "--parallel-envs", "2", "--eval-rollouts", "2",
    "--d-model", "16", "--layers", "1", "--heads", "2", "--max-seq-len", "8", "--max-time", "16",
    "--head-hidden", "16", "--head-layers", "1", "--num-critics", "2", "--gammas", "0.9", "0.99",
    "--batch-size", "4", "--warmup-updates", "1", "--steps-per-epoch", "8", "--updates-per-epoch", "4",
    "--total-env-steps", "100000", "--eval-every", "1000", "--checkpoint-every", "1000", "--device", "cpu",
]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def _start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "icrl", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=ENV)


def _counters(run: Path) -> dict[int, dict]:
    out = {}
    for path in (run / "async" / "collectors").glob("*.json"):
        out[int(path.stem)] = json.loads(path.read_text())
    return out


def _wait(condition, timeout: float, what: str, procs=()) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"a process exited early while waiting for {what}:\n{p.communicate()[1]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _published_updates(run: Path) -> int:
    """The update count in the learner's published weights' metadata (-1 before the first)."""
    try:
        with safe_open(str(run / "async" / "weights.safetensors"), framework="pt", device="cpu") as f:
            return int((f.metadata() or {}).get("updates", -1))
    except (OSError, SafetensorError):
        return -1


def _stop(proc: subprocess.Popen, sig: int) -> str:
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "Traceback" not in err, err
    return out + err


def _updates(run: Path) -> int:
    rows = read_metrics(run / "metrics.jsonl") if (run / "metrics.jsonl").is_file() else []
    return max([r["updates"] for r in rows], default=0)


def test_learn_and_collect_exchange_data_and_weights_under_the_utd_throttle(tmp_path):
    """Two collectors with --max-lead act with the weights the learner publishes; the learner makes at most
    utd x stored env steps updates, reaching exactly that cap once the collectors stop; SIGTERM and SIGINT
    stop every process cleanly (exit 0), the learner with a checkpoint of its last update."""
    run, utd, steps_each = tmp_path / "run", 0.5, 48
    learner = _start("learn", str(run), *TINY, "--utd", str(utd), "--publish-every", "4")
    collectors = [
        _start("collect", str(run), "--collector-id", str(k), "--max-lead", "8", "--max-env-steps", str(steps_each))
        for k in (0, 1)
    ]
    procs = [learner, *collectors]
    try:
        cap = int(utd * 2 * steps_each)
        _wait(lambda: _updates(run) >= cap, 120, f"{cap} updates", [learner])
        for c in collectors:  # they stop by themselves after --max-env-steps
            _, err = c.communicate(timeout=60)
            assert c.returncode == 0 and "Traceback" not in err, err
        # the learner publishes its weights before each wait for data: once they carry the cap it is starved
        # there, with every stored step counted, and the final checkpoint below shows it made no update beyond
        _wait(lambda: _published_updates(run) == cap, 60, "the capped weights to be published", [learner])
        counters = _counters(run)
        stored = sum(c["stored_env_steps"] for c in counters.values())
        assert stored == 2 * steps_each and all(c["state"] == "finished" for c in counters.values())
        # each collector reloaded a published version: it acted with the learner's weights, not only the first
        assert all(c["weights_updates"] > 0 for c in counters.values()), counters
        rows = [r for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "train"]
        assert rows and all(r["updates"] <= utd * r["async/stored_env_steps"] for r in rows)
        _stop(learner, signal.SIGTERM)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    ckpt = list_checkpoints(run)[-1]
    _, _, state = read_checkpoint(ckpt)
    assert state["updates"] == cap == int(utd * stored)  # consumed every stored step the ratio allows
    assert (run / "config.json").is_file() and (run / "async" / "weights.safetensors").is_file()


def test_sigkill_loses_no_stored_rollout_and_a_restarted_collector_continues(tmp_path):
    run = tmp_path / "run"
    learner = _start("learn", str(run), *TINY, "--utd", "0.05")
    collector = _start("collect", str(run), "--collector-id", "3")
    procs = [learner, collector]
    fifo = run / "replay" / "fifo"
    try:
        _wait(lambda: len(list_rollout_files(fifo)) >= 200, 120, "200 stored rollouts", procs)
        twin = _start("collect", str(run), "--collector-id", "3", "--max-env-steps", "16")  # the id is taken
        _, err = twin.communicate(timeout=60)
        assert twin.returncode == 2 and "collector id 3 is in use" in err and len(err.strip().splitlines()) == 1, err
        collector.send_signal(signal.SIGKILL)  # mid-write, most likely: it writes one file per 2 env steps
        collector.wait(timeout=30)
        files = list_rollout_files(fifo)
        for f in files:  # every finished file loads (atomic renames); temp files are not listed
            assert load_rollout(f.path).num_timesteps == 3
        before = _counters(run)[3]
        again = _start("collect", str(run), "--collector-id", "3", "--max-env-steps", "16")
        _, err = again.communicate(timeout=60)
        assert again.returncode == 0 and "Traceback" not in err, err
        after = _counters(run)[3]
        assert after["starts"] == 2 and after["state"] == "finished"
        assert after["env_steps"] >= before["env_steps"] + 16 and after["stored_rollouts"] > before["stored_rollouts"]
        assert len(list_rollout_files(fifo)) > len(files)
        assert "stopped by SIGINT" in _stop(learner, signal.SIGINT)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    _, _, state = read_checkpoint(list_checkpoints(run)[-1])  # written at the stop, reads back whole
    assert state["updates"] > 0
