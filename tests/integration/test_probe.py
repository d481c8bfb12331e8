"""Hostile input through the real CLI, one subprocess per case (issue 13).

Every refusal must exit 2 with one line on stderr (`icrl: error: ...`, naming the problem) and leave the run
directory as it was (or absent); every recovery (an inconsistent checkpoint, a replay file with NaN, a run dir
spelled differently) must exit 0 with its warning; no case may print a traceback, die of a signal (segfault)
or leave a non-finite weight on disk. Tiny configs keep the whole table near a minute on 2 CPU cores.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from helpers import run_icrl

TINY = [
    "--env", "tmaze", "--env-kwargs", '{"length": 1}', "--parallel-envs", "2", "--eval-rollouts", "2",
    "--d-model", "16", "--layers", "1", "--heads", "2", "--max-seq-len", "8", "--max-time", "16",
    "--head-hidden", "16", "--head-layers", "1", "--num-critics", "2", "--steps-per-epoch", "8",
    "--updates-per-epoch", "2", "--batch-size", "4", "--device", "cpu", "--threads", "1",
    "--checkpoint-every", "1", "--eval-every", "100", "--log-every", "100",
]


def train(run_dir: str | Path, total: int, *extra: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return run_icrl("train", *TINY, "--total-env-steps", str(total), "--run-dir", str(run_dir), *extra, cwd=cwd,
                    timeout=timeout)


def snapshot(path: Path) -> dict[str, str] | None:
    """Every file under `path` with a hash of its bytes (None when `path` does not exist)."""
    if not path.exists():
        return None
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(path.rglob("*"))}


def assert_sane(out: subprocess.CompletedProcess, run_dir: Path | None = None) -> None:
    """No traceback, no death by signal, and every weights file on disk finite."""
    assert "Traceback" not in out.stderr + out.stdout, out.stderr
    assert out.returncode >= 0, f"killed by signal {-out.returncode}: {out.stderr}"
    if run_dir is not None and run_dir.exists():
        for f in run_dir.rglob("*.safetensors"):
            bad = [k for k, t in load_file(str(f)).items() if t.is_floating_point() and not torch.isfinite(t).all()]
            assert not bad, f"{f} holds non-finite tensors {bad[:3]}"


def assert_refused(out: subprocess.CompletedProcess, *words: str) -> str:
    assert_sane(out)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("icrl: error: "), out.stderr
    for w in words:
        assert w.lower() in lines[0].lower(), (w, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """A finished tiny run (`base`, 5 checkpoints) and one of another model size (`foreign`)."""
    root = tmp_path_factory.mktemp("probe")
    for name, extra in (("base", ()), ("foreign", ("--d-model", "32"))):
        out = train(root / name, 40, "--keep-checkpoints", "5", *extra, cwd=root)
        assert out.returncode == 0, out.stderr
    return root


def copy_run(runs: Path, tmp_path: Path, name: str = "run") -> Path:
    dst = tmp_path / name
    shutil.copytree(runs / "base", dst)
    return dst


# --------------------------------------------------------------------------------- refused on a fresh dir
FRESH = [
    (["--heads", "0"], "--heads"), (["--d-model", "0"], "--d-model"), (["--eval-every", "0"], "--eval-every"),
    (["--eval-rollouts", "0"], "--eval-rollouts"), (["--device", "banana"], "--device"),
    (["--device", "cuda:99"], "--device"), (["--grad-clip", "-1"], "--grad-clip"), (["--lr", "nan"], "--lr"),
    (["--tau", "0"], "--tau"), (["--gammas", "0.9", "1.5"], "--gammas"),
    (["--redq-subset", "3"], "--redq-subset"), (["--batch-size", "0"], "--batch-size"),
    (["--dropout", "1.5"], "--dropout"), (["--eps-start", "2"], "--eps-start"), (["--seed", "-1"], "--seed"),
    (["--threads", "-1"], "--threads"), (["--max-seq-len", "1"], "--max-seq-len"),
    (["--steps-per-epoch", "0"], "--steps-per-epoch"), (["--eval-max-steps", "0"], "--eval-max-steps"),
    (["--d-model", "30", "--heads", "4"], "divisible"), (["--heads", "abc"], "--heads"),
    (["--hedas", "3"], "--hedas"), (["--traj-encoder", "banana"], "banana"),
    (["--env-kwargs", '{"length": null}'], "'length'"), (["--env-kwargs", '{"length": "abc"}'], "'length'"),
    (["--env-kwargs", '{"length": -3}'], "length=-3"), (["--env-kwargs", '{"bogus": 1}'], "'bogus'"),
    (["--env-kwargs", "not json"], "--env-kwargs"), (["--env-kwargs", "[1]"], "--env-kwargs"),
    (["--env", "no_such_env"], "no_such_env"), (["--preset", "nope"], "preset"),
    (["--env", "../x:y"], "not a module name"), (["--env-kwargs", "[" * 20_000 + "]" * 20_000], "nested too deeply"),
]


@pytest.mark.parametrize(("flags", "word"), FRESH, ids=[" ".join(f)[:60] for f, _ in FRESH])
def test_bad_value_refused_before_anything_is_written(tmp_path, flags, word):
    out = train(tmp_path / "run", 16, *flags, cwd=tmp_path)
    assert_refused(out, word)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("source", "word"), [('raise RuntimeError("boom")\n', "RuntimeError: boom"),
                                              ("def f(:\n", "SyntaxError"),
                                              ("import no_such_dependency\n", "no_such_dependency")])
def test_a_user_module_that_raises_or_does_not_parse_is_one_line(tmp_path, source, word):
    """The module of `--env module:factory` is the user's code: its failure is said with where it happened."""
    (tmp_path / "usermod.py").write_text(source)
    out = train(tmp_path / "run", 16, "--env", "usermod:Env", cwd=tmp_path)
    assert_refused(out, word)
    assert "usermod" in out.stderr and not (tmp_path / "run").exists()


def test_run_dir_that_is_a_file_or_below_one(tmp_path):
    (tmp_path / "afile").write_text("keep me")
    assert_refused(train(tmp_path / "afile", 16, cwd=tmp_path), "is a file")
    assert_refused(train(tmp_path / "afile" / "sub", 16, cwd=tmp_path), "is a file")
    assert (tmp_path / "afile").read_text() == "keep me"


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into any folder")
def test_unwritable_run_dir(tmp_path):
    locked = tmp_path / "ro"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        assert_refused(train(locked / "run", 16, cwd=tmp_path), "not writable")
    finally:
        locked.chmod(0o700)


# --------------------------------------------------------------------------- refused on an existing run
EXISTING = [
    (["train", "{tiny}", "--total-env-steps", "40", "--run-dir", "{run}"], "--resume"),
    (["train", "{tiny}", "--total-env-steps", "48", "--run-dir", "{run}", "--resume", "--lr", "0.01"], "optim.lr"),
    (["train", "{tiny}", "--total-env-steps", "48", "--run-dir", "{run}", "--resume", "--heads", "0"], "--heads"),
    (["eval", "{run}", "--rollouts", "0"], "--rollouts"),
    (["eval", "{run}", "--device", "banana"], "device"),
    (["eval", "{run}", "--checkpoint", "ckpt-000099"], "ckpt-000099"),
    (["eval", "{run}", "--seed", "-1"], "--seed"),
    (["learn", "{run}", "--utd", "nan"], "--utd"),
    (["collect", "{run}", "--wait", "-1"], "--wait"),
]


@pytest.mark.parametrize(("argv", "word"), EXISTING, ids=["no-resume", "resume-lr", "resume-heads-0", "eval-rollouts-0",
                                                          "eval-device", "eval-missing-checkpoint", "eval-seed",
                                                          "learn-utd", "collect-wait"])
def test_refusal_leaves_an_existing_run_unchanged(runs, tmp_path, argv, word):
    run = copy_run(runs, tmp_path)
    args = [a for x in argv for a in (TINY if x == "{tiny}" else [x.replace("{run}", str(run))])]
    before = snapshot(run)
    assert_refused(run_icrl(*args, cwd=tmp_path), word)
    assert snapshot(run) == before


def test_tampered_config_json_is_refused_by_eval(runs, tmp_path):
    run = copy_run(runs, tmp_path)
    cfg = json.loads((run / "config.json").read_text())
    cfg["model"]["heads"] = 0
    (run / "config.json").write_text(json.dumps(cfg))
    before = snapshot(run)
    assert_refused(run_icrl("eval", str(run), cwd=tmp_path), "--heads")
    (tmp_path / "empty").mkdir()
    assert_refused(run_icrl("eval", str(tmp_path / "empty"), cwd=tmp_path), "config.json")
    assert snapshot(run) == before
    (run / "config.json").write_text("[]")
    before = snapshot(run)
    assert_refused(train(run, 48, "--resume", cwd=tmp_path), "config")
    assert snapshot(run) == before


# ------------------------------------------------------------ inconsistent checkpoints: one warning, fallback
class _Payload:
    """Pickles to a shell command: `torch.load(weights_only=True)` must refuse it, never run it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _state_edit(fn):
    def edit(ckpt: Path, runs: Path, tmp: Path) -> None:
        state = json.loads((ckpt / "state.json").read_text())
        fn(state)
        (ckpt / "state.json").write_text(json.dumps(state))
    return edit


TAMPER = {
    "foreign_optimizer": lambda c, r, t: shutil.copy(r / "foreign/checkpoints" / c.name / "optimizer.pt", c),
    "foreign_weights": lambda c, r, t: shutil.copy(r / "foreign/checkpoints" / c.name / "agent.safetensors", c),
    "state_missing_keys": _state_edit(lambda s: [s.pop("learner"), s.pop("collector")]),
    "rng_wrong_size": _state_edit(lambda s: s["rng"].update(torch=s["rng"]["torch"][:100])),
    "exploration_wrong_size": _state_edit(lambda s: s["exploration"].update(scale=[0.5] * 7)),
    "state_not_object": lambda c, r, t: (c / "state.json").write_text("[1, 2]"),
    "pickle_payload": lambda c, r, t: torch.save({"optimizer": _Payload(t / "pwned"), "scheduler": {}},
                                                 c / "optimizer.pt"),
}
# Each run tampers with its newest checkpoints in this order (newest first): every one must be skipped with
# one warning, the resume must start from the next older one, and the skipped ones must be kept aside.
CASES = [["foreign_optimizer", "foreign_weights", "state_missing_keys", "rng_wrong_size"],
         ["pickle_payload", "exploration_wrong_size", "state_not_object"]]


@pytest.mark.parametrize("tampers", CASES, ids=["+".join(c) for c in CASES])
def test_inconsistent_checkpoints_fall_back_to_the_previous_one(runs, tmp_path, tampers):
    run = copy_run(runs, tmp_path)
    ckpts = sorted((run / "checkpoints").glob("ckpt-*"))[::-1]  # newest first
    for ckpt, name in zip(ckpts, tampers):
        TAMPER[name](ckpt, runs, tmp_path)
    out = train(run, 48, "--resume", cwd=tmp_path)
    assert_sane(out, run)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("skipping checkpoint") == len(tampers), out.stdout
    assert f"resuming from {ckpts[len(tampers)]}" in out.stdout
    assert json.loads((run / "checkpoints/ckpt-000006/state.json").read_text())["env_steps"] == 48
    for ckpt in ckpts[: len(tampers)]:  # set aside, not deleted
        assert (ckpt.parent / f"rejected-{ckpt.name}" / "agent.safetensors").is_file()
    assert not (tmp_path / "pwned").exists()


# ------------------------------------------------------------------------- the same run, spelled otherwise
@pytest.mark.parametrize("spelling", ["moved+absolute+threads", "dot_slash+device"])
def test_resume_ignores_path_spelling_and_run_only_settings(runs, tmp_path, spelling):
    run = copy_run(runs, tmp_path)
    if spelling == "dot_slash+device":
        out = train("./run/", 48, "--resume", "--device", "auto", cwd=tmp_path)
    else:
        moved = tmp_path / "elsewhere" / "run2"
        moved.parent.mkdir()
        shutil.move(str(run), str(moved))
        run = moved
        out = train(moved.resolve(), 48, "--resume", "--threads", "2", cwd=tmp_path)
    assert_sane(out, run)
    assert out.returncode == 0 and "resuming from" in out.stdout, out.stderr


# --------------------------------------------------------------------------------------- non-finite data
@pytest.mark.parametrize("kind", ["obs", "reward"])  # inf rewards: tests/unit/test_guards.py
def test_non_finite_env_output_is_a_clear_error(tmp_path, kind):
    out = train(tmp_path / "run", 16, "--env", "probe_envs:BadValueEnv", "--env-kwargs",
                json.dumps({"kind": kind}), cwd=tmp_path)
    line = assert_refused(out, "BadValueEnv", "step 3", "'obs'" if kind == "obs" else "reward")
    assert "nan" in line.lower() or "inf" in line.lower()
    assert not list((tmp_path / "run").rglob("*.safetensors"))


def test_replay_files_with_nan_and_foreign_metrics_lines_are_skipped(runs, tmp_path):
    from icrl.data.storage import load_rollout, save_rollout

    run = copy_run(runs, tmp_path)
    files = sorted((run / "replay/fifo").glob("*.npz"))
    for f in files:  # "valid" files whose rewards are NaN, as a foreign writer could leave them
        r = load_rollout(f)
        r.reward[:] = np.nan
        save_rollout(f, r, fsync=False)
    with open(run / "metrics.jsonl", "a") as f:  # and foreign lines in the log
        f.write('{"epoch": [1]}\n{"epoch": "x"}\n[]\n')
    out = train(run, 48, "--resume", cwd=tmp_path)
    assert_sane(out, run)
    assert out.returncode == 0, out.stderr
    assert "non-finite" in out.stderr


def test_endless_episodes_do_not_hang_evaluation(tmp_path):
    out = train(tmp_path / "run", 16, "--env-kwargs", '{"length": 100000000000}', "--eval-max-steps", "20",
                cwd=tmp_path, timeout=60)
    assert_sane(out, tmp_path / "run")
    assert out.returncode == 0 and "evaluation stopped at 20 steps" in out.stdout, out.stderr


# ---------------------------------------------------------------------- one process per run, clean stops
def _start(run: Path, tmp_path: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = [sys.executable, "-m", "icrl", "train", *TINY, "--total-env-steps", "100000", "--run-dir", str(run), *extra]
    # SIGINT reaches Python as KeyboardInterrupt only when not ignored (a background CI shell ignores it)
    return subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _stop_after(proc: subprocess.Popen, ckpt: Path, sig: signal.Signals) -> tuple[str, str]:
    try:
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None and not ckpt.exists():
            time.sleep(0.05)
        proc.send_signal(sig)
        return proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_second_process_is_refused_and_signals_stop_cleanly(tmp_path):
    """A second start or --resume beside a live run is refused naming its pid; SIGINT and SIGTERM stop a run in
    one line with the resume hint (exit 130 / 143), and the run resumes from what they left."""
    run = tmp_path / "run"
    first = _start(run, tmp_path)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and first.poll() is None and not (run / "checkpoints/ckpt-000002").exists():
            time.sleep(0.05)
        assert_refused(train(run, 100000, "--resume", cwd=tmp_path), "in use", f"pid {first.pid}")
        assert_refused(run_icrl("learn", str(run), *TINY, "--total-env-steps", "64", cwd=tmp_path), "in use")
    finally:
        _, err = _stop_after(first, run, signal.SIGINT)
    assert first.returncode == 130 and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 and "SIGINT" in err and "--resume" in err, err
    newest = max((run / "checkpoints").glob("ckpt-*"))
    second = _start(run, tmp_path, "--resume")
    out, err = _stop_after(second, newest.with_name(f"ckpt-{int(newest.name[5:]) + 2:06d}"), signal.SIGTERM)
    assert second.returncode == 143 and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 and "SIGTERM" in err and "--resume" in err, err
    assert f"resuming from {newest}" in out
    for f in run.rglob("*.safetensors"):
        assert all(torch.isfinite(t).all() for t in load_file(str(f)).values() if t.is_floating_point())
