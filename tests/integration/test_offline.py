"""Offline and mixed training: the sampler's offline_fraction, importing data into the protected folder, the
offline epochs of `train`, the CLI, and offline learning of the T-Maze from a local Minari dataset."""

from __future__ import annotations

import dataclasses
import json
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from icrl import train
from icrl.cli import main
from icrl.config import ConfigError, EnvConfig, ExperimentConfig, LossConfig, ModelConfig
from icrl.config.presets import tmaze
from icrl.data import DiskReplay, list_rollout_files, load_rollout, make_loader, rollout_file_name
from icrl.data.minari_io import OfflineDataNotFoundError, SpaceMismatchError
from icrl.data.offline import MANIFEST, import_offline_data, resolve_source
from icrl.data.sampler import EmptyReplayError, ReplayDataset
from icrl.envs import Collector, make_vector_env
from icrl.envs.collect import RandomPolicy
from icrl.envs.tasks.tmaze import DOWN, RIGHT, UP, TMaze
from icrl.types import ActionSpec, Rollout

SPEC = ActionSpec("discrete", 2)


def _marked(marker: float, n: int = 5) -> Rollout:
    """A rollout whose observations all equal `marker`, so a window tells which file it came from."""
    return Rollout(
        obs={"obs": np.full((n, 1), marker, np.float32)}, prev_action=np.zeros((n, 2), np.float32),
        prev_reward=np.zeros(n, np.float32), time=np.arange(n), reset=np.eye(n, dtype=bool)[0],
        action=np.zeros(n - 1, np.int64), reward=np.zeros(n - 1, np.float32),
        terminated=np.eye(n - 1, dtype=bool)[-1], truncated=np.zeros(n - 1, bool),
    )


def _replay(root: Path, n_fifo: int, n_protected: int) -> Path:
    replay = DiskReplay(root, capacity_timesteps=10_000, fsync=False, fsync_protected=False)
    for i in range(n_fifo):
        replay.write(_marked(i))  # markers 0, 1, ... in fifo
    for i in range(n_protected):
        replay.write(_marked(100 + i), protected=True)  # 100, 101, ... in protected
    return root


def _markers(p: float | None, root: Path, batches: int = 30, batch_size: int = 50) -> np.ndarray:
    ds = ReplayDataset(root, batch_size=batch_size, max_seq_len=3, action_spec=SPEC, seed=0,
                       offline_fraction=p, auto_refresh=False, empty_timeout_s=0.2)
    return np.concatenate([ds.sample_batch().inputs.obs["obs"][:, 0, 0].numpy() for _ in range(batches)])


# ------------------------------------------------------------------------------------------------ sampling
@pytest.mark.parametrize("p, expected", [(None, 5 / 8), (0.25, 0.25), (0.8, 0.8), (0.0, 0.0), (1.0, 1.0)])
def test_offline_fraction_sets_how_often_windows_come_from_protected(tmp_path, p, expected):
    markers = _markers(p, _replay(tmp_path, n_fifo=3, n_protected=5))  # 1500 windows
    protected = markers >= 100
    sd = np.sqrt(expected * (1 - expected) / len(markers))
    assert abs(protected.mean() - expected) <= 4.5 * sd + 1e-12, (protected.mean(), expected)
    if 0 < expected < 1:  # and uniformly over the files inside each folder
        for values, k in ((markers[protected], 5), (markers[~protected], 3)):
            counts = np.bincount(values.astype(int) % 100, minlength=k)
            q = 1 / k
            assert np.all(np.abs(counts - len(values) * q) <= 4.5 * np.sqrt(len(values) * q * (1 - q))), counts


def test_offline_fraction_falls_back_only_strictly_between_0_and_1(tmp_path):
    root = _replay(tmp_path, n_fifo=0, n_protected=2)
    assert np.all(_markers(0.3, root, batches=2) >= 100)  # fifo still empty: protected serves every window
    with pytest.raises(EmptyReplayError, match="offline_fraction=0.0 windows come only from fifo"):
        _markers(0.0, root, batches=1)
    with pytest.raises(ValueError, match="offline_fraction"):
        ReplayDataset(root, batch_size=1, max_seq_len=2, action_spec=SPEC, offline_fraction=1.5)
    loader = make_loader(root, batch_size=8, max_seq_len=3, action_spec=SPEC, seed=0, offline_fraction=1.0)
    assert torch.all(next(loader).inputs.obs["obs"][:, 0, 0] >= 100)
    loader.close()


# ------------------------------------------------------------------------------------------------- config
def test_config_validates_the_offline_fields():
    def cfg(**train):
        return ExperimentConfig().replace(**train).validate()

    cfg(offline_data="x", total_env_steps=0, offline_updates=10)  # purely offline is valid
    for kwargs, match in [
        (dict(offline_data="x", offline_fraction=1.5), "offline_fraction must be in \\[0.0, 1.0\\], got 1.5"),
        (dict(offline_updates=10), "need offline_data"),
        (dict(offline_fraction=0.5), "need offline_data"),
        (dict(offline_data="x", total_env_steps=0), "total_env_steps 0 is below parallel_envs"),
        (dict(offline_data="x", offline_updates=10, start_updates_after=100), "start_updates_after=0"),
        (dict(offline_data="x", offline_updates=-1), "offline_updates must be >= 0"),
    ]:
        with pytest.raises(ConfigError, match=match):
            cfg(**kwargs)


# ------------------------------------------------------------------------------------------ rollout folders
def _config(run_dir: Path, source: str | Path, env: str = "tmaze", env_kwargs: str = '{"length": 3}',
            **train) -> ExperimentConfig:
    return ExperimentConfig(
        env=EnvConfig(env=env, env_kwargs=env_kwargs, parallel_envs=2),
        model=ModelConfig(d_model=16, layers=1, heads=1, max_seq_len=8, head_hidden=16, head_layers=1),
        loss=LossConfig(gammas=(0.9, 0.99), num_critics=2),
    ).replace(eval_rollouts=2, **{"run_dir": str(run_dir), "offline_data": str(source), "batch_size": 4,
                             "warmup_updates": 1, "steps_per_epoch": 20, "updates_per_epoch": 2,
                             "total_env_steps": 40, "eval_every": 1, **train})


def _collected_run(root: Path, env: str = "tmaze", kwargs: dict | None = None) -> Path:
    """A run dir whose replay/fifo holds random-policy rollouts."""
    venv = make_vector_env(env, kwargs or {"length": 3}, 2)
    spec = ActionSpec.from_space(venv.single_action_space)
    rollouts, _ = Collector(venv, spec, seed=0).collect(RandomPolicy(spec, seed=0), 60)
    venv.close()
    replay = DiskReplay(root / "replay", capacity_timesteps=10_000, fsync=False)
    for r in rollouts:
        replay.write(r)
    return root


def _contents(folder: Path) -> list[bytes]:
    return sorted(b"".join(a.tobytes() for a in load_rollout(f.path).to_arrays().values())
                  for f in list_rollout_files(folder))


def test_rollout_folder_import_copies_every_rollout_once(tmp_path):
    src = _collected_run(tmp_path / "src")
    assert resolve_source(str(src)) == ("rollouts", [src / "replay" / "fifo", src / "replay" / "protected"])
    dst = tmp_path / "dst" / "replay"
    cfg = _config(tmp_path / "dst", src)
    record = import_offline_data(cfg, dst)
    assert record["rollouts"] == len(list_rollout_files(src / "replay" / "fifo")) > 0
    assert _contents(dst / "protected") == _contents(src / "replay" / "fifo")
    assert import_offline_data(cfg, dst) == json.loads((dst / MANIFEST).read_text())  # a second call: no-op
    assert len(list_rollout_files(dst / "protected")) == record["rollouts"]
    with pytest.raises(ConfigError, match="already holds offline data from"):
        import_offline_data(cfg, dst, source=str(src / "replay" / "fifo"))
    with pytest.raises(ConfigError, match="this run's own replay"):
        import_offline_data(_config(src, src), src / "replay")

    # an import interrupted while moving its files is undone and redone at the next start
    manifest = json.loads((dst / MANIFEST).read_text())
    names = [f.name for f in list_rollout_files(dst / "protected")]
    (dst / MANIFEST).write_text(json.dumps({**manifest, "status": "moving", "files": names}))
    (dst / ".offline-import-deadbeef").mkdir()
    import_offline_data(cfg, dst)
    assert _contents(dst / "protected") == _contents(src / "replay" / "fifo")
    assert not list(dst.glob(".offline-import-*"))


def test_rollout_folder_import_rejects_bad_inputs_and_writes_nothing(tmp_path):
    src = _collected_run(tmp_path / "src")
    dst = tmp_path / "dst" / "replay"
    with pytest.raises(SpaceMismatchError, match=r"obs\['obs'\] float32\[4\] \(the env's: float32\[3\]\)"):
        import_offline_data(_config(tmp_path / "dst", src, env="cue_recall", env_kwargs="{}"), dst)
    (src / "replay" / "fifo" / rollout_file_name(7)).write_bytes(b"garbage, not an npz")
    with pytest.raises(ValueError, match="corrupt rollout file .*remove or replace"):
        import_offline_data(_config(tmp_path / "dst", src), dst)
    assert list_rollout_files(dst / "protected") == [] and not (dst / MANIFEST).exists()
    assert not list(dst.glob(".offline-import-*"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(OfflineDataNotFoundError, match="no icrl rollout files"):
        import_offline_data(_config(tmp_path / "dst", tmp_path / "empty"), dst)
    with pytest.raises(ValueError, match="a file"):
        resolve_source(str(next((src / "replay" / "fifo").iterdir())))


# ---------------------------------------------------------------------------------------- training modes
def _rows(run_dir: Path, kind: str) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == kind]


def test_offline_then_online_by_resume_and_mixed_sampling(tmp_path, monkeypatch):
    import icrl.run.build

    fractions = []

    def recording_make_loader(*args, **kwargs):
        fractions.append(kwargs.get("offline_fraction"))
        return make_loader(*args, **kwargs)

    monkeypatch.setattr(icrl.run.build, "make_loader", recording_make_loader)
    src = _collected_run(tmp_path / "src")
    n_src = len(list_rollout_files(src / "replay" / "fifo"))
    run = tmp_path / "run"
    cfg = _config(run, src, offline_updates=3, offline_fraction=0.5, total_env_steps=0)
    result = train(cfg)  # purely offline: 2 epochs of 2 updates (3 rounded up), evaluated on the env
    assert result["env_steps"] == 0 and result["updates"] == 4 and result["rollouts"] >= 2
    assert list_rollout_files(run / "replay" / "fifo") == []
    assert [r["env_steps"] for r in _rows(run, "train")] == [0, 0]

    # fine-tune online from the offline checkpoint: the data is not imported twice
    result = train(dataclasses.replace(cfg).replace(resume=True, total_env_steps=40))
    assert result["env_steps"] == 40 and result["updates"] == 8
    assert [r["env_steps"] for r in _rows(run, "train")] == [0, 0, 20, 40]
    assert len(list_rollout_files(run / "replay" / "protected")) == n_src
    assert len(list_rollout_files(run / "replay" / "fifo")) > 0
    assert fractions == [0.5, 0.5]  # both runs sample with --offline-fraction


# ------------------------------------------------------------------------------------------------ Minari
def _tmaze_dataset(minari, dataset_id: str, length: int, expert: int, noisy: int, eps: float = 0.3) -> float:
    """A local Minari T-Maze dataset in the env's raw spaces: scripted optimal episodes plus episodes whose
    every action is random with probability `eps`. Returns the dataset's success rate."""
    from minari.data_collector.episode_buffer import EpisodeBuffer

    rng = np.random.default_rng(0)
    env = TMaze(length=length)
    buffers = []
    for i in range(expert + noisy):
        obs, _ = env.reset(seed=int(rng.integers(2**31)))
        goal_up = obs[0] == 1.0
        observations, actions, rewards, terms, truncs = [obs], [], [], [], []
        done = False
        while not done:
            a = RIGHT if env._pos[0] < length else (UP if goal_up else DOWN)
            if i >= expert and rng.random() < eps:
                a = int(rng.integers(4))
            obs, r, term, trunc, _ = env.step(a)
            observations.append(obs)
            actions.append(a)
            rewards.append(r)
            terms.append(term)
            truncs.append(trunc)
            done = term or trunc
        buffers.append(EpisodeBuffer(observations=np.stack(observations), actions=np.asarray(actions),
                                     rewards=rewards, terminations=terms, truncations=truncs))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # minari warns about missing author / permalink metadata
        minari.create_dataset_from_buffers(dataset_id, buffers, observation_space=env.observation_space,
                                           action_space=env.action_space)
    return float(np.mean([b.rewards[-1] == 1.0 for b in buffers]))


def test_cli_export_minari_and_train_errors(tmp_path, minari_home, capsys):
    src = _collected_run(tmp_path / "src")
    (src / "config.json").write_text(_config(src, src).to_json())
    main(["export-minari", str(src), "test/tmaze3-random-v0"])
    out = capsys.readouterr().out
    assert "test/tmaze3-random-v0:" in out and "episodes" in out
    assert minari_home.load_dataset("test/tmaze3-random-v0").total_episodes == len(
        list_rollout_files(src / "replay" / "fifo"))
    with pytest.raises(SystemExit) as exit_info:
        main(["export-minari", str(src), "test/tmaze3-random-v0"])
    assert exit_info.value.code == 2 and "already exists" in capsys.readouterr().err
    main(["export-minari", str(src), "test/tmaze3-random-v0", "--overwrite"])

    base = ["train", "--env", "tmaze", "--env-kwargs", '{"length": 3}', "--total-env-steps", "0",
            "--offline-updates", "2", "--offline-fraction", "1.0", "--run-dir"]
    with pytest.raises(SystemExit) as exit_info:
        main([*base, str(tmp_path / "a"), "--offline-data", "test/absent-v0"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "never downloads" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit) as exit_info:  # the right dataset, the wrong env
        main([*base, str(tmp_path / "b"), "--offline-data", "test/tmaze3-random-v0", "--env", "cue_recall",
              "--env-kwargs", "{}"])
    assert exit_info.value.code == 2 and "does not fit the env" in capsys.readouterr().err


@pytest.mark.learning
def test_offline_filtered_bc_learns_tmaze_from_a_minari_dataset(tmp_path, minari_home):
    """Purely offline (no env step): filtered BC on 100 scripted + 100 noisy episodes recalls the cue."""
    torch.set_num_threads(1)
    data_success = _tmaze_dataset(minari_home, "test/tmaze6-mixed-v0", length=6, expert=100, noisy=100)
    assert 0.5 < data_success < 0.8  # the noisy half mostly fails

    venv = make_vector_env("tmaze", {"length": 6}, 8)  # the random-policy baseline
    spec = ActionSpec.from_space(venv.single_action_space)
    _, episodes = Collector(venv, spec, seed=0).collect_rollouts(RandomPolicy(spec, seed=0), 64)
    random_success = np.mean([e.success for e in episodes])
    assert random_success < 0.05

    cfg = tmaze(length=6)
    cfg = dataclasses.replace(
        cfg,
        loss=dataclasses.replace(cfg.loss, online_coeff=0.0, offline_coeff=1.0),  # filtered BC only
    ).replace(
        run_dir=str(tmp_path / "run"), total_env_steps=0, offline_updates=300, updates_per_epoch=100,
        eval_every=1, warmup_updates=50, offline_data="test/tmaze6-mixed-v0", offline_fraction=1.0,
    )
    t0 = time.perf_counter()
    result = train(cfg)
    seconds = time.perf_counter() - t0
    train_rows = _rows(tmp_path / "run", "train")
    print(f"offline T-Maze(6): success {[r['success_rate'] for r in _rows(tmp_path / 'run', 'eval')]} after "
          f"100/200/300 updates, random {random_success:.2f}, data {data_success:.2f}, {seconds:.0f} s")
    assert result["env_steps"] == 0 and result["updates"] == 300
    assert train_rows[-1]["train/loss"] < train_rows[0]["train/loss"]
    assert result["success_rate"] >= 0.9 and result["return_mean"] >= 0.9, result


def test_bad_offline_data_leaves_no_env_open(tmp_path, monkeypatch):
    """Offline data is found missing only after the envs exist and the run dir is locked: the failed call
    closes its envs (env subprocesses with --async-envs) instead of leaving them to the garbage collector."""
    import icrl.run.build as build

    opened = []

    def recording_make_env(*args, **kwargs):
        opened.append(make_env(*args, **kwargs))
        return opened[-1]

    make_env = build.make_run_envs
    monkeypatch.setattr(build, "make_run_envs", recording_make_env)
    cfg = ExperimentConfig(
        env=EnvConfig(env="tmaze", env_kwargs='{"length": 2}', parallel_envs=2),
        model=ModelConfig(d_model=16, layers=1, heads=2, max_seq_len=8),
    ).replace(run_dir=str(tmp_path / "run"), total_env_steps=16, steps_per_epoch=8, updates_per_epoch=1,
              batch_size=2, eval_rollouts=2, offline_data=str(tmp_path / "missing"), device="cpu")
    with pytest.raises(OfflineDataNotFoundError):
        train(cfg)
    assert len(opened) == 2 and all(v.closed for v in opened)  # the train and eval envs
