"""Crafter with instructions (AMAGO, Grigsby et al. 2024, §5): complete a sequence of Crafter achievements in order.

Crafter (Hafner 2021) is a procedurally generated 2-D Minecraft: every world is new, and 22 achievements
(collect wood, place a table, make a pickaxe, defeat a zombie, ...) form a tech tree. AMAGO turns it into a
sparse goal-conditioned task: each episode draws an instruction of 1-5 achievements; the agent sees the
whole instruction and gets +1 for each one it completes in order. Rollouts record every achievement
unlocked, so hindsight relabeling (docs/design.md §7) can turn a failed rollout into a success for the instruction
it did complete.

The pieces, as in AMAGO's official Crafter env, with the differences this library's goal contract needs:
* Goals are the 22 Crafter achievements only, one token each (1..22 in crafter's sorted achievement list;
  `ACHIEVEMENTS`). AMAGO also has "travel to (x, y)" goals; they are not achievements and are left out.
* Procedural instructions draw their length uniformly from `instruction_length` (AMAGO: 1..5) and each goal
  from AMAGO's weights (`DEFAULT_GOAL_WEIGHTS`: category weights collect .3, defeat .1, eat .1, make .15,
  place .15 - renormalised without travel - times per-item weights that favour the feasible early goals;
  "wake_up" has weight 0). Goals may repeat, back to back too: each unlock completes one slot, so
  "collect wood, collect wood" means twice.
* Observation: `{"image": uint8 [size, size, 3] (crafter's own render: local view + inventory), "goal": int64
  [k]}` with the full instruction visible (AMAGO's default; completed slots are zeroed). AMAGO's other
  observation kinds (texture ids, cropped image + inventory) are not provided.
* Episodes last at most `episode_length` steps (AMAGO: 2500; crafter's own default is 10000).

Achievements, reward and termination follow docs/CONTRACTS.md ("Goal-conditioned tasks"); the progress rule is
`InstructionProgress` and the achievement record is `achieved_tokens`, both pure and testable without crafter.
An achievement counts every time crafter's counter for it goes up, not only the first time in an episode:
collecting wood twice achieves collect_wood twice.

Needs crafter (`pip install 'icrl[crafter]'`), imported in the constructor so this module imports without it.
Crafter is slow on CPU: ~180 steps/s, and generating a world takes ~0.8 s (every reset).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from icrl.envs.tasks.grid import wants_new_task
from icrl.envs.tasks.instruction import InstructionProgress

CRAFTER_HINT = (
    "The crafter env needs the crafter package: pip install 'icrl[crafter]'  (or: pip install crafter)"
)

# crafter's achievements in its own (sorted) order; goal token of ACHIEVEMENTS[i] is i + 1.
ACHIEVEMENTS: tuple[str, ...] = (
    "collect_coal", "collect_diamond", "collect_drink", "collect_iron", "collect_sapling", "collect_stone",
    "collect_wood", "defeat_skeleton", "defeat_zombie", "eat_cow", "eat_plant", "make_iron_pickaxe",
    "make_iron_sword", "make_stone_pickaxe", "make_stone_sword", "make_wood_pickaxe", "make_wood_sword",
    "place_furnace", "place_plant", "place_stone", "place_table", "wake_up",
)  # fmt: skip
GOAL_VOCAB = len(ACHIEVEMENTS)  # 22
TOKENS: dict[str, int] = {name: i + 1 for i, name in enumerate(ACHIEVEMENTS)}
# One crafter step unlocks at most two achievements: waking up, then whatever the step's action does.
ACHIEVED_SLOTS = 2


def _amago_weights() -> dict[str, float]:
    """AMAGO's procedural goal distribution: P(category) * P(item | category), travel goals removed."""
    categories = {  # category weight, {item: weight within the category}
        "collect": (0.3, {"sapling": .2, "wood": .2, "stone": .18, "drink": .17, "coal": .1, "iron": .1,
                          "diamond": .05}),
        "defeat": (0.1, {"skeleton": .4, "zombie": .6}),
        "eat": (0.1, {"cow": .7, "plant": .3}),
        "make": (0.15, {f"{m}_{t}": pm * .5 for m, pm in (("iron", .1), ("stone", .3), ("wood", .6))
                        for t in ("pickaxe", "sword")}),
        "place": (0.15, {"furnace": .1, "plant": .2, "stone": .3, "table": .4}),
    }  # fmt: skip
    total = sum(w for w, _ in categories.values())
    weights = {name: 0.0 for name in ACHIEVEMENTS}
    for cat, (w_cat, items) in categories.items():
        for item, w_item in items.items():
            weights[f"{cat}_{item}"] = w_cat * w_item / total
    return weights


DEFAULT_GOAL_WEIGHTS: dict[str, float] = _amago_weights()


def goal_tokens(names: Iterable[str]) -> list[int]:
    """Achievement names -> goal tokens (1..22); raises ValueError naming an unknown name."""
    out = []
    for name in names:
        if name not in TOKENS:
            raise ValueError(f"unknown Crafter achievement {name!r}; valid names: {', '.join(ACHIEVEMENTS)}")
        out.append(TOKENS[name])
    return out


def goal_names(tokens: Iterable[int]) -> list[str]:
    """Goal tokens -> achievement names; token 0 ("no goal") is skipped."""
    return [ACHIEVEMENTS[int(t) - 1] for t in tokens if int(t) != 0]


def achieved_tokens(before: Mapping[str, int], after: Mapping[str, int]) -> tuple[int, ...]:
    """Tokens of the achievements whose crafter counter went up between two cumulative count dicts
    (`info["achievements"]`), in token order, repeated as often as the counter rose."""
    out: list[int] = []
    for name in ACHIEVEMENTS:
        out.extend([TOKENS[name]] * max(0, int(after.get(name, 0)) - int(before.get(name, 0))))
    return tuple(out)


def _crafter_module() -> Any:
    try:
        import crafter
    except ImportError as e:
        raise ImportError(f"{CRAFTER_HINT} ({e})") from e
    found = tuple(crafter.constants.achievements)
    if found != ACHIEVEMENTS:
        raise ImportError(
            f"this crafter version has achievements {found}, icrl's goal tokens expect {ACHIEVEMENTS}; "
            "install crafter 1.8.x: pip install 'crafter>=1.8,<2'"
        )
    return crafter


def _length_range(instruction_length: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(instruction_length, (int, np.integer)):
        lo = hi = int(instruction_length)
    else:
        lo, hi = (int(v) for v in instruction_length)
    if not 1 <= lo <= hi:
        raise ValueError(f"instruction_length must be k >= 1 or (min, max) with 1 <= min <= max, got "
                         f"{instruction_length}")  # fmt: skip
    return lo, hi


def _check_sizes(episode_length: int, size: int, area: int, render_mode: str | None) -> None:
    """Refuse CrafterEnv sizes crafter cannot work with, before importing crafter."""
    if int(episode_length) < 1:
        raise ValueError(f"CrafterEnv episode_length must be >= 1, got {episode_length}")
    if int(size) < 18:
        raise ValueError(
            f"CrafterEnv size must be >= 18 (crafter draws 9x9 cells of >= 2 px), got {size}"
        )
    if int(area) < 12:
        raise ValueError(f"CrafterEnv area must be >= 12 (one of crafter's 12x12 chunks), got {area}")
    if render_mode not in (None, "rgb_array"):
        raise ValueError(f"CrafterEnv render_mode must be None or 'rgb_array', got {render_mode!r}")


class CrafterEnv(gym.Env):
    """Crafter with instructions (AMAGO): complete 1-5 given achievements in order; +1 each, done when all are.

    kwargs:
      instructions: True (default): the goal-conditioned task below. False: plain Crafter - observation the
        image Box only, crafter's own reward (+1 per achievement unlocked for the first time in the episode,
        +-0.1 per health point gained/lost), no goals, no `info["achieved"]`.
      instruction_length: k or (min, max) (default (1, 5) as in AMAGO): length of procedural instructions,
        uniform in [min, max]. The goal observation has max slots.
      tasks: fixed instructions instead of procedural ones, e.g. [["collect_wood", "place_table"]]; each new
        task picks one uniformly. Excludes instruction_length and goal_weights.
      goal_weights: {achievement: weight} for procedural goals (default `DEFAULT_GOAL_WEIGHTS`, AMAGO's).
      episode_length: time limit (default 2500, AMAGO's); reaching it truncates.
      size: side of the square image observation (default 64, crafter's; >= 18). Crafter's speed hardly
        depends on it; smaller images make the agent's CNN cheaper.
      area: side of the square world in cells (default 64, crafter's and AMAGO's). Generating a world costs
        ~0.8 s at 64 and ~0.2 s at 32 (smaller worlds: cheaper resets for tests and CPU runs, an easier task).
      render_mode: "rgb_array": `render()` returns the current observation image, scaled up to >= 256 px.

    Instruction mode (docs/CONTRACTS.md, goal-conditioned tasks): observation `{"image", "goal"}`, goal tokens
    1..22 = `ACHIEVEMENTS`, `metadata["goal_vocab"] = 22`, `metadata["achieved_slots"] = 2`; every info holds
    `info["achieved"]` (tokens unlocked by that step, repeats included). Reward 1 per sub-goal completed in
    order; all done -> terminated, `info["success"] = 1.0`. Death -> terminated, success 0; the time limit
    -> truncated, success 0.

    A task is (world, instruction): `reset()` with options=None or {"new_task": True} (or a seed) draws a new
    world seed and a new instruction; {"new_task": False} regenerates the same world (same map, same start)
    with the same instruction, so a multi-episode rollout can retry a known world.
    """

    metadata: dict[str, Any] = {"render_modes": ["rgb_array"], "render_fps": 10}
    action_space: gym.spaces.Discrete  # set in __init__

    def __init__(
        self,
        instructions: bool = True,
        instruction_length: int | Sequence[int] | None = None,
        tasks: Sequence[Sequence[str]] | None = None,
        goal_weights: Mapping[str, float] | None = None,
        episode_length: int = 2500,
        size: int = 64,
        area: int = 64,
        render_mode: str | None = None,
    ):
        _check_sizes(episode_length, size, area, render_mode)
        self.instructions = bool(instructions)
        self.episode_length = int(episode_length)
        self.size = int(size)
        self.area = int(area)
        self.render_mode = render_mode
        self.slots = self._init_goals(instruction_length, tasks, goal_weights)
        self._init_spaces()
        # Task and episode state
        self._world_seed: int | None = None
        self._instruction: tuple[int, ...] = ()
        self._progress: InstructionProgress | None = None
        self._env: Any = None
        self._counts: dict[str, int] = {}
        self._image = np.zeros((self.size, self.size, 3), np.uint8)
        self._t = 0

    def _init_goals(
        self,
        instruction_length: int | Sequence[int] | None,
        tasks: Sequence[Sequence[str]] | None,
        goal_weights: Mapping[str, float] | None,
    ) -> int:
        """Set where instructions come from (fixed `tasks`, or procedural lengths and goal weights) and
        return the number of goal slots the observation needs; refuse kwargs that do not fit the mode."""
        self._tasks: list[tuple[int, ...]] | None = None
        self._weights = np.zeros(GOAL_VOCAB)
        if not self.instructions:
            if tasks is not None or instruction_length is not None or goal_weights is not None:
                raise ValueError("tasks, instruction_length and goal_weights need instructions=True")
            self._lengths = (0, 0)
            return 0
        if tasks is not None:
            if instruction_length is not None or goal_weights is not None:
                raise ValueError("give either fixed tasks or instruction_length/goal_weights, not both")
            self._tasks = [tuple(self._check_task(task)) for task in tasks]
            if not self._tasks:
                raise ValueError("tasks must hold at least one instruction")
            self._lengths = (0, 0)
            return max(len(t) for t in self._tasks)
        self._lengths = (1, 5) if instruction_length is None else _length_range(instruction_length)
        self._weights = self._check_weights(DEFAULT_GOAL_WEIGHTS if goal_weights is None else goal_weights)
        return self._lengths[1]

    def _init_spaces(self) -> None:
        """Import crafter (checking its version) and declare the spaces: crafter's 17 actions; the image, plus
        the goal slots and the goal-contract metadata in instruction mode."""
        crafter = _crafter_module()
        self._crafter_env_cls = crafter.Env
        self.action_space = gym.spaces.Discrete(len(crafter.constants.actions))  # 17
        image = gym.spaces.Box(0, 255, (self.size, self.size, 3), np.uint8)
        if self.instructions:
            goal = gym.spaces.Box(0, GOAL_VOCAB, (self.slots,), np.int64)
            self.observation_space = gym.spaces.Dict({"image": image, "goal": goal})
            self.metadata = {**self.metadata, "goal_vocab": GOAL_VOCAB, "achieved_slots": ACHIEVED_SLOTS}
        else:
            self.observation_space = image

    # ---------------------------------------------------------------------------------------------- tasks
    @staticmethod
    def _check_task(task: Sequence[str]) -> list[int]:
        if isinstance(task, str):
            raise ValueError(f"each task is a list of achievement names, got the string {task!r}")
        tokens = goal_tokens(task)
        if not tokens:
            raise ValueError("a task needs at least one achievement")
        return tokens

    def _check_weights(self, weights: Mapping[str, float]) -> np.ndarray:
        w = np.zeros(GOAL_VOCAB)
        for name, value in weights.items():
            w[goal_tokens([name])[0] - 1] = float(value)
        if not np.all(np.isfinite(w)) or np.any(w < 0):
            raise ValueError(f"goal_weights must be finite and >= 0, got {dict(weights)}")
        if np.count_nonzero(w) < 1:
            raise ValueError("goal_weights must give a positive weight to at least one achievement")
        return w / w.sum()

    def _sample_instruction(self) -> tuple[int, ...]:
        rng = self.np_random
        if self._tasks is not None:
            return self._tasks[int(rng.integers(len(self._tasks)))]
        k = int(rng.integers(self._lengths[0], self._lengths[1] + 1))
        tokens: list[int] = []
        for _ in range(k):
            tokens.append(int(rng.choice(GOAL_VOCAB, p=self._weights)) + 1)
        return tuple(tokens)

    @property
    def instruction(self) -> list[str]:
        """The current task's instruction as achievement names (empty in plain mode or before a reset)."""
        return goal_names(self._instruction)

    # ------------------------------------------------------------------------------------------------ API
    def _obs(self) -> Any:
        if not self.instructions:
            return self._image.copy()
        return {"image": self._image.copy(), "goal": self._progress.goal()}  # type: ignore[union-attr]

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        if wants_new_task(options, seed, self._world_seed is not None):
            self._world_seed = int(self.np_random.integers(2**31 - 1))
            if self.instructions:
                self._instruction = self._sample_instruction()
        # A fresh crafter.Env per episode: its first reset builds the world from (seed, episode 1) only, so the
        # same world seed always gives the same world; no reliance on crafter's private attributes.
        self._env = self._crafter_env_cls(
            area=(self.area, self.area),
            size=(self.size, self.size),
            reward=True,
            length=None,
            seed=self._world_seed,
        )
        self._image = np.ascontiguousarray(self._env.reset(), dtype=np.uint8)
        self._counts = {name: 0 for name in ACHIEVEMENTS}  # a new player has unlocked nothing
        self._t = 0
        if not self.instructions:
            return self._obs(), {}
        self._progress = InstructionProgress(self._instruction, self.slots)
        return self._obs(), {"achieved": ()}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        if self._env is None:
            raise RuntimeError("CrafterEnv.step called before reset()")
        action = int(action)
        if not 0 <= action < self.action_space.n:
            raise ValueError(f"CrafterEnv action must be in [0, {self.action_space.n}), got {action}")
        image, crafter_reward, _, crafter_info = self._env.step(action)
        self._image = np.ascontiguousarray(image, dtype=np.uint8)
        self._t += 1
        died = crafter_info["discount"] == 0.0  # crafter's `done` is death here: its own time limit is off
        truncated = self._t >= self.episode_length
        if not self.instructions:
            return self._obs(), float(crafter_reward), died, truncated and not died, {}
        achieved = achieved_tokens(self._counts, crafter_info["achievements"])
        self._counts = dict(crafter_info["achievements"])
        if len(achieved) > ACHIEVED_SLOTS:
            raise RuntimeError(
                f"one crafter step unlocked {goal_names(achieved)}, more than achieved_slots={ACHIEVED_SLOTS}; "
                "this crafter version behaves differently from 1.8.x (pip install 'crafter>=1.8,<2')"
            )
        reward = float(self._progress.update(achieved))  # type: ignore[union-attr]
        success = self._progress.done  # type: ignore[union-attr]
        terminated = success or died
        truncated = truncated and not terminated
        info: dict[str, Any] = {"achieved": achieved}
        if terminated or truncated:
            info["success"] = float(success)
        return self._obs(), reward, terminated, truncated, info

    def render(self) -> np.ndarray | None:
        """The current observation image, scaled up by an integer factor to at least 256 px (no re-render, so
        rendering never touches crafter's random state)."""
        if self.render_mode != "rgb_array":
            return None
        scale = max(1, -(-256 // self.size))
        return np.repeat(np.repeat(self._image, scale, axis=0), scale, axis=1)
