"""Processes around the Python API (issue 12): a script trains on its own env class, another process loads the
run as the README shows and steps a fresh env with `predict`, agreeing with `icrl eval`; run directories are
data, not code (an `os:system` payload never runs); env errors are one line with exit code 2."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import icrl
from icrl.config import EnvConfig, ExperimentConfig, ModelConfig
from icrl.envs.user import RunEnvError
from icrl.run.load import RunDirError
from icrl.seeding import derive_seed

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
ICRL = Path(sys.executable).with_name("icrl")  # the console script (its sys.path lacks the working directory)
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
TINY = ["--d-model", "16", "--layers", "1", "--heads", "2", "--head-hidden", "16", "--max-seq-len", "16",
        "--parallel-envs", "2", "--updates-per-epoch", "1", "--batch-size", "2", "--eval-rollouts", "2",
        "--threads", "1", "--device", "cpu"]

# The README's "Python API" lines, in a process that never imports the training script: it loads the run
# first (and reports what env code was loaded by then), then imports the user's env only to step a fresh one.
PLAY = """
import json, sys
import icrl

policy = icrl.load(sys.argv[1])
loaded = sorted(m for m in sys.modules if "custom_env" in m or "Signpost" in dir(sys.modules[m]))
sys.path.insert(0, sys.argv[2])
from custom_env import Signpost

env = Signpost()
obs, info = env.reset(seed=int(sys.argv[3]))
returns, lengths = [], []
for _ in range(int(sys.argv[4])):
    state, start, reward, total, steps, done = None, True, None, 0.0, 0, False
    while not done:
        action, state = policy.predict(obs, state, episode_start=start, reward=reward)
        obs, reward, terminated, truncated, info = env.step(action)
        total, steps, start, done = total + reward, steps + 1, False, terminated or truncated
    returns.append(total)
    lengths.append(steps)
    obs, info = env.reset()
print(json.dumps({"loaded": loaded, "returns": returns, "lengths": lengths}))
"""


def run(args, cwd=None, env=None, timeout=300):
    if args[0] == ICRL and not ICRL.exists():
        pytest.skip(f"no icrl console script beside {sys.executable} (pip install -e . in this environment)")
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=cwd, env=env or ENV,
                          timeout=timeout)


def assert_one_line_error(out, *needles):
    assert out.returncode == 2, (out.stdout[-2000:], out.stderr[-2000:])
    assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("icrl: error: ")
    for needle in needles:
        assert needle in out.stderr, (needle, out.stderr)


@pytest.fixture(scope="module")
def signpost(tmp_path_factory):
    """examples/custom_env.py, run as a user would: trains on its own `Signpost` class (defined in __main__)."""
    root = tmp_path_factory.mktemp("signpost")
    out = run([sys.executable, EXAMPLES / "custom_env.py", "--run-dir", root / "run", "--steps", "200", "--quick"],
              cwd=root)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "greedy returns of 5 fresh episodes" in out.stdout
    return root / "run"


def test_readme_flow_other_process_loads_and_predicts_like_icrl_eval(signpost):
    cfg = json.loads((signpost / "config.json").read_text())
    assert cfg["env"]["env"] == "__main__:Signpost"
    assert json.loads((signpost / "spaces.json").read_text())["env"]["rebuild"] == "none"
    seed, rollouts = derive_seed(0, "eval-cli", "rollouts"), 6  # the seed `icrl eval` gives its env copies
    play = run([sys.executable, "-c", PLAY, signpost, EXAMPLES, seed, rollouts])
    assert play.returncode == 0, play.stderr[-3000:]
    result = json.loads(play.stdout.strip().splitlines()[-1])
    assert result["loaded"] == []  # icrl.load imported no env code
    # The run cannot rebuild a class defined in a script: icrl eval says how to pass it, in one line
    assert_one_line_error(run([ICRL, "eval", signpost]), "--env package.module:factory")
    # ... and with --env (resolved from the working directory by the console script) it agrees with predict
    ev = run([ICRL, "eval", signpost, "--env", "custom_env:Signpost", "--rollouts", rollouts, "--parallel-envs", 1],
             cwd=EXAMPLES)
    assert ev.returncode == 0, ev.stderr[-3000:]
    stats = json.loads((signpost / "eval.json").read_text())
    assert stats["rollouts"] == rollouts
    assert stats["return_mean"] == pytest.approx(np.mean(result["returns"]))
    assert stats["return_std"] == pytest.approx(np.std(result["returns"]))
    assert stats["episode_length_mean"] == pytest.approx(np.mean(result["lengths"]))


@pytest.mark.slow
def test_console_script_imports_factories_from_the_working_directory(tmp_path):
    """`icrl train --env mymod:make` finds ./mymod.py (like python -m icrl); an epoch that stores no rollout
    says why and what to change; the run's `mymod:make` is code, so `icrl eval` builds it only when trusted."""
    (tmp_path / "mymod.py").write_text("from icrl.envs.tasks.tmaze import TMaze\n\n"
                                       "def make():\n    return TMaze(length=30)\n")
    out = run([ICRL, "train", "--env", "mymod:make", "--total-env-steps", "16", "--steps-per-epoch", "16",
               "--run-dir", "run", *TINY], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    text = " ".join(out.stdout.split())
    assert "epoch 1 finished no rollout" in text and "--chunk-len" in text and "--steps-per-epoch" in text
    assert_one_line_error(run([ICRL, "eval", "run"], cwd=tmp_path), "'mymod:make'", "--trust-run-env")
    ok = run([ICRL, "eval", "run", "--trust-run-env", "--rollouts", "2"], cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr[-3000:]


def _shadow_popgym(tmp_path: Path) -> dict:
    """An environment in which `import popgym` fails, as without the extra."""
    (tmp_path / "shadow" / "popgym").mkdir(parents=True)
    (tmp_path / "shadow" / "popgym" / "__init__.py").write_text("raise ImportError('No module named popgym')\n")
    return {**ENV, "PYTHONPATH": os.pathsep.join([str(tmp_path / "shadow"), ENV.get("PYTHONPATH", "")])}


@pytest.mark.parametrize("env_name, needles", [
    ("Taxi-v3", ["Taxi-v4"]),  # gymnasium's own advice
    ("nosuch", ["icrl envs", "popgym/<name>"]),  # short: the forms and families, not 60 names
    ("tmaz", ["Did you mean 'tmaze'"]),
    ("HalfCheetah-v5", ["pip install 'icrl[mujoco]'"]),
    ("popgym/RepeatPreviousEasy", ["pip install 'icrl[popgym]'"]),
])
def test_env_errors_are_one_line_with_exit_2(tmp_path, env_name, needles):
    env = ENV
    if env_name.startswith("HalfCheetah"):
        if subprocess.run([sys.executable, "-c", "import mujoco"], capture_output=True).returncode == 0:
            pytest.skip("MuJoCo is installed here")
    if env_name.startswith("popgym/"):
        env = _shadow_popgym(tmp_path)
    out = run([sys.executable, "-m", "icrl", "train", "--env", env_name, "--run-dir", tmp_path / "run", *TINY], env=env)
    assert_one_line_error(out, *needles)
    assert len(out.stderr) < 600 and not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- run directories are data
@pytest.fixture(scope="module")
def evil_run(tmp_path_factory):
    """A real tiny run whose config.json was edited to name `os:system` with a command that leaves a marker."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("evil")
    cfg = ExperimentConfig(
        env=EnvConfig(env="tmaze", env_kwargs='{"length": 3}', parallel_envs=2),
        model=ModelConfig(d_model=16, layers=1, heads=2, head_hidden=16, max_seq_len=16),
    ).replace(
        eval_rollouts=2, run_dir=str(root / "run"), total_env_steps=32, steps_per_epoch=16,
        updates_per_epoch=1, batch_size=2, device="cpu", threads=1,
    )
    icrl.train(cfg)
    marker = root / "pwned"
    config = json.loads((root / "run" / "config.json").read_text())
    config["env"].update(env="os:system", env_kwargs=json.dumps({"command": f"touch {marker}"}))
    (root / "run" / "config.json").write_text(json.dumps(config))
    return root / "run", marker


def test_a_config_file_naming_os_system_runs_nothing(evil_run, tmp_path):
    """`--config` reads data, as a run directory is: a config naming code as its env is refused before anything
    is built, for train and learn, a run dir or its config.json; naming the env (`--env`) takes the user's."""
    run_dir, marker = evil_run
    for args in (["train", "--config", run_dir], ["train", "--config", run_dir / "config.json"],
                 ["learn", tmp_path / "learner", "--config", run_dir]):
        out = run([sys.executable, "-m", "icrl", *args])
        assert_one_line_error(out, "'os:system'", "--trust-run-env", "a config file is data")
        assert not marker.exists(), args
    assert not (tmp_path / "learner").exists()
    from icrl.cli import parse

    args = parse(["train", "--config", str(run_dir), "--env", "tmaze"])  # the user's env: no refusal
    assert args.config.env.env == "tmaze" and not marker.exists()


@pytest.mark.slow
def test_a_run_dir_naming_os_system_runs_nothing(evil_run, tmp_path):
    run_dir, marker = evil_run
    for args in (["eval", run_dir], ["eval", run_dir, "--env-kwargs", "{}"], ["collect", run_dir, "--wait", "1"]):
        assert_one_line_error(run([sys.executable, "-m", "icrl", *args]), "'os:system'", "--trust-run-env")
        assert not marker.exists(), args
    with pytest.raises(RunEnvError, match="os:system"):
        from icrl.run.artifacts import record_video

        record_video(run_dir, 1)
    policy = icrl.load(run_dir)  # needs no env at all: the spaces are in spaces.json
    action, _ = policy.predict(np.array([1.0, 0.0, 0.0, 0.0], np.float32))
    assert 0 <= int(action) < 4 and not marker.exists()
    if subprocess.run([sys.executable, "-c", "import minari"], capture_output=True).returncode == 0:
        datasets = {**ENV, "MINARI_DATASETS_PATH": str(tmp_path / "datasets")}
        out = run([sys.executable, "-m", "icrl", "export-minari", run_dir, "icrl/evil-v0"], env=datasets)
        assert out.returncode == 0, out.stderr[-2000:]  # spaces.json is enough: no env is built
        old = tmp_path / "old"  # a run from before spaces.json: export would have to build the env
        shutil.copytree(run_dir, old, ignore=shutil.ignore_patterns("replay"))
        (old / "spaces.json").unlink()
        out = run([sys.executable, "-m", "icrl", "export-minari", old, "icrl/old-v0"], env=datasets)
        assert_one_line_error(out, "'os:system'")
        with pytest.raises(RunDirError, match="spaces.json"):
            icrl.load(old / "agent.safetensors")
    assert not marker.exists()
    # The payload is live: with the explicit opt-in it does run (and then fails, returning no env).
    out = run([sys.executable, "-m", "icrl", "eval", run_dir, "--trust-run-env"])
    assert_one_line_error(out, "returned int, not a gymnasium.Env")
    assert marker.exists()
