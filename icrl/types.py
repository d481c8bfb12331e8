"""The data contract shared by every part of icrl (docs/design.md §2).

A *timestep* is what the policy sees at step t: the observation, the previous action and reward, the
time index inside the rollout and a reset flag that marks the first timestep of every episode.
A *rollout* is the sequence of timesteps from a hard reset (a new task) to the end of the task; it
may hold several episodes of the same task. A rollout of T actions has T + 1 timesteps: the last one
carries the final observation, on which no action is taken.

Shapes use B (batch of sequences), L (sequence length), N (parallel envs), T (actions in a rollout),
A (width of the action vector: the number of actions for discrete spaces).
"""

from __future__ import annotations

import re
from dataclasses import MISSING, dataclass, fields
from typing import Any, Literal, TypeVar

import gymnasium as gym
import numpy as np
import torch

ActionKind = Literal["discrete", "continuous", "multibinary"]
ArrayT = TypeVar("ArrayT", np.ndarray, torch.Tensor)


MAX_ACTION_DIM = 1 << 16
"""The widest action vector icrl takes: a Discrete(n) is a one-hot of n numbers in every timestep's input and
every head's output, so a space typed with a few zeros too many would otherwise end in an allocator error."""


@dataclass(frozen=True)
class ActionSpec:
    """The agent-side action space: Discrete(n), Box(-1, 1, (D,)) or MultiBinary(D), and every conversion of
    its actions (the one home for them; `agent_to_env_action` below maps them onto the env's own space).

    An action has three forms: what a policy returns (ids, or [D] arrays in roughly the right range),
    its *storage* form (what the replay keeps: int64 ids | float32 in [-1, 1] | int8 0/1), and the float
    *vector* of width `dim` the networks see (one-hot for discrete, the [-1, 1] vector for continuous,
    0/1 for multi-binary). The vector conversions take numpy arrays or torch tensors and return the same.
    """

    kind: ActionKind
    dim: int

    @classmethod
    def from_space(cls, space: gym.Space) -> ActionSpec:
        spec = None
        if isinstance(space, gym.spaces.Discrete):
            spec = cls("discrete", int(space.n))
        elif isinstance(space, gym.spaces.Box) and len(space.shape) == 1:
            spec = cls("continuous", int(space.shape[0]))
        elif isinstance(space, gym.spaces.MultiBinary) and isinstance(space.n, int):  # n: int or shape tuple
            spec = cls("multibinary", space.n)
        if spec is not None:
            if spec.dim > MAX_ACTION_DIM:  # refused before any array of that width exists
                raise ValueError(
                    f"the action space {space} makes action vectors of {spec.dim:,} numbers (the previous action is "
                    f"an input at every timestep, one-hot for Discrete, and the heads output as many), more than "
                    f"icrl's limit of {MAX_ACTION_DIM:,}: give the env fewer actions (e.g. factor them into a "
                    "MultiBinary code)")
            return spec
        raise ValueError(
            f"Unsupported agent action space {space!r}: the agent acts in Discrete(n), a 1-D Box or a 1-D "
            "MultiBinary (agent_action_space maps an env's action space onto one of them)"
        )

    @property
    def storage_dtype(self) -> np.dtype:
        """dtype of stored actions: int64 ids for discrete (never a type that caps the action count)."""
        return np.dtype({"discrete": np.int64, "continuous": np.float32, "multibinary": np.int8}[self.kind])

    def storage_shape(self, n: int) -> tuple[int, ...]:
        return (n,) if self.kind == "discrete" else (n, self.dim)

    def as_stored(self, action: np.ndarray) -> np.ndarray:
        """Actions as a policy returns them [..] | [.., D] -> storage form: int64 ids, float32 clipped to
        [-1, 1], int8 (> 0) for multi-binary."""
        if self.kind == "discrete":
            return np.asarray(action).astype(np.int64)
        if self.kind == "continuous":
            return np.clip(np.asarray(action, dtype=np.float32), -1.0, 1.0)
        return (np.asarray(action) > 0).astype(np.int8)

    def to_vector(self, action: ArrayT) -> ArrayT:
        """Stored actions [..] (discrete ids) or [.., D] -> float32 vectors [.., dim]."""
        if isinstance(action, torch.Tensor):
            if self.kind == "discrete":
                return torch.nn.functional.one_hot(action.long(), self.dim).float()
            return action.float()
        if self.kind == "discrete":
            return np.eye(self.dim, dtype=np.float32)[np.asarray(action, dtype=np.int64)]
        return np.asarray(action, dtype=np.float32)

    def from_vector(self, a_vec: ArrayT) -> ArrayT:
        """Network action vectors [.., A] -> storage form [..] | [.., D] (argmax, > 0.5, or clipped)."""
        if isinstance(a_vec, torch.Tensor):
            if self.kind == "discrete":
                return a_vec.argmax(-1).to(torch.int64)
            if self.kind == "multibinary":
                return (a_vec > 0.5).to(torch.int8)
            return a_vec.clamp(-1.0, 1.0).to(torch.float32)
        if self.kind == "discrete":
            return a_vec.argmax(-1).astype(np.int64)
        if self.kind == "multibinary":
            return (a_vec > 0.5).astype(np.int8)
        return np.clip(a_vec, -1.0, 1.0).astype(np.float32)

    def zero_vector(self, *batch: int) -> np.ndarray:
        """[*batch, dim] float32 zeros: the previous action where a rollout or an episode starts."""
        return np.zeros((*batch, self.dim), dtype=np.float32)

    def to_json(self) -> dict:
        return {"kind": self.kind, "dim": self.dim}


def action_to_vector(spec: ActionSpec, action: Any) -> np.ndarray:
    """One action as a policy returns it -> the float32 vector [A] the policy sees as prev_action."""
    return spec.to_vector(spec.as_stored(np.asarray(action).reshape(spec.storage_shape(1)[1:])))


SUPPORTED_ACTION_SPACES = ("Discrete(n), a bounded 1-D Box, a 1-D MultiBinary, a 1-D MultiDiscrete of up to "
                           "MAX_JOINT_ACTIONS combinations")
MAX_JOINT_ACTIONS = 4096
"""A MultiDiscrete action space becomes one Discrete over every combination (np.ravel_multi_index): exact,
and the agent's discrete heads need nothing new, but the head's width is the number of combinations."""


def agent_action_space(env_space: gym.Space) -> gym.Space:
    """The agent-side action space for an env action space; raises ValueError for unsupported ones."""
    if isinstance(env_space, gym.spaces.Discrete):
        return gym.spaces.Discrete(int(env_space.n))
    if isinstance(env_space, gym.spaces.Box) and len(env_space.shape) == 1:
        if not (np.all(np.isfinite(env_space.low)) and np.all(np.isfinite(env_space.high))):
            raise ValueError(
                f"Unsupported action space {env_space!r}: the Box has infinite bounds, so agent actions in "
                "[-1, 1] cannot be rescaled to it. Give the env finite bounds first (e.g. ClipAction + a "
                "RescaleAction wrapper)."
            )
        return gym.spaces.Box(-1.0, 1.0, env_space.shape, np.float32)
    if isinstance(env_space, gym.spaces.MultiBinary) and np.ndim(env_space.n) == 0:
        return gym.spaces.MultiBinary(int(env_space.n))  # type: ignore[arg-type]  # n is 0-d here (np.ndim)
    if isinstance(env_space, gym.spaces.MultiDiscrete) and np.ndim(env_space.nvec) == 1:
        joint = int(np.prod(env_space.nvec, dtype=np.int64))
        if joint <= MAX_JOINT_ACTIONS:
            return gym.spaces.Discrete(joint)
        raise ValueError(
            f"Unsupported action space {env_space!r}: icrl acts in a MultiDiscrete space as one Discrete over every "
            f"combination, and this one has {joint:,} (at most {MAX_JOINT_ACTIONS:,}); Gymnasium has no wrapper for "
            "this: write a gymnasium.ActionWrapper that exposes a Box (each entry rounded into its range) or "
            "MultiBinary action instead"
        )
    raise ValueError(
        f"Unsupported action space {env_space!r}. "
        f"icrl supports {SUPPORTED_ACTION_SPACES.replace('MAX_JOINT_ACTIONS', str(MAX_JOINT_ACTIONS))}; "
        "Gymnasium ships no wrapper that flattens other action spaces (Tuple, Dict, a multi-dimensional Box): "
        "write a gymnasium.ActionWrapper that exposes one of these (e.g. a flat Box reshaped in `action()`)."
    )


def box_to_env(env_space: gym.spaces.Box, action: np.ndarray) -> np.ndarray:
    """Agent actions [..., D] in [-1, 1] (clipped) -> linearly onto the Box's [low, high], exact at both ends, in
    its dtype: one action or a batch of them."""
    u = np.clip(np.asarray(action, dtype=np.float64), -1.0, 1.0)
    low, high = env_space.low.astype(np.float64), env_space.high.astype(np.float64)
    out = 0.5 * (1.0 - u) * low + 0.5 * (1.0 + u) * high  # exact low at -1 and high at +1
    return np.clip(out, low, high).astype(env_space.dtype)


def agent_to_env_action(env_space: gym.Space, action: Any) -> Any:
    """Agent action in storage format -> the action the wrapped env expects. Pure: no env state involved.

    Discrete: id in [0, n) -> id + start. Box: [-1, 1] (clipped) -> linearly onto [low, high], exact at both
    ends. MultiBinary: 0/1 vector as int8. MultiDiscrete: the joint id -> np.unravel_index(id, nvec) + start.
    """
    if isinstance(env_space, gym.spaces.Discrete):
        a = int(np.asarray(action).reshape(()))
        if not 0 <= a < env_space.n:
            raise ValueError(f"discrete action {a} outside [0, {env_space.n})")
        return np.int64(a + int(env_space.start))
    if isinstance(env_space, gym.spaces.Box):
        return box_to_env(env_space, np.asarray(action).reshape(env_space.shape))
    if isinstance(env_space, gym.spaces.MultiBinary):
        return (np.asarray(action).reshape(env_space.shape) > 0).astype(np.int8)
    if isinstance(env_space, gym.spaces.MultiDiscrete):  # the joint id -> one entry per sub-action
        nvec = np.asarray(env_space.nvec, dtype=np.int64)
        a = int(np.asarray(action).reshape(()))
        if not 0 <= a < int(np.prod(nvec)):
            raise ValueError(f"discrete action {a} outside [0, {int(np.prod(nvec))})")
        return (np.array(np.unravel_index(a, nvec), dtype=np.int64) + env_space.start).astype(env_space.dtype)
    agent_action_space(env_space)  # raises the explanatory error
    raise AssertionError("unreachable")


@dataclass
class Rollout:
    """One stored rollout, or one chunk of a very long rollout, as plain numpy arrays.

    Consecutive chunks of one rollout share their boundary timestep: the last timestep of a chunk is
    the first of the next one. `time` keeps counting across chunks.
    """

    obs: dict[str, np.ndarray]  # each [T+1, ...] in the observation's own dtype (images stay uint8)
    prev_action: np.ndarray  # [T+1, A] float32; zeros at t=0 and wherever reset is 1
    prev_reward: np.ndarray  # [T+1] float32; zero at t=0 and wherever reset is 1
    time: np.ndarray  # [T+1] int64 step index inside the rollout
    reset: np.ndarray  # [T+1] bool, 1 at the first timestep of every episode (also t=0 of a rollout)
    action: np.ndarray  # [T] int64 (discrete) | [T, D] float32 in [-1, 1] | [T, D] int8 (multibinary)
    reward: np.ndarray  # [T] float32 reward received after action t
    terminated: np.ndarray  # [T] bool: timestep t+1 ends the task (no bootstrapping past it)
    truncated: np.ndarray  # [T] bool: timestep t+1 hit a time limit (bootstrapped)
    # Goal-conditioned tasks (docs/design.md §7) only: goal tokens achieved at each timestep, padded with -1.
    achieved: np.ndarray | None = None  # [T+1, K] int64

    @property
    def num_timesteps(self) -> int:
        return len(self.time)

    def __len__(self) -> int:
        return self.num_timesteps

    def validate(self) -> None:
        """Raise ValueError naming the first field whose length or dtype breaks the contract."""
        n = self.num_timesteps
        if n < 1:
            raise ValueError("a rollout needs at least one timestep")
        for key, arr in self.obs.items():
            if len(arr) != n:
                raise ValueError(f"obs[{key!r}] has {len(arr)} rows, expected T+1={n}")
        for name in ("prev_action", "prev_reward", "reset"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} rows, expected T+1={n}")
        for name in ("action", "reward", "terminated", "truncated"):
            if len(getattr(self, name)) != n - 1:
                raise ValueError(f"{name} has {len(getattr(self, name))} rows, expected T={n - 1}")
        if self.achieved is not None and len(self.achieved) != n:
            raise ValueError(f"achieved has {len(self.achieved)} rows, expected T+1={n}")

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Flat name -> array mapping for npz storage (obs keys become `obs/<key>`)."""
        out = {f"obs/{k}": v for k, v in self.obs.items()}
        for f in fields(self):
            if f.name != "obs" and getattr(self, f.name) is not None:
                out[f.name] = getattr(self, f.name)
        return out

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> Rollout:
        obs = {k[len("obs/") :]: v for k, v in arrays.items() if k.startswith("obs/")}
        required = [f.name for f in fields(cls) if f.name != "obs" and f.default is MISSING]
        missing = [name for name in required if name not in arrays]
        if missing:
            raise ValueError(f"missing fields {missing}")
        kwargs: dict[str, Any] = {f.name: arrays.get(f.name) for f in fields(cls) if f.name != "obs"}
        rollout = cls(obs=obs, **kwargs)
        rollout.validate()
        return rollout


@dataclass
class Timesteps:
    """What the policy sees, as tensors [B, L, ...] (L = 1 when acting step by step)."""

    obs: dict[str, torch.Tensor]  # each [B, L, ...]
    prev_action: torch.Tensor  # [B, L, A] float
    prev_reward: torch.Tensor  # [B, L] float
    time: torch.Tensor  # [B, L] long
    reset: torch.Tensor  # [B, L] bool

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.time.shape)  # type: ignore[return-value]

    def named(self) -> dict[str, torch.Tensor]:
        """Every tensor by name ("obs/<key>" for the observations), in a fixed order: what static buffers of
        timesteps are laid out by (a captured acting step's inputs, a captured update's batch)."""
        return {**{f"obs/{k}": v for k, v in self.obs.items()}, "prev_action": self.prev_action,
                "prev_reward": self.prev_reward, "time": self.time, "reset": self.reset}

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Timesteps:
        return Timesteps(
            obs={k: v.to(device, non_blocking=non_blocking) for k, v in self.obs.items()},
            prev_action=self.prev_action.to(device, non_blocking=non_blocking),
            prev_reward=self.prev_reward.to(device, non_blocking=non_blocking),
            time=self.time.to(device, non_blocking=non_blocking),
            reset=self.reset.to(device, non_blocking=non_blocking),
        )

    @classmethod
    def from_numpy(cls, step: dict, device: torch.device | str = "cpu") -> Timesteps:
        """A batch of single timesteps from the vector env ([N, ...] arrays) -> tensors [N, 1, ...]."""

        on_host = torch.device(device).type == "cpu"

        def t(x: np.ndarray, dtype: type | None = None) -> torch.Tensor:
            # numpy views and one from_numpy per leaf: this runs once per vector step of acting
            a = torch.from_numpy(np.ascontiguousarray(np.asarray(x, dtype=dtype)[:, None]))
            return a if on_host else a.to(device)

        return cls(
            obs={k: t(v) for k, v in step["obs"].items()},
            prev_action=t(step["prev_action"], np.float32),
            prev_reward=t(step["prev_reward"], np.float32),
            time=t(step["time"], np.int64),
            reset=t(step["reset"], np.bool_),
        )


@dataclass
class Batch:
    """A training batch of B windows of at most L timesteps, padded at the end.

    `mask` marks real timesteps; nothing else in the batch uses magic padding values. A TD transition
    t -> t+1 exists where `has_action[:, t] & mask[:, t+1]`; the last timestep of a window has no
    successor inside the window and is not TD-trained.
    """

    inputs: Timesteps  # [B, L, ...]
    action: torch.Tensor  # [B, L, A] float (one-hot for discrete); zero where has_action is False
    reward: torch.Tensor  # [B, L] float; reward after the action at t
    terminated: torch.Tensor  # [B, L] bool
    truncated: torch.Tensor  # [B, L] bool
    mask: torch.Tensor  # [B, L] bool: a real timestep, not padding
    has_action: torch.Tensor  # [B, L] bool: an action was taken at t (every real timestep but a rollout's last)
    achieved: torch.Tensor | None = None  # [B, L, K] long, goal tasks only

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.mask.shape)  # type: ignore[return-value]

    def to(self, device: torch.device | str, non_blocking: bool = False, *, learner_only: bool = False) -> Batch:
        """The batch on `device`. `learner_only`: move only what the learning update reads (docs/design.md §4);
        `truncated` and `achieved` (read by samplers and relabelers on the host, never by the losses) then stay
        where they are, so no update pays for their copy."""
        def mv(x):
            return None if x is None else x.to(device, non_blocking=non_blocking)

        return Batch(
            inputs=self.inputs.to(device, non_blocking),
            action=mv(self.action),
            reward=mv(self.reward),
            terminated=mv(self.terminated),
            truncated=self.truncated if learner_only else mv(self.truncated),
            mask=mv(self.mask),
            has_action=mv(self.has_action),
            achieved=self.achieved if learner_only else mv(self.achieved),
        )

    def pin_memory(self) -> Batch:
        """Called by DataLoader(pin_memory=True) so host-to-GPU copies can overlap compute; `truncated` and
        `achieved`, which the learner leaves on the host (`to(..., learner_only=True)`), are not pinned."""

        def pin(x):
            return None if x is None else x.pin_memory()

        return Batch(
            inputs=Timesteps(
                obs={k: pin(v) for k, v in self.inputs.obs.items()},
                prev_action=pin(self.inputs.prev_action),
                prev_reward=pin(self.inputs.prev_reward),
                time=pin(self.inputs.time),
                reset=pin(self.inputs.reset),
            ),
            action=pin(self.action),
            reward=pin(self.reward),
            terminated=pin(self.terminated),
            truncated=self.truncated,
            mask=pin(self.mask),
            has_action=pin(self.has_action),
            achieved=self.achieved,
        )


    def to_learner_fields(self) -> dict[str, torch.Tensor]:
        """The tensors the learning update reads, by name ("obs/<key>" for the observations): what a captured
        update copies into its static buffers (icrl.agent.learner)."""
        return {**self.inputs.named(), "action": self.action, "reward": self.reward, "terminated": self.terminated,
                "mask": self.mask, "has_action": self.has_action}

    @classmethod
    def zeros_like_fields(cls, fields: dict[str, torch.Tensor], length: int, device: torch.device | str) -> Batch:
        """An all-padding batch [B, length, ...] on `device` with the layout of `to_learner_fields`' output
        (`truncated` zeros; no `achieved`): a captured update's static input buffers."""
        z = {name: torch.zeros((x.shape[0], length, *x.shape[2:]), dtype=x.dtype, device=device)
             for name, x in fields.items()}
        return cls(
            inputs=Timesteps(obs={k[4:]: v for k, v in z.items() if k.startswith("obs/")}, prev_action=z["prev_action"],
                             prev_reward=z["prev_reward"], time=z["time"], reset=z["reset"]),
            action=z["action"], reward=z["reward"], terminated=z["terminated"], truncated=torch.zeros_like(z["mask"]),
            mask=z["mask"], has_action=z["has_action"],
        )


@dataclass
class EpisodeStats:
    """One finished episode, reported by the collector. Rollout-level results average over rollouts."""

    env_index: int  # which parallel env copy
    rollout_id: int  # counts rollouts per env copy
    episode_index: int  # 0-based index of the episode inside its rollout (meta-RL adaptation curves)
    ret: float  # undiscounted return of the episode
    length: int  # actions taken in the episode
    success: float | None  # info["success"] at the episode's last step, when the env reports it
    task: str | None = None  # info["task"] at the episode's last step as a metric key (`task_key`), when reported


TASK_KEY_MAX_LEN = 64
_TASK_KEY_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def task_key(value: Any) -> str | None:
    """An env's `info["task"]` -> the name icrl logs it under (`return/<task>`, docs/CONTRACTS.md): `str(value)`
    with every character outside `A-Z a-z 0-9 _ . -` replaced by `_`, cut to 64 characters; None for None or "".
    Names that differ only where they were replaced count as one task (`"go to"` and `"go_to"`)."""
    if value is None:
        return None
    return _TASK_KEY_UNSAFE.sub("_", str(value))[:TASK_KEY_MAX_LEN] or None
