"""Crafter with instructions: the goal contract's progress rule and achievement record (pure, no crafter), then
the real env (skipped without crafter): spaces, seeding, task semantics, a scripted wood-and-table run, and a
vector-env collection. Crafter builds a 64x64 world in ~0.8 s per reset, so most tests use 32x32 worlds
(~0.2 s) and keep resets few."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections import deque

import gymnasium as gym
import numpy as np
import pytest

from icrl.envs.tasks.crafter_env import (
    ACHIEVED_SLOTS,
    ACHIEVEMENTS,
    DEFAULT_GOAL_WEIGHTS,
    GOAL_VOCAB,
    TOKENS,
    CrafterEnv,
    achieved_tokens,
    goal_names,
    goal_tokens,
)
from icrl.envs.tasks.instruction import InstructionProgress

requires_crafter = pytest.mark.skipif(
    importlib.util.find_spec("crafter") is None,
    reason="crafter is not installed: pip install 'icrl[crafter]'",
)
WOOD, TABLE, SAPLING = TOKENS["collect_wood"], TOKENS["place_table"], TOKENS["collect_sapling"]


# ------------------------------------------------------------------------------------- pure logic (no crafter)
def test_tokens_follow_crafters_sorted_achievement_list():
    assert len(ACHIEVEMENTS) == GOAL_VOCAB == 22 and list(ACHIEVEMENTS) == sorted(ACHIEVEMENTS)
    assert goal_tokens(["collect_coal", "wake_up"]) == [1, 22] and WOOD == 7
    assert goal_names([7, 0, 21, 0]) == ["collect_wood", "place_table"]
    with pytest.raises(ValueError, match="unknown Crafter achievement 'collect_gold'"):
        goal_tokens(["collect_gold"])


def test_achieved_tokens_counts_every_unlock():
    zero = dict.fromkeys(ACHIEVEMENTS, 0)
    assert achieved_tokens(zero, zero) == ()
    after = {**zero, "collect_wood": 1, "wake_up": 1}
    assert achieved_tokens(zero, after) == (WOOD, TOKENS["wake_up"])  # token order
    # a repeated unlock counts again: the second wood achieves collect_wood a second time
    assert achieved_tokens(after, {**after, "collect_wood": 2}) == (WOOD,)
    assert achieved_tokens(zero, {**zero, "place_plant": 2}) == (TOKENS["place_plant"],) * 2


def test_instruction_progress_follows_the_contract():
    p = InstructionProgress([WOOD, TABLE, WOOD], slots=5)
    np.testing.assert_array_equal(p.goal(), [WOOD, TABLE, WOOD, 0, 0])  # padded at the end
    assert p.update([]) == 0 and p.update([TABLE]) == 0  # out of order: nothing
    assert p.update([WOOD]) == 1 and not p.done
    np.testing.assert_array_equal(p.goal(), [0, TABLE, WOOD, 0, 0])  # completed slot zeroed in place
    assert p.update([WOOD]) == 0  # the current goal is place_table now
    assert p.update([TABLE, WOOD]) == 2 and p.done  # one step may complete several in a row
    np.testing.assert_array_equal(p.goal(), np.zeros(5))
    assert p.update([WOOD]) == 0
    twice = InstructionProgress([WOOD, WOOD], slots=2)
    assert twice.update([WOOD]) == 1 and not twice.done  # one unlock completes one slot
    assert twice.update([WOOD, WOOD]) == 1 and twice.done
    with pytest.raises(ValueError, match="does not fit"):
        InstructionProgress([WOOD, TABLE], slots=1)


def test_default_goal_weights_are_amagos():
    w = DEFAULT_GOAL_WEIGHTS
    assert set(w) == set(ACHIEVEMENTS) and abs(sum(w.values()) - 1.0) < 1e-9
    assert w["wake_up"] == 0.0 and min(v for k, v in w.items() if k != "wake_up") > 0
    # collect 0.3 * wood 0.2 and make 0.15 * (iron 0.1 * sword 0.5), renormalised without travel goals (0.8)
    assert w["collect_wood"] == pytest.approx(0.3 * 0.2 / 0.8)
    assert w["make_iron_sword"] == pytest.approx(0.15 * 0.05 / 0.8)


def test_invalid_arguments():  # all checked before crafter is imported
    with pytest.raises(ValueError, match="unknown Crafter achievement"):
        CrafterEnv(tasks=[["collect_wood", "mine_gold"]])
    with pytest.raises(ValueError, match="not both"):
        CrafterEnv(tasks=[["collect_wood"]], instruction_length=2)
    with pytest.raises(ValueError, match="instructions=True"):
        CrafterEnv(instructions=False, instruction_length=2)
    with pytest.raises(ValueError, match="instruction_length"):
        CrafterEnv(instruction_length=(3, 2))
    with pytest.raises(ValueError, match="at least one achievement"):
        CrafterEnv(instruction_length=2, goal_weights={"collect_wood": 0.0})
    with pytest.raises(ValueError, match="size must be >= 18"):
        CrafterEnv(size=16)
    with pytest.raises(ValueError, match="area must be >= 12"):
        CrafterEnv(area=8)


def _fresh_module(name: str):
    """Execute a module's file again in a new module object (sys.modules untouched)."""
    spec = importlib.util.find_spec(name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_registered_without_importing_crafter(monkeypatch):
    monkeypatch.setitem(sys.modules, "crafter", None)  # simulate a missing crafter: `import crafter` fails
    fresh_env_module = _fresh_module("icrl.envs.tasks.crafter_env")  # a module-level crafter import would fail here
    assert "crafter" in _fresh_module("icrl.envs.registry").TASKS  # the registry imports without crafter
    fresh_make = _fresh_module("icrl.envs.make")
    with pytest.raises(ImportError, match=r"pip install 'icrl\[crafter\]'"):
        fresh_env_module.CrafterEnv()
    with pytest.raises(ImportError, match=r"pip install 'icrl\[crafter\]'"):
        fresh_make.make_env("crafter")


# --------------------------------------------------------------------------------------- with crafter installed
@requires_crafter
def test_sampled_instructions():
    env = CrafterEnv(size=32)
    env.np_random, _ = gym.utils.seeding.np_random(0)  # sampling only, no world (a reset builds one)
    draws = [env._sample_instruction() for _ in range(2000)]
    assert {len(d) for d in draws} == {1, 2, 3, 4, 5}  # AMAGO: uniform length in [1, 5]
    assert any(a == b for d in draws for a, b in zip(d, d[1:]))  # repeats allowed, as in AMAGO
    counts = np.bincount([t for d in draws for t in d], minlength=GOAL_VOCAB + 1)[1:]
    assert counts[TOKENS["wake_up"] - 1] == 0
    assert counts[TOKENS["eat_cow"] - 1] > 5 * counts[TOKENS["make_iron_sword"] - 1]  # weighted, not uniform
    env = CrafterEnv(instruction_length=3, goal_weights={"collect_wood": 1, "place_table": 1})
    env.np_random, _ = gym.utils.seeding.np_random(0)
    draws = {env._sample_instruction() for _ in range(200)}
    assert draws <= {(a, b, c) for a in (WOOD, TABLE) for b in (WOOD, TABLE) for c in (WOOD, TABLE)}
    assert len(draws) == 8  # every combination, repeats included


@requires_crafter
def test_spaces_plain_mode_and_render():
    env = CrafterEnv(instruction_length=(1, 3), size=32)
    assert env.observation_space == gym.spaces.Dict(
        {
            "image": gym.spaces.Box(0, 255, (32, 32, 3), np.uint8),
            "goal": gym.spaces.Box(0, 22, (3,), np.int64),
        }
    )
    assert env.action_space == gym.spaces.Discrete(17)
    assert env.metadata["goal_vocab"] == 22 and env.metadata["achieved_slots"] == ACHIEVED_SLOTS == 2
    plain = CrafterEnv(instructions=False, size=64, episode_length=3, render_mode="rgb_array")
    assert plain.observation_space == gym.spaces.Box(0, 255, (64, 64, 3), np.uint8)
    assert "goal_vocab" not in plain.metadata
    obs, info = plain.reset(seed=0)
    assert obs.dtype == np.uint8 and obs.shape == (64, 64, 3) and obs.std() > 0 and info == {}
    frame = plain.render()
    assert frame.shape == (256, 256, 3) and np.array_equal(frame[::4, ::4], obs)
    for t in range(3):
        obs, reward, terminated, truncated, info = plain.step(0)
        assert isinstance(reward, float) and not terminated and truncated == (t == 2) and info == {}


@requires_crafter
def test_seeding_and_what_a_task_is():
    a, b = CrafterEnv(size=32, area=32), CrafterEnv(size=32, area=32)
    (oa, _), (ob, _) = a.reset(seed=7), b.reset(seed=7)
    assert np.array_equal(oa["image"], ob["image"]) and np.array_equal(oa["goal"], ob["goal"])
    assert a.instruction == b.instruction and 1 <= len(a.instruction) <= 5
    actions = np.random.default_rng(0).integers(0, 17, size=20)
    for action in actions:
        sa, sb = a.step(action), b.step(action)
        assert np.array_equal(sa[0]["image"], sb[0]["image"]) and sa[1:4] == sb[1:4]
    first_instruction = a.instruction
    # same task: the same world regenerated (same first image) and the full instruction again
    again, info = a.reset(options={"new_task": False})
    assert info == {"achieved": ()} and a.instruction == first_instruction
    assert np.array_equal(again["image"], oa["image"]) and np.array_equal(again["goal"], oa["goal"])
    # a new task: a new world and (for this seed) a new instruction
    new, _ = a.reset()
    assert not np.array_equal(new["image"], oa["image"]) and a.instruction != first_instruction


@requires_crafter
def test_multi_episode_rollout_keeps_the_task():
    from icrl.envs.wrapper import TimestepWrapper

    wrapped = TimestepWrapper(CrafterEnv(size=32, area=16, episode_length=4), episodes_per_rollout=2)
    first, _ = wrapped.reset(seed=3)
    for t in range(9):  # episode 1: steps 0-3, bridge step 4, episode 2: steps 5-8
        ts, reward, terminated, truncated, info = wrapped.step(0)
        if t == 4:  # the second episode starts in the same world with the same instruction
            assert ts["reset"] == 1 and info == {"achieved": ()}
            assert np.array_equal(ts["obs"]["image"], first["obs"]["image"])
            assert np.array_equal(ts["obs"]["goal"], first["obs"]["goal"])
    assert truncated and not terminated and info["success"] == 0.0


MOVES = {1: (-1, 0), 2: (1, 0), 3: (0, -1), 4: (0, 1)}  # crafter's move_left/right/up/down
DO, PLACE_TABLE = 5, 8


def _scripted_action(cenv) -> int:
    """Collect two wood (walk to the nearest tree by BFS, face it, "do"), then place a table."""
    world, player = cenv._world, cenv._player
    pos, facing = tuple(int(v) for v in player.pos), tuple(int(v) for v in player.facing)

    def free(p: tuple[int, int]) -> bool:
        material, obj = world[p]
        return material in ("grass", "sand", "path") and obj is None

    if player.inventory["wood"] >= 2:
        if free((pos[0] + facing[0], pos[1] + facing[1])):
            return PLACE_TABLE
        return next(a for a, (dx, dy) in MOVES.items() if free((pos[0] + dx, pos[1] + dy)))
    first_move: dict[tuple[int, int], int | None] = {pos: None}
    queue = deque([pos])
    while queue:
        p = queue.popleft()
        for a, (dx, dy) in MOVES.items():
            if world[(p[0] + dx, p[1] + dy)][0] == "tree":
                if p != pos:
                    return first_move[p]  # type: ignore[return-value]
                return DO if facing == (dx, dy) else a  # moving into a tree only turns the player
        for a, (dx, dy) in MOVES.items():
            q = (p[0] + dx, p[1] + dy)
            if q not in first_move and free(q):
                first_move[q] = a if p == pos else first_move[p]
                queue.append(q)
    raise AssertionError("no reachable tree")


@requires_crafter
def test_scripted_wood_then_table_rewards_and_achievements():
    env = CrafterEnv(tasks=[["collect_wood", "place_table"]], episode_length=200, size=32, area=32)
    obs, info = env.reset(seed=0)
    np.testing.assert_array_equal(obs["goal"], [WOOD, TABLE])
    events = []  # (achieved, reward, goal) on steps that achieved something
    for _ in range(200):
        obs, reward, terminated, truncated, info = env.step(_scripted_action(env._env))
        assert len(info["achieved"]) <= ACHIEVED_SLOTS
        if info["achieved"] or reward:
            events.append((info["achieved"], reward, obs["goal"].tolist()))
        if terminated or truncated:
            break
    events = [e for e in events if e[0] != (SAPLING,)]  # "do" on grass may yield a sapling on the way
    assert events == [
        ((WOOD,), 1.0, [0, TABLE]),  # first sub-goal done, its slot zeroed
        ((WOOD,), 0.0, [0, TABLE]),  # the second wood is achieved again, but it is not the current goal
        ((TABLE,), 1.0, [0, 0]),
    ]
    assert terminated and not truncated and info["success"] == 1.0


@requires_crafter
def test_vector_env_collection():
    from icrl.envs.collect import Collector, RandomPolicy
    from icrl.envs.make import make_vector_env

    kwargs = {"episode_length": 12, "size": 32, "area": 32, "instruction_length": 2}
    venv = make_vector_env("crafter", kwargs, num_envs=2)
    wrapper = venv.envs[0]
    collector = Collector(venv, wrapper.action_spec, seed=0)
    rollouts, stats = collector.collect(RandomPolicy(wrapper.action_spec, seed=0), num_env_steps=30)
    venv.close()
    assert len(rollouts) == 2 and len(stats) == 2
    for r in rollouts:
        T = len(r.action)
        assert r.obs["image"].shape == (T + 1, 32, 32, 3) and r.obs["image"].dtype == np.uint8
        assert r.obs["goal"].shape == (T + 1, 2) and r.obs["goal"].dtype == np.int64
        assert np.all(r.obs["goal"][0] > 0)  # a length-2 instruction, nothing completed at the start
        assert (T == 12 and r.truncated[-1]) or r.terminated[-1]  # time limit (or death / success)
        assert np.all(r.reward >= 0) and r.reward.sum() <= 2
