"""Minari datasets <-> icrl rollouts, so offline data enters the one replay format (docs/design.md §6).

Import. A Minari episode holds T+1 observations and T actions, rewards, terminations and truncations in
the env's own spaces. It becomes one `Rollout` exactly as `TimestepWrapper` would have recorded it: the
observation goes through the wrapper's converters (`_flatten_obs_space`: one-hot for Discrete, float64 ->
float32, Dict keys joined by "/"), actions are mapped to the agent space (Discrete ids minus `start`, Box
actions rescaled from [low, high] to [-1, 1]), and prev_action / prev_reward / time / reset are rebuilt
(zeros and reset=1 at the first timestep). The dataset's spaces must equal the env's own spaces, or the
agent-side spaces icrl exports (below); anything else is refused with both spaces named.

Export. Rollouts are written in the agent-side spaces (what the policy sees; for Box observations,
Discrete actions and [-1, 1] Box actions these are the env's own spaces). A multi-episode rollout is split
at its reset flags into one Minari episode per inner episode; the bridge transition between two episodes
(the ignored action on the final observation) belongs to neither. An inner episode, or a chunk cut by
`--chunk-len`, ends without a done flag in icrl's data; its Minari episode is marked truncated (icrl
bootstraps through it, as through a time limit). Per-episode attributes (`icrl_*`: source rollout, first
time index, the bridge) let `read_minari` glue the episodes back into the original rollouts, so an
export -> import round trip reproduces every array exactly. One exception: a rollout cut by
`--rollout-horizon` right at an episode boundary ends with a lone reset timestep, which holds no
transition; it is dropped.

Minari is an optional extra (`pip install 'icrl[offline]'`) imported only inside these functions. Only
local datasets are read (never downloaded); storage is HDF5 through h5py (no pickle), images lossless.
"""

from __future__ import annotations

import os
import shutil
import uuid
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from icrl.config.errors import flag
from icrl.envs.wrapper import _flatten_obs_space, action_to_vector, agent_action_space
from icrl.types import ActionSpec, Rollout

INSTALL_HINT = "Minari datasets need the optional extra: pip install 'icrl[offline]' (minari[hdf5])"
_FLUSH_EPISODES = 256  # episodes buffered per HDF5 write


class SpaceMismatchError(ValueError):
    """Offline data recorded in other observation or action spaces than the env's."""


class OfflineDataNotFoundError(FileNotFoundError, ValueError):
    """A dataset or rollout folder that does not exist (also a ValueError: the CLI reports it in one line)."""


def require_minari():
    """The `minari` module, or an ImportError that says how to install it."""
    try:
        import minari
    except ImportError as e:
        raise ImportError(INSTALL_HINT) from e
    return minari


# ------------------------------------------------------------------------------------------------ spaces
def agent_observation_space(env_space: gym.Space) -> gym.Space:
    """The observation space the policy sees, nested like the env's: every leaf converted as
    TimestepWrapper converts it (a plain Box stays a Box). Its flattened keys are the Rollout obs keys."""
    leaves = _flatten_obs_space(env_space)
    if len(leaves) == 1 and leaves[0][1] == ():
        return leaves[0][2]
    root: dict = {}
    for _, path, box, _ in leaves:
        node = root
        for name in path[:-1]:
            node = node.setdefault(name, {})
        node[path[-1]] = box

    def build(node: dict) -> gym.spaces.Dict:
        return gym.spaces.Dict({k: build(v) if isinstance(v, dict) else v for k, v in node.items()})

    return build(root)


def check_spaces(
    data_obs: gym.Space, data_act: gym.Space, env_obs: gym.Space, env_act: gym.Space, source: str
) -> None:
    """Accept data recorded in the env's own spaces or in icrl's agent-side spaces; else SpaceMismatchError."""
    _flatten_obs_space(data_obs)  # unsupported spaces raise their own explanatory ValueError
    agent_action_space(data_act)
    problems = []
    if data_obs != env_obs and data_obs != agent_observation_space(env_obs):
        problems.append(f"observation space {data_obs} (the env's: {env_obs})")
    if data_act != env_act and data_act != agent_action_space(env_act):
        problems.append(f"action space {data_act} (the env's: {env_act})")
    if problems:
        raise SpaceMismatchError(
            f"offline data {source} does not fit the env: it has " + "; ".join(problems) + ". Train with the "
            f"{flag('env')} (and {flag('env_kwargs')}) the data was recorded in."
        )


def env_to_agent_actions(space: gym.Space, actions: Any) -> np.ndarray:
    """Env actions [T, ...] of `space` -> agent actions in storage format ([T] int64 | [T, D] float32 in
    [-1, 1] | [T, D] int8): the inverse of `agent_to_env_action`, exact for [-1, 1] Boxes."""
    agent_space = agent_action_space(space)  # raises for unsupported spaces
    spec = ActionSpec.from_space(agent_space)
    a = np.asarray(actions)
    n = len(a)
    if isinstance(space, gym.spaces.Discrete):
        ids = a.astype(np.int64).reshape(n) - int(space.start)
        if n and (ids.min() < 0 or ids.max() >= space.n):
            raise ValueError(f"discrete actions outside {space}: min {ids.min()}, max {ids.max()} after -start")
        return ids
    if isinstance(space, gym.spaces.MultiDiscrete):  # one entry per sub-action -> the joint id
        nvec = np.asarray(space.nvec, dtype=np.int64)
        sub = a.astype(np.int64).reshape(n, len(nvec)) - np.asarray(space.start, dtype=np.int64)
        return np.ravel_multi_index(tuple(sub.T), nvec).astype(np.int64) if n else np.zeros(0, np.int64)
    if isinstance(space, gym.spaces.Box):
        x = a.astype(np.float64).reshape(n, spec.dim)  # [T, D]
        low, high = space.low.astype(np.float64), space.high.astype(np.float64)
        span = np.where(high > low, high - low, 1.0)
        # (2a - (low + high)) / (high - low): exact (a power-of-two scaling) when the Box is [-1, 1]
        u = np.where(high > low, (2.0 * x - (low + high)) / span, 0.0)
        return np.clip(u, -1.0, 1.0).astype(np.float32)
    return (a.reshape(n, spec.dim) > 0).astype(np.int8)


def _convert_observations(space: gym.Space, observations: Any, n: int) -> dict[str, np.ndarray]:
    """Batched env observations (leading dim n, nested like `space`) -> {key: [n, ...]} as the wrapper
    converts them one by one (Box leaves in one vectorised cast, which is the same operation)."""
    out = {}
    for key, path, box, fn in _flatten_obs_space(space):
        value, sub = observations, space
        for p in path:
            if isinstance(sub, gym.spaces.Dict):  # paths name Dict keys and Tuple indices (_flatten_obs_space)
                value, sub = value[p], sub[p]
            elif isinstance(sub, gym.spaces.Tuple):
                value, sub = value[int(p)], sub[int(p)]
            else:
                raise TypeError(f"observation {key!r}: {sub!r} is not a Dict or Tuple space, cannot take its {p!r}")
        if len(value) != n:
            raise ValueError(f"observation {key!r} has {len(value)} rows, expected T+1={n}")
        if isinstance(sub, gym.spaces.Box):
            out[key] = np.asarray(value, dtype=box.dtype).reshape(n, *box.shape)
        else:
            out[key] = np.stack([fn(row) for row in value]) if n else np.zeros((0, *box.shape), box.dtype)
    return out


# ------------------------------------------------------------------------------------ rollouts <-> episodes
@dataclass
class Segment:
    """One episode of a rollout: timesteps [start, end] (inclusive) and the actions start .. end-1."""

    start: int
    end: int


def split_episodes(rollout: Rollout) -> list[Segment]:
    """The episodes of a rollout, cut at its reset flags; a trailing lone reset timestep is dropped."""
    n = rollout.num_timesteps
    starts = [0] + [int(k) for k in np.flatnonzero(rollout.reset[1:]) + 1]
    segments = [Segment(s, e - 1) for s, e in zip(starts, starts[1:] + [n])]
    return [s for s in segments if s.end > s.start]


def _prev_from_actions(spec: ActionSpec, action: np.ndarray, reward: np.ndarray, reset: np.ndarray,
                       prev_action0: np.ndarray, prev_reward0: float) -> tuple[np.ndarray, np.ndarray]:
    """prev_action [n, A] and prev_reward [n] as the wrapper builds them: the previous transition's action
    vector and reward, zero wherever reset is 1, and the given values at t=0."""
    n = len(reset)
    prev_action = np.zeros((n, spec.dim), dtype=np.float32)
    prev_reward = np.zeros(n, dtype=np.float32)
    if n > 1:
        prev_action[1:] = np.stack([action_to_vector(spec, a) for a in action])
        prev_reward[1:] = reward
    prev_action[0], prev_reward[0] = prev_action0, prev_reward0
    prev_action[reset], prev_reward[reset] = 0.0, 0.0
    return prev_action, prev_reward


def _episode_parts(ep: Any, obs_space: gym.Space, act_space: gym.Space) -> dict[str, np.ndarray]:
    """One Minari episode's arrays in icrl's types (agent actions, converted observations)."""
    t = len(ep.rewards)
    action = env_to_agent_actions(act_space, ep.actions)
    if len(action) != t or len(ep.terminations) != t or len(ep.truncations) != t:
        raise ValueError(f"episode {ep.id}: {len(action)} actions, {t} rewards, {len(ep.terminations)} "
                         f"terminations, {len(ep.truncations)} truncations; Minari episodes need T of each")
    parts = {f"obs/{k}": v for k, v in _convert_observations(obs_space, ep.observations, t + 1).items()}
    parts.update(action=action, reward=np.asarray(ep.rewards, dtype=np.float32),
                 terminated=np.asarray(ep.terminations, dtype=bool), truncated=np.asarray(ep.truncations, bool))
    achieved = (ep.infos or {}).get("icrl_achieved")
    if achieved is not None:
        parts["achieved"] = np.asarray(achieved, dtype=np.int64)
    return parts


def _assemble(spec: ActionSpec, episodes: list[tuple[dict[str, np.ndarray], dict]]) -> Rollout:
    """Glue the episodes of one rollout (with their icrl_* attributes) back into a Rollout."""
    first_meta = episodes[0][1]
    cat: dict[str, list[np.ndarray]] = {}
    reset_parts = []
    for j, (parts, meta) in enumerate(episodes):
        parts = dict(parts)
        if int(meta.get("icrl_end_marked", 0)):  # the exporter set this flag; icrl's data had none
            parts["truncated"] = parts["truncated"].copy()
            parts["truncated"][-1] = False
        if j + 1 < len(episodes):  # the bridge transition to the next episode
            parts["action"] = np.concatenate([parts["action"], np.asarray(meta["icrl_bridge_action"])[None]])
            for name, key in (("reward", "icrl_bridge_reward"), ("terminated", "icrl_bridge_terminated"),
                              ("truncated", "icrl_bridge_truncated")):
                parts[name] = np.concatenate([parts[name], np.asarray([meta[key]], dtype=parts[name].dtype)])
        for name, value in parts.items():
            cat.setdefault(name, []).append(value)
        reset = np.zeros(len(parts[next(k for k in parts if k.startswith("obs/"))]), dtype=bool)
        reset[0] = bool(meta.get("icrl_reset0", 1)) if j == 0 else True
        reset_parts.append(reset)
    arrays = {k: np.concatenate(v) for k, v in cat.items()}
    reset = np.concatenate(reset_parts)
    arrays["action"] = arrays["action"].astype(spec.storage_dtype).reshape(spec.storage_shape(len(arrays["reward"])))
    prev0 = np.asarray(first_meta.get("icrl_prev_action0", np.zeros(spec.dim)), dtype=np.float32)
    arrays["prev_action"], arrays["prev_reward"] = _prev_from_actions(
        spec, arrays["action"], arrays["reward"], reset, prev0, float(first_meta.get("icrl_prev_reward0", 0.0)))
    arrays["time"] = int(first_meta.get("icrl_time0", 0)) + np.arange(len(reset), dtype=np.int64)
    arrays["reset"] = reset
    return Rollout.from_arrays(arrays)  # validates the lengths


# ----------------------------------------------------------------------------------------------- reading
def locate_minari(source: str | os.PathLike) -> Path:
    """The data folder of a local Minari dataset: `source` is a dataset folder (holding data/metadata.json)
    or a dataset id under $MINARI_DATASETS_PATH (default ~/.minari/datasets). Never downloads."""
    path = Path(source).expanduser()
    for candidate in (path / "data", path):
        if (candidate / "metadata.json").is_file():
            return candidate
    require_minari()
    from minari.storage.datasets_root_dir import get_dataset_path

    data = get_dataset_path(str(source)) / "data"
    if not (data / "metadata.json").is_file():
        raise OfflineDataNotFoundError(
            f"no folder {str(source)!r} and no local Minari dataset {str(source)!r} (looked in {data.parent}). "
            "icrl reads local datasets only and never downloads: create it, fetch it with `minari download "
            f"{source}`, or set MINARI_DATASETS_PATH to the folder that holds it."
        )
    return data


def read_minari(
    source: str | os.PathLike, env_obs_space: gym.Space, env_act_space: gym.Space, achieved_slots: int = 0
) -> Iterator[Rollout]:
    """The rollouts of a local Minari dataset, converted for an env with these spaces (checked first).

    Episodes exported by icrl are glued back into their rollouts; other episodes become one rollout each.
    """
    require_minari()
    from minari.dataset.minari_dataset import MinariDataset

    data_path = locate_minari(source)
    try:
        dataset = MinariDataset(data_path)
    except (ValueError, KeyError, OSError, AssertionError) as e:
        raise ValueError(f"cannot read the Minari dataset at {data_path}: {type(e).__name__}: {e}") from e
    check_spaces(dataset.observation_space, dataset.action_space, env_obs_space, env_act_space, str(source))
    spec = ActionSpec.from_space(agent_action_space(env_act_space))
    indices = dataset.episode_indices
    metas = dataset.storage.get_episode_metadata(indices)
    group: list[tuple[dict[str, np.ndarray], dict]] = []
    group_id = None
    try:
        for ep, meta in zip(dataset.iterate_episodes(indices), metas):
            parts = _episode_parts(ep, dataset.observation_space, dataset.action_space)
            if achieved_slots and "achieved" not in parts:
                raise ValueError(f"the env is goal-conditioned but episode {ep.id} of {source} records no "
                                 "achieved goals (infos['icrl_achieved']): such data cannot be mixed with its rollouts")
            rid = meta.get("icrl_rollout")
            rid = None if rid is None else int(rid)
            if group and (rid is None or rid != group_id):
                yield _assemble(spec, group)
                group = []
            group.append((parts, meta))
            group_id = rid
        if group:
            yield _assemble(spec, group)
    except (OSError, KeyError) as e:  # h5py errors on a damaged file
        raise ValueError(f"cannot read the Minari dataset at {data_path}: {type(e).__name__}: {e}") from e


# ----------------------------------------------------------------------------------------------- writing
def _nest(obs_space: gym.Space, obs: dict[str, np.ndarray], s: int, e: int) -> Any:
    """Rollout obs rows [s, e] -> the nested layout of `obs_space` (the agent-side space)."""
    if not isinstance(obs_space, gym.spaces.Dict):
        return obs["obs"][s : e + 1]

    def build(space: gym.spaces.Dict, prefix: str) -> dict:
        return {k: build(sub, f"{prefix}{k}/") if isinstance(sub, gym.spaces.Dict) else obs[f"{prefix}{k}"][s : e + 1]
                for k, sub in space.spaces.items()}

    return build(obs_space, "")


def _episodes_of(index: int, rollout: Rollout, obs_space: gym.Space) -> Iterator[tuple[Any, dict]]:
    """(EpisodeBuffer, icrl_* attributes) for every episode of one rollout."""
    from minari.data_collector.episode_buffer import EpisodeBuffer

    segments = split_episodes(rollout)
    for j, seg in enumerate(segments):
        s, e = seg.start, seg.end
        term, trunc = rollout.terminated[s:e].copy(), rollout.truncated[s:e].copy()
        marked = not (term[-1] or trunc[-1])
        trunc[-1] = trunc[-1] or marked
        meta: dict[str, Any] = {"icrl_rollout": index, "icrl_episode": j, "icrl_time0": int(rollout.time[s]),
                                "icrl_reset0": int(rollout.reset[s]), "icrl_end_marked": int(marked),
                                "icrl_prev_action0": rollout.prev_action[s].astype(np.float32),
                                "icrl_prev_reward0": float(rollout.prev_reward[s])}
        if j + 1 < len(segments):
            meta.update(icrl_bridge_action=np.asarray(rollout.action[e]), icrl_bridge_reward=float(rollout.reward[e]),
                        icrl_bridge_terminated=int(rollout.terminated[e]),
                        icrl_bridge_truncated=int(rollout.truncated[e]))
        infos = None if rollout.achieved is None else {"icrl_achieved": rollout.achieved[s : e + 1]}
        buffer = EpisodeBuffer(observations=_nest(obs_space, rollout.obs, s, e), actions=rollout.action[s:e],
                               rewards=rollout.reward[s:e], terminations=term, truncations=trunc, infos=infos)
        yield buffer, meta


def write_minari(
    dataset_id: str,
    rollouts: Iterable[Rollout],
    observation_space: gym.Space,
    action_space: gym.Space,
    *,
    overwrite: bool = False,
    description: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> tuple[Path, int, int]:
    """Write rollouts (in the agent-side spaces given) as the local Minari dataset `dataset_id`.

    The dataset is built in a hidden temporary folder and moved into place at the end, so a failure leaves
    no partial dataset. An existing dataset with this id is refused unless `overwrite`, and then replaced
    only once the new one is complete. Returns (dataset folder, episodes, steps).
    """
    require_minari()
    from minari.dataset.minari_dataset import parse_dataset_id
    from minari.storage.datasets_root_dir import get_dataset_path

    try:
        namespace = parse_dataset_id(dataset_id)[0]
    except ValueError as e:
        raise ValueError(f"{e} Example: icrl/tmaze-expert-v0") from e
    target = get_dataset_path(dataset_id)
    if target.exists() and not overwrite:
        raise FileExistsError(
            f"the Minari dataset {dataset_id!r} already exists at {target}; choose another id (e.g. bump its -vN "
            f"version) or pass {flag('overwrite')} to replace it"
        )
    root = get_dataset_path()
    tmp = root / f".icrl-export-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir()
        storage = _new_storage(tmp / "data", dataset_id, observation_space, action_space,
                               description, metadata)
        episodes, steps = _write_episodes(storage, rollouts, observation_space)
        if episodes == 0:
            raise ValueError(f"nothing to export to {dataset_id!r}: no rollout with at least one action")
        _ensure_namespace(namespace)
        _move_into_place(tmp, target, root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target, episodes, steps


def _new_storage(
    data_path: Path,
    dataset_id: str,
    observation_space: gym.Space,
    action_space: gym.Space,
    description: str | None,
    metadata: dict[str, Any] | None,
) -> Any:
    """An empty Minari storage (HDF5, lossless images) holding the dataset's metadata, icrl's under "icrl"."""
    minari = require_minari()
    from minari.dataset.minari_storage import MinariStorage

    storage = MinariStorage.new(data_path, observation_space=observation_space, action_space=action_space,
                                data_format="hdf5", jpeg_encoding=False)
    info = {"dataset_id": dataset_id, "minari_version": minari.__version__, "algorithm_name": "icrl"}
    if description:
        info["description"] = description
    storage.update_metadata({**info, "icrl": metadata or {}})
    return storage


def _write_episodes(
    storage: Any, rollouts: Iterable[Rollout], observation_space: gym.Space
) -> tuple[int, int]:
    """Write every episode of the rollouts with its icrl_* attributes; returns (episodes, steps).

    Episodes go to HDF5 about `_FLUSH_EPISODES` at a time (checked after each rollout), so a large export
    never holds all its episodes in memory; the attributes are written once at the end.
    """
    buffers: list = []
    metas: list[dict] = []
    episodes = steps = 0
    for i, rollout in enumerate(rollouts):
        for buffer, meta in _episodes_of(i, rollout, observation_space):
            buffers.append(buffer)
            metas.append(meta)
            steps += len(buffer.rewards)
        if len(buffers) >= _FLUSH_EPISODES:
            storage.update_episodes(buffers)
            episodes, buffers = episodes + len(buffers), []
    if buffers:
        storage.update_episodes(buffers)
        episodes += len(buffers)
    if episodes:
        storage.update_episode_metadata(metas, range(episodes))
    return episodes, steps


def _ensure_namespace(namespace: str | None) -> None:
    """Create the dataset's local Minari namespace if it is new (minari's warnings about it silenced)."""
    from minari.namespace import create_namespace, list_local_namespaces

    if namespace is not None and namespace not in list_local_namespaces():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            create_namespace(namespace)


def _move_into_place(tmp: Path, target: Path, root: Path) -> None:
    """Rename the finished dataset folder `tmp` to `target`. An existing dataset there is moved aside first
    and deleted only once the new one is in place; if the move fails (or is interrupted), it is put back."""
    target.parent.mkdir(parents=True, exist_ok=True)
    trash = None
    try:
        if target.exists():
            trash = root / f".icrl-replaced-{uuid.uuid4().hex[:8]}"
            os.rename(target, trash)
        os.rename(tmp, target)
    except BaseException:
        if trash is not None and not target.exists():
            os.rename(trash, target)  # put the old dataset back
        raise
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)
