"""Step a vector env of TimestepWrapper'd envs with a policy and cut the stream into stored rollouts.

The vector env uses SAME_STEP autoreset: when env i's rollout ends, the step returns the *next* rollout's
first timestep and puts the final timestep in `info["final_obs"][i]`. The collector appends that final
timestep to the finished rollout, starts a new buffer with the reset timestep and tells the policy
(`new_rollout[i] = True`) so it clears env i's memory. No step is lost or duplicated, and buffers persist
across `collect` calls so rollouts can be longer than one call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

from icrl.guards import first_nonfinite, nonfinite_env_error, nonfinite_keys
from icrl.types import ActionSpec, EpisodeStats, Rollout, Timesteps


class Policy(Protocol):
    def act(self, ts: Timesteps, new_rollout: np.ndarray) -> np.ndarray:
        """ts: [N, 1, ...]; new_rollout: [N] bool -> actions in storage format ([N] int64 | [N, D])."""
        ...


class RandomPolicy:
    """Uniformly random actions (exploration baseline, tests, filling a replay before learning)."""

    def __init__(self, action_spec: ActionSpec, seed: int | None = None):
        self.action_spec = action_spec
        self.rng = np.random.default_rng(seed)

    def act(self, ts: Timesteps, new_rollout: np.ndarray) -> np.ndarray:
        n, d = ts.time.shape[0], self.action_spec.dim
        if self.action_spec.kind == "discrete":
            return self.rng.integers(0, d, size=n).astype(np.int64)  # [N]
        if self.action_spec.kind == "continuous":
            return self.rng.uniform(-1.0, 1.0, size=(n, d)).astype(np.float32)  # [N, D]
        return self.rng.integers(0, 2, size=(n, d)).astype(np.int8)  # [N, D]


def _index(tree: Any, i: int) -> Any:
    """Env i's slice of a batched nested dict of arrays (copied: the vector env may reuse its buffers)."""
    if isinstance(tree, dict):
        return {k: _index(v, i) for k, v in tree.items()}
    return np.array(tree[i])


def _info_at(info: dict, key: str, i: int) -> Any:
    """Env i's value of a vector-env info key, or None when env i did not report it."""
    if key in info and info.get(f"_{key}", np.ones(len(info[key]), bool))[i]:
        return info[key][i]
    return None


@dataclass
class _Buffer:
    """The in-progress rollout (or chunk) of one env: T+1 timesteps and T actions."""

    timesteps: list[dict] = field(default_factory=list)
    actions: list[np.ndarray] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    terminated: list[bool] = field(default_factory=list)
    truncated: list[bool] = field(default_factory=list)

    def to_rollout(self, spec: ActionSpec) -> Rollout:
        ts = self.timesteps
        n = len(self.actions)
        action = np.asarray(self.actions, dtype=spec.storage_dtype).reshape(spec.storage_shape(n))
        rollout = Rollout(
            obs={k: np.stack([t["obs"][k] for t in ts]) for k in ts[0]["obs"]},  # each [T+1, ...]
            prev_action=np.stack([t["prev_action"] for t in ts]).astype(np.float32),  # [T+1, A]
            prev_reward=np.asarray([t["prev_reward"] for t in ts], dtype=np.float32),  # [T+1]
            time=np.asarray([t["time"] for t in ts], dtype=np.int64),  # [T+1]
            reset=np.asarray([t["reset"] for t in ts], dtype=bool),  # [T+1]
            action=action,  # [T] | [T, D]
            reward=np.asarray(self.rewards, dtype=np.float32),  # [T]
            terminated=np.asarray(self.terminated, dtype=bool),  # [T]
            truncated=np.asarray(self.truncated, dtype=bool),  # [T]
            # goal-conditioned envs only (docs/CONTRACTS.md): goals achieved at each timestep, -1 padded
            achieved=np.stack([t["achieved"] for t in ts]).astype(np.int64) if "achieved" in ts[0] else None,
        )
        rollout.validate()
        return rollout


@dataclass
class _EpisodeTracker:
    rollout_id: int = 0
    episode_index: int = 0
    ret: float = 0.0
    length: int = 0


class Collector:
    """Collect rollouts (or chunks of `chunk_len` actions) from a SAME_STEP vector env of wrapped envs.

    Use separate collectors for training and evaluation: `collect_rollouts` hard-resets every env and the
    next `collect` hard-resets again, dropping rollouts in progress.
    """

    def __init__(
        self,
        venv: gym.vector.VectorEnv,
        action_spec: ActionSpec,
        chunk_len: int | None = None,
        seed: int | None = None,
    ):
        mode = venv.metadata.get("autoreset_mode")
        if mode is not None and mode != gym.vector.AutoresetMode.SAME_STEP:
            raise ValueError(f"Collector needs a vector env with autoreset_mode=SAME_STEP, got {mode}")
        if chunk_len is not None and chunk_len < 1:
            raise ValueError(f"chunk_len must be >= 1, got {chunk_len}")
        self.venv = venv
        self.action_spec = action_spec
        self.chunk_len = chunk_len
        self.seed = seed
        self.num_envs = venv.num_envs
        self.total_env_steps = 0  # env steps taken by `collect` (all envs together)
        self.total_rollouts = 0  # rollouts finished by `collect`
        self.eval_env_steps = 0  # env steps taken by `collect_rollouts`
        self.capped_rollouts = 0  # rollouts the last `collect_rollouts` cut at its step cap
        self._started = False
        self._next_rollout_id = 0
        # (env index, rollout id) of every rollout/chunk returned by the last collect/collect_rollouts call,
        # parallel to the returned list: links rollouts to their EpisodeStats and to their env copy.
        self.last_sources: list[tuple[int, int]] = []

    # ------------------------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, int]:
        """Counters to checkpoint so a resumed run keeps its step counts (and exploration schedule)."""
        return {
            "total_env_steps": self.total_env_steps,
            "total_rollouts": self.total_rollouts,
            "eval_env_steps": self.eval_env_steps,
            "next_rollout_id": self._next_rollout_id,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.total_env_steps = int(state["total_env_steps"])
        self.total_rollouts = int(state["total_rollouts"])
        self.eval_env_steps = int(state.get("eval_env_steps", 0))
        self._next_rollout_id = int(state.get("next_rollout_id", 0))

    def _env_label(self, i: int) -> str:
        """How errors name env copy i: its Gymnasium id, else its class."""
        try:  # Sync/AsyncVectorEnv (what icrl builds) have get_attr, SyncVectorEnv has envs; the base class neither
            spec = self.venv.get_attr("spec")[i]  # type: ignore[attr-defined]
            if spec is not None:
                return f"{spec.id!r} (copy {i})"
            return f"{type(self.venv.envs[i].unwrapped).__name__} (copy {i})"  # type: ignore[attr-defined]
        except (AttributeError, IndexError, TypeError):
            return f"copy {i}"

    def _check_finite(self, obs: dict, rewards: np.ndarray | None) -> None:
        """NaN / inf never enter a rollout (icrl.guards): one vectorised test per key and vector step."""
        found = first_nonfinite(obs["obs"], rewards)
        if found is not None:
            i, key = found
            step = len(self._buffers[i].actions) + 1 if rewards is not None else 0
            value = float(rewards[i]) if key == "reward" and rewards is not None else None
            raise nonfinite_env_error(self._env_label(i), step, key, value)

    def _hard_reset(self, seed: int | None) -> None:
        obs, _ = self.venv.reset(seed=seed)
        self._started = False
        self._check_finite(obs, None)
        self._current = obs  # batched timestep dict, [N, ...] leaves
        self._buffers = [_Buffer(timesteps=[_index(obs, i)]) for i in range(self.num_envs)]
        self._new_rollout = np.ones(self.num_envs, dtype=bool)  # [N]
        self._trackers = [_EpisodeTracker(rollout_id=self._new_id()) for _ in range(self.num_envs)]
        self._started = True

    def _new_id(self) -> int:
        self._next_rollout_id += 1
        return self._next_rollout_id - 1

    # -------------------------------------------------------------------------------------------- step
    def _step(
        self, policy: Policy, chunk_len: int | None
    ) -> tuple[list[tuple[int, int, Rollout, bool]], list[EpisodeStats]]:
        """One vector step. Returns (env index, rollout id, rollout or chunk, rollout finished) and stats."""
        actions = self._act(policy)
        obs, rewards, terms, truncs, info = self.venv.step(actions)
        self._check_finite(obs, rewards)
        self._current = obs
        finished: list[tuple[int, int, Rollout, bool]] = []
        stats: list[EpisodeStats] = []
        for i in range(self.num_envs):
            buf = self._buffers[i]
            done = bool(terms[i] or truncs[i])
            reward = float(rewards[i])
            buf.actions.append(np.array(actions[i]))
            buf.rewards.append(reward)
            buf.terminated.append(bool(terms[i]))
            buf.truncated.append(bool(truncs[i]))
            if done:
                next_ts, step_info = self._final_timestep(i, info)
            else:
                next_ts, step_info = _index(obs, i), info
            buf.timesteps.append(next_ts)
            # A step that lands on a reset timestep is the bridge between two episodes of one rollout: it
            # belongs to no episode.
            if not int(next_ts["reset"]):
                self._track_episode(i, reward, step_info, stats)
            if done:
                self._end_rollout(i, obs, finished)
            elif chunk_len is not None and len(buf.actions) >= chunk_len:
                self._end_chunk(i, next_ts, finished)
        return finished, stats

    def _act(self, policy: Policy) -> np.ndarray:
        """The policy's actions for the current timesteps: storage format, as the env will execute them."""
        ts = Timesteps.from_numpy(self._current)
        new_rollout = self._new_rollout.copy()
        self._new_rollout[:] = False
        actions = np.asarray(policy.act(ts, new_rollout))
        spec = self.action_spec
        actions = actions.astype(spec.storage_dtype, copy=False).reshape(spec.storage_shape(self.num_envs))
        if spec.kind == "continuous":
            actions = np.clip(actions, -1.0, 1.0)  # stored actions are what the env executed
        return actions

    def _final_timestep(self, i: int, info: dict) -> tuple[dict, dict]:
        """Env i's final timestep and the info of its last step, when its rollout just ended: with SAME_STEP
        autoreset the batch already holds the next rollout's reset timestep, so both come from
        `final_obs` / `final_info`, checked here as the batch check cannot see them."""
        next_ts = _index_object(info["final_obs"][i])
        bad = nonfinite_keys(next_ts["obs"])
        if bad:
            raise nonfinite_env_error(self._env_label(i), len(self._buffers[i].actions), bad[0])
        return next_ts, info.get("final_info", {})

    def _track_episode(self, i: int, reward: float, step_info: dict, stats: list[EpisodeStats]) -> None:
        """Add a step to env i's current episode; append its EpisodeStats when the step ended it."""
        tr = self._trackers[i]
        tr.ret += reward
        tr.length += 1
        if _info_at(step_info, "episode_end", i):
            success = _info_at(step_info, "success", i)
            stats.append(
                EpisodeStats(
                    env_index=i,
                    rollout_id=tr.rollout_id,
                    episode_index=tr.episode_index,
                    ret=tr.ret,
                    length=tr.length,
                    success=None if success is None else float(success),
                )
            )
            tr.episode_index += 1
            tr.ret, tr.length = 0.0, 0

    def _end_rollout(self, i: int, obs: dict, finished: list[tuple[int, int, Rollout, bool]]) -> None:
        """Env i's rollout ended: hand it over; the next one starts from the reset timestep in the batch, with
        a new id, and the policy is told to clear env i's memory."""
        tr = self._trackers[i]
        finished.append((i, tr.rollout_id, self._buffers[i].to_rollout(self.action_spec), True))
        self._buffers[i] = _Buffer(timesteps=[_index(obs, i)])
        self._trackers[i] = _EpisodeTracker(rollout_id=self._new_id())
        self._new_rollout[i] = True

    def _end_chunk(self, i: int, next_ts: dict, finished: list[tuple[int, int, Rollout, bool]]) -> None:
        """Env i's buffer holds `chunk_len` actions: hand it over as a chunk; the rollout goes on in a new
        buffer that starts from the boundary timestep, which both chunks share."""
        rollout_id = self._trackers[i].rollout_id
        finished.append((i, rollout_id, self._buffers[i].to_rollout(self.action_spec), False))
        self._buffers[i] = _Buffer(timesteps=[next_ts])

    # --------------------------------------------------------------------------------------------- API
    def collect(self, policy: Policy, num_env_steps: int) -> tuple[list[Rollout], list[EpisodeStats]]:
        """Take ceil(num_env_steps / N) vector steps; return the rollouts/chunks and episodes that ended."""
        if not self._started:
            self._hard_reset(self.seed)
        rollouts: list[Rollout] = []
        stats: list[EpisodeStats] = []
        self.last_sources = []
        for _ in range(math.ceil(num_env_steps / self.num_envs)):
            finished, step_stats = self._step(policy, self.chunk_len)
            self.total_env_steps += self.num_envs
            self.total_rollouts += sum(1 for f in finished if f[3])
            rollouts.extend(f[2] for f in finished)
            self.last_sources.extend((f[0], f[1]) for f in finished)
            stats.extend(step_stats)
        return rollouts, stats

    def collect_rollouts(
        self, policy: Policy, num_rollouts: int, seed: int | None = None, max_steps: int | None = None
    ) -> tuple[list[Rollout], list[EpisodeStats]]:
        """Evaluation: hard-reset, then return the first ceil(num_rollouts / N) whole rollouts of every env.

        Taking the same number from every env keeps short rollouts from being over-represented. Rollouts
        are returned whole (chunk_len does not apply); their episode stats come with them.
        `max_steps`: when a rollout in progress reaches this many steps, collection stops and every env still
        short of its rollouts contributes the one in progress as it stands (truncated; return so far, success
        0 when the env reports success): an env whose episodes never end cannot hang evaluation.
        `self.capped_rollouts` counts those rollouts (0 when the cap was not reached).
        """
        per_env = math.ceil(num_rollouts / self.num_envs)
        self._hard_reset(seed)
        kept: list[list[tuple[int, Rollout]]] = [[] for _ in range(self.num_envs)]
        all_stats: list[EpisodeStats] = []
        self.capped_rollouts = 0
        while any(len(k) < per_env for k in kept):
            if max_steps is not None and max(len(b.actions) for b in self._buffers) >= max_steps:
                self._keep_unfinished(kept, per_env, all_stats)
                break
            finished, step_stats = self._step(policy, None)
            self.eval_env_steps += self.num_envs
            all_stats.extend(step_stats)
            for i, rid, rollout, _ in finished:
                if len(kept[i]) < per_env:
                    kept[i].append((rid, rollout))
        self._started = False  # the next `collect` starts from a hard reset
        self.last_sources = [(i, rid) for i in range(self.num_envs) for rid, _ in kept[i]]
        ids = set(self.last_sources)
        stats = [s for s in all_stats if (s.env_index, s.rollout_id) in ids]
        return [r for k in kept for _, r in k], stats


    def _keep_unfinished(self, kept: list[list[tuple[int, Rollout]]], per_env: int, stats: list[EpisodeStats]) -> None:
        """At the evaluation step cap: every env short of rollouts keeps the one in progress, truncated."""
        reports_success = any(s.success is not None for s in stats)
        for i, k in enumerate(kept):
            buf, tr = self._buffers[i], self._trackers[i]
            if len(k) >= per_env or not buf.actions:
                continue
            buf.truncated[-1] = True
            k.append((tr.rollout_id, buf.to_rollout(self.action_spec)))
            stats.append(EpisodeStats(env_index=i, rollout_id=tr.rollout_id, episode_index=tr.episode_index,
                                      ret=tr.ret, length=tr.length, success=0.0 if reports_success else None))
            self.capped_rollouts += 1


def _index_object(final: Any) -> Any:
    """A per-env final timestep from `info["final_obs"]` (already unbatched) -> copied nested dict (of arrays)."""
    if isinstance(final, dict):
        return {k: _index_object(v) for k, v in final.items()}
    return np.array(final)
