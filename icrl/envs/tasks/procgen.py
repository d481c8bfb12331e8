"""Procgen (Cobbe et al. 2020): one game, or the official AMAGO's multi-game mix with two attempts per level.

`procgen/<game>` plays one game (`icrl envs procgen` lists the 16, e.g. `procgen/coinrun`); `procgen_multi` draws
a game and a level per rollout from `games` (`ProcgenGames`), the official `TwoAttemptMTProcgen`
(`amago/envs/builtin/procgen_envs.py`, `examples/09_multitask_procgen.py`), whose choices it keeps:

- 64 x 64 RGB frames, the 15 Procgen actions for every game;
- a level drawn uniformly from `levels` (the official `seed_range`, default 0-2,000) and played as a
  one-level game (`num_levels=1`, `start_level=level`), so a second attempt replays the same level;
- `distribution_mode` "easy", "hard" or "memory-hard" (memory mode where a game has one, hard elsewhere);
- `reward_scales`: a factor per game on its rewards.

Where icrl differs, and why:

- the attempts are icrl's multi-episode rollouts: `--episodes-per-rollout 2` gives the official two attempts
  (`reset(options={"new_task": False})` replays the level), where the official env counts them itself and paints
  a 4 x 4 black square on the second attempt's frames (icrl's timesteps already mark a new episode);
- a seeded reset seeds the game and level draw and the level's own randomness, so runs repeat (the official
  env draws with Python's global `random`);
- `info["success"]` is Procgen's "level complete" on the step that ends an episode, `info["task"]` the game
  (icrl logs `return/<game>` and `success/<game>`, docs/CONTRACTS.md), `info["level"]` the level.

Installing: every Procgen build on PyPI pins numpy < 2 and gym < 1 (`procgen2`, `procgen-mirror`: 0.10.7), or
needs Python 3.13 (`procgen-gym`). The game engine itself runs with numpy 2 (checked here: numpy 2.4, Python
3.11); only the pins and `procgen/__init__.py`'s registration with the old `gym` stand in the way. So
`pip install cffi imageio && pip install --no-deps procgen2 gym3` (pip then warns about the pins), and icrl
imports the engine's `procgen.env` without running that `__init__` (`_import_procgen`).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from icrl.envs.tasks.grid import wants_new_task

PROCGEN_HINT = ("Procgen games need the optional packages procgen2 and gym3, installed without their numpy<2 / gym "
                "pins: pip install cffi imageio && pip install --no-deps procgen2 gym3 (icrl/envs/tasks/procgen.py)")
# The official ALL_PROCGEN_GAMES; the games that have a "memory" distribution mode first.
MEMORY_GAMES = ("dodgeball", "caveflyer", "heist", "jumper", "maze", "miner")
GAMES: tuple[str, ...] = (
    *MEMORY_GAMES, "fruitbot", "plunder", "chaser", "leaper", "bigfish", "starpilot", "bossfight", "ninja",
    "coinrun", "climber",
)  # fmt: skip
MODES = ("easy", "hard", "memory-hard")
ACTIONS = 15


def _import_procgen() -> Any:
    """`procgen.env.ProcgenGym3Env`, imported without `procgen/__init__.py` (which registers ids with the old
    `gym` package)."""
    if "procgen" not in sys.modules:
        spec = importlib.util.find_spec("procgen")
        if spec is None or spec.submodule_search_locations is None:
            raise ImportError(PROCGEN_HINT)
        package = types.ModuleType("procgen")  # the package without its __init__: only its submodules are used
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = spec
        sys.modules["procgen"] = package
    try:
        from procgen.env import ProcgenGym3Env  # noqa: PLC0415 - optional dependency, imported on use
    except ImportError as e:
        raise ImportError(f"{PROCGEN_HINT} ({e})") from e
    return ProcgenGym3Env


def procgen_env_names() -> list[str]:
    """The "procgen/" family's members (no import needed)."""
    return list(GAMES)


class ProcgenGames(gym.Env):
    """Procgen games, a game and a level per rollout (AMAGO's multi-game Procgen); procgen2 + gym3, docs/tasks.md.

    Args:
      games: game names (default all 16, `GAMES`); distinct.
      distribution_mode: "easy", "hard" or "memory-hard".
      levels: the levels drawn from, inclusive (the official `seed_range`).
      reward_scales: game -> factor on its rewards (1 for a game it leaves out).
      time_limit: truncate an episode after this many steps (default: none but the games' own, 1,000 in most).
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(
        self,
        games: Sequence[str] | None = None,
        distribution_mode: str = "easy",
        levels: Sequence[int] = (0, 2000),
        reward_scales: dict[str, float] | None = None,
        time_limit: int | None = None,
    ):
        if isinstance(games, str):
            raise ValueError(f"procgen games must be a list of game names, got the string {games!r}")
        self.games = list(GAMES if games is None else games)
        unknown = [g for g in self.games if g not in GAMES]
        if unknown or not self.games or len(set(self.games)) != len(self.games):
            raise ValueError(f"procgen needs one or more distinct games of {list(GAMES)}, got {self.games}")
        if distribution_mode not in MODES:
            raise ValueError(f"procgen distribution_mode must be one of {MODES}, got {distribution_mode!r}")
        lo, hi = (int(x) for x in levels)
        if not 0 <= lo <= hi < 2**31 - 1:
            raise ValueError(f"procgen levels must be (low, high) with 0 <= low <= high, got {tuple(levels)}")
        scales = dict(reward_scales or {})
        if set(scales) - set(self.games) or any(
                not (isinstance(v, (int, float)) and np.isfinite(v) and v > 0) for v in scales.values()):
            raise ValueError(f"procgen reward_scales must map games of {self.games} to numbers > 0, got {scales}")
        if time_limit is not None and (type(time_limit) is not int or time_limit < 1):
            raise ValueError(f"procgen time_limit must be a whole number of steps >= 1 or None, got {time_limit!r}")
        self.time_limit = time_limit
        self._engine = _import_procgen()
        self.distribution_mode, self.levels, self.reward_scales = distribution_mode, (lo, hi), scales
        self.observation_space = gym.spaces.Box(0, 255, (64, 64, 3), np.uint8)
        self.action_space = gym.spaces.Discrete(ACTIONS)
        self.game: str | None = None
        self.level = 0
        self._env: Any = None
        self._steps = 0  # in the current episode

    def _mode(self, game: str) -> str:
        if self.distribution_mode == "memory-hard":
            return "memory" if game in MEMORY_GAMES else "hard"
        return self.distribution_mode

    def _info(self) -> dict[str, Any]:
        return {"task": self.game, "level": self.level}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        if wants_new_task(options, seed, self.game is not None):
            self.game = self.games[int(self.np_random.integers(len(self.games)))]
            self.level = int(self.np_random.integers(self.levels[0], self.levels[1] + 1))
        self.close()
        self._env = self._engine(num=1, env_name=self.game, num_levels=1, start_level=self.level,
                                 distribution_mode=self._mode(self.game),  # type: ignore[arg-type]
                                 rand_seed=int(self.np_random.integers(2**31 - 1)),
                                 num_threads=0)  # one copy: step it in this thread (the engine's default is 4)
        _, obs, _ = self._env.observe()
        self._steps = 0
        return obs["rgb"][0].copy(), self._info()

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        if self._env is None:
            raise RuntimeError("procgen: step() called before reset()")
        self._env.act(np.asarray([int(np.asarray(action).reshape(()))], np.int32))
        reward, obs, first = self._env.observe()
        info = self._info()
        done = bool(first[0])  # the engine has already started the next episode: this frame is its first
        if done:
            info["success"] = bool(self._env.get_info()[0].get("prev_level_complete", 0))
        self._steps += 1
        truncated = not done and self.time_limit is not None and self._steps >= self.time_limit
        reward = float(reward[0]) * self.reward_scales.get(self.game, 1.0)  # type: ignore[arg-type]
        return obs["rgb"][0].copy(), reward, done, truncated, info

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None


def make_procgen(member: str, **kwargs: Any) -> ProcgenGames:
    """A member of the "procgen/" family by name ("coinrun"): that one game; kwargs go to `ProcgenGames`."""
    return ProcgenGames([member], **kwargs)
