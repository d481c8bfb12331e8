"""Frames and `icrl eval --video`: a GIF of the rollouts, or one line (exit 2) for an env without frames or
without pygame."""

import subprocess
import sys

import numpy as np
from PIL import Image

import icrl
from icrl import train
from icrl.config import EnvConfig, ExperimentConfig, ModelConfig
from icrl.envs.tasks.tmaze import TMaze

from helpers import cli, tiny


def test_tmaze_frames_show_cue_only_at_start():
    env = TMaze(length=4, render_mode="rgb_array")
    env.reset(seed=0)
    first = env.render()
    assert first.shape == (36, 60, 3) and first.dtype == np.uint8
    env.step(3)  # right
    later = env.render()
    assert not np.array_equal(first[:, :12], later[:, :12])  # cue gone, agent moved


def _tiny_run(run_dir, env: str, kwargs: str):
    cfg = ExperimentConfig(
        env=EnvConfig(env=env, env_kwargs=kwargs, parallel_envs=2),
        model=ModelConfig(d_model=16, layers=1, heads=2, head_hidden=16, max_seq_len=16),
    ).replace(
        eval_rollouts=2, run_dir=str(run_dir), total_env_steps=32, steps_per_epoch=16, updates_per_epoch=1,
    )
    train(cfg)


def test_eval_video_writes_a_gif(tmp_path):
    _tiny_run(tmp_path / "run", "tmaze", '{"length": 3}')
    out = subprocess.run(
        [sys.executable, "-m", "icrl", "eval", str(tmp_path / "run"), "--rollouts", "2", "--video", "2"],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    gif = Image.open(tmp_path / "run" / "eval_video.gif")
    assert gif.n_frames >= 2 and gif.size[1] >= 96


def test_video_of_an_env_without_frames_fails_in_one_line(tmp_path):
    _tiny_run(tmp_path / "run", "cue_recall", '{"delay": 1}')
    out = subprocess.run(
        [sys.executable, "-m", "icrl", "eval", str(tmp_path / "run"), "--rollouts", "2", "--video", "1"],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 2 and "cue_recall" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "run" / "eval_video.gif").exists()


def test_video_without_pygame_is_one_line_exit_2(in_tmp, monkeypatch, capsys):
    icrl.train(tiny("runs/pole", env="CartPole-v1", env_kwargs='{"max_episode_steps": 8}'))
    monkeypatch.setitem(sys.modules, "pygame", None)  # `import pygame` raises ImportError: as if not installed
    capsys.readouterr()
    code = cli("eval", "runs/pole", "--rollouts", "2", "--video", "1")
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "pygame" in err and "CartPole-v1" in err
