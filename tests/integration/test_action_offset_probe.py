"""benchmarks/action_offset_probe.py and action_offset_trace.py end to end on a tiny two-armed bandit run: the trace
trains as `icrl train` does and writes one row per 5 updates; the probe reads every checkpoint of that run."""

from __future__ import annotations

import json
import subprocess
import sys

from helpers import CLI_ENV, ROOT, TINY


def test_the_trace_trains_as_icrl_train_and_the_probe_reads_its_checkpoints(tmp_path):
    run_dir, trace = tmp_path / "run", tmp_path / "trace.jsonl"
    tiny = [*TINY]
    tiny[tiny.index("--updates-per-epoch") + 1] = "6"  # 12 updates: trace rows at updates 0, 5, 10
    args = ["train", "--env", "bandit", "--env-kwargs", '{"arms": 2, "horizon": 8}', *tiny, "--warmup-updates", "1",
            "--checkpoint-every", "1", "--keep-checkpoints", "10", "--device", "cpu", "--run-dir", str(run_dir)]
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "action_offset_trace.py"), str(trace), *args],
                   check=True, env=CLI_ENV, cwd=tmp_path, capture_output=True)
    rows = [json.loads(x) for x in trace.read_text().splitlines()]
    assert [r["update"] for r in rows] == [0, 5, 10]
    for r in rows:
        assert 0.0 <= r["batch_p1"] <= 1.0 and 0.0 <= r["data_a1"] <= 1.0
        assert abs(r["batch_dq_piw"]) < 50 and abs(r["batch_dq"]) < 50
        assert 0.0 < r["batch_dq_member_sd"] < 50  # four members with their own initialisations never agree exactly
    assert (run_dir / "metrics.jsonl").exists()  # the run itself is an ordinary icrl run

    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "action_offset_probe.py"), str(run_dir),
                          "--rollouts", "3"], check=True, env=CLI_ENV, cwd=tmp_path, capture_output=True, text=True)
    probed = [json.loads(x) for x in out.stdout.splitlines()]
    assert [p["checkpoint"] for p in probed] == ["ckpt-000001", "ckpt-000002"]
    for p in probed:
        assert len(p["q_arm_offset"]) == 2 and abs(sum(p["q_arm_offset"])) < 1e-2  # centred over the arms
        assert abs(sum(p["policy_mean_probs"]) - 1) < 1e-2 and abs(sum(p["greedy_share"]) - 1) < 1e-2
        assert 0.0 <= p["policy_entropy"] <= 0.7
