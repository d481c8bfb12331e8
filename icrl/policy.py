"""`icrl.load(path)` and `policy.predict(...)`: act with a trained agent in any loop, as with Stable-Baselines3.

    policy = icrl.load("runs/icrl")               # a run directory, a checkpoint folder, or a weights file
    obs, _ = env.reset(seed=0)
    state, start, reward = None, True, None
    while True:
        action, state = policy.predict(obs, state, episode_start=start, reward=reward)
        obs, reward, terminated, truncated, _ = env.step(action)
        start = terminated or truncated
        if start:
            obs, _ = env.reset()

Loading (`icrl.run.load.load_run`, the loader `icrl eval` uses too) reads config.json, the weights and
the env's spaces (RUN_DIR/spaces.json, or the checkpoint's state.json): nothing imports, builds or calls the
env, so a policy trained on a class defined in a script loads in a process that has never seen that class.
Acting reuses the collector's path: observations go through `TimestepWrapper`'s converters (around a
`SpacesOnlyEnv`), the timesteps come from the same state machine (`RolloutClocks`), the agent steps with its
KV cache / hidden state through `AgentPolicy`, and actions are mapped back to the env's space as in training.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from icrl.agent.model import Agent, AgentPolicy
from icrl.config import ConfigError, ExperimentConfig
from icrl.envs.clock import RolloutClocks
from icrl.guards import nonfinite_keys
from icrl.run.load import RunDirError, load_run
from icrl.spaces_json import SPACES_FILE, spaces_wrapper
from icrl.types import Timesteps, agent_to_env_action


@dataclass
class PolicyState:
    """What `predict` carries from one call to the next, for N envs: the encoder's memory (Transformer KV
    cache or RNN hidden state, inside `acting`) and each env's timestep state machine (`clocks`, what
    `TimestepWrapper` runs in training): each env's previous action (the next timestep's input), its time
    index inside the rollout, and the index of its current episode inside the rollout."""

    acting: AgentPolicy
    clocks: RolloutClocks  # of the N envs

    @property
    def prev_action(self) -> np.ndarray:  # [N, A] float32, zeros at a rollout's / episode's first timestep
        return self.clocks.prev_action.copy()

    @property
    def time(self) -> np.ndarray:  # [N] int64: the time index the next observation gets
        return self.clocks.time.copy()

    @property
    def episode(self) -> np.ndarray:  # [N] int64: episodes begun in the current rollout, minus one
        return self.clocks.episode.copy()

    @property
    def num_envs(self) -> int:
        return len(self.clocks.time)


class InContextPolicy:
    """A trained agent that maps raw env observations to env actions, one step of N envs at a time."""

    def __init__(self, agent: Agent, config: ExperimentConfig, observation_space: gym.Space,
                 action_space: gym.Space, device: torch.device) -> None:
        self.agent, self.config, self.device = agent, config, device
        self.observation_space, self.action_space = observation_space, action_space  # the env's own
        self._io = spaces_wrapper(observation_space, action_space)
        self.spec = self._io.action_spec

    def __repr__(self) -> str:
        e = self.config.env
        return (f"InContextPolicy({e.env!r}, {self.config.model.traj_encoder}, observation_space="
                f"{self.observation_space}, action_space={self.action_space})")

    def initial_state(self, num_envs: int = 1) -> PolicyState:
        """Fresh memory for `num_envs` envs, each at the start of a new task."""
        e = self.config.env
        return PolicyState(
            acting=AgentPolicy(self.agent, num_envs, greedy=True, device=self.device),
            clocks=RolloutClocks(self.spec, num_envs, e.episodes_per_rollout, e.rollout_horizon),
        )

    def predict(
        self,
        observation: Any,
        state: PolicyState | None = None,
        episode_start: Any = None,
        *,
        reward: Any = None,
        deterministic: bool = True,
        new_task: Any = None,
    ) -> tuple[Any, PolicyState]:
        """The action(s) for `observation`, and the state to pass to the next call.

        Follows sb3-contrib RecurrentPPO's `predict(observation, state, episode_start, deterministic)`, plus
        the previous reward, which an in-context agent reads: it adapts to a task from its own history. Every
        argument after `episode_start` is keyword-only (`reward=`, `deterministic=`), so RecurrentPPO's habit of
        passing `deterministic` fourth is an error, not a reward of True.

        observation: a raw observation of the env (as `env.reset` / `env.step` return it), or a batch of N
            of them (leading axis N, as a gymnasium vector env returns them; a Dict's leaves each batched).
        state: None at the start (every env begins a new task), then whatever the last call returned. It
            holds the KV cache / hidden state and each env's previous action and time index; it is updated
            in place and returned.
        episode_start: bool, or [N] bools: this observation is the first of a new episode (after
            `env.reset()`). Whether that is a **new task** (memory cleared) or the **next episode of the same
            task** (memory kept: meta-RL) follows the rollouts the agent was trained on. With one episode per
            rollout (the default) every new episode is a new task, exactly like RecurrentPPO. With
            `--episodes-per-rollout K`, every K-th episode starts a new task and the ones between continue the
            rollout (reset flag set, previous action and reward zeroed, time counting on); with
            `--rollout-horizon H`, an episode that starts after H steps of the rollout starts a new task.
            Multi-episode agents were trained seeing each episode's final observation (with its last reward)
            before the next episode's first one: call `predict` on the final observation too (ignore its
            action), then on the first observation of the next episode with `episode_start=True`.
            A Gymnasium vector env in its default NEXT_STEP autoreset mode does exactly that: it returns the
            final observation with `terminated`/`truncated`, and the reset one at the next step, so pass
            `episode_start=` the done flags of the step before the last one (SAME_STEP mode returns the reset
            observation at once: pass that step's done flags, which skips the final observation).
        reward: the reward the env returned for the previous action (float or [N]); ignored where a rollout
            or episode starts. Required everywhere else: an agent fed a fake 0 would act on a wrong history.
        deterministic: the greedy action (the mode of the policy's discount head, as `icrl eval`), else a
            sample from the policy.
        new_task: bool or [N] bools (keyword): start a new task in these envs now (memory cleared), whatever
            the rollout schedule says; e.g. to move an env to another task without waiting for K episodes.

        Returns (action, state): env actions (Discrete ids with the space's start, Box actions rescaled to the
        env's bounds, MultiBinary 0/1), one action for one observation or an array of N for a batch.
        """
        n, single = self._batch_size(observation)
        obs_rows = [self._obs_row(observation, i, single) for i in range(n)]  # before any change
        first = state is None
        state = self._state_for(state, n)
        hard, inner, cont = self._boundaries(state, episode_start, new_task, first)
        step = self._next_timestep(state, obs_rows, hard, inner, cont, reward)
        state.acting.greedy = bool(deterministic)
        actions = state.acting.act(Timesteps.from_numpy(step), new_rollout=hard)  # storage format [N] | [N, D]
        state.clocks.acted(self.spec.to_vector(self.spec.as_stored(actions)))  # [N, A] float32
        env_actions = [agent_to_env_action(self.action_space, a) for a in actions]
        return (env_actions[0] if single else np.stack(env_actions)), state

    def _state_for(self, state: Any, n: int) -> PolicyState:
        """`state` as given (checked: the previous call's, for the same N envs), or a fresh one for None."""
        if state is None:
            return self.initial_state(n)
        if not isinstance(state, PolicyState):
            raise TypeError(f"state must be None (a new task) or the state the previous predict returned, got "
                            f"{type(state).__name__}")
        if state.num_envs != n:
            raise ValueError(f"state is for {state.num_envs} envs but the observation batch has {n}")
        return state

    def _boundaries(
        self, state: PolicyState, episode_start: Any, new_task: Any, first: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Where this observation starts a new task (`hard`), the next episode of the same task (`inner`), or
        continues the episode (`cont`): [N] bools each, one of the three true per env."""
        n = state.num_envs
        start = self._flags(episode_start, n, "episode_start", default=first)
        hard = self._flags(new_task, n, "new_task", default=False) | first
        over = state.clocks.rollout_over()
        hard |= start & over  # the rollout the agent was trained on is over: a new task
        return hard, start & ~hard, ~start & ~hard

    @staticmethod
    def _next_timestep(state: PolicyState, obs_rows: list[dict[str, np.ndarray]], hard: np.ndarray,
                       inner: np.ndarray, cont: np.ndarray, reward: Any) -> dict:  # fmt: skip
        """The timestep dict the agent sees ([N, ...] arrays), after moving each env's time, episode index and
        previous action across the boundaries (`RolloutClocks`). Raises (leaving `state` as it was) when a reward
        is missing."""
        n = state.num_envs
        if cont.any() and reward is None:
            raise ValueError("predict(..., reward=None) after the first step: pass the reward the env returned for "
                             "the previous action (an in-context agent reads it), or episode_start=True")
        rewards = np.zeros(n, np.float32) if reward is None else _rewards(reward, n)
        state.clocks.start(hard, new_task=True)
        state.clocks.start(inner, new_task=False)
        obs = {k: np.stack([o[k] for o in obs_rows]) for k in obs_rows[0]}  # each [N, ...]
        return {"obs": obs, **state.clocks.timestep(rewards, cont)}  # each [N, ...]

    # ------------------------------------------------------------------------------------------ helpers
    @staticmethod
    def _flags(value: Any, n: int, name: str, default: bool) -> np.ndarray:
        if value is None:
            return np.full(n, default, dtype=bool)
        flags = np.asarray(value, dtype=bool).reshape(-1)
        if flags.size == 1:
            return np.full(n, bool(flags[0]))
        if flags.size != n:
            raise ValueError(f"{name} has {flags.size} entries for {n} envs")
        return flags.copy()

    def _batch_size(self, observation: Any) -> tuple[int, bool]:
        """(N, single): a lone observation is N=1, single=True; a batch has a leading axis of N."""
        space, value = self.observation_space, observation
        while isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):  # the first leaf decides
            try:
                if isinstance(space, gym.spaces.Dict):
                    name = next(iter(space.spaces))
                    key: str | int = name
                    space, value = space.spaces[name], value[name]
                else:
                    key = 0
                    space, value = space.spaces[0], value[0]
            except (KeyError, IndexError, TypeError) as e:
                raise ValueError(f"observation lacks {key!r} of the env's observation space "
                                 f"{self.observation_space}") from e
        shape = np.shape(value)
        leaf: tuple[int, ...]
        if isinstance(space, gym.spaces.Discrete):
            leaf = ()
        elif isinstance(space, gym.spaces.MultiDiscrete):
            leaf = tuple(np.shape(space.nvec))
        elif isinstance(space, gym.spaces.MultiBinary):
            leaf = tuple(np.atleast_1d(space.n))
        else:  # a Box: TimestepWrapper accepts no other leaf
            leaf = tuple(space.shape or ())
        if shape == leaf:
            return 1, True
        if len(shape) == len(leaf) + 1 and shape[1:] == leaf:
            if shape[0] == 0:
                raise ValueError(f"observation batch of shape {shape} is empty: "
                                 "pass one observation or a batch of N >= 1")
            return int(shape[0]), False
        raise ValueError(f"observation of shape {shape} is neither one observation of {space} nor a batch of them")

    def _obs_row(self, observation: Any, i: int, single: bool) -> dict[str, np.ndarray]:
        """Observation i converted as in training; ValueError for one that is not a finite value of the space
        (a NaN fed to the agent would spread through its memory into every later action)."""
        row = self._io.convert_obs(self._row(observation, i, single))
        bad = nonfinite_keys(row)
        if bad:
            where = "the observation" if single else f"observation {i} of the batch"
            raise ValueError(f"{where} holds NaN or inf (key {bad[0]!r}); predict takes finite observations")
        return row

    def _row(self, tree: Any, i: int, single: bool) -> Any:
        if single:
            return tree
        if isinstance(tree, dict):
            return {k: self._row(v, i, single) for k, v in tree.items()}
        if isinstance(tree, tuple):
            return tuple(self._row(v, i, single) for v in tree)
        return np.asarray(tree)[i]


def _rewards(reward: Any, n: int) -> np.ndarray:
    """`reward` (a number, or [N] numbers) as [N] float32; ValueError for a string, NaN / inf, a value float32
    cannot hold, or the wrong count, which would otherwise be read as (or turn into) some other number."""
    arr = np.asarray(reward)
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"reward must be a number or [N] numbers, got {reward!r}")
    if arr.size not in (1, n):
        raise ValueError(f"reward has {arr.size} entries for {n} envs")
    if nonfinite_keys({"reward": arr.astype(np.float64)}):
        raise ValueError(f"reward must be finite (and within float32's range), got {reward!r}")
    return np.broadcast_to(arr.astype(np.float32).reshape(-1), (n,))


def load(path: str | Path, device: str | torch.device = "cpu", *, env: Any = None) -> InContextPolicy:
    """The policy of a run directory, a checkpoint folder (RUN_DIR/checkpoints/ckpt-N), a weights file in
    either, or a zip written by `icrl export` (checked as hostile input: icrl.run.load), ready to `predict`. The
    latest checkpoint of a run directory is used (else its final weights), as `icrl eval` does. `device`: "cpu",
    "cuda", "auto", ...

    Nothing of the env is imported or built: the spaces come from RUN_DIR/spaces.json (or the checkpoint).
    A run from an icrl that did not write them needs `env=`: the env (or its class, a factory, a vector env,
    or its name), whose spaces are read once; building it is then the caller's explicit choice.
    """
    from icrl.config.validation import device_error

    bad_device = device_error(str(device)) if isinstance(device, (str, torch.device)) else (
        f"device must be a str or torch.device such as 'cpu', 'cuda' or 'auto', got {device!r}")
    if bad_device:  # the same line as `icrl eval --device` (not torch's AssertionError deep in loading)
        raise ConfigError(bad_device)
    path = Path(path)
    if not path.exists():
        raise RunDirError(f"{path} does not exist; pass a run directory written by `icrl train` or a checkpoint")
    if path.is_file() and path.suffix.lower() == ".zip":  # `icrl export`: unpacked, checked, loaded, removed
        from icrl.run.load import unpacked

        with unpacked(path) as folder:
            return load(folder, device, env=env)

    def spaces_of(cfg: ExperimentConfig) -> tuple[gym.Space, gym.Space]:
        if env is None:
            raise RunDirError(
                f"{path} has no {SPACES_FILE} (a run from an older icrl), so the env's spaces are unknown: pass the "
                "env to read them from, icrl.load(path, env=...) (an env, its class or its name)"
            )
        from icrl.envs.user import env_spaces

        return env_spaces(env, cfg.env.kwargs)

    from icrl.device import resolve_device

    agent, cfg, spaces = load_run(path, device, spaces_of=spaces_of)  # a bad device is refused in there
    dev = resolve_device(device) if isinstance(device, str) else torch.device(device)
    return InContextPolicy(agent, cfg, spaces[0], spaces[1], dev)


def evaluate(policy: InContextPolicy | str | Path, env: Any = None, n_episodes: int = 10, deterministic: bool = True,
             *, env_kwargs: dict[str, Any] | None = None, seed: int = 0, parallel_envs: int | None = None,
             max_steps: int | None = None, trust_run_env: bool = False) -> dict[str, Any]:
    """Play `n_episodes` rollouts with a trained policy and summarise them, as SB3's `evaluate_policy`:
    `return_mean`, `return_std`, `success_rate` (None when the env reports no `info["success"]`), and each
    rollout's `returns`, `successes` and `lengths` (for meta-RL runs also `return_by_episode`).

    policy: an `icrl.load` result, or a path to load. env: any form `icrl.train` takes (an id or task name,
        a class, a zero-arg factory, an instance made by gymnasium.make, a vector env); None: the run's own env
        when its name can be rebuilt safely (a built-in task or a registered id), or with `trust_run_env`. It must
        give the spaces the policy was trained on.
    n_episodes: rollouts to play; a rollout is the run's `episodes_per_rollout` episodes of one task (one
        episode for most runs), and returns sum over them.
    deterministic: greedy actions (as `icrl eval`), else sampled from the policy.
    env_kwargs: kwargs for the env (default: the run's when `env` is None or the run's env name, else none).
    seed: seeds the envs; with the run's env and seed this is exactly `icrl eval RUN --seed S`'s evaluation.
    trust_run_env: with env None, build the run's env even when its config.json names code to import and call
        (`package.module:factory`); a run directory is data, so icrl does not run that code unless asked.
    """
    from icrl.config.bounds import MAX_PARALLEL_ENVS, MAX_ROLLOUTS
    from icrl.run.evaluate import evaluate_agent

    _check_count("n_episodes", n_episodes, MAX_ROLLOUTS)  # a count that would run for ever, or play nothing
    if max_steps is not None:
        _check_count("max_steps", max_steps, 10**9)
    if parallel_envs is not None:
        _check_count("parallel_envs", parallel_envs, MAX_PARALLEL_ENVS)
    policy = policy if isinstance(policy, InContextPolicy) else load(policy)
    return evaluate_agent(policy.agent, policy.config, (policy.observation_space, policy.action_space),
                          policy.device, env, n_episodes, deterministic, env_kwargs=env_kwargs, seed=seed,
                          parallel_envs=parallel_envs, max_steps=max_steps, trust_run_env=trust_run_env)


def _check_count(name: str, value: Any, most: int) -> None:
    """A whole number from 1 to `most`, else ConfigError naming `name` (as the CLI's bounds do)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value <= most:
        raise ConfigError(f"{name} must be a whole number from 1 to {most:,}, got {value!r}")
