"""BabyAI (Chevalier-Boisvert et al., ICLR 2019) instruction-following levels from minigrid, multi-task.

`babyai/<Level>` is minigrid's `BabyAI-<Level>-v<N>` (the latest registered version; `icrl envs babyai` lists
the levels, e.g. `babyai/GoToLocal`, `babyai/PutNextLocal`, `babyai/BossLevel`). Every task is a freshly
generated room layout with a new language mission ("go to the red ball", "pick up a key, then open the
green door", ...), so one policy learns the whole level distribution.

Observation `Dict`:

- `"image"`: the agent's 7x7 egocentric view, each cell's (object, color, state) one-hot encoded into
  11 + 6 + 3 = 20 channels: `Box(0, 255, (7, 7, 20), uint8)` holding 0 or 255. minigrid's raw view holds small
  integer ids (0..10); one-hot channels are the usual BabyAI input, and scaling them to 255 means the CNN's
  pixel / 255 sees exactly 0 or 1. It is an image key (uint8, H x W x C), which the IMPALA CNN handles at 7x7
  (its three stages pool 7 -> 4 -> 2 -> 1); the Nature CNN needs >= 36x36, so with `cnn="nature"` pass
  `image_encoding="flat"`: the same one-hot as a float32 vector Box(0, 1, (980,)) for the MLP.
- `"direction"`: Discrete(4), the agent's heading (the timestep wrapper one-hot encodes it).
- `"goal"`: the mission as word tokens, `Box(0, V, (max_mission_len,), int64)` padded with 0 at the end,
  following docs/CONTRACTS.md "Goal-conditioned tasks" for the observation only (`metadata["goal_vocab"] = V`).
  BabyAI reports no achieved sub-goals, so the env is not relabelable and declares no `achieved_slots`.

Vocabulary: `BABYAI_VOCAB`, a fixed, ordered list of every word minigrid's BabyAI grammar
(`minigrid/envs/babyai/core/verifier.py`: the `surface` methods of the instructions and object descriptions,
with `COLOR_NAMES`, `OBJ_TYPES`, `LOC_NAMES`) can produce; token = position + 1. It is written out rather than
derived at run time so that token ids never change with the minigrid version (a trained policy keeps its
meaning); the tests scan minigrid's source to check it is complete. The comma of ", then" is dropped (it always
precedes "then"); a word outside the vocabulary raises a ValueError. The default length, 72, fits every mission
the grammar can make (two "and" pairs joined by "then"/"after you", each action at most 17 words: "put a red
object on your left next to a grey object in front of you"); short levels can pass e.g. `max_mission_len=8`.

Success: minigrid gives reward 1 - 0.9 * steps / max_steps > 0 on completing the mission and 0 on failing
it or timing out. `info["success"]` is 1.0 on a step with reward > 0 (the episode then terminates) and 0.0 on
every other step, so its value at an episode's last step is that episode's success. Every reset and step info
holds `info["task"]`, the level's name ("GoToLocal"): icrl logs return and success per task (docs/CONTRACTS.md),
so an env that mixes levels reports each episode's level (one level per env here: one task, all its missions).

Tasks: a task is the layout and mission made from a task seed drawn from the env's `np_random`.
`reset()` (or `new_task=True`, or a seeded reset) draws a new one; `reset(options={"new_task": False})`
regenerates the same layout and mission (meta-RL rollouts replay one task k times). Mission generation's
rejection-sampling messages ("Sampling rejected: ...", printed by minigrid) are silenced.

minigrid is an optional dependency (`pip install 'icrl[minigrid]'`), imported only when an env is built.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import re
from typing import Any

import gymnasium as gym
import numpy as np

from icrl.envs.tasks.grid import wants_new_task

MINIGRID_HINT = (
    "BabyAI envs need the optional package minigrid: pip install 'icrl[minigrid]' (or pip install 'minigrid>=3.0')"
)

# Every word of the BabyAI grammar, in a fixed order (token = index + 1; 0 is padding). Do not reorder: the
# ids are part of trained policies. Append new words at the end.
BABYAI_VOCAB: tuple[str, ...] = (
    # instructions: "go to", "pick up", "open", "put ... next to ..."
    "go", "to", "pick", "up", "open", "put", "next",
    # articles: "the" for a unique object, "a" when several match
    "the", "a",
    # object types (minigrid OBJ_TYPES) and the untyped "object"
    "ball", "box", "key", "door", "object",
    # colors (minigrid COLOR_NAMES)
    "red", "green", "blue", "purple", "yellow", "grey",
    # locations: "in front of you", "behind you", "on your left/right"
    "in", "front", "of", "you", "behind", "on", "your", "left", "right",
    # sequences: "A and B", "A, then B", "A after you B"
    "and", "then", "after",
)  # fmt: skip
WORD_TO_TOKEN: dict[str, int] = {w: i + 1 for i, w in enumerate(BABYAI_VOCAB)}
GOAL_VOCAB = len(BABYAI_VOCAB)  # V: tokens are 1..V
MAX_MISSION_LEN = 72
IMAGE_ENCODINGS = ("onehot", "flat")
_N_OBJECT, _N_COLOR, _N_STATE = 11, 6, 3  # minigrid OBJECT_TO_IDX, COLOR_TO_IDX, STATE_TO_IDX sizes
_CHANNELS = _N_OBJECT + _N_COLOR + _N_STATE
# [_N_OBJECT | _N_COLOR | _N_STATE, 20] uint8 rows: the one-hot (0/255) contribution of each channel's value
_ONEHOT = [
    np.eye(_CHANNELS, dtype=np.uint8)[offset : offset + n] * np.uint8(255)
    for offset, n in ((0, _N_OBJECT), (_N_OBJECT, _N_COLOR), (_N_OBJECT + _N_COLOR, _N_STATE))
]


def import_minigrid():
    """`import minigrid` (which registers the BabyAI ids), or an ImportError that says how to install it."""
    try:
        import minigrid  # noqa: PLC0415 - optional dependency, imported on use
    except ImportError as e:
        raise ImportError(f"{MINIGRID_HINT} ({e})") from e
    return minigrid


def tokenize_mission(mission: str, max_len: int = MAX_MISSION_LEN) -> np.ndarray:
    """A BabyAI mission -> [max_len] int64 tokens in 1..V, padded with 0. ValueError for an unknown word or a
    mission longer than max_len."""
    words = mission.replace(",", " ").split()
    unknown = sorted({w for w in words if w not in WORD_TO_TOKEN})
    if unknown:
        raise ValueError(
            f"BabyAI mission {mission!r} has words outside the BabyAI vocabulary: {unknown}. Only BabyAI "
            "levels are supported; a new minigrid word must be appended to icrl.envs.tasks.babyai.BABYAI_VOCAB."
        )
    if len(words) > max_len:
        raise ValueError(
            f"BabyAI mission {mission!r} has {len(words)} words, more than max_mission_len={max_len}; "
            f"raise max_mission_len (every BabyAI mission fits in {MAX_MISSION_LEN})"
        )
    out = np.zeros(max_len, dtype=np.int64)  # [max_len]
    out[: len(words)] = [WORD_TO_TOKEN[w] for w in words]
    return out


def babyai_levels() -> dict[str, str]:
    """Level name -> registered gymnasium id, e.g. "GoToLocal" -> "BabyAI-GoToLocal-v0", for every BabyAI id
    minigrid registers (the highest version of each); needs minigrid."""
    import_minigrid()
    best: dict[str, tuple[int, str]] = {}
    for env_id in gym.registry:
        m = re.fullmatch(r"BabyAI-(.+)-v(\d+)", env_id)
        if m and int(m.group(2)) >= best.get(m.group(1), (-1, ""))[0]:
            best[m.group(1)] = (int(m.group(2)), env_id)
    return {name: env_id for name, (_, env_id) in sorted(best.items())}


def babyai_env_names() -> list[str]:
    """Every member of the "babyai/" family (the level names); needs minigrid."""
    return list(babyai_levels())


class BabyAI(gym.Env):
    """A BabyAI level with one-hot image, direction and mission-token observations (module doc).

    Args:
      level: a level name ("GoToLocal") or its registered id ("BabyAI-GoToLocal-v0").
      max_mission_len: length k of the "goal" token vector (default 72 fits every BabyAI mission).
      image_encoding: "onehot" (uint8 image [7, 7, 20], for the CNN) or "flat" (float32 vector [980]).
      **level_kwargs: passed to the level (e.g. max_steps, render_mode="rgb_array", agent_view_size).
    """

    def __init__(
        self,
        level: str,
        max_mission_len: int = MAX_MISSION_LEN,
        image_encoding: str = "onehot",
        **level_kwargs: Any,
    ):
        levels = babyai_levels()
        env_id = levels.get(level) or (level if level in levels.values() else None)
        if env_id is None:
            close = difflib.get_close_matches(level, list(levels), n=3, cutoff=0.6)
            hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
            raise ValueError(f"Unknown BabyAI level {level!r}.{hint} Levels: {', '.join(levels)}")
        if image_encoding not in IMAGE_ENCODINGS:
            raise ValueError(f"BabyAI image_encoding must be one of {IMAGE_ENCODINGS}, got {image_encoding!r}")
        if int(max_mission_len) < 1:
            raise ValueError(f"BabyAI max_mission_len must be >= 1, got {max_mission_len}")
        self.env_id = env_id
        self.level = next(name for name, i in levels.items() if i == env_id)  # "GoToLocal": the info["task"]
        self.max_mission_len = int(max_mission_len)
        self.image_encoding = image_encoding
        # disable_env_checker: the checker cannot sample minigrid's MissionSpace and only warns
        self.level_env = gym.make(env_id, disable_env_checker=True, **level_kwargs)
        level_space = self.level_env.observation_space
        level_image = level_space["image"] if isinstance(level_space, gym.spaces.Dict) else None
        if not isinstance(level_image, gym.spaces.Box):
            raise ValueError(f"BabyAI level {env_id}: expected a Dict with an image Box, got {level_space!r}")
        h, w, _ = level_image.shape
        image = (
            gym.spaces.Box(0, 255, (h, w, _CHANNELS), np.uint8)
            if image_encoding == "onehot"
            else gym.spaces.Box(0.0, 1.0, (h * w * _CHANNELS,), np.float32)
        )
        self.observation_space = gym.spaces.Dict(
            {
                "image": image,
                "direction": gym.spaces.Discrete(4),
                "goal": gym.spaces.Box(0, GOAL_VOCAB, (self.max_mission_len,), np.int64),
            }
        )
        self.action_space = self.level_env.action_space  # Discrete(7): left, right, forward, pickup, ...
        self.render_mode = self.level_env.render_mode
        self.metadata = {**self.level_env.metadata, "goal_vocab": GOAL_VOCAB}
        self.mission = ""
        self._goal = np.zeros(self.max_mission_len, dtype=np.int64)  # [k]
        self.task_seed: int | None = None  # seed of the current layout and mission (None before reset)

    def _image(self, raw: np.ndarray) -> np.ndarray:
        raw = np.asarray(raw, dtype=np.int64)  # [H, W, 3] (object, color, state) ids
        onehot = _ONEHOT[0][raw[..., 0]] | _ONEHOT[1][raw[..., 1]] | _ONEHOT[2][raw[..., 2]]  # [H, W, 20]
        if self.image_encoding == "onehot":
            return onehot
        return (onehot.reshape(-1) > 0).astype(np.float32)  # [H * W * 20]

    def _obs(self, raw: dict) -> dict[str, np.ndarray]:
        return {
            "image": self._image(raw["image"]),
            "direction": np.int64(raw["direction"]),
            "goal": self._goal.copy(),
        }

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        if wants_new_task(options, seed, self.task_seed is not None):
            self.task_seed = int(self.np_random.integers(2**31 - 1))
        with contextlib.redirect_stdout(io.StringIO()):  # minigrid prints "Sampling rejected: ..." here
            raw, _ = self.level_env.reset(seed=self.task_seed)
        self.mission = str(raw["mission"])
        self._goal = tokenize_mission(self.mission, self.max_mission_len)
        return self._obs(raw), {"mission": self.mission, "task": self.level}

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        raw, reward, terminated, truncated, _ = self.level_env.step(int(np.asarray(action).reshape(())))
        info = {"success": float(float(reward) > 0), "task": self.level}
        return self._obs(raw), float(reward), bool(terminated), bool(truncated), info

    def render(self) -> Any:
        return self.level_env.render()

    def close(self) -> None:
        self.level_env.close()


def make_babyai(member: str, **kwargs: Any) -> BabyAI:
    """A member of the "babyai/" family by name ("GoToLocal"); kwargs go to `BabyAI`."""
    return BabyAI(member, **kwargs)
