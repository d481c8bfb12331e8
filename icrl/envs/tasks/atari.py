"""Atari 2600 games through the Arcade Learning Environment (ale-py): one game, or AMAGO's multi-game mix.

`atari/<Game>` plays one game (`icrl envs atari` lists the ~100 with ROMs in ale-py, e.g. `atari/Pong`);
`atari_multi` draws a game per rollout from `games` (`AtariMulti`): the official AMAGO's multi-game Atari
setting (`amago/envs/builtin/ale_retro.py`: `AtariGame`, `ALE`; `examples/08_ale.py`), whose choices it keeps:

- frame skip 5 (the example's; `AtariGame` defaults to 4), done inside ALE: a step's reward sums its frames
  and the observation is the last frame (no max-pooling for colour frames);
- RGB frames resized to 84 x 84 by pixel-area averaging (the official code's `cv2.INTER_AREA`);
- sticky actions with probability 0.25 (ALE v5, Machado et al. 2018), no no-op starts;
- the full action space, Discrete(18), for every game, so one policy serves all;
- episodes truncated after 108,000 emulator frames (30 minutes of play, 21,600 steps at frame skip 5);
  losing a life does not end the episode (`terminal_on_life_loss=True` does);
- rewards unclipped: scores differ by orders of magnitude between games, and the example scales them all by
  0.25 in the agent instead (icrl: `--reward-scale`); `clip_rewards=True` clips them to [-1, 1];
- `grayscale=True`: the official grayscale path, single frames max-pooled over the last two of each skip.

Where icrl differs, and why:

- images are channels-last `uint8 [84, 84, 3]`, icrl's image layout (icrl.nets.tstep), not channels-first;
- the resize is numpy's, not OpenCV's (no extra dependency): the same area weights, so frames match
  `cv2.INTER_AREA` up to float rounding (at most 1 grey level);
- a seeded reset seeds the emulator (sticky actions included) and `atari_multi`'s game draw, so runs repeat;
  the official `ALE` draws with Python's global `random` and builds a fresh, unseeded emulator every reset;
- `atari_multi` keeps the emulator of each game it has played (building one costs ~0.1 s), and
  `reset(options={"new_task": False})` keeps the game, so a meta-RL rollout plays one game throughout;
- the example pins each parallel actor to one game (`games[actor % len(games)]`) where the `ALE` env samples;
  `atari_multi` samples. Pinned copies: `icrl.train(cfg, env=gymnasium.vector.SyncVectorEnv(
  [functools.partial(AtariGame, g) for g in games]))`.

Every reset and step info holds `info["task"]`, the game ("Pong": icrl logs `return/Pong`, docs/CONTRACTS.md),
and `info["lives"]`; `atari_multi` adds `info["task_id"]`, the game's index in `games`. ale-py is an optional
dependency (`pip install 'icrl[atari]'`; its wheels include the ROMs), imported when an env is built.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from icrl.envs.tasks.grid import wants_new_task

ATARI_HINT = "Atari games need the optional package ale-py: pip install 'icrl[atari]' (or pip install ale-py)"
FULL_ACTIONS = 18  # ALE's full action space: every game, the same meaning per id (NOOP, FIRE, UP, ...)
# The official example's DEFAULT_MULTIGAME_LIST (examples/08_ale.py).
DEFAULT_GAMES: tuple[str, ...] = (
    "Pong", "Boxing", "Breakout", "Gopher", "MsPacman", "ChopperCommand", "CrazyClimber", "BattleZone",
    "Qbert", "Seaquest",
)  # fmt: skip


def _import_ale() -> Any:
    try:
        import ale_py  # noqa: PLC0415 - optional dependency, imported on use
    except ImportError as e:
        raise ImportError(f"{ATARI_HINT} ({e})") from e
    gym.register_envs(ale_py)  # registers the ALE/<Game>-v5 ids the game names are read from
    return ale_py


def atari_games() -> dict[str, str]:
    """Game name -> ale-py ROM id ("SpaceInvaders" -> "space_invaders") for every `ALE/<Game>-v5` id ale-py
    registers (the games it ships ROMs for); needs ale-py."""
    _import_ale()
    games = {}
    for env_id, spec in gym.registry.items():
        m = re.fullmatch(r"ALE/(\w+)-v5", env_id)
        if m and isinstance(spec.kwargs.get("game"), str):
            games[m.group(1)] = spec.kwargs["game"]
    return dict(sorted(games.items()))


def atari_env_names() -> list[str]:
    """Every member of the "atari/" family (the game names); needs ale-py."""
    return list(atari_games())


def resolve_game(name: str) -> str:
    """A game name ("SpaceInvaders"; case and underscores ignored, so the ROM id "space_invaders" works too)
    -> its canonical name; a one-line ValueError with close matches and every valid name otherwise."""
    games = atari_games()
    by_key = {g.lower(): g for g in games}
    found = by_key.get(str(name).lower().replace("_", "").replace("-", ""))
    if found is not None:
        return found
    close = difflib.get_close_matches(str(name), list(games), n=3, cutoff=0.6)
    hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
    raise ValueError(f"Unknown Atari game {name!r}.{hint} Games ({len(games)}): {', '.join(games)}")


def area_weights(n_in: int, n_out: int) -> np.ndarray:
    """[n_out, n_in] float32 resampling matrix: output cell i averages the input cells over [i s, (i + 1) s),
    s = n_in / n_out, each weighted by its overlap (pixel-area resampling, as `cv2.INTER_AREA` downscales)."""
    s = n_in / n_out
    edges = np.arange(n_out + 1) * s
    cells = np.arange(n_in)[None, :]
    overlap = np.minimum(edges[1:, None], cells + 1) - np.maximum(edges[:-1, None], cells)
    return (np.clip(overlap, 0.0, None) / s).astype(np.float32)


def _resolution(resolution: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(resolution, (int, np.integer)):
        h = w = int(resolution)
    else:
        h, w = (int(v) for v in resolution)
    if not (8 <= h <= 210 and 8 <= w <= 160):
        raise ValueError(f"Atari resolution must be k or (h, w) within 8..210 x 8..160, got {resolution}")
    return h, w


def _check_settings(frame_skip: int, sticky_action_prob: float, time_limit: int, render_mode: Any) -> None:
    """Refuse settings ALE cannot use before building an emulator (so atari_multi fails at construction)."""
    if int(frame_skip) < 1:
        raise ValueError(f"Atari frame_skip must be >= 1, got {frame_skip}")
    if not 0.0 <= float(sticky_action_prob) <= 1.0:
        raise ValueError(f"Atari sticky_action_prob must be in [0, 1], got {sticky_action_prob}")
    if int(time_limit) < 1:
        raise ValueError(f"Atari time_limit (emulator frames) must be >= 1, got {time_limit}")
    if render_mode not in (None, "rgb_array"):
        raise ValueError(f"Atari render_mode must be None or 'rgb_array', got {render_mode!r}")


class AtariGame(gym.Env):
    """One Atari game (ALE v5), set up as the official AMAGO's multi-game experiments (module doc).

    Args:
      game: the game's name, e.g. "Pong" (`icrl envs atari` lists them).
      frame_skip: emulator frames per step (default 5, the official example's).
      resolution: k or (h, w) of the observation image (default 84).
      grayscale: one max-pooled grey channel instead of RGB (default False, the official example's).
      sticky_action_prob: probability that the emulator repeats the previous action on a frame (default 0.25).
      time_limit: emulator frames before the episode is truncated (default 108,000: 30 minutes of play).
      terminal_on_life_loss: end the episode (terminated) when a life is lost (default False).
      clip_rewards: clip each step's reward to [-1, 1] (default False: the game's own score).
      render_mode: "rgb_array": `render()` returns the full 210 x 160 RGB screen.

    Observation `Box(0, 255, (h, w, 3 or 1), uint8)`, action `Discrete(18)`; a game has no hidden task, so
    every reset starts a new episode of it (a seeded one reseeds the emulator).
    """

    metadata: dict[str, Any] = {"render_modes": ["rgb_array"], "render_fps": 12}

    def __init__(
        self,
        game: str,
        frame_skip: int = 5,
        resolution: int | Sequence[int] = 84,
        grayscale: bool = False,
        sticky_action_prob: float = 0.25,
        time_limit: int = 108_000,
        terminal_on_life_loss: bool = False,
        clip_rewards: bool = False,
        render_mode: str | None = None,
    ):
        _check_settings(frame_skip, sticky_action_prob, time_limit, render_mode)
        h, w = _resolution(resolution)
        self.game = resolve_game(game)
        self.frame_skip, self.grayscale, self.time_limit = int(frame_skip), bool(grayscale), int(time_limit)
        self.terminal_on_life_loss, self.clip_rewards = bool(terminal_on_life_loss), bool(clip_rewards)
        self.render_mode = render_mode
        self.metadata = {**self.metadata, "render_fps": max(1, 60 // self.frame_skip)}
        ale_py = _import_ale()
        self.ale_env = ale_py.AtariEnv(
            game=atari_games()[self.game],
            obs_type="grayscale" if self.grayscale else "rgb",
            frameskip=1 if self.grayscale else self.frame_skip,  # grayscale: skipped and max-pooled here
            repeat_action_probability=float(sticky_action_prob),
            full_action_space=True,
            render_mode=render_mode,
        )
        self._shape = (h, w, 1 if self.grayscale else 3)
        self.observation_space = gym.spaces.Box(0, 255, self._shape, np.uint8)
        self.action_space = gym.spaces.Discrete(FULL_ACTIONS)
        self._rows, self._cols = area_weights(210, h), area_weights(160, w)  # [h, 210], [w, 160]
        self._frames = 0  # emulator frames this episode (the official time counter)
        self._lives = 0

    def _screen(self, frame: np.ndarray) -> np.ndarray:
        """ALE frame [210, 160, 3] or [210, 160] uint8 -> the observation [h, w, C] uint8 (area-resized)."""
        h, w, c = self._shape
        rows = self._rows @ frame.reshape(210, 160 * c).astype(np.float32)  # [h, 160 * C]
        out = rows.reshape(h, 160, c).transpose(0, 2, 1).reshape(h * c, 160) @ self._cols.T  # [h * C, w]
        return np.ascontiguousarray(np.rint(out.reshape(h, c, w).transpose(0, 2, 1)), dtype=np.uint8)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        frame, info = self.ale_env.reset(seed=seed)  # a seed reseeds the emulator, sticky actions included
        self._frames, self._lives = 0, int(info["lives"])
        return self._screen(frame), {"task": self.game, "lives": self._lives}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        a = int(np.asarray(action).reshape(()))
        if not 0 <= a < FULL_ACTIONS:
            raise ValueError(f"Atari action must be in [0, {FULL_ACTIONS}), got {a}")
        if self.grayscale:
            frame, reward, terminated, truncated, info = self._skip_and_max(a)
        else:
            frame, reward, terminated, truncated, info = self.ale_env.step(a)
        reward = float(reward)
        self._frames += self.frame_skip  # as the official counter: a step counts frame_skip frames
        if self.terminal_on_life_loss and int(info["lives"]) < self._lives:
            terminated = True
        truncated = (bool(truncated) or self._frames >= self.time_limit) and not terminated
        if self.clip_rewards:
            reward = min(max(reward, -1.0), 1.0)
        info = {"task": self.game, "lives": int(info["lives"])}
        return self._screen(frame), reward, bool(terminated), bool(truncated), info

    def _skip_and_max(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        """frame_skip single frames, rewards summed, the max of the last two frames (`_MaxAndSkipEnv`)."""
        total, last = 0.0, []
        for i in range(self.frame_skip):
            frame, reward, terminated, truncated, info = self.ale_env.step(action)
            total += float(reward)
            if i >= self.frame_skip - 2:
                last.append(frame)
            if terminated or truncated:
                break
        pooled = np.maximum(last[0], last[-1]) if last else frame  # ended before the last two: the frame seen
        return pooled, total, bool(terminated), bool(truncated), info

    def render(self) -> np.ndarray | None:
        return self.ale_env.render() if self.render_mode == "rgb_array" else None

    def close(self) -> None:
        self.ale_env.close()


def make_atari(member: str, **kwargs: Any) -> AtariGame:
    """A member of the "atari/" family by name ("Pong"); kwargs go to `AtariGame`."""
    return AtariGame(member, **kwargs)


class AtariMulti(gym.Env):
    """Multi-game Atari (AMAGO's ALE setting): a game per rollout from `games`; extra icrl[atari].

    Args:
      games: game names (default `DEFAULT_GAMES`, the official example's ten); distinct.
      the other kwargs: as `AtariGame`, shared by every game.

    `reset()` or `reset(options={"new_task": True})` (or a seeded reset) draws a game uniformly;
    `{"new_task": False}` plays the same game again. No game id is in the observation: as in the official env
    the agent tells the games apart from the screen. A seeded reset reseeds the draw and gives every game's
    emulator its own seed (used on that game's next reset). Emulators are built when a game is first drawn.
    """

    metadata: dict[str, Any] = {"render_modes": ["rgb_array"], "render_fps": 12}

    def __init__(
        self,
        games: Sequence[str] | None = None,
        frame_skip: int = 5,
        resolution: int | Sequence[int] = 84,
        grayscale: bool = False,
        sticky_action_prob: float = 0.25,
        time_limit: int = 108_000,
        terminal_on_life_loss: bool = False,
        clip_rewards: bool = False,
        render_mode: str | None = None,
    ):
        if isinstance(games, str):
            raise ValueError(f"atari_multi games must be a list of game names, got the string {games!r}")
        _check_settings(frame_skip, sticky_action_prob, time_limit, render_mode)
        h, w = _resolution(resolution)
        self.games = [resolve_game(g) for g in (DEFAULT_GAMES if games is None else games)]
        if not self.games or len(set(self.games)) != len(self.games):
            raise ValueError(f"atari_multi needs one or more distinct games, got {self.games}")
        self._settings: dict[str, Any] = dict(
            frame_skip=frame_skip, resolution=(h, w), grayscale=grayscale, render_mode=render_mode,
            sticky_action_prob=sticky_action_prob, time_limit=time_limit, clip_rewards=clip_rewards,
            terminal_on_life_loss=terminal_on_life_loss,
        )  # fmt: skip
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Box(0, 255, (h, w, 1 if grayscale else 3), np.uint8)
        self.action_space = gym.spaces.Discrete(FULL_ACTIONS)
        self.envs: dict[str, AtariGame] = {}
        self.task: int | None = None  # index of the current game in `games`
        self._game_seeds: dict[str, int] = {}

    @property
    def game(self) -> str | None:
        """The current game's name (None before the first reset)."""
        return None if self.task is None else self.games[self.task]

    def _env(self, game: str) -> AtariGame:
        if game not in self.envs:
            self.envs[game] = AtariGame(game, **self._settings)
        return self.envs[game]

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        if seed is not None:
            seeds = self.np_random.integers(0, 2**31 - 1, size=len(self.games))
            self._game_seeds = {g: int(s) for g, s in zip(self.games, seeds)}
        if wants_new_task(options, seed, self.task is not None):
            self.task = int(self.np_random.integers(len(self.games)))
        game = self.games[self.task]  # type: ignore[index]
        obs, info = self._env(game).reset(seed=self._game_seeds.pop(game, None))  # each seed used once
        return obs, {**info, "task_id": self.task}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        if self.task is None:
            raise RuntimeError("atari_multi: step() called before reset()")
        obs, reward, terminated, truncated, info = self.envs[self.games[self.task]].step(action)
        return obs, reward, terminated, truncated, {**info, "task_id": self.task}

    def render(self) -> np.ndarray | None:
        game = self.game
        return None if game is None or game not in self.envs else self.envs[game].render()

    def close(self) -> None:
        for env in self.envs.values():
            env.close()
