"""Step a vector env of TimestepWrapper'd envs with a policy and cut the stream into stored rollouts.

The vector env uses SAME_STEP autoreset: when env i's rollout ends, the step returns the *next* rollout's
first timestep and puts the final timestep in `info["final_obs"][i]`. The collector appends that final
timestep to the finished rollout, starts a new buffer with the reset timestep and tells the policy
(`new_rollout[i] = True`) so it clears env i's memory. No step is lost or duplicated, and buffers persist
across `collect` calls so rollouts can be longer than one call.

The buffers are one ring of batched arrays (`_StepRing`), written once per vector step; per-env Python runs only
where a rollout, chunk or episode ends. With 128 T-Maze copies the per-env lists it replaced were ~16-21% of
acting's time, the ring 3-4% (docs/results.md, acting). Its memory: every env's row spans the oldest unfinished
rollout of any env (rounded up to a power of two), so envs whose rollouts differ much in length hold up to a few
times what per-env lists would; `chunk_len` bounds it for very long rollouts.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

from icrl.guards import first_nonfinite, nonfinite_env_error, nonfinite_keys
from icrl.types import ActionSpec, EpisodeStats, Rollout, Timesteps, task_key


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


def _leaves(tree: dict, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], np.ndarray]]:
    """(path, array) of every array in a nested timestep dict, in a fixed order."""
    out: list[tuple[tuple[str, ...], np.ndarray]] = []
    for k, v in tree.items():
        out += _leaves(v, (*prefix, k)) if isinstance(v, dict) else [((*prefix, k), v)]
    return out


def _at(tree: Any, path: tuple[str, ...]) -> Any:
    for p in path:
        tree = tree[p]
    return tree


def _info_at(info: dict, key: str, i: int) -> Any:
    """Env i's value of a vector-env info key, or None when env i did not report it."""
    if key not in info or not info.get(f"_{key}", np.ones(len(info[key]), bool))[i]:
        return None
    values = info[key]
    if isinstance(values, dict):  # the env gave a dict: a vector env's info holds it as arrays per key
        return {k: v[i] for k, v in values.items() if not k.startswith("_")}
    return values[i]


def _success(value: Any, key: str, env: Callable[[], str]) -> float | None:
    """An episode's `info[key]` as 0.0 / 1.0 (None when not reported): a bool or a 0/1 number, anything else is
    refused in one line naming the env, as a success rate of 7.00 or NaN would mislead every evaluation."""
    if value is None:
        return None
    arr = np.asarray(value) if isinstance(value, (bool, int, float, np.generic, np.ndarray)) else None
    if arr is not None and arr.shape == () and arr.dtype.kind in "biuf" and float(arr) in (0.0, 1.0):
        return float(arr)
    text = repr(value)
    raise ValueError(f"env {env()} reported info[{key!r}] = {text if len(text) <= 80 else text[:77] + '...'} when an "
                     "episode ended; icrl reads it as the episode's success: give a bool or 0 / 1 "
                     "(or leave the key out)")


class _StepRing:
    """Every env's steps since its oldest unfinished rollout (or chunk) began, as batched arrays.

    Vector step k writes the batch the policy acted on (timestep leaves [N, ...]) at global index k and what
    the step returned (actions, rewards, terminated, truncated [N, ...]) beside it; row i of indices s..k is
    env i's buffer when it started at s. A finished rollout is one slice per field: no per-env Python per
    step. Indices are global and taken modulo the capacity, which doubles when the live span would not fit.
    """

    def __init__(self, first: dict, num_envs: int, spec: ActionSpec, capacity: int = 64) -> None:
        self.paths = [p for p, _ in _leaves(first)]
        self.spec, self.num_envs, self.cap = spec, num_envs, capacity
        n = num_envs
        self.ts = [np.empty((capacity, *np.shape(a)), np.asarray(a).dtype) for _, a in _leaves(first)]  # [cap, N, ...]
        self.action = np.empty((capacity, *spec.storage_shape(n)), spec.storage_dtype)  # [cap, N(, D)]
        self.reward = np.empty((capacity, n), np.float64)
        self.terminated = np.empty((capacity, n), bool)
        self.truncated = np.empty((capacity, n), bool)

    def _arrays(self) -> list[np.ndarray]:
        return [*self.ts, self.action, self.reward, self.terminated, self.truncated]

    def fit(self, oldest: int, newest: int) -> None:
        """Make room for global indices oldest..newest (grow x2, keeping the live rows at their indices)."""
        if newest - oldest + 1 <= self.cap:
            return
        cap = self.cap
        while newest - oldest + 1 > cap:
            cap *= 2
        live = np.arange(oldest, newest)  # the rows written so far
        grown = []
        for a in self._arrays():
            b = np.empty((cap, *a.shape[1:]), a.dtype)
            b[live % cap] = a[live % self.cap]
            grown.append(b)
        self.cap = cap
        self.ts, (self.action, self.reward, self.terminated, self.truncated) = grown[:-4], grown[-4:]

    def put_timestep(self, k: int, batch: dict) -> None:
        j = k % self.cap
        for path, arr in zip(self.paths, self.ts):
            arr[j] = _at(batch, path)  # the paths of the first batch: one lookup per leaf, no re-flattening

    def put_step(self, k: int, action: np.ndarray, reward: np.ndarray, term: np.ndarray, trunc: np.ndarray) -> None:
        j = k % self.cap
        self.action[j], self.reward[j], self.terminated[j], self.truncated[j] = action, reward, term, trunc

    def rollout(self, i: int, start: int, end: int, final: dict | None = None) -> Rollout:
        """Env i's timesteps start..end (global, inclusive) and the actions between them, or with `final` (the
        timestep that ended the rollout, not in the batch under SAME_STEP autoreset) as timestep end + 1."""
        t_idx = np.arange(start, end + 1) % self.cap  # [T+1] (or [T] before `final`)
        a_idx = t_idx if final is not None else t_idx[:-1]  # [T]
        leaves = {}
        for arr, path in zip(self.ts, self.paths):
            rows = arr[t_idx, i]
            if final is not None:
                rows = np.concatenate([rows, np.asarray(_at(final, path))[None]])
            leaves[path] = rows
        spec = self.spec
        rollout = Rollout(
            obs={p[1]: v for p, v in leaves.items() if p[0] == "obs"},  # each [T+1, ...]
            prev_action=leaves[("prev_action",)].astype(np.float32),  # [T+1, A]
            prev_reward=leaves[("prev_reward",)].astype(np.float32),  # [T+1]
            time=leaves[("time",)].astype(np.int64),  # [T+1]
            reset=leaves[("reset",)].astype(bool),  # [T+1]
            action=self.action[a_idx, i].reshape(spec.storage_shape(len(a_idx))),  # [T] | [T, D]
            reward=self.reward[a_idx, i].astype(np.float32),  # [T]
            terminated=self.terminated[a_idx, i].copy(),  # [T]
            truncated=self.truncated[a_idx, i].copy(),  # [T]
            # goal-conditioned envs only (docs/CONTRACTS.md): goals achieved at each timestep, -1 padded
            achieved=leaves[("achieved",)].astype(np.int64) if ("achieved",) in leaves else None,
        )
        rollout.validate()
        return rollout


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
            step = self._k - int(self._start[i]) + 1 if rewards is not None else 0
            value = float(rewards[i]) if key == "reward" and rewards is not None else None
            raise nonfinite_env_error(self._env_label(i), step, key, value)

    def _hard_reset(self, seed: int | None) -> None:
        obs, _ = self.venv.reset(seed=seed)
        self._started = False
        self._k = 0  # global index of the current batch in the ring
        self._start = np.zeros(self.num_envs, np.int64)  # [N] global index where each env's buffer starts
        self._check_finite(obs, None)
        self._current = obs  # batched timestep dict, [N, ...] leaves
        self._ring = _StepRing(obs, self.num_envs, self.action_spec)
        self._ring.put_timestep(0, obs)
        self._new_rollout = np.ones(self.num_envs, dtype=bool)  # [N]
        n = self.num_envs
        self._rollout_id = np.array([self._new_id() for _ in range(n)], np.int64)  # [N] of the rollout in progress
        self._episode_index = np.zeros(n, np.int64)  # [N] episodes finished in it
        self._ret, self._len = np.zeros(n, np.float64), np.zeros(n, np.int64)  # [N] the episode in progress
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
        k, ring = self._k, self._ring
        ring.fit(int(self._start.min()), k + 1)
        ring.put_step(k, actions, rewards, terms, truncs)
        ring.put_timestep(k + 1, obs)  # the batch the policy acts on next (a chunk's boundary timestep too)
        done = np.logical_or(terms, truncs)  # [N]
        finals = {int(i): self._final_timestep(int(i), info) for i in np.flatnonzero(done)}
        final_info = info.get("final_info", {})
        # A step that lands on a reset timestep is the bridge between two episodes of one rollout: it belongs to
        # no episode. The timestep it lands on is the batch's, or for an ended rollout the final one.
        lands_on_reset = np.asarray(obs["reset"]).astype(bool).copy()  # [N]
        for j, final in finals.items():
            lands_on_reset[j] = bool(int(final["reset"]))
        counted = ~lands_on_reset
        self._ret[counted] += np.asarray(rewards, np.float64)[counted]
        self._len[counted] += 1
        stats: list[EpisodeStats] = []
        for e in np.flatnonzero(counted & self._episode_ends(info, final_info, done)):
            self._end_episode(int(e), info if not done[e] else final_info, stats)
        finished: list[tuple[int, int, Rollout, bool]] = []
        chunk_full = np.zeros_like(done) if chunk_len is None else ~done & (k + 1 - self._start >= chunk_len)
        for i in map(int, np.flatnonzero(done | chunk_full)):
            if done[i]:
                rollout = ring.rollout(i, int(self._start[i]), k, final=finals[i])
            else:  # a chunk: the rollout goes on from the boundary timestep, which both chunks share
                rollout = ring.rollout(i, int(self._start[i]), k + 1)
            finished.append((i, int(self._rollout_id[i]), rollout, bool(done[i])))
            self._start[i] = k + 1
            if done[i]:  # the next rollout starts from the reset timestep in the batch, with a new id
                self._rollout_id[i] = self._new_id()
                self._episode_index[i], self._ret[i], self._len[i] = 0, 0.0, 0
                self._new_rollout[i] = True  # the policy clears env i's memory
        self._k = k + 1
        self._current = obs
        return finished, stats

    def _episode_ends(self, info: dict, final_info: dict, done: np.ndarray) -> np.ndarray:
        """[N] bool: the env reported `episode_end` for this step (in `final_info` where its rollout ended)."""
        def flags(d: dict) -> np.ndarray:
            if "episode_end" not in d:
                return np.zeros(self.num_envs, bool)
            return np.asarray(d.get("_episode_end", np.ones(self.num_envs, bool)), bool) & np.asarray(
                d["episode_end"]).astype(bool)
        return np.where(done, flags(final_info), flags(info))

    def _end_episode(self, i: int, step_info: dict, stats: list[EpisodeStats]) -> None:
        """Env i's episode ended with this step: its EpisodeStats, and the next episode starts counting."""
        key, value = "success", _info_at(step_info, "success", i)
        if value is None:  # Gymnasium's and Stable-Baselines3's key for the same thing
            key, value = "is_success", _info_at(step_info, "is_success", i)
        success = _success(value, key, lambda: self._env_label(i))
        stats.append(EpisodeStats(env_index=i, rollout_id=int(self._rollout_id[i]),
                                  episode_index=int(self._episode_index[i]), ret=float(self._ret[i]),
                                  length=int(self._len[i]), success=success,
                                  task=task_key(_info_at(step_info, "task", i))))  # multi-task envs name it
        self._episode_index[i] += 1
        self._ret[i], self._len[i] = 0.0, 0

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

    def _final_timestep(self, i: int, info: dict) -> dict:
        """Env i's final timestep, when its rollout just ended: with SAME_STEP autoreset the batch already holds
        the next rollout's reset timestep, so it comes from `final_obs`, checked here as the batch check cannot
        see it."""
        final = _index_object(info["final_obs"][i])
        bad = nonfinite_keys(final["obs"])
        if bad:
            raise nonfinite_env_error(self._env_label(i), self._k - int(self._start[i]) + 1, bad[0])
        return final

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
            if max_steps is not None and self._k - int(self._start.min()) >= max_steps:
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
            start = int(self._start[i])
            if len(k) >= per_env or start == self._k:
                continue
            rollout = self._ring.rollout(i, start, self._k)
            rollout.truncated[-1] = True
            rid = int(self._rollout_id[i])
            k.append((rid, rollout))
            task = next((s.task for s in stats if (s.env_index, s.rollout_id) == (i, rid) and s.task), None)
            stats.append(EpisodeStats(env_index=i, rollout_id=rid, episode_index=int(self._episode_index[i]),
                                      ret=float(self._ret[i]), length=int(self._len[i]),
                                      success=0.0 if reports_success else None, task=task))  # its episodes' task
            self.capped_rollouts += 1


def _index_object(final: Any) -> Any:
    """A per-env final timestep from `info["final_obs"]` (already unbatched) -> copied nested dict (of arrays)."""
    if isinstance(final, dict):
        return {k: _index_object(v) for k, v in final.items()}
    return np.array(final)
