"""Meta-World ML1 and ML10 (Yu et al., CoRL 2019; metaworld 3.x, `-v3` tasks) as in-context meta-RL tasks.

A Sawyer arm must reach, push, open, ... A *task* is one object/goal configuration of one task class (metaworld's
`Task`, 50 per class and split). The goal is hidden (metaworld's ML setting zeroes the goal slots of the 39-d
observation), so the agent has to infer it from rewards within a rollout of k episodes
(`--episodes-per-rollout k`): `reset(options={"new_task": False})` keeps the task, while `reset()` (or
`new_task=True`, or a seeded reset) draws a new one uniformly from the split's tasks - for ML10 that is also
a new task class, so every class is equally likely.

- `metaworld/ML1/<task>` (e.g. `metaworld/ML1/reach-v3`, any of metaworld's 50 task classes): one class;
  the train and test splits hold different goal positions.
- `metaworld/ML10`: 10 train classes; `{"split": "test"}` gives the 5 held-out test classes.

Observations are metaworld's Box(39,) float64 (the timestep wrapper makes them float32), actions Box(-1, 1, (4,))
(xyz of the hand, gripper). Rewards are metaworld's (v2 reward functions, 0..10 per step), unscaled.
An episode lasts `max_episode_steps` steps (default 500, metaworld's `max_path_length`) and is then
truncated; it never terminates unless `terminate_on_success=True`.

Success: metaworld reports `info["success"]` per step (the object is at the goal *now*). Here
`info["success"]` is 1.0 from the first successful step of an episode on (it has succeeded at least once), so
its value at the episode's last step says whether the episode ever succeeded. This is the number metaworld's
own evaluation computes (`metaworld.evaluation` ends each episode at its first success) and the usual ML1/ML10
success rate; a "success at the last step" rate would punish pushing the object past the goal after reaching
it. The per-step value is `info["step_success"]`. Every reset and step info holds `info["task"]`, the task class
("reach-v3"; icrl logs return and success per task, docs/CONTRACTS.md), and `info["task_id"]`, its index in
`class_names`.

Cost: building the benchmark's task lists is slow (`metaworld.ML1` ~1 s, `metaworld.ML10` ~12 s), so it
happens once per (benchmark, task, seed) and process (`get_benchmark`, cached): the copies of a
`SyncVectorEnv` share it, and forked `AsyncVectorEnv` workers inherit it when the parent built one (as
`make_vector_env` does). Each env instance builds the MuJoCo model of a class (~0.1 s) the first time it samples
that class. The task lists depend on `benchmark_seed` (default 0), so every process and run sees the same
train and test tasks; the env's own seed only picks which of them each rollout plays.

metaworld is an optional dependency (`pip install 'icrl[metaworld]'`), imported only when an env is built. It
pins mujoco 3.3.0: installing it next to `gymnasium[mujoco]` (mujoco 4) can leave a broken mujoco behind (the
error raised then says how to fix it).
"""

from __future__ import annotations

import difflib
import functools
from typing import Any

import gymnasium as gym
import numpy as np

from icrl.envs.tasks.grid import wants_new_task

METAWORLD_HINT = (
    "Meta-World envs need the optional package metaworld: pip install 'icrl[metaworld]' "
    "(or pip install 'metaworld>=3.1')"
)
MUJOCO_FIX = (
    "metaworld is installed but MuJoCo does not import - typically metaworld's mujoco==3.3.0 was installed over "
    "mujoco 4, leaving mujoco-core 4 behind. Fix: pip uninstall -y mujoco mujoco-core mujoco-studio && "
    "pip install mujoco==3.3.0"
)
BENCHMARKS = ("ML1", "ML10")
SPLITS = ("train", "test")


def import_metaworld():
    """`import metaworld`, or an ImportError that says how to install (or repair) it."""
    try:
        import metaworld  # noqa: PLC0415 - optional dependency, imported on use
    except ImportError as e:
        raise ImportError(f"{METAWORLD_HINT} ({e})") from e
    except OSError as e:  # libmujoco.so.4.0.0 not found: a half-downgraded mujoco
        raise ImportError(f"{MUJOCO_FIX} ({e})") from e
    return metaworld


def ml1_task_names() -> list[str]:
    """The 50 task classes of metaworld ("assembly-v3", ..., "window-open-v3"); needs metaworld."""
    return sorted(import_metaworld().ML1.ENV_NAMES)


def metaworld_env_names() -> list[str]:
    """Every member of the "metaworld/" family: "ML1/<task>" for all tasks, then "ML10"; needs metaworld."""
    return [f"ML1/{t}" for t in ml1_task_names()] + ["ML10"]


@functools.lru_cache(maxsize=None)
def get_benchmark(benchmark: str, task: str | None, seed: int) -> Any:
    """`metaworld.ML1(task, seed)` or `metaworld.ML10(seed)`, built once per process (it is slow)."""
    metaworld = import_metaworld()
    if benchmark == "ML1":
        return metaworld.ML1(task, seed=seed)
    return metaworld.ML10(seed=seed)


def _is_scalar(value: Any) -> bool:
    """`np.isscalar` as a plain bool: its TypeGuard admits complex, which `float()` rejects in the stubs."""
    return bool(np.isscalar(value))


class MetaWorldML(gym.Env):
    """Meta-World ML1 / ML10 with a hidden task per rollout (module doc).

    Args:
      benchmark: "ML1" or "ML10".
      task: the ML1 task class, e.g. "reach-v3" (only and required for ML1).
      split: "train" or "test" (ML1: other goal positions; ML10: the 5 held-out classes).
      max_episode_steps: episode length (truncation), >= 1; default 500 as in metaworld.
      benchmark_seed: seed of metaworld's task lists (which 50 goals each class has).
      terminate_on_success: end the episode at its first successful step (metaworld's evaluation mode).
      render_mode: None, "rgb_array", "depth_array" or "human".
      **env_kwargs: other arguments of metaworld's env classes (width, height, camera_name, camera_id,
        reward_function_version).
    """

    def __init__(
        self,
        benchmark: str = "ML1",
        task: str | None = None,
        split: str = "train",
        max_episode_steps: int = 500,
        benchmark_seed: int = 0,
        terminate_on_success: bool = False,
        render_mode: str | None = None,
        **env_kwargs: Any,
    ):
        import_metaworld()  # a clear error first when the extra is missing (even if a benchmark is cached)
        if benchmark not in BENCHMARKS:
            raise ValueError(f"Meta-World benchmark must be one of {BENCHMARKS}, got {benchmark!r}")
        if split not in SPLITS:
            raise ValueError(f"Meta-World split must be one of {SPLITS}, got {split!r}")
        if int(max_episode_steps) < 1:
            raise ValueError(f"Meta-World max_episode_steps must be >= 1, got {max_episode_steps}")
        if benchmark == "ML1":
            names = ml1_task_names()
            if task not in names:
                close = difflib.get_close_matches(str(task), names, n=3, cutoff=0.6)
                hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
                raise ValueError(f"Unknown Meta-World ML1 task {task!r}.{hint} Tasks: {', '.join(names)}")
        elif task is not None:
            raise ValueError(f"Meta-World {benchmark} takes no task (got {task!r}); its classes are fixed")
        bench = get_benchmark(benchmark, task, int(benchmark_seed))
        self.benchmark, self.split = benchmark, split
        self.max_episode_steps = int(max_episode_steps)
        self.terminate_on_success = bool(terminate_on_success)
        self.render_mode = render_mode
        self._env_kwargs = dict(env_kwargs)
        self._classes = dict(bench.train_classes if split == "train" else bench.test_classes)
        self.class_names: list[str] = list(self._classes)
        self.tasks = list(bench.train_tasks if split == "train" else bench.test_tasks)  # 50 per class
        self._envs: dict[str, Any] = {}  # class name -> its MuJoCo env, built on first use

        first = self._class_env(self.class_names[0])
        self.observation_space = first.observation_space  # Box(39,) float64; the same for every class
        self.action_space = first.action_space  # Box(-1, 1, (4,), float32)
        self.metadata = dict(first.metadata)  # render modes and fps
        self.task_index = -1  # index into self.tasks of the current task
        self._t = 0
        self._succeeded = False

    # --------------------------------------------------------------------------------------------- tasks
    def _class_env(self, name: str) -> Any:
        env = self._envs.get(name)
        if env is None:
            env = self._classes[name](render_mode=self.render_mode, **self._env_kwargs)
            env.max_path_length = self.max_episode_steps  # metaworld raises when stepped past it
            if self._envs:  # every class must fit the space declared from the first one
                ref = next(iter(self._envs.values())).observation_space
                if not (np.array_equal(env.observation_space.low, ref.low)
                        and np.array_equal(env.observation_space.high, ref.high)):  # fmt: skip
                    raise RuntimeError(f"Meta-World class {name} has another observation space than the first")
            self._envs[name] = env
        return env

    @property
    def task_name(self) -> str:
        """The current task's class, e.g. "reach-v3"."""
        return self.tasks[self.task_index].env_name

    @property
    def _env(self) -> Any:
        return self._envs[self.task_name]

    def _info(self) -> dict[str, Any]:
        return {"task_id": self.class_names.index(self.task_name), "task": self.task_name}

    # ----------------------------------------------------------------------------------------------- API
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        if wants_new_task(options, seed, self.task_index >= 0):
            self.task_index = int(self.np_random.integers(len(self.tasks)))
            task = self.tasks[self.task_index]
            self._class_env(task.env_name).set_task(task)
        # With a task set, a metaworld reset is deterministic: the task fixes the object and goal positions.
        obs, _ = self._env.reset()
        self._t, self._succeeded = 0, False
        return obs, self._info()

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        if self.task_index < 0:
            raise RuntimeError("MetaWorldML.step called before reset")
        action = np.asarray(action, dtype=np.float32).reshape(self.action_space.shape)
        obs, reward, _, _, inner = self._env.step(action)
        self._t += 1
        step_success = float(inner.get("success", 0.0)) > 0.0
        self._succeeded = self._succeeded or step_success
        info = {k: float(v) for k, v in inner.items() if k != "success" and _is_scalar(v)}
        info.update(self._info(), success=float(self._succeeded), step_success=float(step_success))
        terminated = self.terminate_on_success and step_success
        truncated = not terminated and self._t >= self.max_episode_steps
        return obs, float(reward), terminated, truncated, info

    def render(self) -> np.ndarray | None:
        if self.task_index < 0:
            raise RuntimeError("MetaWorldML.render called before reset")
        return self._env.render()

    def close(self) -> None:
        for env in self._envs.values():
            env.close()
        self._envs.clear()


def make_metaworld(member: str, **kwargs: Any) -> MetaWorldML:
    """A member of the "metaworld/" family by name: "ML1/<task>" or "ML10" (kwargs go to `MetaWorldML`)."""
    bench, _, task = member.partition("/")
    if bench == "ML1" and task:
        return MetaWorldML("ML1", task=task, **kwargs)
    if bench == "ML10" and not task:
        return MetaWorldML("ML10", **kwargs)
    raise ValueError(
        f"Unknown Meta-World env 'metaworld/{member}': use 'metaworld/ML1/<task>' (e.g. "
        "'metaworld/ML1/reach-v3'; list them with `icrl envs metaworld`) or 'metaworld/ML10' "
        "(env kwarg split='test' for the test classes)"
    )
