"""Turn any Gymnasium 1.x env into the icrl timestep format (docs/design.md §2, docs/CONTRACTS.md).

The policy never sees a raw observation: it sees `{"obs", "prev_action", "prev_reward", "time", "reset"}`
so that a sequence model can infer the task from its own history. The wrapper also glues several episodes
of one task into one rollout (meta-RL): the final observation of an inner episode stays in the sequence as
its own timestep, then the next episode starts with reset=1 and zero previous action / reward.
"""

from __future__ import annotations

from typing import Any, Callable

import gymnasium as gym
import numpy as np

# RolloutClock (the timestep state machine) and the action conversions (beside ActionSpec, icrl.types) are
# importable from here as before.
from icrl.config.errors import first_line
from icrl.envs.clock import RolloutClock
from icrl.types import ActionSpec, action_to_vector, agent_action_space, agent_to_env_action

SUPPORTED_OBS_SPACES = "Box (any rank), Discrete, MultiDiscrete, MultiBinary, and Dict / Tuple of these (nested)"
# `time` is int64 but declared with an int32 bound: gymnasium cannot sample an int64 Box up to int64 max.
_TIME_HIGH = np.iinfo(np.int32).max

ObsConverter = Callable[[Any], np.ndarray]


# --------------------------------------------------------------------------------------------- observations
def _convert_space(space: gym.Space, key: str) -> tuple[gym.spaces.Box, ObsConverter]:
    """One leaf space -> (the Box the policy sees, a function raw value -> array in that Box)."""
    if isinstance(space, gym.spaces.Box):
        # float64 becomes float32 (what the networks use); images and other integer Boxes keep their dtype.
        dtype = np.dtype(np.float32) if space.dtype == np.float64 else space.dtype
        shape = space.shape if len(space.shape) > 0 else (1,)  # a scalar Box becomes a 1-vector
        low = np.broadcast_to(space.low, space.shape).astype(dtype).reshape(shape)
        high = np.broadcast_to(space.high, space.shape).astype(dtype).reshape(shape)
        box = gym.spaces.Box(low=low, high=high, shape=shape, dtype=dtype)
        def as_box(x: Any) -> np.ndarray:
            a = np.asarray(x)
            if a.dtype != dtype:  # only a cast can overflow; most envs already return the space's dtype
                with np.errstate(over="ignore"):  # beyond float32 becomes inf: the collector's guard names the env
                    a = a.astype(dtype)
            return a.reshape(shape)

        return box, as_box
    if isinstance(space, gym.spaces.Discrete):
        n, start = int(space.n), int(space.start)
        eye = np.eye(n, dtype=np.float32)
        return gym.spaces.Box(0.0, 1.0, (n,), np.float32), lambda x: eye[int(x) - start].copy()
    if isinstance(space, gym.spaces.MultiDiscrete):
        nvec = np.asarray(space.nvec, dtype=np.int64).reshape(-1)  # [K]
        starts = np.asarray(space.start, dtype=np.int64).reshape(-1)  # [K]
        offsets = np.concatenate([[0], np.cumsum(nvec)[:-1]])  # [K] where each one-hot block begins
        width = int(nvec.sum())

        def multi_one_hot(x: Any) -> np.ndarray:
            out = np.zeros(width, dtype=np.float32)  # [sum(nvec)]
            out[offsets + np.asarray(x, dtype=np.int64).reshape(-1) - starts] = 1.0
            return out

        return gym.spaces.Box(0.0, 1.0, (width,), np.float32), multi_one_hot
    if isinstance(space, gym.spaces.MultiBinary):
        width = int(np.prod(space.n))
        return gym.spaces.Box(0.0, 1.0, (width,), np.float32), lambda x: np.asarray(
            x, dtype=np.float32
        ).reshape(width)
    where = f" (the observation's entry {key!r})" if key != "obs" else ""
    raise ValueError(
        f"Unsupported observation space {space!r}{where}. icrl supports {SUPPORTED_OBS_SPACES}; map other "
        "spaces (Text, Graph, Sequence, ...) onto these with a gymnasium.ObservationWrapper of your own first."
    )


# key "a/b", path ("a", "b"): Dict keys (str) and Tuple indices (int), Box, converter
ObsLeaf = tuple[str, tuple[Any, ...], gym.spaces.Box, ObsConverter]


def _flatten_obs_space(space: gym.Space, prefix: str = "") -> list[ObsLeaf]:
    """Flatten a (nested) Dict or Tuple observation space into (key "a/b", path ("a", "b"), Box, converter)
    leaves; a Tuple's entries are named by their index ("0", "1", ...; the path holds the int)."""
    if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
        leaves = []
        items = space.spaces.items() if isinstance(space, gym.spaces.Dict) else enumerate(space.spaces)
        for name, sub in items:
            key = f"{prefix}/{name}" if prefix else str(name)
            for k, path, box, fn in _flatten_obs_space(sub, key):
                leaves.append((k, (name, *path), box, fn))
        return leaves
    box, fn = _convert_space(space, prefix or "obs")
    return [(prefix or "obs", (), box, fn)]


# ---------------------------------------------------------------------------------------- the user's env
class EnvError(ValueError):
    """An env that raised, or returned something that is not a Gymnasium step, in `reset` or `step`. Its
    own exception (the user's bug, with their traceback) is chained as `__cause__`, and its traceback is kept
    as text in `user_traceback` too, which survives the trip from an env subprocess (a vector env re-raises
    `EnvError(the worker's EnvError)` there, which this constructor unpacks)."""

    message: str
    user_traceback: str

    def __init__(self, message: Any, user_traceback: str = "") -> None:
        if isinstance(message, EnvError):
            message, user_traceback = message.message, message.user_traceback
        super().__init__(message, user_traceback)
        self.message, self.user_traceback = str(message), user_traceback

    def __str__(self) -> str:
        return self.message


def _reward(value: Any) -> float:
    """A step's reward as a float; ValueError for anything that is not one number (None, a string, an array
    of several values: float() would accept some of them and train on something else)."""
    if isinstance(value, (str, bytes)) or value is None:
        raise ValueError(f"returned {value!r} as the reward; a reward is one number")
    arr = np.asarray(value)
    if arr.dtype.kind not in "biuf" or arr.size != 1:
        raise ValueError(f"returned a reward of type {type(value).__name__} (shape {arr.shape}); "
                         "a reward is one number")
    return float(arr.reshape(()))


def env_name(env: gym.Env) -> str:
    """How errors name a user's env: its Gymnasium id, else its class."""
    spec = getattr(env, "spec", None)
    return repr(spec.id) if spec is not None else type(env.unwrapped).__name__


# -------------------------------------------------------------------------------------------------- wrapper
def agent_obs_space(env: gym.Env | gym.vector.VectorEnv) -> gym.spaces.Dict:
    """The "obs" entry of a `TimestepWrapper`'d env's (or vector env's: one copy's) timestep space: the
    observations the agent is built for. TypeError for an env whose timesteps are not icrl's."""
    space = env.single_observation_space if isinstance(env, gym.vector.VectorEnv) else env.observation_space
    obs = space.spaces.get("obs") if isinstance(space, gym.spaces.Dict) else None
    if not isinstance(obs, gym.spaces.Dict):
        raise TypeError(f"{type(env).__name__} does not give icrl timesteps (wrap its env in TimestepWrapper)")
    return obs


def achieved_slots(env: gym.Env) -> int:
    """K of a goal-conditioned env (`metadata["achieved_slots"]`, docs/CONTRACTS.md), 0 for other envs."""
    k = env.metadata.get("achieved_slots", 0) if isinstance(env.metadata, dict) else 0
    if not isinstance(k, (int, np.integer)) or k < 0:
        raise ValueError(f"metadata['achieved_slots'] must be a non-negative int, got {k!r}")
    return int(k)


class TimestepWrapper(gym.Wrapper):
    """Any Gymnasium env -> timesteps `{"obs", "prev_action", "prev_reward", "time", "reset"}`.

    `episodes_per_rollout=k`: one rollout holds k episodes of the same task (the inner env is reset with
    `options={"new_task": False}` between them); the rollout is terminated/truncated as the k-th episode is.
    `rollout_horizon=H`: episodes of the same task repeat until the rollout has taken H actions (bridge
    steps between episodes included), then the rollout is truncated. Only one of the two may be set.
    """

    def __init__(self, env: gym.Env, episodes_per_rollout: int = 1, rollout_horizon: int | None = None):
        super().__init__(env)
        if int(episodes_per_rollout) < 1:
            raise ValueError(f"episodes_per_rollout must be >= 1, got {episodes_per_rollout}")
        if rollout_horizon is not None and int(rollout_horizon) < 1:
            raise ValueError(f"rollout_horizon must be >= 1, got {rollout_horizon}")
        if rollout_horizon is not None and episodes_per_rollout != 1:
            raise ValueError("set either episodes_per_rollout or rollout_horizon, not both")
        self.episodes_per_rollout = int(episodes_per_rollout)
        self.rollout_horizon = None if rollout_horizon is None else int(rollout_horizon)
        self.multi_episode = self.episodes_per_rollout > 1 or self.rollout_horizon is not None

        self._leaves = _flatten_obs_space(env.observation_space)
        self._env_action_space = env.action_space
        # The inner env's own spaces, readable through a vector env (`venv.get_attr`): RUN_DIR/spaces.json
        self.env_observation_space, self.env_action_space = env.observation_space, env.action_space
        # Goal-conditioned envs (docs/CONTRACTS.md) report the goals each step achieved; kept beside the
        # observation (never shown to the policy) so the collector can store it for hindsight relabeling.
        self.achieved_slots = achieved_slots(env)
        self.action_space = agent_action_space(env.action_space)
        self.action_spec = ActionSpec.from_space(self.action_space)
        self.observation_space = gym.spaces.Dict(
            {
                "obs": gym.spaces.Dict({key: box for key, _, box, _ in self._leaves}),
                "prev_action": gym.spaces.Box(-1.0, 1.0, (self.action_spec.dim,), np.float32),
                "prev_reward": gym.spaces.Box(-np.inf, np.inf, (), np.float32),
                "time": gym.spaces.Box(0, _TIME_HIGH, (), np.int64),
                "reset": gym.spaces.Box(0, 1, (), np.int8),
            }
        )
        if self.achieved_slots:
            self.observation_space["achieved"] = gym.spaces.Box(-1, _TIME_HIGH, (self.achieved_slots,), np.int64)
        self._clock = RolloutClock(self.action_spec, self.episodes_per_rollout, self.rollout_horizon)
        self._pending_reset = False  # last timestep was an inner episode's final obs

    @property
    def _t(self) -> int:
        """Actions taken in the current rollout: the time index of the current timestep."""
        return self._clock.time

    # ------------------------------------------------------------------------------------------- helpers
    def convert_obs(self, obs: Any) -> dict[str, np.ndarray]:
        """A raw env observation -> the timestep's "obs" dict (flattened keys, converted leaves)."""
        return self._convert_obs(obs)

    def _convert_obs(self, obs: Any) -> dict[str, np.ndarray]:
        out = {}
        for key, path, box, fn in self._leaves:
            value = obs
            try:
                for p in path:
                    value = value[p]
                out[key] = fn(value)
            except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
                raise ValueError(f"observation {_short(value)} (key {key!r}) is not a value of the observation "
                                 f"space (the agent sees it as {box}): {e}") from e
        return out

    def _call_env(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call the user's env (`reset` / `step`); EnvError (one line: which env, which step, what was wrong,
        the env's own exception chained) when it raises."""
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - any exception of the user's code is reported the same way
            said = f": {first_line(e, limit=300)}" if str(e).strip() else " (no message)"
            raise self._env_error(what, f"raised {type(e).__name__}{said}", e) from e

    def _env_error(self, what: str, problem: str, cause: BaseException | None = None) -> EnvError:
        import traceback

        text = "".join(traceback.format_exception(cause)) if cause is not None else ""
        return EnvError(f"env {env_name(self.env)} at step {self._t} of a rollout: {what}() {problem}; fix the env",
                        text)

    def _timestep(self, obs: Any, prev_reward: float, reset: bool, info: dict | None = None) -> dict:
        """The timestep of raw observation `obs`, from the clock's time and previous action (`RolloutClock`)."""
        try:
            converted = self._convert_obs(obs)
        except ValueError as e:
            raise self._env_error("step" if self._t else "reset", f"returned an {e}", e) from e
        ts = self._clock.timestep(converted, prev_reward, cont=not reset)
        if self.achieved_slots:
            ts["achieved"] = self._achieved(info)  # [K] int64, -1 padded
        return ts

    def _achieved(self, info: dict | None) -> np.ndarray:
        """info["achieved"] (goal tokens this transition achieved) -> [K] int64 padded with -1."""
        out = np.full(self.achieved_slots, -1, dtype=np.int64)
        goals = np.asarray([] if info is None else info.get("achieved", ()), dtype=np.int64).reshape(-1)
        if len(goals) > self.achieved_slots:
            raise ValueError(
                f"the env reported {len(goals)} achieved goals in one step but declares "
                f"metadata['achieved_slots']={self.achieved_slots}; raise achieved_slots in the env"
            )
        if len(goals) and goals.min() < 1:
            raise ValueError(f"achieved goal tokens must be >= 1 (0 means 'no goal'), got {goals.tolist()}")
        out[: len(goals)] = goals
        return out

    # ------------------------------------------------------------------------------------------------ API
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        """Hard reset: a new task (the inner env sees `new_task=True` in multi-episode mode)."""
        if self.multi_episode:
            options = {**(options or {}), "new_task": True}
        self._clock.start(new_task=True)
        obs, info = self._checked_reset(seed=seed, options=options)
        self._pending_reset = False
        return self._timestep(obs, 0.0, reset=True, info=info), info

    def _checked_reset(self, **kwargs: Any) -> tuple[Any, dict]:
        out = self._call_env("reset", self.env.reset, **kwargs)
        if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict)):
            raise self._env_error("reset", f"returned {_short(out)}, not (observation, info dict)")
        return out[0], dict(out[1])

    def _checked_step(self, env_action: Any) -> tuple[Any, float, bool, bool, dict]:
        out = self._call_env("step", self.env.step, env_action)
        if not (isinstance(out, tuple) and len(out) == 5 and isinstance(out[4], dict)):
            raise self._env_error("step", f"returned {_short(out)}, not (obs, reward, terminated, truncated, info)")
        obs, reward, terminated, truncated, info = out
        try:
            reward = _reward(reward)
        except ValueError as e:
            raise self._env_error("step", str(e), e) from e
        return obs, reward, bool(terminated), bool(truncated), dict(info)

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        if self._pending_reset:
            # Bridge step: the action taken on an inner episode's final obs is ignored; the next episode of
            # the same task starts with reset=1 and zero previous action and reward.
            obs, info = self._checked_reset(options={"new_task": False})
            self._clock.acted(self.action_spec.zero_vector())  # the ignored action's step counts
            self._clock.start(new_task=False)
            self._pending_reset = False
            truncated = self.rollout_horizon is not None and self._clock.rollout_over()
            # the bridge step achieves nothing: a new episode's first observation is not an agent's doing
            ts = self._timestep(obs, 0.0, reset=True)
            return ts, 0.0, False, truncated, dict(info)

        env_action = agent_to_env_action(self._env_action_space, action)
        self._clock.acted(action_to_vector(self.action_spec, action))
        obs, reward, terminated, truncated, info = self._checked_step(env_action)
        ts = self._timestep(obs, reward, reset=False, info=info)
        if "success" in info:
            info["success"] = float(info["success"])
        episode_done = terminated or truncated
        if episode_done:
            info["episode_end"] = True
        if not self.multi_episode:
            return ts, reward, terminated, truncated, info
        over = self._clock.rollout_over()
        if self.rollout_horizon is not None:
            if over:
                # The rollout ends on its time limit even if the inner episode terminated right here: the
                # rollout would have continued with another episode, so its value is bootstrapped.
                return ts, reward, False, True, info
            self._pending_reset = episode_done
            return ts, reward, False, False, info
        if episode_done and over:
            return ts, reward, terminated, truncated, info
        self._pending_reset = episode_done
        return ts, reward, False, False, info


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."

