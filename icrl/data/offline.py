"""Offline and mixed training: load a dataset into the replay's protected folder once, and plan the epochs.

Why through the protected folder: offline, online and mixed training are then one code path (docs/design.md §6).
The sampler draws windows from `protected` with probability `--offline-fraction` (or uniformly over all
files when it is unset); `--offline-updates` adds epochs of updates without env steps before collection
starts, so `--total-env-steps 0` trains purely offline while evaluation still runs on the env.

The import is all-or-nothing and happens once per run: rollouts are written to a hidden staging folder
beside `fifo/` and `protected/`, then renamed into `protected/` (new unique names: nothing existing is ever
touched), and RUN_DIR/replay/offline_data.json records the source. A resumed run finds the record and
skips the import; an import interrupted while moving files is undone and redone at the next start.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from icrl.config import ConfigError, ExperimentConfig
from icrl.config.errors import flag
from icrl.data.minari_io import (
    OfflineDataNotFoundError,
    SpaceMismatchError,
    agent_observation_space,
    read_minari,
    write_minari,
)
from icrl.data.storage import (
    ROLLOUT_FILE_RE,
    CorruptRolloutError,
    list_rollout_files,
    load_rollout,
    rollout_file_name,
    save_rollout,
)
from icrl.envs.make import make_env, make_wrapped_env
from icrl.envs.user import EnvOverride, run_env_config
from icrl.envs.wrapper import _flatten_obs_space, achieved_slots, agent_action_space
from icrl.fileio import fsync_dir, write_text_atomic
from icrl.spaces_json import read_spaces, spaces_wrapper
from icrl.types import ActionSpec, Rollout

MANIFEST = "offline_data.json"
_STAGING = ".offline-import-"
SourceKind = Literal["minari", "rollouts"]


def resolve_source(source: str) -> tuple[SourceKind, list[Path] | str]:
    """`--offline-data` -> ("rollouts", folders of .npz files) or ("minari", dataset folder or id).

    A folder holding `data/metadata.json` is a Minari dataset; a run dir means its replay/fifo and
    replay/protected; a replay folder means its fifo/ and protected/; any other folder is read as is.
    Anything that is not a folder is taken as a Minari dataset id.
    """
    path = Path(source).expanduser()
    if path.is_file():
        raise ValueError(f"{flag('offline_data')} {source}: a file; pass a folder of rollout files or a Minari dataset")
    if not path.is_dir():
        return "minari", source
    if (path / "data" / "metadata.json").is_file() or (path / "metadata.json").is_file():
        return "minari", str(path)
    for root in (path / "replay", path):
        subs = [root / "fifo", root / "protected"]
        if any(s.is_dir() for s in subs):
            return "rollouts", subs
    return "rollouts", [path]


def read_rollout_folders(folders: list[Path], env_obs_space, action_spec: ActionSpec) -> Iterator[Rollout]:
    """Every rollout file in `folders` (oldest first), checked against the env's agent-side spaces."""
    files = [f for folder in folders for f in list_rollout_files(folder)]
    if not files:
        where = ", ".join(str(f) for f in folders)
        raise OfflineDataNotFoundError(f"no icrl rollout files (*-T<n>.npz written by DiskReplay) in {where}")
    boxes = {key: box for key, _, box, _ in _flatten_obs_space(env_obs_space)}
    for f in files:
        try:
            rollout = load_rollout(f.path)
        except CorruptRolloutError as e:
            raise ValueError(f"{e}; remove or replace the file, then import again") from e
        except FileNotFoundError:  # evicted by a run that is still writing there
            continue
        problems = []
        if sorted(rollout.obs) != sorted(boxes):
            problems.append(f"observation keys {sorted(rollout.obs)} (the env's: {sorted(boxes)})")
        for key in set(rollout.obs) & set(boxes):
            arr, box = rollout.obs[key], boxes[key]
            if arr.shape[1:] != box.shape or arr.dtype != box.dtype:
                problems.append(f"obs[{key!r}] {arr.dtype}{list(arr.shape[1:])} "
                                f"(the env's: {box.dtype}{list(box.shape)})")
        want = action_spec.storage_shape(len(rollout.action))
        if rollout.action.shape != want or rollout.action.dtype != action_spec.storage_dtype:
            problems.append(f"actions {rollout.action.dtype}{list(rollout.action.shape[1:])} (the env's: "
                            f"{action_spec.kind} actions of width {action_spec.dim})")
        elif rollout.prev_action.shape[1:] != (action_spec.dim,):
            problems.append(f"prev_action width {rollout.prev_action.shape[1]} (the env's: {action_spec.dim})")
        if problems:
            raise SpaceMismatchError(f"rollout file {f.path} does not fit the env: " + "; ".join(problems)
                                     + f". Train with the {flag('env')} (and {flag('env_kwargs')}) "
                                     "the rollouts were collected in.")
        yield rollout


def iter_offline_rollouts(cfg: ExperimentConfig, source: str) -> Iterator[Rollout]:
    """The rollouts of `source`, converted for and checked against the env of `cfg`."""
    env = make_env(cfg.env.env, cfg.env.kwargs)
    try:
        obs_space, act_space, slots = env.observation_space, env.action_space, achieved_slots(env)
    finally:
        env.close()
    _, where = resolve_source(source)
    if isinstance(where, str):  # resolve_source's "minari": a dataset folder or id
        return read_minari(where, obs_space, act_space, achieved_slots=slots)
    spec = ActionSpec.from_space(agent_action_space(act_space))
    return read_rollout_folders(where, obs_space, spec)


MAX_MANIFEST_BYTES = 64 << 20  # a million rollout names with room to spare


def _read_manifest(manifest: Path) -> dict:
    """The import record of `manifest`, or ConfigError (one line) for a file that is not one. It is never
    repaired or removed here: it says which rollouts of protected/ came from which source, and a guess could
    import the data twice or delete a genuine rollout."""
    problem = None
    try:
        if manifest.stat().st_size > MAX_MANIFEST_BYTES:
            problem = f"larger than {MAX_MANIFEST_BYTES:,} bytes"
        else:
            record = json.loads(manifest.read_text(encoding="utf-8"))
            if not isinstance(record, dict) or not isinstance(record.get("source"), str):
                problem = "not an import record (no source)"
            elif not isinstance(record.get("files", []), list) or not isinstance(record.get("status", ""), str):
                problem = "not an import record (files or status of the wrong kind)"
    except (OSError, UnicodeDecodeError) as e:
        problem = f"unreadable ({e})"
    except (ValueError, RecursionError) as e:
        problem = f"not valid JSON ({type(e).__name__})"
    if problem is not None:
        raise ConfigError(f"{manifest} is damaged: {problem}. It records this run's offline import; to import "
                          f"again, remove it and the rollouts that import put in {manifest.parent / 'protected'} "
                          f"(or train in another {flag('run_dir')})")
    return record


def _undo_interrupted(replay_root: Path) -> None:
    """Remove staging folders, and the files of an import that was interrupted while moving them."""
    for stale in replay_root.glob(f"{_STAGING}*"):
        shutil.rmtree(stale, ignore_errors=True)
    manifest = replay_root / MANIFEST
    if manifest.is_file():
        record = _read_manifest(manifest)
        if record.get("status") != "done":
            for name in record.get("files", []):  # only rollout names: a forged manifest names no other file
                if isinstance(name, str) and ROLLOUT_FILE_RE.fullmatch(name):
                    (replay_root / "protected" / name).unlink(missing_ok=True)
            manifest.unlink()


def import_offline_data(cfg: ExperimentConfig, replay_root: str | os.PathLike, source: str | None = None) -> dict:
    """Load `source` (default `--offline-data`) into `replay_root/protected` unless this run already did.

    Returns the import record: source, rollouts, timesteps. Raises ValueError subclasses with a clear
    message for a missing or corrupt source, spaces that do not fit the env, or a replay that already
    holds a different offline dataset.
    """
    source = cfg.replay.offline_data if source is None else source
    if source is None:
        raise ConfigError(f"no offline data given: pass {flag('offline_data')} PATH_OR_MINARI_ID")
    root = Path(replay_root)
    (root / "protected").mkdir(parents=True, exist_ok=True)
    _undo_interrupted(root)
    manifest = root / MANIFEST
    if manifest.is_file():
        record = _read_manifest(manifest)
        if record["source"] != str(source):
            raise ConfigError(f"{root} already holds offline data from {record['source']!r}, not {source!r}; "
                              f"train in another {flag('run_dir')}")
        return record
    kind, where = resolve_source(str(source))
    own = {p.resolve() for p in (root, root / "fifo", root / "protected")}
    if kind == "rollouts" and any(Path(f).resolve() in own for f in where):
        raise ConfigError(f"{flag('offline_data')} {source} is this run's own replay; pass another run's folder")
    staging = root / f"{_STAGING}{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    names, timesteps = [], 0
    try:
        for rollout in iter_offline_rollouts(cfg, str(source)):
            name = rollout_file_name(rollout.num_timesteps)
            save_rollout(staging / name, rollout, fsync=False)
            names.append(name)
            timesteps += rollout.num_timesteps
        if not names:
            raise ValueError(f"{flag('offline_data')} {source} holds no episodes")
        if hasattr(os, "sync"):
            os.sync()  # one flush for all staged files instead of an fsync per file
        record = {"source": str(source), "kind": kind, "rollouts": len(names), "timesteps": timesteps}
        write_text_atomic(manifest, json.dumps({**record, "status": "moving", "files": names}))
        for name in names:
            os.replace(staging / name, root / "protected" / name)
        fsync_dir(root / "protected")
        write_text_atomic(manifest, json.dumps({**record, "status": "done"}, indent=2))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return record


def offline_epochs(cfg: ExperimentConfig) -> int:
    """Epochs of `--updates-per-epoch` updates without env steps that `--offline-updates` asks for."""
    return -(-cfg.replay.offline_updates // cfg.epoch_updates) if cfg.replay.offline_updates else 0


def prepare_offline(cfg: ExperimentConfig, replay_root: str | os.PathLike, log=print, import_data: bool = True) -> int:
    """Train-time entry: import `--offline-data` once (if given and `import_data`: one process of a
    data-parallel run does it); returns the number of offline epochs (without env steps)."""
    if cfg.replay.offline_data is None or not import_data:
        return offline_epochs(cfg)
    record = import_offline_data(cfg, replay_root)
    log(f"icrl: offline data {record['source']}: {record['rollouts']:,} rollouts, {record['timesteps']:,} "
        f"timesteps in {Path(replay_root) / 'protected'}")
    return offline_epochs(cfg)


def export_run(run_dir: str | os.PathLike, dataset_id: str, *, folder: Literal["fifo", "protected", "all"] = "fifo",
               overwrite: bool = False, override: EnvOverride | None = None) -> tuple[Path, int, int]:
    """Write the rollouts of a run's replay (`fifo`: collected ones) as the local Minari dataset `dataset_id`,
    in the agent-side spaces of the run's env. Returns (dataset folder, episodes, steps).

    The spaces come from RUN_DIR/spaces.json; a run without one builds its env, as `override` allows
    (`icrl.envs.user.run_env_config`: a run directory never makes icrl run code on its own)."""
    run = Path(run_dir)
    config = run / "config.json"
    if not config.is_file():
        raise OfflineDataNotFoundError(f"{run} has no config.json; pass a run directory written by `icrl train`")
    cfg = ExperimentConfig.from_json(config.read_text(encoding="utf-8"))
    spaces = read_spaces(run)
    if spaces is not None:
        env = spaces_wrapper(*spaces)
    else:
        cfg = run_env_config(cfg, run, override or EnvOverride())
        env = make_wrapped_env(cfg.env.env, cfg.env.kwargs, cfg.env.episodes_per_rollout, cfg.env.rollout_horizon)
    try:
        obs_space = agent_observation_space(env.env.observation_space)
        act_space = env.action_space
    finally:
        env.close()
    folders = [run / "replay" / f for f in (("fifo", "protected") if folder == "all" else (folder,))]
    rollouts = read_rollout_folders(folders, env.env.observation_space, ActionSpec.from_space(act_space))
    meta = {"format": 1, "env": cfg.env.env, "env_kwargs": cfg.env.kwargs, "folder": folder,
            "episodes_per_rollout": cfg.env.episodes_per_rollout, "rollout_horizon": cfg.env.rollout_horizon}
    return write_minari(dataset_id, rollouts, obs_space, act_space, overwrite=overwrite, metadata=meta,
                        description=f"icrl rollouts of {cfg.env.env} from {run} ({folder})")


