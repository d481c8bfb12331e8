"""XLand-MiniGrid (Nikulin et al., 2023): meta-RL gridworlds in JAX (xminigrid), a hidden ruleset per rollout.

`xland/<env-id>` is xminigrid's environment `<env-id>` (`icrl envs xland` lists them): the XLand ids
(`xland/XLand-MiniGrid-R1-9x9`, rooms R1..R9, sizes 9x9..25x25) draw a ruleset (a goal, rules that turn objects
into others, the objects placed) per rollout from a ruleset benchmark; the MiniGrid ids (`xland/MiniGrid-DoorKey
-5x5`, ...) are xminigrid's ports of classic MiniGrid tasks, one fixed task each. `XLandMiniGrid` is one copy;
`make_vector_env` builds `icrl.envs.tasks.xland_vector.XLandVectorEnv` instead, every copy stepped by one jitted,
vmapped step (the official AMAGO runs the env "already vectorised" too). The choices follow the official AMAGO
(`amago/envs/builtin/xland_minigrid.py`, `examples/11_xland_minigrid.py`):

- rulesets are drawn uniformly from a benchmark (default `small-1m`, the official default), shuffled with
  `jax.random.key(split_key)` and split 80 / 20 into "train" and "test" (`split`, `split_key`, `train_fraction`:
  the official `train_test_split*` arguments; it trains on "train" and validates on "test");
- episodes end when the goal is reached (reward 1 - 0.9 t / max_steps, as xminigrid gives it) or after
  xminigrid's `max_steps`, 3 x height x width (243 at 9x9), the official setting;
- k-shot meta-RL: the official env plays `k_episodes` episodes of one ruleset per rollout, the last observation
  of each shown and the next action ignored (xminigrid's DmEnvAutoResetWrapper); icrl's `--episodes-per-rollout
  K` does exactly that (a bridge step, docs/design.md §2): `reset(options={"new_task": False})` keeps the ruleset
  and lays out a new episode of it (the example's K is 15, its context min(2048, (max_steps + 1) K));
- observation `{"grid", "direction_done", "goal"}` as the official's: the agent's 5x5 view, its heading one-hot
  with a fifth flag set on an episode's last timestep, and the goal's encoding; the rules are not shown.

Where icrl differs, and why:

- `grid` is one-hot, 13 tile + 12 colour channels of 0 / 255 (`uint8 [5, 5, 25]`, an image key for icrl's CNN,
  as `babyai/`), where the official embeds the raw ids in its own encoder; `grid_encoding="ids"` gives the raw
  `[5, 5, 2]` ids;
- `goal` is the encoding + 1 (`int64 [5]`, 1..max(15, height, width)): icrl embeds an obs key "goal" as tokens
  (icrl.nets.goals), where token 0 means an empty slot, while an encoding may hold a real 0;
- a seeded reset seeds the ruleset draws and layouts (copy i of a vector env with seed + i), so runs repeat; the
  official draws from Python's unseeded `random`. The benchmark names are xminigrid 0.9's: `trivial-21k`,
  `small-1m`, `medium-1m`, `medium-3m`, `high-1m`, `high-3m` (the official docstring's "trivial-1m" is gone).

`info["task"]` names each episode's task for per-task metrics (docs/CONTRACTS.md): by default the goal's kind
("AgentNear", "TileNear", ...: 15 names; a ruleset id would give a metric per ruleset of a million), the
ruleset's index in its split with `task_name="ruleset"`, the env id with `task_name="env"` (the MiniGrid ids'
default). `info["success"]` is 1.0 when an episode ends at its goal, 0.0 when it runs out of steps.

xminigrid is an optional dependency (`pip install 'icrl[jax]'`: jax, flax), imported when an env is built. The
benchmarks are downloaded by xminigrid on first use (to `$XLAND_MINIGRID_DATA`, default `~/.xland_minigrid`);
`benchmark` also takes the path of a benchmark file (xminigrid's `save_bz2_pickle` of goals, rules, init_tiles,
num_rules), for machines without that download.
"""

from __future__ import annotations

import difflib
import functools
import os
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

from icrl.envs.tasks.grid import wants_new_task

XLAND_HINT = "XLand-MiniGrid needs the optional package xminigrid: pip install 'icrl[jax]' (or pip install xminigrid)"
DEFAULT_BENCHMARK = "small-1m"  # the official default (its examples/11_xland_minigrid.py and the env's)
SPLITS = ("train", "test", "all")
GRID_ENCODINGS = ("onehot", "ids")
TASK_NAMES = ("goal", "ruleset", "env")
NUM_TILES, NUM_COLORS = 13, 12  # xminigrid.core.constants: a grid cell is (tile id, colour id)
# xminigrid.core.goals.check_goal's order: the first id of a goal's encoding
GOAL_KINDS = (
    "Empty", "AgentHold", "AgentOnTile", "AgentNear", "TileNear", "TileOnPosition", "AgentOnPosition",
    "TileNearUp", "TileNearRight", "TileNearDown", "TileNearLeft", "AgentNearUp", "AgentNearRight",
    "AgentNearDown", "AgentNearLeft",
)  # fmt: skip


def _import_xminigrid() -> tuple[Any, Any]:
    """(jax, xminigrid), or an ImportError naming the pip command. A jax with a GPU would otherwise take 75% of
    its memory at the first array, beside torch's (the official example sets the same variable)."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    try:
        import jax  # noqa: PLC0415 - optional dependency, imported on use
        import xminigrid  # noqa: PLC0415
    except ImportError as e:
        raise ImportError(f"{XLAND_HINT} ({e})") from e
    return jax, xminigrid


def xland_env_names() -> list[str]:
    """Every member of the "xland/" family: xminigrid's registered environment ids; needs xminigrid."""
    return list(_import_xminigrid()[1].registered_environments())


def resolve_env_id(env_id: str) -> str:
    """An xminigrid environment id, or a one-line ValueError with close matches."""
    names = xland_env_names()
    if env_id in names:
        return env_id
    close = difflib.get_close_matches(str(env_id), names, n=3, cutoff=0.6)
    hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
    raise ValueError(f"Unknown XLand-MiniGrid env {env_id!r}.{hint} `icrl envs xland` lists the {len(names)} ids")


@functools.lru_cache(maxsize=4)
def load_rulesets(benchmark: str, split: str, split_key: int, train_fraction: float) -> Any:
    """The rulesets of `benchmark` (a registered name or a file) in `split`, as the official code splits them;
    cached: a vector env and the copy `make_vector_env` checks first share one."""
    jax, xminigrid = _import_xminigrid()
    from xminigrid.benchmarks import load_benchmark_from_path  # noqa: PLC0415

    if os.path.isfile(benchmark):
        bench = load_benchmark_from_path(benchmark)
    elif benchmark in xminigrid.registered_benchmarks():
        try:
            bench = xminigrid.load_benchmark(benchmark)
        except OSError as e:  # urllib's errors are OSErrors: no network, a proxy, a half-written file
            from xminigrid.benchmarks import DATA_PATH, NAME2HFFILENAME  # noqa: PLC0415

            where = os.path.join(DATA_PATH, NAME2HFFILENAME[benchmark])
            raise OSError(f"XLand-MiniGrid benchmark {benchmark!r} could not be downloaded ({e}); put the file at "
                          f"{where} ($XLAND_MINIGRID_DATA) or pass benchmark='/path/to/file'") from e
    else:
        raise ValueError(f"XLand-MiniGrid benchmark must be one of {list(xminigrid.registered_benchmarks())} or "
                         f"a benchmark file, got {benchmark!r}")
    if split == "all":
        return bench
    train, test = bench.shuffle(key=jax.random.key(split_key)).split(prop=train_fraction)
    out = train if split == "train" else test
    if out.num_rulesets() == 0:
        raise ValueError(f"XLand-MiniGrid split {split!r} of {benchmark!r} with train_fraction={train_fraction} "
                         "holds no ruleset")
    return out


class Kernels(NamedTuple):
    """The jitted, vmapped functions of one env id and setting, shared by every copy and vector env of them
    (jax compiles once per number of copies). `state` is a batch of xminigrid TimeSteps, `obs` a tuple
    (grid, direction_done, goal) of [N, ...] jax arrays."""

    env: Any  # the xminigrid Environment (stateless)
    params: Any  # its EnvParams
    fresh: Any  # (rulesets, idx [N], seeds [N]) -> (state, obs)
    masked: Any  # (rulesets, state, mask [N], idx [N], seeds [N]) -> (state, obs): reset only the masked copies
    step: Any  # (state, actions [N]) -> (state, obs, reward [N], terminated [N], truncated [N])


@functools.lru_cache(maxsize=None)
def kernels(env_id: str, max_steps: int | None, onehot: bool) -> Kernels:
    """The `Kernels` of xminigrid env `env_id` with `max_steps` (None: xminigrid's) and a one-hot grid or not;
    cached, so every copy and vector env of a setting shares jax's compiled functions."""
    jax, xminigrid = _import_xminigrid()
    import jax.numpy as jnp  # noqa: PLC0415
    from xminigrid.benchmarks import get_ruleset  # noqa: PLC0415
    from xminigrid.types import StepType  # noqa: PLC0415

    env, params = xminigrid.make(env_id)
    if max_steps is not None:
        params = params.replace(max_steps=int(max_steps))
    has_rules = hasattr(params, "ruleset")

    def obs(ts: Any) -> tuple[Any, Any, Any]:
        grid = ts.observation  # [V, V, 2] uint8 (tile, colour)
        if onehot:
            grid = jnp.concatenate([jax.nn.one_hot(grid[..., 0], NUM_TILES, dtype=jnp.uint8),
                                    jax.nn.one_hot(grid[..., 1], NUM_COLORS, dtype=jnp.uint8)], axis=-1) * 255
        last = (ts.step_type == StepType.LAST).astype(jnp.float32)[..., None]
        heading = jax.nn.one_hot(ts.state.agent.direction, 4, dtype=jnp.float32)
        return grid, jnp.concatenate([heading, last], axis=-1), ts.state.goal_encoding

    def reset_one(rulesets: Any, idx: Any, seed: Any) -> Any:
        p = params
        if has_rules:
            p = params.replace(ruleset=get_ruleset(rulesets.goals, rulesets.rules, rulesets.init_tiles, idx))
        return env.reset(p, jax.random.key(seed))

    def fresh(rulesets: Any, idx: Any, seeds: Any) -> tuple[Any, Any]:
        state = jax.vmap(reset_one, in_axes=(None, 0, 0))(rulesets, idx, seeds)
        return state, obs(state)

    def masked(rulesets: Any, state: Any, mask: Any, idx: Any, seeds: Any) -> tuple[Any, Any]:
        new = jax.vmap(reset_one, in_axes=(None, 0, 0))(rulesets, idx, seeds)
        pick = lambda old, n: jnp.where(mask.reshape(mask.shape + (1,) * (old.ndim - 1)), n, old)  # noqa: E731
        state = jax.tree_util.tree_map(pick, state, new)
        return state, obs(state)

    def step(state: Any, actions: Any) -> tuple[Any, ...]:
        state = jax.vmap(env.step, in_axes=(None, 0, 0))(params, state, actions)
        terminated = state.discount == 0.0  # xminigrid: discount 0 exactly when the goal is reached
        truncated = (state.step_type == StepType.LAST) & ~terminated
        return state, obs(state), state.reward, terminated, truncated

    return Kernels(env, params, jax.jit(fresh), jax.jit(masked), jax.jit(step))


class XLandSetup:
    """What the copies of one `xland/<env-id>` setting share: the kernels, the rulesets (None for the MiniGrid
    ids), how tasks are named; `draw_task`, `reset_seed` and `task_label` are the draws and names of one copy,
    made by the per-copy env and the vector env alike (so both give the same rollouts under the same seed)."""

    def __init__(self, env_id: str, benchmark: str | None, split: str, split_key: int, train_fraction: float,
                 max_steps: int | None, grid_encoding: str, task_name: str | None) -> None:
        self.env_id = resolve_env_id(env_id)
        is_xland = self.env_id.startswith("XLand-MiniGrid")
        if split not in SPLITS:
            raise ValueError(f"XLand-MiniGrid split must be one of {SPLITS}, got {split!r}")
        if not 0.0 < float(train_fraction) < 1.0:
            raise ValueError(f"XLand-MiniGrid train_fraction must be in (0, 1), got {train_fraction}")
        if grid_encoding not in GRID_ENCODINGS:
            raise ValueError(f"XLand-MiniGrid grid_encoding must be one of {GRID_ENCODINGS}, got {grid_encoding!r}")
        if task_name is not None and task_name not in TASK_NAMES:
            raise ValueError(f"XLand-MiniGrid task_name must be one of {TASK_NAMES} or None, got {task_name!r}")
        if max_steps is not None and int(max_steps) < 1:
            raise ValueError(f"XLand-MiniGrid max_steps must be >= 1, got {max_steps}")
        if not is_xland and benchmark is not None:
            raise ValueError(f"benchmark is for the XLand-MiniGrid-* ids; {self.env_id} has one fixed task")
        if not is_xland and task_name in ("goal", "ruleset"):
            raise ValueError(f"task_name={task_name!r} names rulesets; {self.env_id} has one fixed task")
        self.task_name = task_name or ("goal" if is_xland else "env")
        self.onehot = grid_encoding == "onehot"
        self.kernels = kernels(self.env_id, None if max_steps is None else int(max_steps), self.onehot)
        self.rulesets = (load_rulesets(benchmark or DEFAULT_BENCHMARK, split, int(split_key), float(train_fraction))
                         if is_xland else None)
        self.num_rulesets = 0 if self.rulesets is None else int(self.rulesets.num_rulesets())
        # the goal kind of every ruleset, read once on the host (a name per episode costs no device transfer)
        self._kinds = None if self.rulesets is None else np.asarray(self.rulesets.goals[:, 0])

    @property
    def max_steps(self) -> int:
        return int(self.kernels.params.max_steps)

    def spaces(self) -> tuple[gym.spaces.Dict, gym.spaces.Discrete]:
        p = self.kernels.params
        v = int(p.view_size)
        grid = (gym.spaces.Box(0, 255, (v, v, NUM_TILES + NUM_COLORS), np.uint8) if self.onehot
                else gym.spaces.Box(0, max(NUM_TILES, NUM_COLORS) - 1, (v, v, 2), np.uint8))
        vocab = max(len(GOAL_KINDS), int(p.height), int(p.width))
        obs = gym.spaces.Dict({
            "grid": grid,
            "direction_done": gym.spaces.Box(0.0, 1.0, (5,), np.float32),
            "goal": gym.spaces.Box(0, vocab, (5,), np.int64),
        })  # fmt: skip
        return obs, gym.spaces.Discrete(int(self.kernels.env.num_actions(p)))

    def draw_task(self, rng: np.random.Generator) -> int:
        """A new ruleset's index (0 for the MiniGrid ids, which draw nothing)."""
        return int(rng.integers(self.num_rulesets)) if self.num_rulesets else 0

    @staticmethod
    def reset_seed(rng: np.random.Generator) -> int:
        """The jax key seed of an episode's layout."""
        return int(rng.integers(2**31 - 1))

    def task_label(self, idx: int) -> str:
        if self.task_name == "env" or self._kinds is None:
            return self.env_id
        if self.task_name == "ruleset":
            return f"ruleset{idx}"
        kind = int(self._kinds[idx])
        return GOAL_KINDS[kind] if kind < len(GOAL_KINDS) else f"goal{kind}"

    def to_numpy(self, obs: Any) -> dict[str, np.ndarray]:
        """The kernels' obs tuple -> the observation's keys, [N, ...] numpy arrays of their space's dtypes."""
        grid, direction_done, goal = (np.asarray(x) for x in obs)
        return {"grid": np.array(grid, np.uint8), "direction_done": np.array(direction_done, np.float32),
                "goal": goal.astype(np.int64) + 1}


class XLandMiniGrid(gym.Env):
    """One XLand-MiniGrid (or xminigrid MiniGrid) env, set up as the official AMAGO's (module doc); extra
    icrl[jax].

    Args:
      env_id: an xminigrid id, e.g. "XLand-MiniGrid-R1-9x9" (`icrl envs xland`).
      benchmark: the XLand ids' ruleset benchmark, a name (default "small-1m") or a benchmark file.
      split: "train" (default), "test" (the official validation rulesets) or "all".
      split_key, train_fraction: the shuffle's seed (0) and the train share (0.8), the official split.
      max_steps: steps before an episode is truncated (default xminigrid's, 3 x height x width for XLand).
      grid_encoding: "onehot" (default; `uint8 [5, 5, 25]` of 0 / 255) or "ids" (`uint8 [5, 5, 2]`).
      task_name: what `info["task"]` names: "goal" (the goal's kind; XLand default), "ruleset" or "env".
      render_mode: "rgb_array": `render()` draws the whole grid.

    `reset()` (or `new_task=True`, or a seeded reset) draws a ruleset; `{"new_task": False}` keeps it and lays
    out a new episode of it (a new random placement of its objects and the agent).
    """

    metadata: dict[str, Any] = {"render_modes": ["rgb_array"], "render_fps": 8}

    def __init__(self, env_id: str, benchmark: str | None = None, split: str = "train", split_key: int = 0,
                 train_fraction: float = 0.8, max_steps: int | None = None, grid_encoding: str = "onehot",
                 task_name: str | None = None, render_mode: str | None = None) -> None:
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"XLand-MiniGrid render_mode must be None or 'rgb_array', got {render_mode!r}")
        self.setup = XLandSetup(env_id, benchmark, split, split_key, train_fraction, max_steps, grid_encoding,
                                task_name)
        self.observation_space, self.action_space = self.setup.spaces()
        self._actions = int(self.action_space.n)
        self.render_mode = render_mode
        self.task: int | None = None  # the current ruleset's index in the split
        self._state: Any = None

    def _info(self, **extra: Any) -> dict[str, Any]:
        return {"task": self.setup.task_label(self.task or 0), **extra}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        if wants_new_task(options, seed, self.task is not None):
            self.task = self.setup.draw_task(self.np_random)
        seeds = np.asarray([self.setup.reset_seed(self.np_random)], np.uint32)
        self._state, obs = self.setup.kernels.fresh(self.setup.rulesets, np.asarray([self.task], np.int32), seeds)
        return self._row(obs), self._info()

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        if self._state is None:
            raise RuntimeError("XLand-MiniGrid: step() called before reset()")
        a, n = int(np.asarray(action).reshape(())), int(self._actions)
        if not 0 <= a < n:
            raise ValueError(f"XLand-MiniGrid action must be in [0, {n}), got {a}")
        self._state, obs, reward, terminated, truncated = self.setup.kernels.step(
            self._state, np.asarray([a], np.int32))
        term, trunc = bool(np.asarray(terminated)[0]), bool(np.asarray(truncated)[0])
        extra = {"success": float(term)} if term or trunc else {}
        return self._row(obs), float(np.asarray(reward)[0]), term, trunc, self._info(**extra)

    def _row(self, obs: Any) -> dict[str, np.ndarray]:
        return {k: v[0] for k, v in self.setup.to_numpy(obs).items()}

    def render(self) -> np.ndarray | None:
        if self.render_mode != "rgb_array" or self._state is None:
            return None
        import jax  # noqa: PLC0415 - installed: the env was built

        one = jax.tree_util.tree_map(lambda x: x[0], self._state)
        return np.asarray(self.setup.kernels.env.render(self.setup.kernels.params, one))


def make_xland(member: str, **kwargs: Any) -> XLandMiniGrid:
    """A member of the "xland/" family by id ("XLand-MiniGrid-R1-9x9"); kwargs go to `XLandMiniGrid`."""
    return XLandMiniGrid(member, **kwargs)
